//! PostgreSQL over TLS, on servers of the test's own (`justonce_sql::harness::OwnPostgres`:
//! `initdb`, a password, `ssl = on` with certificates the test makes): a verified link
//! carries the queue and the consumer end to end; a server certificate of another
//! authority, TLS asked of a plaintext server, a wrong password and a missing client
//! certificate are each refused, and no error shows the password or a key.

use std::time::Duration;

use justonce::sql::harness::{OwnPostgres, ServerTls, CERT_USER, PASSWORD};
use justonce::sql::{PgQueue, PgStore, PgTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Inspect, Message, Publisher,
    Result,
};
use justonce_test::tls::Pki;

/// A server of the test's own, with `tls` (or plaintext); `None` when PostgreSQL is not
/// installed and services are not required.
async fn server(tls: Option<ServerTls>) -> Option<OwnPostgres> {
    if !OwnPostgres::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").map_or(true, |v| v != "1"),
            "PostgreSQL (initdb) is not installed"
        );
        eprintln!("SKIPPED: PostgreSQL (initdb) is not installed");
        return None;
    }
    Some(
        OwnPostgres::start(tls.as_ref())
            .await
            .expect("postgres starts"),
    )
}

fn served_by(pki: &Pki, other: bool) -> ServerTls {
    let (cert, key) = if other {
        pki.other_server()
    } else {
        pki.server()
    };
    ServerTls {
        cert,
        key,
        client_ca: pki.ca(),
    }
}

/// `?sslmode=verify-full&sslrootcert=CA`, and what else `more` adds.
fn verify_full(ca: &std::path::Path, more: &str) -> String {
    format!("?sslmode=verify-full&sslrootcert={}{more}", ca.display())
}

/// Everything an error says, `Display` and `Debug`: it names the server and never a
/// secret.
fn said(e: &Error, secrets: &[&str]) -> String {
    let text = format!("{e:#} | {e:?}");
    for secret in secrets {
        assert!(!text.contains(secret), "the error shows a secret: {text}");
    }
    assert!(text.contains("cannot connect to PostgreSQL"), "{text}");
    text
}

struct Ledger;

impl Handler<PgTx> for Ledger {
    async fn handle(&self, cx: &Context<'_>, tx: &mut PgTx) -> Result<Disposition> {
        sqlx::query("INSERT INTO tls_ledger (order_id) VALUES ($1)")
            .bind(cx.message().id().map(|id| id.as_str().to_owned()))
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

/// `sslmode=verify-full` with the test's authority: the queue, the dedup store and the
/// consumer's transactions all run over TLS (`pg_stat_ssl` says so of every connection),
/// and three messages published twice each are applied once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_link_carries_the_queue_and_the_consumer() {
    let pki = Pki::new();
    let Some(pg) = server(Some(served_by(&pki, false))).await else {
        return;
    };
    let url = pg.url(&verify_full(&pki.ca(), ""));
    let queue = PgQueue::open(&url, "tls").await.unwrap();
    let store = PgStore::open(&url).await.unwrap();
    let debug = format!("{queue:?} {store:?}");
    assert!(
        !debug.contains(PASSWORD),
        "Debug shows the password: {debug}"
    );
    sqlx::query("CREATE TABLE tls_ledger (order_id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    for round in 0..2 {
        for i in 0..3 {
            let m = Message::new(format!("{{\"round\":{round}}}")).with_id(format!("o-{i}"));
            queue.publish(&m.unwrap()).await.unwrap();
        }
    }
    let consumer = Consumer::new(
        ConsumerOptions::new("tls"),
        queue.clone(),
        store.clone(),
        Ledger,
    )
    .unwrap();
    let pending = queue.clone();
    tokio::time::timeout(
        Duration::from_secs(60),
        consumer.run_until(async move {
            while !matches!(pending.pending().await, Ok(0)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }),
    )
    .await
    .expect("the consumer drains the queue")
    .unwrap();
    let applied: Vec<(String, i64)> = sqlx::query_as(
        "SELECT order_id, COUNT(*) FROM tls_ledger GROUP BY order_id ORDER BY order_id",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        applied,
        vec![("o-0".into(), 1), ("o-1".into(), 1), ("o-2".into(), 1)]
    );
    let plaintext: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.client_addr IS NOT NULL AND NOT s.ssl",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(plaintext, 0, "a connection over TCP ran in plaintext");
    let mine: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(queue.pool())
        .await
        .unwrap();
    assert!(mine);

    // The same server: a wrong password is refused, and not shown.
    let wrong = pg
        .url(&verify_full(&pki.ca(), ""))
        .replace(PASSWORD, "not-the-pw-5d1c");
    let e = PgStore::open(&wrong)
        .await
        .expect_err("a wrong password is refused");
    let text = said(&e, &[PASSWORD, "not-the-pw-5d1c"]);
    assert!(text.contains("password authentication failed"), "{text}");

    // A client certificate logs its user in without a password; without it, refused.
    let (cert, key) = pki.client(CERT_USER);
    let by_cert = format!(
        "postgres://{CERT_USER}@127.0.0.1:{}/postgres{}",
        pg.port(),
        verify_full(
            &pki.ca(),
            &format!("&sslcert={}&sslkey={}", cert.display(), key.display())
        )
    );
    let mut opts = justonce::sql::PgStoreOptions::default();
    opts.dedup_table = "jo_dedup_by_cert".into();
    let store = PgStore::open_with(&by_cert, opts).await.unwrap();
    let user: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(user, CERT_USER);
    let key_pem = std::fs::read_to_string(&key).unwrap();
    let key_body = key_pem.lines().nth(1).unwrap().to_owned();
    let no_cert = format!(
        "postgres://{CERT_USER}@127.0.0.1:{}/postgres{}",
        pg.port(),
        verify_full(&pki.ca(), "")
    );
    let e = PgStore::open(&no_cert)
        .await
        .expect_err("no certificate, no entry");
    said(&e, &[PASSWORD, &key_body]);
}

/// A server whose certificate another authority signed: `verify-full` and `verify-ca`
/// refuse it, and the error says why (the issuer is unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_of_another_authority_is_refused() {
    let pki = Pki::new();
    let Some(pg) = server(Some(served_by(&pki, true))).await else {
        return;
    };
    for mode in ["verify-full", "verify-ca"] {
        let url = pg.url(&format!(
            "?sslmode={mode}&sslrootcert={}",
            pki.ca().display()
        ));
        let e = PgStore::open(&url)
            .await
            .expect_err("an unknown issuer is refused");
        let text = said(&e, &[PASSWORD]);
        assert!(text.to_lowercase().contains("tls"), "{text}");
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
}

/// TLS asked of a server that speaks plaintext only: refused, never plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_asked_of_a_plaintext_server_is_refused() {
    let pki = Pki::new();
    let Some(pg) = server(None).await else {
        return;
    };
    for query in ["?sslmode=require".to_owned(), verify_full(&pki.ca(), "")] {
        let e = PgStore::open(&pg.url(&query))
            .await
            .expect_err("TLS asked, no TLS offered: refused");
        let text = said(&e, &[PASSWORD]);
        assert!(text.to_lowercase().contains("tls"), "{text}");
    }
    // The plaintext server itself works, asked for nothing.
    PgStore::open(&pg.url("?sslmode=disable")).await.unwrap();
}
