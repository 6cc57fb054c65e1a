//! The tests every server-backed SQL store runs, written once: the dedup and claim
//! conformance suites, unique-violation classification, the guards, and a wrong URL.

/// Generates the backend tests for one database. `text` is the SQL type of a text key.
macro_rules! backend_tests {
    (
        service: $service:literal at $addr:literal,
        url: $env:literal or $default:literal,
        store: $store:ident, options: $options:ident,
        claims: $claims:ident, state: $state:ident, version: $version:ident,
        text: $text:literal,
        wrong_scheme: $wrong:literal, bad_url: $bad:literal, shown: $shown:literal $(,)?
    ) => {
        use std::sync::Arc;
        use std::time::Duration;

        use justonce_core::{conformance, Cas, Disposition, ErrorKind, StateMachine, Transition};
        use justonce_sql::{$claims, $options, $state, $store, $version};

        use justonce_core::conformance::unique_name as unique;

        fn url() -> Option<String> {
            conformance::service_available($service, $addr)
                .then(|| std::env::var($env).unwrap_or_else(|_| $default.into()))
        }

        async fn drop_tables(store: &$store, tables: &[&String]) {
            for t in tables {
                sqlx::query(&format!("DROP TABLE {t}"))
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_store_keeps_the_dedup_contract() {
            let Some(url) = url() else { return };
            let mut opts = $options::default();
            opts.dedup_table = unique("jo_dedup_t");
            let table = opts.dedup_table.clone();
            let store = $store::open_with(&url, opts).await.unwrap();
            conformance::dedup_store(Arc::new(store.clone()), "srv").await;
            drop_tables(&store, &[&table]).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_claims_keep_the_claim_contract() {
            let Some(url) = url() else { return };
            let table = unique("jo_claims_t");
            let claims = $claims::open(&url, &table).await.unwrap();
            conformance::claim_store(Arc::new(claims), Duration::from_millis(200), "srv").await;
            drop_tables(&$store::open(&url).await.unwrap(), &[&table]).await;
        }

        #[tokio::test]
        async fn unique_violations_are_classified() {
            let Some(url) = url() else { return };
            let store = $store::open(&url).await.unwrap();
            let t = unique("jo_uniq");
            sqlx::query(&format!("CREATE TABLE {t} (id {} PRIMARY KEY)", $text))
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
            drop_tables(&store, &[&t]).await;
        }

        #[tokio::test]
        async fn the_guards_move_once_and_tell_stale_from_ahead() {
            let Some(url) = url() else { return };
            let store = $store::open(&url).await.unwrap();
            let (orders, accounts) = (unique("jo_orders"), unique("jo_accounts"));
            for ddl in [
                format!(
                    "CREATE TABLE {orders} (order_id {} PRIMARY KEY, status {} NOT NULL)",
                    $text, $text
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
            let state = $state::new(&orders, "order_id", "status", machine).unwrap();
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
            let version = $version::new(&accounts, "id", "version").unwrap();
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
            drop_tables(&store, &[&orders, &accounts]).await;
        }

        #[tokio::test]
        async fn a_wrong_url_says_what_to_do_without_the_password() {
            let e = $store::open($wrong).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            let e = $store::open($bad).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Connect);
            assert!(e.to_string().contains($shown), "{e}");
            assert!(
                !e.to_chain_string().contains("s3cret"),
                "{}",
                e.to_chain_string()
            );
        }
    };
}

pub(crate) use backend_tests;
