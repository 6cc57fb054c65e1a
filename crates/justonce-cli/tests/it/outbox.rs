//! `justonce outbox`: status of a real outbox, the relay process draining it into a queue,
//! dead rows revived and discarded, and a missing table as a clear error.

use std::process::{Command, Output};

use justonce::sql::{SqliteQueue, SqliteStore};
use justonce::{Message, OutboxStore, Source, Store};
use serde_json::Value;

fn justonce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(args)
        .output()
        .expect("the justonce binary runs")
}

fn status(store: &str) -> Value {
    let out = justonce(&["outbox", "status", "--store", store, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_backlog_and_the_relay_process_drains_it_into_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite:{}", dir.path().join("app.db").display());
    let queue_url = format!("sqlite:{}", dir.path().join("q.db").display());
    let store = SqliteStore::open(&store_url).await.unwrap();
    let outbox = store.outbox().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    for i in 0..3 {
        let m = Message::new("{}").with_id(format!("r-{i}")).unwrap();
        outbox.enqueue(&mut tx, &m, Some("acct")).await.unwrap();
    }
    store.commit(tx).await.unwrap();

    let v = status(&store_url);
    assert_eq!(
        (v["pending"].as_u64(), v["dead"].as_u64()),
        (Some(3), Some(0)),
        "{v}"
    );
    assert!(v["oldest_pending_age_secs"].as_f64().is_some(), "{v}");

    let out = justonce(&[
        "outbox",
        "relay",
        "--store",
        &store_url,
        "--transport",
        &queue_url,
        "--queue",
        "receipts",
        "--exit-when-drained",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(status(&store_url)["pending"].as_u64(), Some(0));
    let queue = SqliteQueue::open(&queue_url, "receipts").await.unwrap();
    let got = queue.receive(10, std::time::Duration::ZERO).await.unwrap();
    let ids: Vec<&str> = got
        .iter()
        .map(|d| d.message.id().unwrap().as_str())
        .collect();
    assert_eq!(
        ids,
        ["r-0", "r-1", "r-2"],
        "in order, from the business data's outbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_rows_are_listed_with_reasons_then_revived_or_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let store_url = format!("sqlite:{}", dir.path().join("app.db").display());
    let store = SqliteStore::open(&store_url).await.unwrap();
    let outbox = store.outbox().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    for i in 0..2 {
        let m = Message::new("{}").with_id(format!("r-{i}")).unwrap();
        outbox.enqueue(&mut tx, &m, None).await.unwrap();
    }
    store.commit(tx).await.unwrap();
    let rows = outbox
        .take("test", 10, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    for r in &rows {
        let zero = std::time::Duration::ZERO;
        outbox
            .mark_failed(r.seq, "NO_ROUTE: unroutable", zero, 1)
            .await
            .unwrap();
    }
    let v = status(&store_url);
    assert_eq!(v["dead"].as_u64(), Some(2), "{v}");
    assert_eq!(v["dead_rows"][0]["reason"], "NO_ROUTE: unroutable", "{v}");
    let text = justonce(&["outbox", "status", "--store", &store_url]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("dead 2") && text.contains("NO_ROUTE"),
        "{text}"
    );

    let seq = rows[0].seq.to_string();
    let out = justonce(&["outbox", "revive", "--store", &store_url, "--seq", &seq]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("revived 1"));
    let out = justonce(&["outbox", "discard", "--store", &store_url, "--all"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("discarded 1"));
    let v = status(&store_url);
    assert_eq!(
        (v["pending"].as_u64(), v["dead"].as_u64()),
        (Some(1), Some(0)),
        "{v}"
    );
}

#[test]
fn a_store_without_an_outbox_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("sqlite:{}", dir.path().join("nothing.db").display());
    let out = justonce(&["outbox", "status", "--store", &missing]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist"), "{err}");
}

#[test]
fn outbox_bench_measures_both_sides_and_the_soak_leaves_the_table_empty() {
    let out = justonce(&[
        "outbox",
        "bench",
        "--messages",
        "300",
        "--rounds",
        "2",
        "--latency-samples",
        "3",
        "--soak",
        "500",
        "--ceiling",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["direct"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["relay"].as_array().unwrap().len(), 2, "{v}");
    assert!(v["ratio_median"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["ceiling"]["rounds"].as_array().unwrap().len(), 2, "{v}");
    assert!(v["ceiling"]["ratio_median"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["latency_outbox_p50_ms"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["soak"]["messages"], 500, "{v}");
    assert_eq!(v["soak"]["rows_left"], 0, "every soaked message sent: {v}");
}

/// A PostgreSQL outbox relayed into a PostgreSQL queue of its own database moves its rows
/// (one transaction a batch) unless told to publish; both drain the same messages.
#[test]
fn outbox_bench_moves_into_a_postgres_queue_of_its_database_unless_told_to_publish() {
    let Some(url) = crate::demo::postgres_url() else {
        return;
    };
    for (extra, mode) in [(None, "move"), (Some("--publish"), "publish")] {
        let mut args = vec![
            "outbox",
            "bench",
            "--store",
            &url,
            "--transport",
            &url,
            "--messages",
            "300",
            "--rounds",
            "1",
            "--latency-samples",
            "3",
            "--json",
        ];
        args.extend(extra);
        let out = justonce(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["relay_mode"], mode, "{v}");
        assert!(v["relay"][0].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["latency_outbox_p50_ms"].as_f64().unwrap() > 0.0, "{v}");
    }
}
