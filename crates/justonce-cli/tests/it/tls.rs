//! The demo and the lab over TLS on RabbitMQ and PostgreSQL servers of the test's own
//! (certificates the test makes): the URLs, passwords in them, given in the environment;
//! every order applied once; the same `amqps://` URL aimed at the plaintext port refused;
//! nothing printed shows a password.

use std::process::{Command, Output};

use justonce_amqp::harness::{Cluster, NodeTls};
use justonce_sql::harness::{OwnPostgres, ServerTls, PASSWORD as PG_PASSWORD};
use justonce_test::tls::Pki;
use serde_json::Value;

const MQ_PASSWORD: &str = "mq-pw-61d2-not-shown";

fn justonce(args: &[&str], transport: &str, store: &str) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(args)
        .env("JUSTONCE_TRANSPORT_URL", transport)
        .env("JUSTONCE_STORE_URL", store)
        .output()
        .expect("the justonce binary runs");
    printed(out)
}

/// What a run printed, stdout then stderr, checked for the passwords.
fn printed(out: Output) -> (Output, String) {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for secret in [MQ_PASSWORD, PG_PASSWORD] {
        assert!(!all.contains(secret), "a password was printed: {all}");
    }
    (out, all)
}

/// Runs `args` with the URLs on the command line, where they warn; as [`justonce`].
fn justonce_flags(args: &[&str], transport: &str, store: &str) -> (Output, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_justonce"))
        .args(args)
        .args(["--transport", transport, "--store", store])
        .env_remove("JUSTONCE_TRANSPORT_URL")
        .env_remove("JUSTONCE_STORE_URL")
        .output()
        .expect("the justonce binary runs");
    printed(out)
}

fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("a JSON report")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_and_the_lab_run_over_tls_with_urls_from_the_environment() {
    if !Cluster::installed() || !OwnPostgres::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "rabbitmq-server or PostgreSQL is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: rabbitmq-server or PostgreSQL is not installed");
        return;
    }
    let pki = Pki::new();
    let (cert, key) = pki.server();
    let ca = pki.ca();
    let pg = OwnPostgres::start(Some(&ServerTls {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: ca.clone(),
    }))
    .await
    .expect("postgres with TLS starts");
    let node = Cluster::start_tls(&NodeTls {
        cert,
        key,
        ca: ca.clone(),
    })
    .await
    .expect("a RabbitMQ node with TLS starts");
    node.add_user("app", MQ_PASSWORD).await.unwrap();
    let transport =
        node.amqps_url(0)
            .unwrap()
            .replacen("amqps://", &format!("amqps://app:{MQ_PASSWORD}@"), 1)
            + &format!("?cacertfile={}", ca.display());
    let store = pg.url(&format!(
        "?sslmode=verify-full&sslrootcert={}",
        ca.display()
    ));

    let (out, all) = justonce(
        &["demo", "--messages", "2000", "--json"],
        &transport,
        &store,
    );
    assert!(out.status.success(), "{all}");
    let report = last_json(&out);
    let rows = report["rows"].as_array().unwrap();
    let eo = rows
        .iter()
        .find(|r| r["semantics"] == "effectively-once")
        .unwrap();
    assert_eq!(eo["lost"], 0, "{report}");
    assert_eq!(eo["duplicate_effects"], 0, "{report}");
    assert!(
        !all.contains("warning"),
        "nothing typed on a command line: {all}"
    );

    // The same amqps:// URL aimed at the node's plaintext port: refused, not plaintext.
    let plain_port = node.addr(0).port();
    let tls_port = node.amqps_url(0).unwrap();
    let tls_port = tls_port
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .unwrap()
        .to_owned();
    let wrong = transport.replacen(&format!(":{tls_port}/"), &format!(":{plain_port}/"), 1);
    assert_ne!(wrong, transport);
    let (out, all) = justonce(&["demo", "--messages", "50"], &wrong, &store);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("over TLS"), "{all}");

    // The operator's tools, succeeding and failing, in text and JSON, with the URLs in
    // the environment and on the command line, a client certificate's key among them:
    // none prints a password or the key.
    let (client_cert, client_key) = pki.client(justonce_sql::harness::CERT_USER);
    let key_body: String = std::fs::read_to_string(&client_key)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_owned();
    let by_cert = format!(
        "postgres://{}@127.0.0.1:{}/postgres?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        justonce_sql::harness::CERT_USER,
        pg.port(),
        ca.display(),
        client_cert.display(),
        client_key.display()
    );
    let wrong_mq = transport.replace(MQ_PASSWORD, "wrong-mq-pw");
    let wrong_pg = store.replace(PG_PASSWORD, "wrong-pg-pw");
    let other_ca = store.replace(
        &ca.display().to_string(),
        &pki.other_ca().display().to_string(),
    );
    let mut tried = 0;
    for (args, t, st, ok) in [
        (
            vec!["doctor", "--queue", "orders"],
            &transport,
            &store,
            None,
        ),
        (
            vec!["doctor", "--queue", "orders", "--json"],
            &transport,
            &store,
            None,
        ),
        (
            vec!["dlq", "list", "--queue", "orders"],
            &transport,
            &store,
            None,
        ),
        (vec!["dedup", "stats"], &transport, &store, None),
        (vec!["dedup", "stats", "--json"], &transport, &by_cert, None),
        (
            vec!["doctor", "--queue", "orders"],
            &wrong_mq,
            &store,
            Some(false),
        ),
        (vec!["dedup", "stats"], &transport, &wrong_pg, Some(false)),
        (
            vec!["dedup", "stats", "--json"],
            &transport,
            &other_ca,
            Some(false),
        ),
        (
            vec!["demo", "--messages", "20"],
            &wrong_mq,
            &store,
            Some(false),
        ),
    ] {
        for (out, all) in [justonce(&args, t, st), justonce_flags(&args, t, st)] {
            assert!(
                !all.contains(&key_body),
                "the client key was printed: {all}"
            );
            if let Some(ok) = ok {
                assert_eq!(out.status.success(), ok, "{args:?}: {all}");
            }
            tried += 1;
        }
    }
    assert_eq!(tried, 18);

    let (out, all) = justonce(
        &[
            "lab",
            "--json",
            "--messages",
            "1500",
            "--workers",
            "2",
            "--faults",
            "kill,cut",
        ],
        &transport,
        &store,
    );
    let report = last_json(&out);
    assert!(out.status.success(), "{all}");
    assert_eq!(report["verdict"], "pass", "{report}");
    assert_eq!(report["lost"], 0, "{report}");
    assert_eq!(report["duplicate_effects"], 0, "{report}");
    assert!(report["faults"]["cuts"].as_u64().unwrap() >= 1, "{report}");
}

/// `doctor` reads each link: TLS and what was verified, the certificate's expiry (a
/// warning under 30 days), a certificate of another authority (a failure), and TLS
/// without verification (a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_what_each_link_verified_and_when_its_certificate_expires() {
    use justonce_nats::harness::OwnServer;
    if !OwnServer::installed() || !OwnPostgres::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "nats-server or PostgreSQL is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: nats-server or PostgreSQL is not installed");
        return;
    }
    let pki = Pki::new();
    let ca = pki.ca();
    let tls = |(cert, key): (std::path::PathBuf, std::path::PathBuf)| {
        format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}",
            cert.display(),
            key.display()
        )
    };
    let fresh = OwnServer::start_with(1 << 20, &tls(pki.server()))
        .await
        .unwrap();
    let soon = OwnServer::start_with(1 << 20, &tls(pki.server_expiring_in(10)))
        .await
        .unwrap();
    let (cert, key) = pki.server();
    let pg = OwnPostgres::start(Some(&ServerTls {
        cert,
        key,
        client_ca: ca.clone(),
    }))
    .await
    .unwrap();
    let link = |transport: String, store: String| {
        let (out, all) = justonce(&["doctor", "--json"], &transport, &store);
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("doctor --json: {e}: {all}"));
        let pick = |part: &str| {
            report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["part"] == part && c["link"] == "link")
                .unwrap_or_else(|| panic!("no {part} link check: {report}"))
                .clone()
        };
        (pick("transport"), pick("store"))
    };
    let verify_full = format!("?sslmode=verify-full&sslrootcert={}", ca.display());

    let (t, s) = link(
        format!("tls://127.0.0.1:{}?tls_ca={}", fresh.port(), ca.display()),
        pg.url(&verify_full),
    );
    assert_eq!(t["status"], "pass", "{t}");
    let detail = t["detail"].as_str().unwrap();
    assert!(
        detail.contains("the chain and the host name verified") && detail.contains("days)"),
        "{t}"
    );
    assert_eq!(s["status"], "pass", "{s}");
    assert!(s["detail"].as_str().unwrap().contains("TLS 1."), "{s}");

    let (t, s) = link(
        format!("tls://127.0.0.1:{}?tls_ca={}", soon.port(), ca.display()),
        pg.url("?sslmode=require"),
    );
    assert_eq!(t["status"], "warn", "{t}");
    assert!(t["fix"].as_str().unwrap().contains("renew"), "{t}");
    assert_eq!(s["status"], "warn", "{s}");
    assert!(
        s["detail"].as_str().unwrap().contains("not verified"),
        "{s}"
    );

    let (t, _) = link(
        format!(
            "tls://127.0.0.1:{}?tls_ca={}",
            fresh.port(),
            pki.other_ca().display()
        ),
        pg.url(&verify_full),
    );
    assert_eq!(t["status"], "fail", "{t}");
    assert!(
        t["detail"].as_str().unwrap().contains("UnknownIssuer"),
        "{t}"
    );
}

/// The demo on Kafka over TLS with a client certificate, the URL from the environment:
/// every order applied once; `doctor` says what the link verified; the same URL aimed at
/// the broker's plaintext port is refused. tansu 0.6.0 serves no TLS: a TLS terminator of
/// the test's own is in front of it (`justonce_kafka::harness::TlsFront`), and requires
/// the client's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_over_tls_runs_the_demo_and_passes_the_doctor() {
    use justonce_kafka::harness::{free_port, OwnBroker, TlsFront};
    if !OwnBroker::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "tansu is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: tansu is not installed");
        return;
    }
    let pki = Pki::new();
    let (cert, key) = pki.server();
    let (broker_port, front_port) = (free_port().unwrap(), free_port().unwrap());
    let _broker = OwnBroker::start_behind(broker_port, format!("127.0.0.1:{front_port}"))
        .await
        .expect("tansu starts");
    let ca = pki.ca();
    let _front = TlsFront::start(front_port, &cert, &key, Some(&ca), broker_port)
        .await
        .expect("the TLS front starts");
    let (client_cert, client_key) = pki.client("app");
    let key_line = std::fs::read_to_string(&client_key)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("store.db").display());
    let url = |port: u16| {
        format!(
            "kafka://127.0.0.1:{port}?ssl.ca.location={}&ssl.certificate.location={}&ssl.key.location={}",
            ca.display(),
            client_cert.display(),
            client_key.display()
        )
    };
    let run = |args: &[&str], port: u16| {
        let (out, all) = justonce(args, &url(port), &store);
        assert!(
            !all.contains(&key_line),
            "the client key was printed: {all}"
        );
        (out, all)
    };

    let (out, all) = run(
        &["demo", "--messages", "300", "--seed", "5", "--json"],
        front_port,
    );
    assert!(out.status.success(), "{all}");
    let report = last_json(&out);
    assert_eq!(report["transport"], "kafka", "{report}");
    let eo = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["semantics"] == "effectively-once")
        .unwrap();
    assert_eq!(eo["lost"], 0, "{report}");
    assert_eq!(eo["duplicate_effects"], 0, "{report}");

    let (out, all) = run(&["doctor", "--json"], front_port);
    let doctor: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("doctor --json: {e}: {all}"));
    let link = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["part"] == "transport" && c["link"] == "link")
        .unwrap_or_else(|| panic!("no transport link check: {doctor}"))
        .clone();
    assert_eq!(link["status"], "pass", "{link}");
    assert!(
        link["detail"]
            .as_str()
            .unwrap()
            .contains("the chain and the host name verified"),
        "{link}"
    );

    // The same URL at the broker's own (plaintext) port: refused, nothing sent in clear.
    let (out, all) = run(&["demo", "--messages", "10", "--json"], broker_port);
    assert!(
        !out.status.success(),
        "TLS asked of a plaintext port ran: {all}"
    );
    assert!(all.contains("cannot reach Kafka"), "{all}");
}
