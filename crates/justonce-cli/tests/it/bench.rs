//! `justonce bench` keeps its JSON contract and checks its runs from the business data. No
//! number is asserted: performance is read from the bench's own output, never from tests.

use std::process::Command;

use serde_json::Value;

use crate::demo::{amqp_url, kafka_url, postgres_url};

fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["bench", "--json", "--messages", "1000", "--repeats", "2"])
        .args([
            "--batch",
            "1,10",
            "--concurrency",
            "1",
            "--msg-bytes",
            "200",
        ])
        .args(args)
        .output()
        .expect("the justonce binary runs");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON object")
}

fn check(r: &Value, transport: &str, store: &str) {
    assert_eq!(r["transport"], transport);
    assert_eq!(r["store"], store);
    let variants = r["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 8, "4 variants x 2 batch sizes: {r}");
    for v in variants {
        for key in [
            "msgs_per_sec",
            "p50_ms",
            "p99_ms",
            "cpu_s_per_100k",
            "rss_mb",
        ] {
            let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"));
            assert!(x > 0.0 && x.is_finite(), "{key} in {v}");
        }
        assert!(v["p99_ms"].as_f64() >= v["p50_ms"].as_f64(), "{v}");
        assert_eq!(v["runs"].as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v["ids"], "counter", "{v}");
        for key in ["name", "batch", "concurrency", "msg_bytes"] {
            assert!(v.get(key).is_some(), "missing {key} in {v}");
        }
    }
    for key in [
        "effectively_vs_at_least_batched",
        "effectively_vs_at_least_unbatched",
        "justonce_vs_bare",
    ] {
        let x = r["ratios"][key]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio {key} in {r}"));
        assert!(x > 0.0, "{key}");
    }
}

#[test]
fn bench_json_keeps_the_contract_on_sqlite() {
    check(&bench(&[]), "sqlite", "sqlite");
}

#[test]
fn bench_runs_on_rabbitmq_and_postgres_with_the_bare_lapin_baseline() {
    let (Some(amqp), Some(pg)) = (amqp_url(), postgres_url()) else {
        return;
    };
    check(
        &bench(&["--transport", &amqp, "--store", &pg]),
        "amqp",
        "postgres",
    );
}

#[test]
fn bench_runs_on_kafka_and_postgres_with_the_bare_rdkafka_baseline() {
    let (Some(kafka), Some(pg)) = (kafka_url(), postgres_url()) else {
        return;
    };
    check(
        &bench(&["--transport", &kafka, "--store", &pg]),
        "kafka",
        "postgres",
    );
}

/// `--ids counter,uuid4` runs the runtime's variants again with random message ids, paired
/// with the counter's runs; every run's ledger still holds one payment per message.
#[test]
fn bench_prices_random_message_ids_against_the_counter() {
    let r = bench(&[
        "--variants",
        "at-least-once,effectively-once",
        "--ids",
        "counter,uuid4",
    ]);
    let variants = r["variants"].as_array().expect("variants");
    let with = |ids: &str| variants.iter().filter(|v| v["ids"] == ids).count();
    // Both batch sizes with counter ids; the batched size (10) with uuid4.
    assert_eq!((with("counter"), with("uuid4")), (4, 2), "{r}");
    let costs = r["ratios"]["ids"].as_array().expect("ratios.ids");
    assert_eq!(costs.len(), 2, "{r}");
    for c in costs {
        assert_eq!(
            (&c["ids"], &c["base_ids"]),
            (&"uuid4".into(), &"counter".into())
        );
        let x = c["ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio in {c}"));
        assert!(x > 0.0 && x.is_finite(), "{c}");
    }
}

#[test]
fn bench_refuses_a_transport_it_does_not_know() {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["bench", "--transport", "sqs://eu-west-1/orders"])
        .output()
        .expect("the justonce binary runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("there is no sqs transport"), "{err}");
}

/// Two consumer processes on one PostgreSQL queue, paying into a hot set of 20 accounts:
/// every batch touches rows the other process's batches touch. Run in the order of their
/// accounts, they wait for each other and never deadlock, which the server's own count
/// shows; the ledger check of every run still holds.
#[test]
fn consumer_processes_on_a_hot_set_of_accounts_never_deadlock() {
    let Some(pg) = postgres_url() else { return };
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(["bench", "--json", "--messages", "2000", "--repeats", "1"])
        .args(["--transport", &pg, "--store", &pg])
        .args([
            "--variants",
            "at-least-once,effectively-once",
            "--batch",
            "20",
        ])
        .args(["--concurrency", "1", "--msg-bytes", "200"])
        .args(["--workers", "1,2", "--accounts", "20"])
        .output()
        .expect("the justonce binary runs");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(r["accounts"], 20);
    let variants = r["variants"].as_array().expect("variants");
    assert_eq!(variants.len(), 4, "2 variants x 1 and 2 workers: {r}");
    for v in variants {
        assert_eq!(v["deadlocks"], serde_json::json!([0]), "{v}");
        assert!(v["msgs_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    }
    let scaling = r["ratios"]["workers_scaling"].as_array().expect("scaling");
    assert_eq!(scaling.len(), 2, "{r}");
    assert!(scaling
        .iter()
        .all(|s| s["workers"] == 2 && s["ratio"].as_f64().is_some()));
}

/// `--tls-transport` and `--tls-store`: each variant runs again over verified TLS at the
/// batched size, on the same PostgreSQL server of the test's own (queue and store), paired
/// with its plaintext run (`ratios.tls`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prices_tls_against_plaintext_on_one_server() {
    use justonce_sql::harness::{OwnPostgres, ServerTls};
    if !OwnPostgres::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "PostgreSQL is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: PostgreSQL is not installed");
        return;
    }
    let pki = justonce_test::tls::Pki::new();
    let (cert, key) = pki.server();
    let pg = OwnPostgres::start(Some(&ServerTls {
        cert,
        key,
        client_ca: pki.ca(),
    }))
    .await
    .unwrap();
    let plain = pg.url("?sslmode=disable");
    let tls = pg.url(&format!(
        "?sslmode=verify-full&sslrootcert={}",
        pki.ca().display()
    ));
    let r = tokio::task::spawn_blocking(move || {
        bench(&[
            "--variants",
            "at-least-once,effectively-once",
            "--transport",
            &plain,
            "--store",
            &plain,
            "--tls-transport",
            &tls,
            "--tls-store",
            &tls,
        ])
    })
    .await
    .unwrap();
    let variants = r["variants"].as_array().expect("variants");
    let tls_runs: Vec<_> = variants.iter().filter(|v| v["tls"] == true).collect();
    assert_eq!((variants.len(), tls_runs.len()), (6, 2), "{r}");
    assert!(tls_runs.iter().all(|v| v["batch"] == 10), "{r}");
    let costs = r["ratios"]["tls"].as_array().expect("ratios.tls");
    assert_eq!(costs.len(), 2, "{r}");
    for c in costs {
        let x = c["ratio"]
            .as_f64()
            .unwrap_or_else(|| panic!("ratio in {c}"));
        assert!(x > 0.0 && x.is_finite(), "{c}");
    }
}
