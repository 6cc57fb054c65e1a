use std::sync::Arc;
use std::time::Duration;

use justonce_core::{conformance, ErrorKind};
use justonce_sql::{PgClaimStore, PgStore, PgStoreOptions};

use crate::unique;

fn url() -> Option<String> {
    conformance::service_available("PostgreSQL", "127.0.0.1:5432").then(|| {
        std::env::var("JUSTONCE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_keeps_the_dedup_contract() {
    let Some(url) = url() else { return };
    let mut opts = PgStoreOptions::default();
    opts.dedup_table = unique("jo_dedup_t");
    let table = opts.dedup_table.clone();
    let store = PgStore::open_with(&url, opts).await.unwrap();
    conformance::dedup_store(Arc::new(store.clone()), "pg").await;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_claims_keep_the_claim_contract() {
    let Some(url) = url() else { return };
    let table = unique("jo_claims_t");
    let claims = PgClaimStore::open(&url, &table).await.unwrap();
    conformance::claim_store(Arc::new(claims), Duration::from_millis(200), "pg").await;
    let store = PgStore::open(&url).await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_wrong_postgres_url_says_what_to_do_without_the_password() {
    let e = PgStore::open("mysql://root@127.0.0.1/test")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    let e = PgStore::open("postgres://app:s3cret@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect);
    assert!(
        e.to_string()
            .contains("postgres://app:***@127.0.0.1:1/test"),
        "{e}"
    );
    assert!(
        !e.to_chain_string().contains("s3cret"),
        "{}",
        e.to_chain_string()
    );
}

#[tokio::test]
async fn postgres_guards_move_once_and_tell_stale_from_ahead() {
    use justonce_core::{Cas, Disposition, StateMachine, Transition};
    use justonce_sql::{PgStateGuard, PgVersionGuard};

    let Some(url) = url() else { return };
    let store = PgStore::open(&url).await.unwrap();
    let (orders, accounts) = (unique("jo_orders"), unique("jo_accounts"));
    for ddl in [
        format!("CREATE TABLE {orders} (order_id TEXT PRIMARY KEY, status TEXT NOT NULL)"),
        format!("INSERT INTO {orders} VALUES ('a', 'PENDING'), ('c', 'CANCELLED')"),
        format!("CREATE TABLE {accounts} (id BIGINT PRIMARY KEY, version BIGINT NOT NULL)"),
        format!("INSERT INTO {accounts} VALUES (7, 3)"),
    ] {
        sqlx::query(&ddl).execute(store.pool()).await.unwrap();
    }
    let machine = StateMachine::new([
        ("PENDING", "PAID"),
        ("PAID", "SHIPPED"),
        ("PENDING", "CANCELLED"),
    ])
    .unwrap();
    let state = PgStateGuard::new(&orders, "order_id", "status", machine).unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    assert_eq!(
        state.transition(&mut conn, "a", "PAID").await.unwrap(),
        Transition::Apply
    );
    assert_eq!(
        state.transition(&mut conn, "a", "PAID").await.unwrap(),
        Transition::AlreadyDone
    );
    assert!(matches!(
        state
            .transition(&mut conn, "c", "PAID")
            .await
            .unwrap()
            .to_disposition(),
        Some(Disposition::DeadLetter { .. })
    ));
    assert_eq!(
        state
            .transition(&mut conn, "zzz", "PAID")
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidInput
    );

    // An integer key, bound as an integer.
    let version = PgVersionGuard::new(&accounts, "id", "version").unwrap();
    assert_eq!(
        version.bump(&mut conn, 7_i64, 3).await.unwrap(),
        Cas::Applied
    );
    assert_eq!(
        version.bump(&mut conn, 7_i64, 3).await.unwrap(),
        Cas::Stale { current: 4 }
    );
    assert_eq!(
        version.bump(&mut conn, 7_i64, 9).await.unwrap(),
        Cas::Ahead { current: 4 }
    );
    drop(conn);
    for t in [&orders, &accounts] {
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}
