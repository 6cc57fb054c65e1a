//! MariaDB over TLS, on servers of the test's own (`justonce_sql::harness::OwnMariaDb`:
//! `mariadb-install-db`, `--ssl-cert` with certificates the test makes): a verified link
//! carries a consumer's transactions end to end; a server certificate of another
//! authority, TLS asked of a plaintext server, a wrong password and a missing client
//! certificate are refused, and no error shows the password.

use std::time::Duration;

use justonce::sql::harness::{OwnMariaDb, ServerTls, CERT_USER, PASSWORD};
use justonce::sql::{MySqlStore, MySqlStoreOptions, MySqlTx, SqliteQueue};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Inspect, Message, Publisher,
    Result,
};
use justonce_test::tls::Pki;

async fn server(tls: Option<ServerTls>) -> Option<OwnMariaDb> {
    if !OwnMariaDb::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").map_or(true, |v| v != "1"),
            "MariaDB (mariadbd, mariadb-install-db) is not installed"
        );
        eprintln!("SKIPPED: MariaDB is not installed");
        return None;
    }
    Some(
        OwnMariaDb::start(tls.as_ref())
            .await
            .expect("mariadbd starts"),
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

fn verify_identity(ca: &std::path::Path, more: &str) -> String {
    format!("?ssl-mode=VERIFY_IDENTITY&ssl-ca={}{more}", ca.display())
}

fn said(e: &Error) -> String {
    let text = format!("{e:#} | {e:?}");
    assert!(
        !text.contains(PASSWORD),
        "the error shows the password: {text}"
    );
    assert!(text.contains("cannot connect to MariaDB"), "{text}");
    text
}

struct Ledger;

impl Handler<MySqlTx> for Ledger {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MySqlTx) -> Result<Disposition> {
        sqlx::query("INSERT INTO tls_ledger (order_id) VALUES (?)")
            .bind(cx.message().id().map(|id| id.as_str().to_owned()))
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_link_carries_a_consumer_and_a_client_certificate_logs_in() {
    let pki = Pki::new();
    let Some(db) = server(Some(served_by(&pki, false))).await else {
        return;
    };
    let url = db.url(&verify_identity(&pki.ca(), ""));
    let store = MySqlStore::open(&url).await.unwrap();
    sqlx::query("CREATE TABLE tls_ledger (order_id VARCHAR(64) NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(!cipher.is_empty(), "the store's connection is encrypted");

    let dir = tempfile::tempdir().unwrap();
    let queue = SqliteQueue::open(
        &format!("sqlite:{}", dir.path().join("q.db").display()),
        "tls",
    )
    .await
    .unwrap();
    for _ in 0..2 {
        for i in 0..3 {
            let m = Message::new("{}").with_id(format!("o-{i}")).unwrap();
            queue.publish(&m).await.unwrap();
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

    // A wrong password is refused, and not shown.
    let e = MySqlStore::open(&url.replace(PASSWORD, "not-the-pw-8c2e"))
        .await
        .expect_err("a wrong password is refused");
    let text = said(&e);
    assert!(!text.contains("not-the-pw-8c2e"), "{text}");

    // The certificate user: with its certificate in, without it refused.
    let (cert, key) = pki.client(CERT_USER);
    let by_cert = format!(
        "mysql://{CERT_USER}@127.0.0.1:{}/test{}",
        db.port(),
        verify_identity(
            &pki.ca(),
            &format!("&ssl-cert={}&ssl-key={}", cert.display(), key.display())
        )
    );
    let mut opts = MySqlStoreOptions::default();
    opts.dedup_table = "jo_dedup_by_cert".into();
    MySqlStore::open_with(&by_cert, opts).await.unwrap();
    let no_cert = format!(
        "mysql://{CERT_USER}@127.0.0.1:{}/test{}",
        db.port(),
        verify_identity(&pki.ca(), "")
    );
    let e = MySqlStore::open(&no_cert)
        .await
        .expect_err("no certificate, no entry");
    said(&e);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_authority_and_tls_asked_of_plaintext_are_refused() {
    let pki = Pki::new();
    let Some(other) = server(Some(served_by(&pki, true))).await else {
        return;
    };
    for mode in ["VERIFY_IDENTITY", "VERIFY_CA"] {
        let url = other.url(&format!("?ssl-mode={mode}&ssl-ca={}", pki.ca().display()));
        let e = MySqlStore::open(&url)
            .await
            .expect_err("an unknown issuer is refused");
        let text = said(&e);
        assert!(text.contains("over TLS"), "{text}");
    }
    let Some(plain) = server(None).await else {
        return;
    };
    for query in [
        "?ssl-mode=REQUIRED".to_owned(),
        verify_identity(&pki.ca(), ""),
    ] {
        let e = MySqlStore::open(&plain.url(&query))
            .await
            .expect_err("TLS asked, no TLS offered: refused");
        let text = said(&e);
        assert!(text.contains("over TLS"), "{text}");
    }
    MySqlStore::open(&plain.url("?ssl-mode=DISABLED"))
        .await
        .unwrap();
}
