//! Kafka over TLS and SASL. tansu 0.6.0 serves no TLS (it refuses `--cert` with `--key`,
//! and never uses the acceptor it builds), so each test puts a TLS terminator of its own ([`TlsFront`]) in front of a tansu of
//! its own that advertises the front's address: librdkafka's TLS (OpenSSL, the feature
//! `tls`) is real, the broker behind it is plaintext. tansu's SASL is its own: SCRAM users
//! made by `tansu user create`; it offers no PLAIN (its rsasl is built without it).

use super::*;
use justonce_kafka::harness::{free_port, Scram, TlsFront};
use justonce_kafka::{KafkaSasl, KafkaTls, SaslMechanism};
use justonce_test::tls::Pki;

const PASSWORD: &str = "kafka-s3cret-pw";

/// A tansu of the test's own behind a TLS front; `users` SCRAM users, SASL required
/// when there are any. The front requires a client certificate when `client_ca`.
async fn behind_tls(
    pki: &Pki,
    server: (std::path::PathBuf, std::path::PathBuf),
    client_ca: bool,
    users: &[(&str, &str, Scram)],
) -> Option<(OwnBroker, TlsFront)> {
    if !tansu() {
        return None;
    }
    let (broker_port, front_port) = (free_port().unwrap(), free_port().unwrap());
    let advertised = format!("127.0.0.1:{front_port}");
    let broker = if users.is_empty() {
        OwnBroker::start_behind(broker_port, advertised).await
    } else {
        OwnBroker::start_with(broker_port, advertised, users).await
    }
    .expect("tansu starts");
    let ca = pki.ca();
    let front = TlsFront::start(
        front_port,
        &server.0,
        &server.1,
        client_ca.then_some(ca.as_path()),
        broker_port,
    )
    .await
    .expect("the TLS front starts");
    Some((broker, front))
}

fn quick(o: KafkaOptions) -> KafkaOptions {
    o.request_timeout(Duration::from_secs(6)).partitions(1)
}

/// Publishes, consumes and acks through `o`; a second member of the group finds the
/// records acked.
async fn round_trip(o: KafkaOptions) {
    let q = KafkaSource::connect(o.clone())
        .await
        .expect("connects over TLS");
    let sent: Vec<Message> = (0..3).map(|i| msg(&format!("T-{i}"))).collect();
    q.publish_batch(&sent).await.unwrap();
    let got = receive_n(&q, 3, Duration::from_secs(20)).await;
    assert_eq!(ids(&got), vec!["T-0", "T-1", "T-2"]);
    let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
    q.ack(&receipts).await.unwrap();
    q.close().await;
    let again = KafkaSource::connect(o).await.unwrap();
    let more = receive_n(&again, 1, Duration::from_secs(3)).await;
    assert!(
        more.is_empty(),
        "acked records are not read again: {:?}",
        ids(&more)
    );
}

fn url_opts(url: &str, test: &str) -> KafkaOptions {
    let n = name(test);
    quick(
        KafkaOptions::from_url(url, n.clone())
            .unwrap()
            .group(format!("{n}-g")),
    )
}

/// The error of a connect that must fail (within 3 s), checked for the secrets.
async fn refused(o: KafkaOptions, secrets: &[&str]) -> justonce_core::Error {
    let o = o.request_timeout(Duration::from_secs(3));
    let e = match KafkaPublisher::connect(o).await {
        Ok(_) => panic!("the connect was taken"),
        Err(e) => e,
    };
    let text = format!("{e} {e:?} {:?}", std::error::Error::source(&e));
    for s in secrets {
        assert!(!text.contains(s), "the error carries a secret: {text}");
    }
    e
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_publishes_consumes_and_acks() {
    let pki = Pki::new();
    let Some((_broker, front)) = behind_tls(&pki, pki.server(), false, &[]).await else {
        return;
    };
    let url = format!(
        "kafka://127.0.0.1:{}?ssl.ca.location={}",
        front.port(),
        pki.ca().display()
    );
    let o = url_opts(&url, "tls");
    assert_eq!(o.security_protocol(), "ssl");
    round_trip(o).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_authority_is_refused() {
    let pki = Pki::new();
    let Some((_broker, front)) = behind_tls(&pki, pki.other_server(), false, &[]).await else {
        return;
    };
    let o = quick(
        opts(&format!("127.0.0.1:{}", front.port()), "other-ca").tls(KafkaTls::new().ca(pki.ca())),
    );
    let e = refused(o, &[]).await;
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_asked_of_a_plaintext_port_is_refused() {
    let Some(broker) = own().await else {
        return;
    };
    let pki = Pki::new();
    let o = quick(opts(&broker.brokers(), "plain-port").tls(KafkaTls::new().ca(pki.ca())));
    let e = refused(o, &[]).await;
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    let text = e.to_string();
    assert!(text.contains("cannot reach Kafka"), "{e}");
    assert!(
        text.contains("TLS") || text.contains("SSL"),
        "says TLS: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_over_tls_reaches_the_broker_and_every_refusal_is_clear() {
    let pki = Pki::new();
    let users = [
        ("app256", PASSWORD, Scram::Sha256),
        ("app512", PASSWORD, Scram::Sha512),
    ];
    let Some((_broker, front)) = behind_tls(&pki, pki.server(), false, &users).await else {
        return;
    };
    let at = format!("127.0.0.1:{}", front.port());
    let ca = pki.ca();
    let by_url = url_opts(
        &format!(
            "kafka://app512:{PASSWORD}@{at}?ssl.ca.location={}",
            ca.display()
        ),
        "scram512",
    );
    assert_eq!(by_url.security_protocol(), "sasl_ssl");
    assert!(!format!("{by_url:?}").contains(PASSWORD));
    let by_options = quick(opts(&at, "scram256").tls(KafkaTls::new().ca(&ca)).sasl(
        KafkaSasl::new(SaslMechanism::ScramSha256, "app256", PASSWORD),
    ));
    // librdkafka before 2.6.1 repeated the client nonce in its final SCRAM message
    // (librdkafka #4895), which an RFC 5802 server (tansu's) refuses as `invalid-proof`.
    for o in [by_url, by_options] {
        round_trip(o).await;
    }
    // A wrong password, and a user the broker does not know.
    for (user, pw) in [("app256", "not-the-password"), ("nobody", PASSWORD)] {
        let o = quick(
            opts(&at, "scram-wrong")
                .tls(KafkaTls::new().ca(&ca))
                .sasl(KafkaSasl::new(SaslMechanism::ScramSha256, user, pw)),
        );
        let e = refused(o, &[PASSWORD, "not-the-password"]).await;
        let text = e.to_string();
        assert!(
            text.contains("SASL authentication error") && text.contains("check the user name"),
            "{user}: {e}"
        );
    }
    // No credentials: a broker that requires SASL answers nothing else.
    let o = quick(opts(&at, "scram-none").tls(KafkaTls::new().ca(&ca)));
    let e = refused(o, &[]).await;
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_front_that_asks_for_a_client_certificate_takes_ours_and_refuses_none() {
    let pki = Pki::new();
    let Some((_broker, front)) = behind_tls(&pki, pki.server(), true, &[]).await else {
        return;
    };
    let at = format!("127.0.0.1:{}", front.port());
    let (cert, key) = pki.client("app");
    let key_pem = std::fs::read_to_string(&key).unwrap();
    let with = quick(opts(&at, "mtls").tls(KafkaTls::new().ca(pki.ca()).client_cert(cert, &key)));
    round_trip(with).await;
    let without = quick(opts(&at, "mtls-none").tls(KafkaTls::new().ca(pki.ca())));
    let body = key_pem.lines().nth(1).unwrap_or_default().to_owned();
    let e = refused(without, &[body.as_str()]).await;
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
}
