//! `justonce doctor` against the real services: it passes the topology justonce declares,
//! and flags a classic queue that is not durable, dead letters with nowhere to go, a
//! retention shorter than the redelivery horizon, a missing dedup table and an unreachable
//! broker, exiting 1 on a fail.

use std::process::{Command, Output};

use justonce::amqp::{AmqpOptions, AmqpPublisher, QueueType};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use serde_json::Value;

use crate::demo::amqp_url;

fn doctor(args: &[&str]) -> (Value, Output) {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["doctor", "--json"])
        .args(args)
        .output()
        .expect("the justonce binary runs");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (v, out)
}

/// The status of the first check of `link` whose detail contains `says`.
fn status<'a>(v: &'a Value, link: &str, says: &str) -> &'a str {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["link"] == link && c["detail"].as_str().unwrap().contains(says))
        .and_then(|c| c["status"].as_str())
        .unwrap_or_else(|| panic!("no {link} check saying {says:?} in {v}"))
}

fn statuses(v: &Value) -> Vec<(String, String)> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["link"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_justonce_s_topology_and_flags_what_breaks_the_chain() {
    let Some(url) = amqp_url() else { return };
    let run = format!("{:08x}", fastrand::u32(..));
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    justonce::sql::SqliteStore::open(&store).await.unwrap();

    // What justonce declares (a quorum queue, the CLI's default) passes, whole.
    let good = format!("doctor-good-{run}");
    let p = AmqpPublisher::connect(&url, AmqpOptions::new(&good).queue_type(QueueType::Quorum))
        .await
        .unwrap();
    let (v, out) = doctor(&[
        "--transport",
        &url,
        "--queue",
        &good,
        "--store",
        &store,
        "--retention-secs",
        "86400",
    ]);
    p.delete_topology().await.unwrap();
    assert!(out.status.success(), "{v}");
    assert_eq!(v["ok"], true, "{v}");
    let all = statuses(&v);
    assert!(all.iter().all(|(_, s)| s == "pass"), "{all:?}");
    for link in [
        "work queue",
        "dead letters",
        "publisher confirms",
        "dedup table",
        "store clock",
        "dedup retention",
        "consumer timeout",
    ] {
        assert!(
            all.iter().any(|(l, _)| l == link),
            "{link} is checked: {all:?}"
        );
    }

    // A classic queue that is not durable, and no dead-letter exchange or queue.
    let bare = format!("doctor-bare-{run}");
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        bare.as_str().into(),
        QueueDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let (v, out) = doctor(&[
        "--transport",
        &url,
        "--queue",
        &bare,
        "--queue-type",
        "classic",
        "--retention-secs",
        "60",
    ]);
    ch.queue_delete(bare.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = conn.close(200, "done".into()).await;
    assert_eq!(out.status.code(), Some(1), "a fail exits 1: {v}");
    assert_eq!(v["ok"], false);
    assert_eq!(status(&v, "work queue", "is not durable"), "fail", "{v}");
    assert_eq!(
        status(&v, "dead letters", ".dlx does not exist"),
        "fail",
        "{v}"
    );
    assert_eq!(
        status(&v, "dead letters", ".dead does not exist"),
        "fail",
        "{v}"
    );
    assert_eq!(
        status(&v, "publish exchange", "does not exist"),
        "fail",
        "{v}"
    );
    assert_eq!(
        status(
            &v,
            "dedup retention",
            "not longer than the redelivery horizon"
        ),
        "fail",
        "{v}"
    );

    // A store without the dedup table, and a broker that is not there.
    let empty = format!("sqlite:{}", dir.path().join("empty.db").display());
    sqlx::SqlitePool::connect(&format!("{empty}?mode=rwc"))
        .await
        .unwrap()
        .close()
        .await;
    let (v, out) = doctor(&[
        "--transport",
        "amqp://guest:guest@127.0.0.1:1/%2f",
        "--store",
        &empty,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(status(&v, "reachable", "cannot connect"), "fail", "{v}");
    assert_eq!(status(&v, "dedup table", "jo_dedup"), "fail", "{v}");
}

#[tokio::test]
async fn doctor_checks_the_sqlite_queue_and_names_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let q = justonce::sql::SqliteQueue::open(&url, "orders")
        .await
        .unwrap();
    drop(q);
    let (v, out) = doctor(&["--transport", &url, "--queue", "orders"]);
    assert!(out.status.success(), "{v}");
    assert_eq!(status(&v, "queue", "orders exists"), "pass");
    assert_eq!(status(&v, "durable queue", "WAL"), "pass");
    let (v, out) = doctor(&["--transport", &url, "--queue", "ordres"]);
    assert_eq!(out.status.code(), Some(1), "{v}");
    assert_eq!(
        status(&v, "queue", "orders"),
        "fail",
        "the error names what exists: {v}"
    );
}

#[tokio::test]
async fn doctor_checks_the_postgres_queue_and_a_mariadb_store() {
    let (Some(pg), Some(my)) = (crate::demo::postgres_url(), crate::demo::mysql_url()) else {
        return;
    };
    let queue = format!("doctor-pg-{:08x}", fastrand::u32(..));
    let q = justonce::sql::PgQueue::open(&pg, &queue).await.unwrap();
    justonce::sql::MySqlStore::open(&my).await.unwrap();
    let (v, out) = doctor(&[
        "--transport",
        &pg,
        "--queue",
        &queue,
        "--store",
        &my,
        "--retention-secs",
        "86400",
    ]);
    justonce::Inspect::cleanup(&q).await.unwrap();
    assert!(out.status.success(), "{v}");
    assert_eq!(status(&v, "queue", "exists"), "pass");
    assert_eq!(status(&v, "durable queue", "fsync is on"), "pass");
    assert_eq!(status(&v, "dedup table", "jo_dedup exists"), "pass");
    assert_eq!(status(&v, "store clock", "within"), "pass");
}
