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
