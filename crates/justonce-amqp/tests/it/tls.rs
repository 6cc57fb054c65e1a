//! RabbitMQ over TLS, on a node of the test's own (`harness::Cluster::start_tls`: a TLS
//! listener with certificates the test makes, and the `rabbitmq_auth_mechanism_ssl`
//! plugin): a verified `amqps://` link carries a publish, a receive and an ack, by password
//! and by client certificate (`EXTERNAL`); another authority, a wrong password, and a
//! certificate login without a certificate are refused; no error shows the password.

use std::time::Duration;

use justonce_amqp::harness::{Cluster, NodeTls};
use justonce_amqp::{AmqpSource, AmqpTls};
use justonce_core::{Error, Publisher, Source};
use justonce_test::tls::Pki;

use crate::{msg, options};

const PASSWORD: &str = "pw-4be1-not-shown";

async fn round_trip(url: &str, test: &str) -> Result<(), Error> {
    let mut o = options(test);
    o.retry_delays = Vec::new();
    let q = AmqpSource::connect(url, o).await?;
    q.publish(&msg("t-1")).await?;
    let got = q.receive(1, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 1, "the message comes back");
    q.ack(&[&got[0].receipt]).await?;
    q.delete_topology().await?;
    Ok(())
}

fn refused(r: Result<(), Error>) -> String {
    let e = r.expect_err("refused");
    let text = format!("{e:#} | {e:?}");
    assert!(!text.contains(PASSWORD), "the password in an error: {text}");
    assert!(text.contains("over TLS"), "{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_is_verified_and_logs_in_by_password_or_by_certificate() {
    if !Cluster::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "rabbitmq-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: rabbitmq-server is not installed");
        return;
    }
    let pki = Pki::new();
    let (cert, key) = pki.server();
    let node = Cluster::start_tls(&NodeTls {
        cert,
        key,
        ca: pki.ca(),
    })
    .await
    .expect("a RabbitMQ node with TLS starts");
    node.add_user("app", PASSWORD).await.unwrap();
    let base = node.amqps_url(0).unwrap();
    let ca = pki.ca();
    let (client_cert, client_key) = pki.client("app");

    // By password, the broker verified against the test's authority.
    let by_password = base.replacen("amqps://", &format!("amqps://app:{PASSWORD}@"), 1);
    round_trip(
        &format!("{by_password}?cacertfile={}", ca.display()),
        "tls-pw",
    )
    .await
    .unwrap();
    // The same through the options type.
    let mut o = options("tls-opts");
    o.tls = {
        let mut t = AmqpTls::default();
        t.cacertfile = Some(ca.clone());
        t
    };
    let q = AmqpSource::connect(&by_password, o).await.unwrap();
    q.delete_topology().await.unwrap();

    // By certificate: EXTERNAL, no password.
    let by_cert = format!(
        "{base}?auth_mechanism=external&cacertfile={}&certfile={}&keyfile={}",
        ca.display(),
        client_cert.display(),
        client_key.display()
    );
    round_trip(&by_cert, "tls-cert").await.unwrap();

    // Refused: the broker's certificate of another authority, a wrong password, and a
    // certificate login without a certificate.
    let text = refused(
        round_trip(
            &format!("{by_password}?cacertfile={}", pki.other_ca().display()),
            "tls-other",
        )
        .await,
    );
    assert!(text.contains("UnknownIssuer"), "{text}");
    refused(
        round_trip(
            &format!(
                "{}?cacertfile={}",
                by_password.replace(PASSWORD, "wrong-pw"),
                ca.display()
            ),
            "tls-wrong",
        )
        .await,
    );
    refused(
        round_trip(
            &format!("{base}?auth_mechanism=external&cacertfile={}", ca.display()),
            "tls-nocert",
        )
        .await,
    );
    // Verification cannot be turned off; TLS files on amqp:// are an error.
    let e = justonce_amqp::connect(
        &format!("{by_password}?verify=verify_none"),
        &AmqpTls::default(),
    )
    .await
    .expect_err("verify_none is refused");
    assert!(e.to_string().contains("verification"), "{e}");
    let plain = node.url(0);
    let e = justonce_amqp::connect(
        &format!("{plain}?cacertfile={}", ca.display()),
        &AmqpTls::default(),
    )
    .await
    .expect_err("TLS files on amqp:// are refused");
    assert!(e.to_string().contains("use amqps://"), "{e}");
}
