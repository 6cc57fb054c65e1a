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

/// Two transactions that lock rows 1 and 2 in opposite orders: the server aborts one.
macro_rules! deadlock {
    ($pool:expr, $table:expr, $p:literal) => {{
        let pool = $pool;
        let t = $table;
        for sql in [
            format!("CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)"),
            format!("INSERT INTO {t} VALUES (1, 0), (2, 0)"),
        ] {
            sqlx::query(&sql).execute(pool).await.unwrap();
        }
        let update = format!("UPDATE {t} SET v = v + 1 WHERE id = {}", $p);
        let mut a = pool.begin().await.unwrap();
        let mut b = pool.begin().await.unwrap();
        sqlx::query(&update).bind(1).execute(&mut *a).await.unwrap();
        sqlx::query(&update).bind(2).execute(&mut *b).await.unwrap();
        let (ra, rb) = tokio::join!(
            sqlx::query(&update).bind(2).execute(&mut *a),
            sqlx::query(&update).bind(1).execute(&mut *b)
        );
        assert!(ra.is_err() != rb.is_err(), "one of the two is the victim");
        drop((a, b));
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(pool)
            .await
            .unwrap();
    }};
}

/// The store's own deadlock count: on a database of its own, PostgreSQL's count is 0 and the
/// check passes; after a deadlock there it warns, naming `lock_key`. MariaDB's count is the
/// server's: after a deadlock it warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reads_the_store_s_deadlock_count_and_names_lock_key() {
    let (Some(pg), Some(my)) = (crate::demo::postgres_url(), crate::demo::mysql_url()) else {
        return;
    };
    let conflicts = |v: &Value| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["link"] == "lock conflicts")
            .cloned()
            .unwrap_or_else(|| panic!("no lock conflicts check: {v}"))
    };
    let db = format!("jo_doctor_{:08x}", fastrand::u32(..));
    let admin = sqlx::PgPool::connect(&pg).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .unwrap();
    let (base, query) = pg.split_once('?').unwrap_or((&pg, ""));
    let url = format!("{}/{db}?{query}", base.rsplit_once('/').unwrap().0);
    drop(justonce::sql::PgStore::open(&url).await.unwrap());
    let (quiet, _) = doctor(&["--transport", &pg, "--store", &url]);
    {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        deadlock!(&pool, "jo_hot", "$1");
        pool.close().await;
    }
    // The statistics reach other sessions within a second or so.
    let mut after = Value::Null;
    for _ in 0..30 {
        after = conflicts(&doctor(&["--transport", &pg, "--store", &url]).0);
        if after["status"] == "warn" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    sqlx::query(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .execute(&admin)
        .await
        .unwrap();
    assert_eq!(status(&quiet, "lock conflicts", "no deadlock"), "pass");
    assert_eq!(after["status"], "warn", "{after}");
    assert!(
        after["detail"]
            .as_str()
            .unwrap()
            .contains("counted 1 deadlock "),
        "{after}"
    );
    assert!(
        after["fix"]
            .as_str()
            .unwrap()
            .contains("implement Handler::lock_key"),
        "{after}"
    );

    justonce::sql::MySqlStore::open(&my).await.unwrap();
    let pool = sqlx::MySqlPool::connect(&my).await.unwrap();
    deadlock!(&pool, format!("jo_hot_{:08x}", fastrand::u32(..)), "?");
    let (v, _) = doctor(&["--transport", &pg, "--store", &my]);
    assert_eq!(
        status(&v, "lock conflicts", "since the server started"),
        "warn"
    );
}
