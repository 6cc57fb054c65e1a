use std::sync::Arc;
use std::time::Duration;

use justonce_core::{conformance, ErrorKind};
use justonce_sql::{MySqlClaimStore, MySqlStore, MySqlStoreOptions};

use crate::unique;

fn url() -> Option<String> {
    conformance::service_available("MariaDB", "127.0.0.1:3306").then(|| {
        std::env::var("JUSTONCE_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_store_keeps_the_dedup_contract() {
    let Some(url) = url() else { return };
    let mut opts = MySqlStoreOptions::default();
    opts.dedup_table = unique("jo_dedup_t");
    let table = opts.dedup_table.clone();
    let store = MySqlStore::open_with(&url, opts).await.unwrap();
    conformance::dedup_store(Arc::new(store.clone()), "maria").await;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_claims_keep_the_claim_contract() {
    let Some(url) = url() else { return };
    let table = unique("jo_claims_t");
    let claims = MySqlClaimStore::open(&url, &table).await.unwrap();
    conformance::claim_store(Arc::new(claims), Duration::from_millis(200), "maria").await;
    let store = MySqlStore::open(&url).await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_wrong_mariadb_url_says_what_to_do_without_the_password() {
    let e = MySqlStore::open("postgres://postgres@127.0.0.1/test")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    let e = MySqlStore::open("mysql://app:s3cret@127.0.0.1:1/test")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect);
    assert!(
        e.to_string().contains("mysql://app:***@127.0.0.1:1/test"),
        "{e}"
    );
    assert!(
        !e.to_chain_string().contains("s3cret"),
        "{}",
        e.to_chain_string()
    );
}

#[tokio::test]
async fn unique_violations_are_classified_on_mariadb() {
    let Some(url) = url() else { return };
    let store = MySqlStore::open(&url).await.unwrap();
    let t = unique("jo_uniq");
    sqlx::query(&format!("CREATE TABLE {t} (id VARCHAR(10) PRIMARY KEY)"))
        .execute(store.pool())
        .await
        .unwrap();
    let insert = format!("INSERT INTO {t} VALUES ('a')");
    sqlx::query(&insert).execute(store.pool()).await.unwrap();
    let e: justonce_core::Error = sqlx::query(&insert)
        .execute(store.pool())
        .await
        .unwrap_err()
        .into();
    assert_eq!(e.kind(), ErrorKind::UniqueViolation);
    sqlx::query(&format!("DROP TABLE {t}"))
        .execute(store.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn mariadb_guards_move_once_and_tell_stale_from_ahead() {
    use justonce_core::{Cas, Disposition, StateMachine, Transition};
    use justonce_sql::{MySqlStateGuard, MySqlVersionGuard};

    let Some(url) = url() else { return };
    let store = MySqlStore::open(&url).await.unwrap();
    let (orders, accounts) = (unique("jo_orders"), unique("jo_accounts"));
    for ddl in [
        format!(
            "CREATE TABLE {orders} (order_id VARCHAR(20) PRIMARY KEY, status VARCHAR(20) NOT NULL)"
        ),
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
    let state = MySqlStateGuard::new(&orders, "order_id", "status", machine).unwrap();
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
    let version = MySqlVersionGuard::new(&accounts, "id", "version").unwrap();
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
