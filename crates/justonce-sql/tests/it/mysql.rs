crate::backend::backend_tests! {
    service: "MariaDB" at "127.0.0.1:3306",
    url: "JUSTONCE_MYSQL_URL" or "mysql://root@127.0.0.1:3306/test",
    store: MySqlStore, options: MySqlStoreOptions,
    claims: MySqlClaimStore, state: MySqlStateGuard, version: MySqlVersionGuard,
    text: "VARCHAR(20)",
    wrong_scheme: "postgres://postgres@127.0.0.1/test",
    bad_url: "mysql://app:s3cret@127.0.0.1:1/test",
    shown: "mysql://app:***@127.0.0.1:1/test",
}

/// The outbox contract, one test per rule, each on an outbox table of its own.
mod outbox {
    use justonce_sql::{MySqlOutboxOptions, MySqlStore};
    use justonce_test::outbox::Outboxed;
    use justonce_test::{unique_name, Backend};

    use super::url;

    justonce_test::outbox_store_tests!(|| async {
        let url = url()?;
        let store = MySqlStore::open(&url).await.unwrap();
        let table = unique_name("jo_outbox_t").replace('-', "_");
        let outbox = store
            .outbox_with(MySqlOutboxOptions::default().table(table.clone()))
            .await
            .unwrap();
        let pool = store.pool().clone();
        Some(
            Backend::new(Outboxed { store, outbox }).cleaning_up(move || async move {
                sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {table}"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }),
        )
    });
}
