//! The store contracts on Debian 13's PostgreSQL (17) and MariaDB (11.8), from
//! `scripts/debian13.sh`'s root: a server of each rule's own, run in the root. The
//! machine's (15 and 10.11) run them in `postgres.rs` and `mysql.rs`.

use std::sync::Arc;

use justonce_sql::harness::{OwnMariaDb, OwnPostgres};
use justonce_sql::{MySqlClaimStore, MySqlStore, MySqlStoreOptions};
use justonce_sql::{PgClaimStore, PgStore, PgStoreOptions};
use justonce_test::{unique_name as unique, Backend};

/// A PostgreSQL 17 cluster of the test's own; `None` (loudly) when the root is not built.
async fn postgres_17() -> Option<OwnPostgres> {
    let root = justonce_test::debian13_root()?;
    let pg = OwnPostgres::start_in(&root)
        .await
        .expect("a PostgreSQL cluster from Debian 13's root starts");
    let store = PgStore::open(&pg.url("")).await.unwrap();
    let (version,): (String,) = sqlx::query_as("SHOW server_version")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(version.starts_with("17."), "{version}");
    Some(pg)
}

mod dedup_contract_postgres_17 {
    use super::*;

    justonce_test::dedup_store_tests!(|| async {
        let pg = postgres_17().await?;
        let mut opts = PgStoreOptions::default();
        opts.dedup_table = unique("jo_dedup_t");
        let store = PgStore::open_with(&pg.url(""), opts).await.unwrap();
        Some(Backend::new(store).keeping(pg))
    });
}

mod claim_contract_postgres_17 {
    use super::*;

    justonce_test::claim_store_tests!(|| async {
        let pg = postgres_17().await?;
        let claims = PgClaimStore::open(&pg.url(""), &unique("jo_claims_t"))
            .await
            .unwrap();
        Some(Backend::new(Arc::new(claims)).keeping(pg))
    });
}

mod outbox_contract_postgres_17 {
    use super::*;

    justonce_test::outbox_store_tests!(|| async {
        let pg = postgres_17().await?;
        let store = PgStore::open(&pg.url("")).await.unwrap();
        let outbox = store
            .outbox_with(justonce_sql::OutboxOptions::default().table(unique("jo_outbox_t")))
            .await
            .unwrap();
        Some(Backend::new(justonce_test::outbox::Outboxed { store, outbox }).keeping(pg))
    });
}

/// A MariaDB 11.8 server of the test's own; `None` (loudly) when the root is not built.
async fn mariadb_11() -> Option<OwnMariaDb> {
    let root = justonce_test::debian13_root()?;
    let db = OwnMariaDb::start_in(&root)
        .await
        .expect("a MariaDB server from Debian 13's root starts");
    let store = MySqlStore::open(&db.url("")).await.unwrap();
    let (version,): (String,) = sqlx::query_as("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(version.starts_with("11.8"), "{version}");
    Some(db)
}

mod dedup_contract_mariadb_11 {
    use super::*;

    justonce_test::dedup_store_tests!(|| async {
        let db = mariadb_11().await?;
        let mut opts = MySqlStoreOptions::default();
        opts.dedup_table = unique("jo_dedup_t");
        let store = MySqlStore::open_with(&db.url(""), opts).await.unwrap();
        Some(Backend::new(store).keeping(db))
    });
}

mod claim_contract_mariadb_11 {
    use super::*;

    justonce_test::claim_store_tests!(|| async {
        let db = mariadb_11().await?;
        let claims = MySqlClaimStore::open(&db.url(""), &unique("jo_claims_t"))
            .await
            .unwrap();
        Some(Backend::new(Arc::new(claims)).keeping(db))
    });
}

mod outbox_contract_mariadb_11 {
    use super::*;

    justonce_test::outbox_store_tests!(|| async {
        let db = mariadb_11().await?;
        let store = MySqlStore::open(&db.url("")).await.unwrap();
        let outbox = store
            .outbox_with(justonce_sql::OutboxOptions::default().table(unique("jo_outbox_t")))
            .await
            .unwrap();
        Some(Backend::new(justonce_test::outbox::Outboxed { store, outbox }).keeping(db))
    });
}

/// On 11.8 snapshot isolation is on by default: the conflict comes without asking.
#[tokio::test]
async fn a_snapshot_conflict_is_busy_on_mariadb_11_by_default() {
    let Some(db) = mariadb_11().await else {
        return;
    };
    crate::mysql::a_snapshot_conflict_is_busy(&db.url(""), false).await;
}
