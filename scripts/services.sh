#!/usr/bin/env bash
# Starts every local service the tests may use that is not answering on its port, and waits
# for it. Loopback only. Safe to run again: a service that answers is left alone.
#   scripts/services.sh               every service
#   scripts/services.sh --skip-kafka  every one but Kafka (tansu)
#   scripts/services.sh --kafka-only  Kafka alone: tansu built once per machine, then started
#                                     (.ci/run runs this in the background while it compiles)
set -u
only=all
case "${1:-}" in
--skip-kafka) only=others ;;
--kafka-only) only=kafka ;;
"") ;;
*)
  echo "usage: $0 [--skip-kafka | --kafka-only]" >&2
  exit 2
  ;;
esac

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # name port seconds
  local i
  for ((i = 0; i < $3 * 4; i++)); do
    up "$2" && { echo "services: $1 up on :$2"; return 0; }
    sleep 0.25
  done
  echo "services: $1 did not come up on :$2 within $3 s" >&2
  return 1
}

start() { # name port seconds command...
  local name=$1 port=$2 secs=$3
  shift 3
  if up "$port"; then
    echo "services: $name already up on :$port"
    return 0
  fi
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "services: $name is down and $1 is not installed" >&2
    return 1
  fi
  echo "services: starting $name"
  "$@" >/dev/null 2>&1 || true
  wait_for "$name" "$port" "$secs"
}

# Kafka: tansu (a Kafka-protocol broker in Rust; no Apache Kafka here), built once per
# machine with cargo into a cache outside the repository (about 15 minutes on two cores),
# then started on :9092 with SQLite storage in a data directory of its own.
TANSU_VERSION=0.6.0
TANSU_HOME="${XDG_CACHE_HOME:-$HOME/.cache}/justonce/tansu-$TANSU_VERSION"
TANSU_BIN="$TANSU_HOME/bin/tansu"
TANSU_DATA="${XDG_CACHE_HOME:-$HOME/.cache}/justonce/tansu-data"

install_tansu() {
  [ -x "$TANSU_BIN" ] && return 0
  echo "services: building tansu $TANSU_VERSION into $TANSU_HOME (once per machine)"
  # At the lowest priority, in a target directory of its own (not CARGO_TARGET_DIR, which
  # the workspace's build holds locked while this runs beside it).
  env -u CARGO_TARGET_DIR nice -n 19 cargo install --locked --quiet tansu \
    --version "$TANSU_VERSION" --features libsql --root "$TANSU_HOME" >"${TMPDIR:-/tmp}/justonce-tansu-install.log" 2>&1 || {
    echo "services: building tansu failed; see ${TMPDIR:-/tmp}/justonce-tansu-install.log" >&2
    return 1
  }
}

start_tansu() {
  mkdir -p "$TANSU_DATA" || return 1
  (cd "$TANSU_DATA" && RUST_LOG=warn exec setsid "$TANSU_BIN" broker \
    --listener-url tcp://127.0.0.1:9092 --advertised-listener-url tcp://127.0.0.1:9092 \
    --storage-engine sqlite://tansu.db) >>"$TANSU_DATA/tansu.log" 2>&1 </dev/null &
}

# Two repairs of tansu 0.6.0's SQLite storage, made once tansu has made its tables and
# no-ops after: an index on the record headers, and a trigger that keeps a topic deletion to
# its topic (the SQL file says why; the harness runs the same file).
TANSU_REPAIRS="$(cd "$(dirname "$0")/.." && pwd)/crates/justonce-kafka/src/tansu_repairs.sql"
repair_tansu() {
  local db="$TANSU_DATA/tansu.db"
  [ -f "$db" ] || return 0
  for _ in $(seq 1 50); do
    if command -v sqlite3 >/dev/null 2>&1; then
      sqlite3 -bail -cmd ".timeout 5000" "$db" <"$TANSU_REPAIRS" 2>/dev/null && return 0
    elif command -v python3 >/dev/null 2>&1; then
      python3 -c 'import sqlite3, sys; c = sqlite3.connect(sys.argv[1], timeout=5); c.executescript(open(sys.argv[2]).read()); c.commit()' \
        "$db" "$TANSU_REPAIRS" 2>/dev/null && return 0
    fi
    sleep 0.2
  done
  echo "services: could not repair tansu's storage in $db: deleting a Kafka topic deletes them all" >&2
  return 1
}

status=0
if [ "$only" != kafka ]; then
  start postgresql 5432 60 bash -c 'pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start' || status=1
  start mariadb 3306 60 start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || status=1
  start redis 6379 30 redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || status=1
  start rabbitmq 5672 120 rabbitmq-server -detached || status=1
  start nats 4222 30 start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log || status=1
  start mosquitto 1883 30 mosquitto -d -c /etc/mosquitto/mosquitto.conf || status=1
fi
[ "$only" = others ] && exit $status
if up 9092; then
  echo "services: kafka (tansu) already up on :9092"
  repair_tansu || status=1
elif install_tansu; then
  echo "services: starting kafka (tansu)"
  start_tansu
  if wait_for kafka 9092 30; then repair_tansu || status=1; else status=1; fi
else
  status=1
fi
exit $status
