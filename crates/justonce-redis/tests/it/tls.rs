//! Redis over TLS with an ACL user, on `redis-server`s of the test's own (`--tls-port`
//! only, certificates the test makes): a verified link with a client certificate carries a
//! stream's publish, receive and ack and a claim; another authority, no client
//! certificate, a wrong password and TLS asked of a plaintext server are refused, and no
//! error shows the password.

use std::time::Duration;

use justonce_core::{Error, Publisher, Source};
use justonce_redis::harness::OwnServer;
use justonce_redis::{RedisStream, RedisStreamOptions};
use justonce_test::tls::Pki;

const PASSWORD: &str = "pw-a93f-not-shown";

/// A TLS-only server of the test's own, its clients verified against the test's
/// authority, with the ACL user `app`; `None` when `redis-server` is missing.
async fn tls_server(pki: &Pki) -> Option<OwnServer> {
    if !OwnServer::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "redis-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: redis-server is not installed");
        return None;
    }
    let (cert, key) = pki.server();
    let ca = pki.ca();
    let password = format!(">{PASSWORD}");
    let args = [
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca.to_str().unwrap(),
        "--tls-auth-clients",
        "yes",
        "--user",
        "app",
        "on",
        &password,
        "~*",
        "&*",
        "+@all",
        "--user",
        "default",
        "off",
    ];
    Some(
        OwnServer::start_tls(&args)
            .await
            .expect("redis-server starts with TLS"),
    )
}

async fn round_trip(url: &str) -> Result<(), Error> {
    let opts = RedisStreamOptions::new(justonce_test::unique_name("jo-tls"));
    let q = RedisStream::connect(url, opts).await?;
    q.publish(
        &justonce_core::Message::new("x")
            .with_id("a")
            .map_err(|e| Error::config(e.to_string()))?,
    )
    .await?;
    let got = q.receive(1, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 1, "the message comes back");
    q.ack(&[&got[0].receipt]).await?;
    Ok(())
}

fn refused(r: Result<(), Error>) -> String {
    let e = r.expect_err("refused");
    let text = format!("{e:#} | {e:?}");
    assert!(!text.contains(PASSWORD), "the password in an error: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_link_with_a_client_certificate_and_an_acl_user_works_and_nothing_less() {
    let pki = Pki::new();
    let Some(server) = tls_server(&pki).await else {
        return;
    };
    let port = server.port();
    let (cert, key) = pki.client("app");
    let client = format!("&tls_cert={}&tls_key={}", cert.display(), key.display());
    let ca = pki.ca();
    let good = format!(
        "rediss://app:{PASSWORD}@127.0.0.1:{port}/0?tls_ca={}{client}",
        ca.display()
    );
    round_trip(&good).await.unwrap();
    // A claim store on the same link.
    justonce_redis::RedisClaimStore::connect(&good)
        .await
        .unwrap();

    let other = format!(
        "rediss://app:{PASSWORD}@127.0.0.1:{port}/0?tls_ca={}{client}",
        pki.other_ca().display()
    );
    let text = refused(round_trip(&other).await);
    assert!(text.contains("over TLS"), "{text}");

    let no_cert = format!(
        "rediss://app:{PASSWORD}@127.0.0.1:{port}/0?tls_ca={}",
        ca.display()
    );
    refused(round_trip(&no_cert).await);

    let wrong = good.replace(PASSWORD, "wrong-password-x");
    let text = refused(round_trip(&wrong).await);
    assert!(!text.contains("wrong-password-x"), "{text}");

    // The redis crate's `#insecure` would skip verification: refused before connecting.
    let text = refused(round_trip(&format!("{good}#insecure")).await);
    assert!(text.contains("verification"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_asked_of_a_plaintext_server_is_refused() {
    let Some(plain) = crate::server::own(&[]).await else {
        return;
    };
    let pki = Pki::new();
    let port = plain.port();
    for url in [
        format!("rediss://127.0.0.1:{port}"),
        format!("rediss://127.0.0.1:{port}?tls_ca={}", pki.ca().display()),
    ] {
        let text = refused(round_trip(&url).await);
        assert!(text.contains("over TLS"), "{url}: {text}");
    }
    // TLS parameters on redis:// are an error, not ignored.
    let text = refused(
        round_trip(&format!(
            "redis://127.0.0.1:{port}?tls_ca={}",
            pki.ca().display()
        ))
        .await,
    );
    assert!(text.contains("use rediss://"), "{text}");
}
