//! The store contracts on Debian 13's PostgreSQL (17), from `scripts/debian13.sh`'s root: a
//! cluster of each rule's own, run in the root. The machine's PostgreSQL (15) runs them in
//! `postgres.rs`.

use std::sync::Arc;

use justonce_sql::harness::OwnPostgres;
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
