//! `justonce lab` end to end: real worker processes under real faults, and a checker that
//! passes effectively-once and fails the weaker semantics. Broker and database restarts of
//! the shared services are left to the matrix in `.ci/run`, which runs alone: here other
//! tests share them (`own_servers.rs` restarts servers of its own).

use std::process::Command;

use serde_json::Value;

use crate::demo::{amqp_url, postgres_url};

/// Runs the lab with `--json`; returns its report and whether it exited 0.
fn lab(args: &[&str]) -> (Value, bool) {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["lab", "--json", "--workers", "2", "--lease-ms", "500"])
        .args(args)
        .output()
        .expect("the justonce binary runs");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON object ({e}); stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (report, out.status.success())
}

fn n(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {v}"))
}

#[test]
fn the_lab_passes_effectively_once_and_fails_the_weaker_semantics() {
    let (eo, ok) = lab(&["--messages", "3000", "--semantics", "effectively-once"]);
    for key in [
        "scenario",
        "transport",
        "store",
        "semantics",
        "seed",
        "messages",
        "workers",
        "faults",
        "deliveries",
        "redeliveries",
        "effects",
        "lost",
        "duplicate_effects",
        "dead_lettered",
        "drain_seconds",
        "msgs_per_sec",
        "verdict",
        "why",
    ] {
        assert!(eo.get(key).is_some(), "missing {key} in {eo}");
    }
    assert!(ok, "{eo}");
    assert_eq!(eo["verdict"], "pass", "{eo}");
    // Three kills are planned; the third needs a replacement worker to reach its fault
    // point before a short run drains, so only two are certain here.
    assert!(n(&eo["faults"], "kills") >= 2, "{eo}");
    assert!(n(&eo["faults"], "pauses") >= 1, "{eo}");
    assert!(n(&eo, "redeliveries") > 0, "{eo}");
    assert_eq!(n(&eo, "lost"), 0, "{eo}");
    assert_eq!(n(&eo, "duplicate_effects"), 0, "{eo}");

    let (alo, ok) = lab(&["--messages", "1500", "--semantics", "at-least-once"]);
    assert!(!ok, "the checker fails at-least-once: {alo}");
    assert_eq!(alo["verdict"], "fail");
    assert!(n(&alo, "duplicate_effects") > 0, "{alo}");
    assert_eq!(n(&alo, "lost"), 0, "{alo}");

    let (amo, ok) = lab(&["--messages", "1500", "--semantics", "at-most-once"]);
    assert!(!ok, "the checker fails at-most-once: {amo}");
    assert!(n(&amo, "lost") > 0, "{amo}");
}

#[test]
fn the_lab_on_rabbitmq_and_postgres_survives_kills_pauses_and_network_faults() {
    let (Some(amqp), Some(pg)) = (amqp_url(), postgres_url()) else {
        return;
    };
    let (r, ok) = lab(&[
        "--transport",
        &amqp,
        "--store",
        &pg,
        "--messages",
        "1500",
        "--faults",
        "kill,pause,cut,delay,blackhole",
    ]);
    assert!(ok, "{r}");
    assert_eq!(r["transport"], "amqp");
    assert_eq!(r["store"], "postgres");
    assert!(n(&r["faults"], "cuts") >= 2, "a cut and a black hole: {r}");
    assert!(n(&r, "redeliveries") > 0, "{r}");
    assert_eq!(n(&r, "lost") + n(&r, "duplicate_effects"), 0, "{r}");
}

#[test]
fn the_lab_on_a_postgres_queue_survives_cuts_and_pauses_longer_than_the_lease() {
    let Some(pg) = postgres_url() else { return };
    let (r, ok) = lab(&[
        "--transport",
        &pg,
        "--store",
        &pg,
        "--messages",
        "1500",
        "--faults",
        "kill,pause,cut",
    ]);
    assert!(ok, "{r}");
    assert_eq!(r["transport"], "postgres");
    assert_eq!(n(&r, "lost") + n(&r, "duplicate_effects"), 0, "{r}");
}

#[test]
fn the_relay_class_makes_broker_duplicates_and_no_duplicate_effect() {
    let (r, ok) = lab(&["--faults", "relay", "--messages", "1500"]);
    assert!(ok, "{r}");
    assert_eq!(r["scenario"], "relay", "{r}");
    assert!(n(&r["faults"], "relay_kills") >= 1, "{r}");
    assert_eq!(n(&r["faults"], "producer_kills"), 1, "{r}");
    // The relays' re-sends reached the consumer as first deliveries, and changed nothing.
    assert!(n(&r, "broker_duplicates") > 0, "{r}");
    assert_eq!(n(&r, "duplicate_effects"), 0, "{r}");
    assert_eq!(n(&r, "lost"), 0, "{r}");
    assert_eq!(n(&r, "outbox_left"), 0, "{r}");
}

/// `lab --worker`: the lab drives a consumer it did not start itself (here `justonce
/// worker`, run by a shell command from the URLs in its environment, as a user's binary
/// would be), kills and pauses it, and judges it only by the user's query. Effectively-once
/// passes; at-least-once fails on the orders the lab published twice and the kills.
#[test]
fn the_lab_judges_a_users_own_consumer_by_its_query() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("order.json");
    std::fs::write(
        &template,
        r#"{"order_id":"{{id}}","account":{{account}},"amount":{{amount}}}"#,
    )
    .unwrap();
    let exe = env!("CARGO_BIN_EXE_justonce");
    let run = |semantics: &str| {
        let tables = format!("jo_user_{}", semantics.replace('-', "_"));
        let worker = format!(
            "exec '{exe}' worker --transport \"$JUSTONCE_TRANSPORT_URL\" \
             --store \"$JUSTONCE_STORE_URL\" --queue {semantics} --tables {tables} \
             --semantics {semantics} --lease-ms 500 --batch-size 20"
        );
        let sql = format!("SELECT order_id, count(*) FROM {tables}_ledger GROUP BY order_id");
        let at = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
        lab(&[
            "--worker",
            &worker,
            "--transport",
            &at("queue.db"),
            "--store",
            &at("store.db"),
            "--queue",
            semantics,
            "--publish-template",
            template.to_str().unwrap(),
            "--effects-sql",
            &sql,
            "--messages",
            "1000",
            "--fault-every-ms",
            "500",
        ])
    };

    let (eo, ok) = run("effectively-once");
    assert!(ok, "{eo}");
    assert_eq!(eo["scenario"], "worker", "{eo}");
    assert!(n(&eo["faults"], "kills") >= 3, "{eo}");
    assert!(n(&eo["faults"], "pauses") >= 1, "{eo}");
    assert!(n(&eo["faults"], "duplicate_publishes") > 0, "{eo}");
    assert_eq!(n(&eo, "lost"), 0, "{eo}");
    assert_eq!(n(&eo, "duplicate_effects"), 0, "{eo}");
    assert_eq!(n(&eo, "effects"), 1000, "{eo}");

    let (alo, ok) = run("at-least-once");
    assert!(
        !ok,
        "the lab fails a consumer that applies duplicates: {alo}"
    );
    assert_eq!(alo["verdict"], "fail", "{alo}");
    assert!(
        n(&alo, "duplicate_effects") >= n(&alo["faults"], "duplicate_publishes"),
        "every re-sent order applied twice, at least: {alo}"
    );
    assert_eq!(n(&alo, "lost"), 0, "{alo}");
}

#[test]
fn lab_worker_refuses_what_it_cannot_judge() {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["lab", "--worker", "true", "--transport", "sqlite:q.db"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--store"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["lab", "--worker", "true", "--transport", "sqlite:q.db"])
        .args(["--store", "redis://127.0.0.1:6379", "--queue", "q"])
        .args(["--effects-sql", "SELECT 1, 1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SQL store"), "{err}");
}

/// The failover class: the lab's own three-node RabbitMQ cluster, the work queue's leader
/// taken down three times. At-least-once fails on it with duplicate effects (effectively-once
/// passes it in the matrix `.ci/run` runs), and the leader did move three times.
#[test]
fn on_a_failing_over_cluster_at_least_once_duplicates() {
    let Some(pg) = postgres_url() else { return };
    if !justonce_amqp::harness::Cluster::installed() {
        assert!(
            std::env::var_os("JUSTONCE_REQUIRE_SERVICES").is_none(),
            "rabbitmq-server is not installed"
        );
        eprintln!("SKIPPED: rabbitmq-server is not installed");
        return;
    }
    let (r, ok) = lab(&[
        "--transport",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
        "--store",
        &pg,
        "--faults",
        "failover",
        "--semantics",
        "at-least-once",
        "--messages",
        "1500",
    ]);
    assert!(!ok, "{r}");
    assert_eq!(r["scenario"], "failover", "{r}");
    assert!(n(&r["faults"], "failovers") >= 3, "{r}");
    assert!(n(&r, "duplicate_effects") > 0, "{r}");
    assert_eq!(n(&r, "lost"), 0, "{r}");
}
