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

/// MariaDB's "Record has changed since last read" (error 1020): a write to a row another
/// transaction changed after this one's snapshot, under `innodb_snapshot_isolation` (on by
/// default from MariaDB 11.8, where `turn_on` is false; a session setting from 10.6.18 and
/// 10.11.8). It is a conflict that a retry of the transaction passes: busy, never the
/// message's fault.
pub(crate) async fn a_snapshot_conflict_is_busy(url: &str, turn_on: bool) {
    use justonce_core::ErrorKind;
    use sqlx::Connection as _;
    let table = justonce_test::unique_name("jo_snap");
    let mut a = sqlx::MySqlConnection::connect(url).await.unwrap();
    let mut b = sqlx::MySqlConnection::connect(url).await.unwrap();
    let mut setup = vec![
        format!("CREATE TABLE {table} (id INT PRIMARY KEY, n INT) ENGINE=InnoDB"),
        format!("INSERT INTO {table} VALUES (1, 0)"),
    ];
    if turn_on {
        setup.push("SET SESSION innodb_snapshot_isolation = ON".into());
    }
    setup.extend([
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ".into(),
        "START TRANSACTION".into(),
        format!("SELECT n FROM {table} WHERE id = 1"),
    ]);
    for sql in setup {
        sqlx::query(&sql).execute(&mut a).await.unwrap();
    }
    sqlx::query(&format!("UPDATE {table} SET n = 1 WHERE id = 1"))
        .execute(&mut b)
        .await
        .unwrap();
    let conflict = sqlx::query(&format!("UPDATE {table} SET n = 2 WHERE id = 1"))
        .execute(&mut a)
        .await
        .expect_err("a write to a row changed since the snapshot conflicts");
    let e = justonce_core::Error::from(conflict);
    assert!(
        e.to_string().contains("Record has changed since last read"),
        "{e}"
    );
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(e.is_transient() && !e.kind().is_message_fault(), "{e}");
    let _ = sqlx::query("ROLLBACK").execute(&mut a).await;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&mut b)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_snapshot_isolation_write_conflict_is_busy_not_the_message_s() {
    if !justonce_test::service_available("MariaDB", "127.0.0.1:3306") {
        return;
    }
    let url = std::env::var("JUSTONCE_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    a_snapshot_conflict_is_busy(&url, true).await;
}
