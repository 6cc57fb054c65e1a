//! NATS with logins and TLS, on `nats-server`s of the test's own (a configuration with
//! users, a token, an nkey, or TLS with certificates the test makes): each way of logging
//! in carries a publish, a receive and an ack; a wrong or missing credential, a server
//! certificate of another authority, TLS asked of a plaintext server and a missing client
//! certificate are refused; no error shows a password, a token or a seed.

use std::path::Path;
use std::time::Duration;

use justonce_core::{Error, Publisher, Source};
use justonce_nats::harness::OwnServer;
use justonce_nats::NatsStream;
use justonce_test::tls::Pki;

use crate::{msg, opts};

const PASSWORD: &str = "pw-2e8d-not-shown";
const TOKEN: &str = "tok-71b0-not-shown";

/// A server of the test's own with `extra` in its configuration; `None` when
/// `nats-server` is missing and services are not required.
async fn server(extra: &str) -> Option<OwnServer> {
    if !OwnServer::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "nats-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: nats-server is not installed");
        return None;
    }
    Some(
        OwnServer::start_with(1 << 20, extra)
            .await
            .expect("nats-server starts"),
    )
}

/// Connects (JetStream may take a moment on a server that just started), publishes one
/// message, receives and acks it.
async fn round_trip(url: &str, test: &str) -> Result<(), Error> {
    let mut tries = 0;
    let q = loop {
        match NatsStream::connect(url, opts(test, 2_000)).await {
            Ok(q) => break q,
            Err(e) if tries < 20 && e.to_string().contains("JetStream") => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    };
    q.publish(&msg("a")).await?;
    let got = q.receive(1, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 1, "the message comes back");
    q.ack(&[&got[0].receipt]).await?;
    Ok(())
}

/// The error's every word, `Display` and `Debug`, with none of `secrets` in it.
fn refused(r: Result<(), Error>, secrets: &[&str]) -> String {
    let e = r.expect_err("refused");
    let text = format!("{e:#} | {e:?}");
    for s in secrets {
        assert!(!text.contains(s), "a secret in the error: {text}");
    }
    assert!(text.contains("cannot connect to NATS"), "{text}");
    text
}

fn nkey_seed_file(dir: &Path) -> (std::path::PathBuf, String, String) {
    let pair = nkeys::KeyPair::new_user();
    let seed = pair.seed().unwrap();
    let path = dir.join("user.nk");
    std::fs::write(&path, format!("{seed}\n")).unwrap();
    (path, pair.public_key(), seed)
}

/// Users with passwords and an nkey user on one server; a token on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_of_logging_in_works_and_a_wrong_one_is_refused_unshown() {
    let dir = tempfile::tempdir().unwrap();
    let (nkey_file, public, seed) = nkey_seed_file(dir.path());
    let Some(users) = server(&format!(
        "authorization {{\n  users = [\n    {{user: app, password: \"{PASSWORD}\"}}\n    \
         {{nkey: {public}}}\n  ]\n}}"
    ))
    .await
    else {
        return;
    };
    let port = users.port();
    round_trip(
        &format!("nats://app:{PASSWORD}@127.0.0.1:{port}"),
        "auth-user",
    )
    .await
    .unwrap();
    round_trip(
        &format!("nats://127.0.0.1:{port}?nkey_file={}", nkey_file.display()),
        "auth-nkey",
    )
    .await
    .unwrap();
    let text = refused(
        round_trip(
            &format!("nats://app:wrong-{PASSWORD}@127.0.0.1:{port}"),
            "auth-bad",
        )
        .await,
        &[PASSWORD],
    );
    assert!(text.to_lowercase().contains("authorization"), "{text}");
    refused(
        round_trip(&format!("nats://127.0.0.1:{port}"), "auth-none").await,
        &[PASSWORD, &seed],
    );
    // An nkey the server does not know.
    let stranger_dir = tempfile::tempdir().unwrap();
    let (stranger, _, stranger_seed) = nkey_seed_file(stranger_dir.path());
    refused(
        round_trip(
            &format!("nats://127.0.0.1:{port}?nkey_file={}", stranger.display()),
            "auth-stranger",
        )
        .await,
        &[PASSWORD, &seed, &stranger_seed],
    );

    let Some(token) = server(&format!("authorization {{\n  token: \"{TOKEN}\"\n}}")).await else {
        return;
    };
    let port = token.port();
    round_trip(&format!("nats://{TOKEN}@127.0.0.1:{port}"), "auth-token")
        .await
        .unwrap();
    refused(
        round_trip(
            &format!("nats://not-{TOKEN}@127.0.0.1:{port}"),
            "auth-token-bad",
        )
        .await,
        &[TOKEN],
    );
}

fn tls_block(cert: &Path, key: &Path, ca: &Path, verify: bool) -> String {
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify}\n  \
         timeout: 2\n}}",
        cert.display(),
        key.display(),
        ca.display()
    )
}

/// `tls://` with the test's authority and a client certificate: a round trip; without
/// the certificate, or trusting another authority, or asking TLS of a plaintext server:
/// refused, and the error says TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_both_ways_and_never_dropped() {
    let pki = Pki::new();
    let (cert, key) = pki.server();
    let Some(tls) = server(&tls_block(&cert, &key, &pki.ca(), true)).await else {
        return;
    };
    let port = tls.port();
    let (client_cert, client_key) = pki.client("app");
    let client = format!(
        "&tls_cert={}&tls_key={}",
        client_cert.display(),
        client_key.display()
    );
    let ca = pki.ca();
    round_trip(
        &format!("tls://127.0.0.1:{port}?tls_ca={}{client}", ca.display()),
        "tls-ok",
    )
    .await
    .unwrap();
    // No client certificate: the server refuses.
    refused(
        round_trip(
            &format!("tls://127.0.0.1:{port}?tls_ca={}", ca.display()),
            "tls-nocert",
        )
        .await,
        &[],
    );
    // Another authority: the client refuses the server.
    let text = refused(
        round_trip(
            &format!(
                "tls://127.0.0.1:{port}?tls_ca={}{client}",
                pki.other_ca().display()
            ),
            "tls-otherca",
        )
        .await,
        &[],
    );
    assert!(text.contains("over TLS"), "{text}");

    // TLS asked of a server without it: refused, never plaintext.
    let Some(plain) = server("").await else {
        return;
    };
    let port = plain.port();
    for url in [
        format!("tls://127.0.0.1:{port}"),
        format!("nats://127.0.0.1:{port}?tls_required=true"),
        format!("nats://127.0.0.1:{port}?tls_ca={}", ca.display()),
    ] {
        let text = refused(round_trip(&url, "tls-plain").await, &[]);
        assert!(text.contains("over TLS"), "{url}: {text}");
    }
}
