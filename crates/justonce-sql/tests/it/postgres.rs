crate::backend::backend_tests! {
    service: "PostgreSQL" at "127.0.0.1:5432",
    url: "JUSTONCE_POSTGRES_URL" or "postgres://postgres@127.0.0.1:5432/test",
    store: PgStore, options: PgStoreOptions,
    claims: PgClaimStore, state: PgStateGuard, version: PgVersionGuard,
    text: "TEXT",
    wrong_scheme: "mysql://root@127.0.0.1/test",
    bad_url: "postgres://app:s3cret@127.0.0.1:1/test",
    shown: "postgres://app:***@127.0.0.1:1/test",
}
