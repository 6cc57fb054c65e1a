use std::process::Command;

use serde_json::Value;

fn demo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_justonce"))
        .arg("demo")
        .args(args)
        .output()
        .expect("the justonce binary runs")
}

pub(crate) fn json_demo(args: &[&str]) -> Value {
    let out = demo(&[&["--json", "--lease-ms", "300"], args].concat());
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

pub(crate) fn row<'a>(report: &'a Value, semantics: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["semantics"] == semantics)
        .unwrap()
}

pub(crate) fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {v}"))
}

#[test]
fn demo_json_keeps_the_contract_and_shows_each_semantic() {
    let r = json_demo(&["--messages", "3000", "--seed", "1"]);
    for key in [
        "messages",
        "seed",
        "transport",
        "store",
        "strategy",
        "id_strategy",
        "faults",
        "rows",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert_eq!(r["transport"], "sqlite");
    assert_eq!(r["strategy"], "dedup-table");
    assert_eq!(r["id_strategy"], "message-id");
    let faults = &r["faults"];
    for key in [
        "duplicate_publishes",
        "crash_before_commit",
        "crash_after_commit",
        "ack_lost",
        "crash_after_ack",
        "poison",
    ] {
        assert!(n(faults, key) > 0, "the seed must plan some {key}");
    }
    let names: Vec<_> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["semantics"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["at-most-once", "at-least-once", "effectively-once"]);
    for r in r["rows"].as_array().unwrap() {
        for key in [
            "sent",
            "deliveries",
            "handler_runs",
            "effects",
            "lost",
            "duplicate_effects",
            "dead_lettered",
        ] {
            n(r, key);
        }
        assert!(r["seconds"].as_f64().unwrap() > 0.0 && r["msgs_per_sec"].as_f64().unwrap() > 0.0);
        assert_eq!(n(r, "sent"), 3000, "one distinct id per order");
    }
    let poison = n(faults, "poison");

    let amo = row(&r, "at-most-once");
    assert!(n(amo, "lost") > 0, "at-most-once loses: {amo}");

    let alo = row(&r, "at-least-once");
    assert_eq!(n(alo, "lost"), 0, "{alo}");
    assert!(
        n(alo, "duplicate_effects") > 0,
        "at-least-once duplicates: {alo}"
    );
    assert_eq!(n(alo, "dead_lettered"), poison);

    let eo = row(&r, "effectively-once");
    assert_eq!(n(eo, "lost"), 0, "{eo}");
    assert_eq!(n(eo, "duplicate_effects"), 0, "{eo}");
    assert!(
        n(eo, "deliveries") > n(eo, "sent"),
        "the faults caused redeliveries: {eo}"
    );
    assert_eq!(n(eo, "dead_lettered"), poison);
    assert_eq!(
        n(eo, "effects"),
        3000 - poison,
        "one effect per well-formed order"
    );
}

#[test]
fn fresh_uuids_per_publish_attempt_defeat_dedup() {
    let r = json_demo(&[
        "--messages",
        "2000",
        "--seed",
        "3",
        "--id-strategy",
        "fresh-uuid",
    ]);
    let dups = n(&r["faults"], "duplicate_publishes");
    assert!(dups > 0);
    let eo = row(&r, "effectively-once");
    assert_eq!(n(eo, "lost"), 0);
    assert_eq!(
        n(eo, "duplicate_effects"),
        dups,
        "every re-sent order took effect twice: {eo}"
    );
    assert_eq!(n(eo, "sent"), 2000 + dups, "each retry published a new id");

    let out = demo(&[
        "--messages",
        "300",
        "--seed",
        "3",
        "--id-strategy",
        "fresh-uuid",
        "--lease-ms",
        "300",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(table.contains("effectively-once"), "{table}");
    assert!(
        table.contains("a producer id regenerated on retry defeats dedup"),
        "{table}"
    );
}

#[test]
fn a_backend_that_is_not_built_or_refuses_is_a_clear_error() {
    let out = demo(&["--transport", "sqs://eu-west-1/orders", "--messages", "10"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("there is no sqs transport"), "{err}");
    assert!(
        err.contains("kafka://"),
        "the error names every scheme: {err}"
    );
    let out = demo(&[
        "--store",
        "redis://app:s3cret@127.0.0.1/0",
        "--messages",
        "10",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot connect to Redis"), "{err}");
    assert!(
        !err.contains("s3cret"),
        "credentials are never printed: {err}"
    );
}

/// The defect of issue 49: `amqps://` against RabbitMQ's plaintext port ran the demo in
/// plaintext. It is refused now, with an error that says TLS and no password.
#[test]
fn amqps_against_the_plaintext_port_fails_and_says_tls() {
    let Some(url) = amqp_url() else { return };
    let tls = url.replacen("amqp://", "amqps://", 1);
    let out = demo(&["--transport", &tls, "--messages", "10"]);
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("over TLS"), "{all}");
    assert!(!all.contains("guest:guest"), "{all}");
}

#[test]
fn the_demo_on_rabbitmq_applies_every_order_once_under_real_broker_faults() {
    if !justonce_test::service_available("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let url = std::env::var("JUSTONCE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let r = json_demo(&["--transport", &url, "--messages", "3000", "--seed", "1"]);
    assert_eq!(r["transport"], "amqp");
    let poison = n(&r["faults"], "poison");
    let eo = row(&r, "effectively-once");
    assert_eq!(n(eo, "lost"), 0, "{eo}");
    assert_eq!(n(eo, "duplicate_effects"), 0, "{eo}");
    assert!(
        n(eo, "deliveries") > n(eo, "sent"),
        "channel closes caused redeliveries: {eo}"
    );
    assert_eq!(n(eo, "dead_lettered"), poison, "{eo}");
    let alo = row(&r, "at-least-once");
    assert_eq!(n(alo, "lost"), 0, "{alo}");
    assert!(n(alo, "duplicate_effects") > 0, "{alo}");
    assert!(n(row(&r, "at-most-once"), "lost") > 0);
}

/// The demo on a Redis stream, and with its effects in Redis (balances and ledger counted
/// from Redis): effectively-once loses and doubles nothing, at-least-once doubles, with the
/// dedup key in the Redis commit and with the Redis claim store.
#[test]
fn the_demo_on_redis_applies_every_order_once() {
    if !justonce_test::service_available("Redis", "127.0.0.1:6379") {
        return;
    }
    let url =
        std::env::var("JUSTONCE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    for args in [
        vec!["--transport", url.as_str()],
        vec!["--store", url.as_str()],
        vec!["--store", url.as_str(), "--strategy", "claim"],
    ] {
        let mut all = args.clone();
        all.extend(["--messages", "1500", "--seed", "3"]);
        let r = json_demo(&all);
        let poison = n(&r["faults"], "poison");
        let eo = row(&r, "effectively-once");
        assert_eq!(n(eo, "lost"), 0, "{args:?}: {eo}");
        assert_eq!(n(eo, "duplicate_effects"), 0, "{args:?}: {eo}");
        assert!(n(eo, "deliveries") > n(eo, "sent"), "{args:?}: {eo}");
        assert_eq!(n(eo, "dead_lettered"), poison, "{args:?}: {eo}");
        let alo = row(&r, "at-least-once");
        assert_eq!(n(alo, "lost"), 0, "{args:?}: {alo}");
        assert!(n(alo, "duplicate_effects") > 0, "{args:?}: {alo}");
    }
}

/// The demo on a NATS JetStream stream: effectively-once loses and doubles nothing,
/// at-least-once doubles; and the server drops the planned duplicate publishes (the same
/// `Nats-Msg-Id` inside the window), so at-most-once, where only those could double an
/// effect, doubles none.
#[test]
fn the_demo_on_nats_applies_every_order_once_and_the_server_drops_duplicate_publishes() {
    if !justonce_test::service_available("NATS", "127.0.0.1:4222") {
        return;
    }
    let url = std::env::var("JUSTONCE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let r = json_demo(&[
        "--transport",
        url.as_str(),
        "--messages",
        "1500",
        "--seed",
        "3",
    ]);
    assert!(n(&r["faults"], "duplicate_publishes") > 0, "{r}");
    let poison = n(&r["faults"], "poison");
    let eo = row(&r, "effectively-once");
    assert_eq!(n(eo, "lost"), 0, "{eo}");
    assert_eq!(n(eo, "duplicate_effects"), 0, "{eo}");
    assert!(n(eo, "deliveries") > n(eo, "sent"), "{eo}");
    assert_eq!(n(eo, "dead_lettered"), poison, "{eo}");
    let alo = row(&r, "at-least-once");
    assert_eq!(n(alo, "lost"), 0, "{alo}");
    assert!(n(alo, "duplicate_effects") > 0, "{alo}");
    let amo = row(&r, "at-most-once");
    assert_eq!(n(amo, "duplicate_effects"), 0, "{amo}");
}

/// The demo on Kafka (tansu) with the PostgreSQL store: effectively-once (the group's
/// committed offsets and the dedup table) and the consumer's positions in the business
/// database lose and double nothing; at-least-once doubles.
#[test]
fn the_demo_on_kafka_applies_every_order_once_with_positions_in_kafka_or_in_the_database() {
    let (Some(kafka), Some(pg)) = (kafka_url(), postgres_url()) else {
        return;
    };
    let r = json_demo(&[
        "--transport",
        &kafka,
        "--store",
        &pg,
        "--messages",
        "600",
        "--seed",
        "3",
    ]);
    assert_eq!(r["transport"], "kafka");
    let poison = n(&r["faults"], "poison");
    for semantics in ["effectively-once", "exactly-once (same database)"] {
        let row = row(&r, semantics);
        assert_eq!(n(row, "lost"), 0, "{row}");
        assert_eq!(n(row, "duplicate_effects"), 0, "{row}");
        assert_eq!(n(row, "dead_lettered"), poison, "{row}");
        // Kafka counts positions, not deliveries: unknown, not 0.
        assert!(row["deliveries"].is_null(), "{row}");
    }
    let alo = row(&r, "at-least-once");
    assert_eq!(n(alo, "lost"), 0, "{alo}");
    assert!(n(alo, "duplicate_effects") > 0, "{alo}");
}

#[test]
fn every_strategy_keeps_effectively_once() {
    for strategy in [
        "dedup-table",
        "unique-key",
        "state-machine",
        "version",
        "claim",
    ] {
        let r = json_demo(&["--messages", "1500", "--seed", "2", "--strategy", strategy]);
        assert_eq!(r["strategy"], strategy);
        let poison = n(&r["faults"], "poison");
        let eo = row(&r, "effectively-once");
        assert_eq!(n(eo, "lost"), 0, "{strategy}: {eo}");
        assert_eq!(n(eo, "duplicate_effects"), 0, "{strategy}: {eo}");
        assert!(
            n(eo, "deliveries") > n(eo, "sent"),
            "{strategy}: redeliveries happened: {eo}"
        );
        assert_eq!(n(eo, "dead_lettered"), poison, "{strategy}: {eo}");
        let alo = row(&r, "at-least-once");
        assert!(
            n(alo, "duplicate_effects") > 0,
            "{strategy}: without the method, duplicates: {alo}"
        );
        if strategy == "claim" {
            assert!(n(eo, "api_calls") >= n(eo, "effects"), "{eo}");
        }
    }
}

#[test]
fn ids_derived_by_the_consumer_survive_a_producer_that_regenerates_them() {
    for ids in ["field", "content-hash"] {
        let r = json_demo(&["--messages", "1500", "--seed", "3", "--id-strategy", ids]);
        let dups = n(&r["faults"], "duplicate_publishes");
        let eo = row(&r, "effectively-once");
        assert_eq!(
            n(eo, "sent"),
            1500 + dups,
            "{ids}: the publisher made a new id per attempt"
        );
        assert_eq!(n(eo, "lost"), 0, "{ids}: {eo}");
        assert_eq!(n(eo, "duplicate_effects"), 0, "{ids}: {eo}");
    }
}

pub(crate) fn postgres_url() -> Option<String> {
    justonce_test::service_available("PostgreSQL", "127.0.0.1:5432").then(|| {
        std::env::var("JUSTONCE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    })
}

pub(crate) fn mysql_url() -> Option<String> {
    justonce_test::service_available("MariaDB", "127.0.0.1:3306").then(|| {
        std::env::var("JUSTONCE_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    })
}

/// The shared tansu (`scripts/services.sh`), at JUSTONCE_KAFKA_URL or :9092.
pub(crate) fn kafka_url() -> Option<String> {
    justonce_test::service_available("Kafka (tansu)", "127.0.0.1:9092").then(|| {
        std::env::var("JUSTONCE_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into())
    })
}

pub(crate) fn amqp_url() -> Option<String> {
    justonce_test::service_available("RabbitMQ", "127.0.0.1:5672").then(|| {
        std::env::var("JUSTONCE_AMQP_URL")
            .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
    })
}

/// Asserts the effectively-once contract on one row: nothing lost, nothing applied twice,
/// redeliveries happened, the poison dead-lettered.
fn assert_once(r: &Value, semantics: &str) {
    let poison = n(&r["faults"], "poison");
    let row = row(r, semantics);
    assert_eq!(n(row, "lost"), 0, "{semantics}: {row}");
    assert_eq!(n(row, "duplicate_effects"), 0, "{semantics}: {row}");
    assert!(
        n(row, "deliveries") > n(row, "sent"),
        "{semantics}: redeliveries happened: {row}"
    );
    assert_eq!(n(row, "dead_lettered"), poison, "{semantics}: {row}");
    assert_eq!(
        n(row, "effects"),
        n(row, "sent") - poison,
        "{semantics}: {row}"
    );
}

#[test]
fn a_postgres_queue_and_store_add_exactly_once_in_one_database() {
    let Some(pg) = postgres_url() else { return };
    let r = json_demo(&[
        "--transport",
        &pg,
        "--store",
        &pg,
        "--messages",
        "2000",
        "--seed",
        "1",
    ]);
    assert_eq!(r["transport"], "postgres");
    assert_eq!(r["store"], "postgres");
    let names: Vec<_> = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["semantics"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "at-most-once",
            "at-least-once",
            "effectively-once",
            "exactly-once (same database)"
        ]
    );
    assert_once(&r, "effectively-once");
    assert_once(&r, "exactly-once (same database)");
    let alo = row(&r, "at-least-once");
    assert!(n(alo, "duplicate_effects") > 0, "{alo}");
    assert!(n(row(&r, "at-most-once"), "lost") > 0);
    // The ack in the transaction removes the redeliveries of commits whose ack was lost.
    let eo = row(&r, "effectively-once");
    let xo = row(&r, "exactly-once (same database)");
    assert!(n(xo, "deliveries") < n(eo, "deliveries"), "{xo} vs {eo}");
}

#[test]
fn rabbitmq_with_a_postgres_or_mariadb_store_applies_every_order_once() {
    let Some(amqp) = amqp_url() else { return };
    for store in [postgres_url(), mysql_url()].into_iter().flatten() {
        let r = json_demo(&[
            "--transport",
            &amqp,
            "--store",
            &store,
            "--messages",
            "2000",
        ]);
        assert_once(&r, "effectively-once");
        assert!(
            n(row(&r, "at-least-once"), "duplicate_effects") > 0,
            "{store}"
        );
    }
}

#[test]
fn every_strategy_keeps_effectively_once_on_postgres_and_mariadb() {
    for store in [postgres_url(), mysql_url()].into_iter().flatten() {
        for strategy in [
            "dedup-table",
            "unique-key",
            "state-machine",
            "version",
            "claim",
        ] {
            // Two batches at once, for one strategy: they deadlock on the hot accounts now and
            // then, and the runtime retries the losing batch whole.
            let concurrency = if strategy == "dedup-table" { "2" } else { "1" };
            let r = json_demo(&[
                "--store",
                &store,
                "--messages",
                "1000",
                "--strategy",
                strategy,
                "--concurrency",
                concurrency,
            ]);
            assert_eq!(r["strategy"], strategy);
            assert_once(&r, "effectively-once");
        }
    }
}

/// The two-hop pipeline: receipts sent through the payments consumer's outbox and relayed
/// with crashes between confirm and mark; counted from the receipts table.
#[test]
fn two_hop_receipts_arrive_once_effectively_once_and_not_otherwise() {
    let r = json_demo(&["--messages", "3000", "--seed", "3", "--pipeline", "two-hop"]);
    let receipts = |s: &str| row(&r, s)["receipts"].clone();
    let eo = receipts("effectively-once");
    assert!(
        n(&eo, "relay_crashes") > 0 && n(&eo, "resent") > 0,
        "the relay must re-send: {eo}"
    );
    assert!(
        n(&eo, "deliveries") > n(&eo, "expected"),
        "duplicates reached the consumer: {eo}"
    );
    assert_eq!(
        (n(&eo, "lost"), n(&eo, "duplicate_effects")),
        (0, 0),
        "{eo}"
    );
    assert_eq!(
        n(&eo, "effects"),
        n(&eo, "expected"),
        "one receipt per payment: {eo}"
    );
    assert_eq!(
        n(&eo, "expected"),
        n(row(&r, "effectively-once"), "effects"),
        "a receipt is expected for each payment the ledger holds"
    );
    let alo = receipts("at-least-once");
    assert_eq!(n(&alo, "lost"), 0, "{alo}");
    assert!(n(&alo, "duplicate_effects") > 0, "{alo}");
    let amo = receipts("at-most-once");
    assert!(n(&amo, "lost") > 0, "{amo}");
    assert!(
        row(&json_demo(&["--messages", "50"]), "effectively-once")
            .get("receipts")
            .is_none(),
        "one-hop rows carry no receipts"
    );
}
