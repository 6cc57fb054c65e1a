//! `doctor` and the lab's restart faults act on the server a URL names, never the machine's
//! default: a RabbitMQ node and a PostgreSQL cluster of the test's own, on ports of their
//! own, of the machine's versions (RabbitMQ 3.10, PostgreSQL 15) and of Debian 13's
//! (RabbitMQ 4.0, PostgreSQL 17, from `scripts/debian13.sh`'s root, run in it).

use std::process::Command;

use justonce_amqp::harness::Cluster;
use justonce_sql::harness::OwnPostgres;
use serde_json::Value;

/// The servers installed, or a loud skip (a failure with JUSTONCE_REQUIRE_SERVICES=1).
fn installed() -> bool {
    if Cluster::installed() && OwnPostgres::installed() {
        return true;
    }
    assert!(
        std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
        "rabbitmq-server or PostgreSQL is not installed and JUSTONCE_REQUIRE_SERVICES=1"
    );
    eprintln!("SKIPPED: rabbitmq-server or PostgreSQL is not installed");
    false
}

fn justonce(args: &[&str]) -> (Value, bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(args)
        .output()
        .expect("the justonce binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON object ({e}); stderr: {stderr}"));
    (v, out.status.success(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_reads_the_consumer_timeout_of_the_rabbitmq_node_the_url_names() {
    if !installed() {
        return;
    }
    // 45 s, where the machine's node has RabbitMQ's default, 30 minutes.
    let conf = "consumer_timeout = 45000";
    let mut nodes = vec![Cluster::start_configured(1, None, conf).await.unwrap()];
    if let Some(root) = justonce_test::debian13_root() {
        nodes.push(
            Cluster::start_configured(1, Some(&root), conf)
                .await
                .unwrap(),
        );
    }
    for node in &nodes {
        let version = node.version().await.unwrap();
        let url = node.url(0);
        let (v, _, _) = tokio::task::spawn_blocking(move || {
            justonce(&[
                "doctor",
                "--json",
                "--transport",
                &url,
                "--queue",
                "jo-doctor-aimed",
                "--max-batch-secs",
                "30",
            ])
        })
        .await
        .unwrap();
        let check = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["link"] == "consumer timeout")
            .unwrap_or_else(|| panic!("no consumer timeout check in {v}"));
        let detail = check["detail"].as_str().unwrap();
        assert!(
            detail.contains("consumer_timeout is 45000 ms on justonce"),
            "RabbitMQ {version}: the node's own timeout is read, not the machine node's: {check}"
        );
        assert_eq!(check["status"], "warn", "45 s < twice 30 s: {check}");
    }
}

/// When the server at `url` last started.
async fn postmaster_started(url: &str) -> String {
    use sqlx::Connection as _;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    let (t,): (String,) = sqlx::query_as("SELECT pg_postmaster_start_time()::text")
        .fetch_one(&mut c)
        .await
        .unwrap();
    let _ = c.close().await;
    t
}

/// The lab against `node` and `pg`, firing a broker and a database restart: both are
/// restarted (a connection to the node opened before is closed by it; the postmaster's
/// start time moves), and no effect is lost or doubled.
async fn the_lab_restarts(node: &Cluster, pg: &OwnPostgres, versions: &str) {
    let conn = lapin::Connection::connect(&node.url(0), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let pg_url = pg.url("");
    let before = postmaster_started(&pg_url).await;
    let (amqp, store) = (node.url(0), pg_url.clone());
    let (r, ok, stderr) = tokio::task::spawn_blocking(move || {
        justonce(&[
            "lab",
            "--json",
            "--workers",
            "2",
            "--lease-ms",
            "500",
            "--transport",
            &amqp,
            "--store",
            &store,
            "--messages",
            "600",
            "--faults",
            "broker-restart,db-restart",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "{versions}: {r}\n{stderr}");
    assert_eq!(
        r["lost"].as_u64().unwrap() + r["duplicate_effects"].as_u64().unwrap(),
        0
    );
    assert!(
        !conn.status().connected(),
        "{versions}: the node the URL names was restarted, closing every connection"
    );
    let after = postmaster_started(&pg_url).await;
    assert_ne!(
        before, after,
        "{versions}: the cluster the URL names was restarted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_restarts_the_rabbitmq_node_and_the_postgres_cluster_its_urls_name() {
    if !installed() {
        return;
    }
    let (node, pg) = tokio::join!(Cluster::start(1), OwnPostgres::start(None));
    let (node, pg) = (node.unwrap(), pg.unwrap());
    the_lab_restarts(&node, &pg, "RabbitMQ 3.10, PostgreSQL 15").await;
    drop((node, pg));
    if let Some(root) = justonce_test::debian13_root() {
        let (node, pg) = tokio::join!(Cluster::start_in(&root, 1), OwnPostgres::start_in(&root));
        let (node, pg) = (node.unwrap(), pg.unwrap());
        the_lab_restarts(&node, &pg, "RabbitMQ 4.0, PostgreSQL 17").await;
    }
}

/// The demo's contract on Debian 13's servers, each of the test's own, run in the root:
/// RabbitMQ 4.0 (every deprecated feature denied) with PostgreSQL 17, NATS 2.10 with
/// MariaDB 11.8, and Valkey 8.1 as the transport and the store. Effectively-once loses and
/// doubles nothing, at-least-once doubles, counted from the business tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_keeps_its_contract_on_debian_13_s_servers() {
    use crate::demo::{json_demo, n, row};
    use justonce_sql::harness::OwnMariaDb;
    let Some(root) = justonce_test::debian13_root() else {
        return;
    };
    let (rabbit, pg, nats, maria, valkey) = tokio::join!(
        Cluster::start_in(&root, 1),
        OwnPostgres::start_in(&root),
        justonce_nats::harness::OwnServer::start_in(&root, 1 << 20),
        OwnMariaDb::start_in(&root),
        justonce_redis::harness::OwnServer::start_in(&root, "valkey-server", &[]),
    );
    let (rabbit, pg, nats, maria, valkey) = (
        rabbit.unwrap(),
        pg.unwrap(),
        nats.unwrap(),
        maria.unwrap(),
        valkey.unwrap(),
    );
    let runs = [
        ("RabbitMQ 4.0 + PostgreSQL 17", rabbit.url(0), pg.url("")),
        ("NATS 2.10 + MariaDB 11.8", nats.url(), maria.url("")),
        ("Valkey 8.1", valkey.url(), valkey.url()),
    ];
    for (what, transport, store) in runs {
        let r = tokio::task::spawn_blocking(move || {
            json_demo(&[
                "--transport",
                &transport,
                "--store",
                &store,
                "--messages",
                "1000",
                "--seed",
                "5",
            ])
        })
        .await
        .unwrap();
        let eo = row(&r, "effectively-once");
        assert_eq!(n(eo, "lost"), 0, "{what}: {eo}");
        assert_eq!(n(eo, "duplicate_effects"), 0, "{what}: {eo}");
        assert!(n(eo, "deliveries") > n(eo, "sent"), "{what}: {eo}");
        let alo = row(&r, "at-least-once");
        assert_eq!(n(alo, "lost"), 0, "{what}: {alo}");
        assert!(n(alo, "duplicate_effects") > 0, "{what}: {alo}");
    }
}
