#!/usr/bin/env bash
# Debian 13's servers (RabbitMQ 4.0, NATS 2.10, Redis 8.0, Valkey 8.1, PostgreSQL 17,
# MariaDB 11.8) in a root of the project's own, built once per machine with debootstrap and
# kept outside the repository. The machine's own servers (Debian 12's) are never touched:
# what runs from this root runs on ports and data directories of its own, started by the
# tests' harnesses (JUSTONCE_SERVER_ROOT names the root to them).
#
#   scripts/debian13.sh install     build the root once (about 1.3 GB; a few minutes)
#   scripts/debian13.sh path        print the root's path (after install)
#   scripts/debian13.sh versions    the servers' versions, one a line
#   scripts/debian13.sh run CMD…    run CMD inside the root
#
# Inside the root, /proc is mounted (made once and kept); /dev holds the nodes debootstrap
# made, and /tmp is the root's own: a harness makes its servers' directories there and
# hands them the paths as seen inside. Nothing of the machine's files is mounted in it, so
# deleting the cache deletes only the cache; `scripts/debian13.sh remove` takes /proc down
# first.
set -euo pipefail

ROOT="${JUSTONCE_DEBIAN13_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/justonce/debian13}"
MIRROR="${JUSTONCE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(rabbitmq-server nats-server redis-server valkey-server postgresql-17 mariadb-server)

# /proc inside the root (made once, kept): Erlang reads it. Never a bind mount of the
# machine's files: an `rm -rf` of the cache would go through it.
mounts() {
  mkdir -p "$ROOT/proc" "$ROOT/tmp"
  chmod 1777 "$ROOT/tmp"
  mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
}

unmount() {
  local m
  for m in tmp dev proc; do
    if mountpoint -q "$ROOT/$m" 2>/dev/null; then umount -l "$ROOT/$m"; fi
  done
}

# Deletes a root, never through a mount (a bind mount of the same file system is one that
# `rm --one-file-system` would not stop at; earlier versions of this script made some).
remove_root() {
  local dir="$1"
  [ -e "$dir" ] || return 0
  ROOT="$dir" unmount
  if findmnt -rn -o TARGET | grep -q "^$dir/"; then
    echo "debian13: $dir still has mounts; not deleting it" >&2
    return 1
  fi
  rm -rf --one-file-system "$dir"
}

install() {
  if [ -f "$ROOT/.justonce-ready" ]; then
    mounts
    return 0
  fi
  if ! command -v debootstrap >/dev/null; then
    echo "debian13: installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  fi
  local partial="$ROOT.partial"
  remove_root "$partial"
  mkdir -p "$(dirname "$ROOT")"
  echo "debian13: debootstrap trixie into $ROOT (once per machine)"
  debootstrap --variant=minbase trixie "$partial" "$MIRROR" >"${TMPDIR:-/tmp}/justonce-debootstrap.log" 2>&1 || {
    echo "debian13: debootstrap failed; see ${TMPDIR:-/tmp}/justonce-debootstrap.log" >&2
    return 1
  }
  # Packages install without starting anything (no init in a root), and PostgreSQL makes no
  # cluster: the harnesses make their own.
  printf '#!/bin/sh\nexit 101\n' >"$partial/usr/sbin/policy-rc.d"
  chmod +x "$partial/usr/sbin/policy-rc.d"
  mkdir -p "$partial/etc/postgresql-common"
  echo "create_main_cluster = false" >"$partial/etc/postgresql-common/createcluster.conf"
  ROOT="$partial" mounts
  echo "debian13: installing ${PACKAGES[*]}"
  if ! chroot "$partial" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${PACKAGES[@]}" >>"${TMPDIR:-/tmp}/justonce-debootstrap.log" 2>&1; then
    echo "debian13: installing the servers failed; see ${TMPDIR:-/tmp}/justonce-debootstrap.log" >&2
    return 1
  fi
  chroot "$partial" apt-get clean
  ROOT="$partial" unmount
  mv "$partial" "$ROOT"
  touch "$ROOT/.justonce-ready"
  mounts
}

versions() {
  chroot "$ROOT" dpkg-query -W -f '${Package} ${Version}\n' "${PACKAGES[@]}"
}

case "${1:-}" in
  install) install ;;
  path) [ -f "$ROOT/.justonce-ready" ] && echo "$ROOT" ;;
  versions) mounts && versions ;;
  run) shift; mounts; exec chroot "$ROOT" "$@" ;;
  remove) remove_root "$ROOT" && remove_root "$ROOT.partial" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
