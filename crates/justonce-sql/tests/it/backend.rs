//! The tests every server-backed SQL store runs, written once: the dedup and claim
//! conformance suites, the outbox's, unique-violation classification, the guards, and a wrong URL.

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

        use justonce_core::{Cas, Disposition, ErrorKind, StateMachine, Transition};
        use justonce_sql::{$claims, $options, $state, $store, $version};
        use justonce_test::Backend;

        use justonce_test::unique_name as unique;

        fn url() -> Option<String> {
            justonce_test::service_available($service, $addr)
                .then(|| std::env::var($env).unwrap_or_else(|_| $default.into()))
        }

        async fn drop_tables(store: &$store, tables: &[&String]) {
            for t in tables {
                sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                    .execute(store.pool())
                    .await
                    .unwrap();
            }
        }

        /// The dedup contract, one test per rule, each on a table of its own.
        mod dedup_contract {
            use super::*;

            justonce_test::dedup_store_tests!(|| async {
                let url = url()?;
                let mut opts = $options::default();
                opts.dedup_table = unique("jo_dedup_t");
                let table = opts.dedup_table.clone();
                let store = $store::open_with(&url, opts).await.unwrap();
                let kept = store.clone();
                Some(Backend::new(store).cleaning_up(move || async move {
                    drop_tables(&kept, &[&table]).await;
                }))
            });
        }

        /// The outbox contract, one test per rule, each on a table of its own.
        mod outbox_contract {
            use super::*;

            justonce_test::outbox_store_tests!(|| async {
                let url = url()?;
                let store = $store::open(&url).await.unwrap();
                let table = unique("jo_outbox_t");
                let outbox = store
                    .outbox_with(justonce_sql::OutboxOptions::default().table(table.clone()))
                    .await
                    .unwrap();
                let kept = store.clone();
                Some(
                    Backend::new(justonce_test::outbox::Outboxed { store, outbox }).cleaning_up(
                        move || async move {
                            // MariaDB's locks live in a table of their own.
                            let locks = format!("{table}_locks");
                            drop_tables(&kept, &[&table, &locks]).await;
                        },
                    ),
                )
            });
        }

        /// The claim contract, one test per rule, each on a table of its own.
        mod claim_contract {
            use super::*;

            justonce_test::claim_store_tests!(|| async {
                let url = url()?;
                let table = unique("jo_claims_t");
                let claims = $claims::open(&url, &table).await.unwrap();
                Some(
                    Backend::new(Arc::new(claims)).cleaning_up(move || async move {
                        drop_tables(&$store::open(&url).await.unwrap(), &[&table]).await;
                    }),
                )
            });
        }

        #[tokio::test]
        async fn tools_read_records_and_free_stuck_claims() {
            let Some(url) = url() else { return };
            let mut opts = $options::default();
            opts.dedup_table = unique("jo_dedup_i");
            let table = opts.dedup_table.clone();
            let store = $store::open_with(&url, opts).await.unwrap();
            crate::inspect::dedup_records_read_back(&store, &table).await;
            let claims_table = unique("jo_claims_i");
            let claims = $claims::open(&url, &claims_table).await.unwrap();
            crate::inspect::a_forced_release_fences_the_holder(&claims, &claims_table).await;
            drop_tables(&store, &[&table, &claims_table]).await;
        }

        #[tokio::test]
        async fn positions_only_move_forward_and_roll_back_with_their_transaction() {
            use justonce_core::{Position, Positions, PositionsIn, Store};
            let Some(url) = url() else { return };
            let store = $store::open(&url).await.unwrap();
            let t = unique("jo_pos");
            let p = store.positions_in_table(&t, true).await.unwrap();
            let at = |partition, offset| Position { partition, offset };
            let mut tx = store.begin().await.unwrap();
            p.save_in(&mut tx, "c", "orders", &[at(0, 10), at(1, 3)])
                .await
                .unwrap();
            store.commit(tx).await.unwrap();
            let mut tx = store.begin().await.unwrap();
            p.save_in(&mut tx, "c", "orders", &[at(0, 5), at(1, 4)])
                .await
                .unwrap();
            p.save_in(&mut tx, "other", "orders", &[at(0, 1)])
                .await
                .unwrap();
            store.commit(tx).await.unwrap();
            assert_eq!(
                p.load("c", "orders", &[0, 1, 2]).await.unwrap(),
                [at(0, 10), at(1, 4)],
                "never back"
            );
            let mut tx = store.begin().await.unwrap();
            p.save_in(&mut tx, "c", "orders", &[at(0, 99)])
                .await
                .unwrap();
            drop(tx);
            assert_eq!(
                p.load("c", "orders", &[0]).await.unwrap(),
                [at(0, 10)],
                "rolled back"
            );
            assert_eq!(
                p.load("other", "orders", &[0, 1]).await.unwrap(),
                [at(0, 1)]
            );
            assert!(p.load("c", "payments", &[0]).await.unwrap().is_empty());
            drop_tables(&store, &[&t]).await;
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

        /// A purge running during a consume: while a consumer's transaction stays open and
        /// the purge deletes thousands of old records, other claims commit at once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_purge_never_blocks_claims() {
            let Some(url) = url() else { return };
            let mut opts = $options::default();
            opts.dedup_table = unique("jo_dedup_purge");
            let table = opts.dedup_table.clone();
            let store = Arc::new($store::open_with(&url, opts).await.unwrap());
            crate::backend::purge_beside_claims(store.clone(), &table, |t| {
                format!("UPDATE {t} SET processed_at = processed_at - INTERVAL '3' DAY")
            })
            .await;
            drop_tables(&store, &[&table]).await;
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

/// Claims `OLD` keys and ages them with `backdate(table)`, then purges them (retention one
/// day, batches of 500) while a consumer's transaction holds a fresh claim open, and checks
/// that 50 other claims commit meanwhile, each within a few seconds.
pub(crate) async fn purge_beside_claims<S>(
    store: std::sync::Arc<S>,
    table: &str,
    backdate: impl Fn(&str) -> String,
) where
    S: justonce_core::DedupStore + HasPool,
{
    use justonce_core::{Claim, DedupKey, Fingerprint, MessageId};
    use std::time::Duration;
    const OLD: usize = 3000;
    let fp = Fingerprint::of(b"p");
    let consumer = "purge-test";
    let key = |i: usize| MessageId::new(format!("m-{i}")).unwrap();
    for chunk in (0..OLD).collect::<Vec<_>>().chunks(500) {
        let mut tx = store.begin().await.unwrap();
        for &i in chunk {
            let id = key(i);
            let k = DedupKey {
                consumer,
                message_id: &id,
            };
            assert_eq!(store.claim(&mut tx, k, fp).await.unwrap(), Claim::Fresh);
        }
        store.commit(tx).await.unwrap();
    }
    store.execute(&backdate(table)).await;

    // A consumer's batch, still open.
    let open_id = key(OLD);
    let mut open_tx = store.begin().await.unwrap();
    let k = DedupKey {
        consumer,
        message_id: &open_id,
    };
    assert_eq!(
        store.claim(&mut open_tx, k, fp).await.unwrap(),
        Claim::Fresh
    );

    let purger = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut purged = 0;
            loop {
                let n = store.purge(Duration::from_secs(86_400), 500).await.unwrap();
                purged += n;
                if n == 0 {
                    return purged;
                }
            }
        })
    };
    for i in OLD + 1..OLD + 51 {
        let id = key(i);
        let claim = async {
            let mut tx = store.begin().await.unwrap();
            let k = DedupKey {
                consumer,
                message_id: &id,
            };
            let c = store.claim(&mut tx, k, fp).await.unwrap();
            store.commit(tx).await.unwrap();
            c
        };
        let c = tokio::time::timeout(Duration::from_secs(5), claim)
            .await
            .expect("a claim waited on the purge");
        assert_eq!(c, Claim::Fresh);
    }
    store.commit(open_tx).await.unwrap();
    let purged = tokio::time::timeout(Duration::from_secs(60), purger)
        .await
        .expect("the purge finished")
        .unwrap();
    assert_eq!(purged, OLD as u64, "every old record, and only those");
    let mut tx = store.begin().await.unwrap();
    let id = key(OLD + 1);
    let k = DedupKey {
        consumer,
        message_id: &id,
    };
    assert_eq!(
        store.claim(&mut tx, k, fp).await.unwrap(),
        Claim::Duplicate,
        "recent records stay"
    );
    store.rollback(tx).await.unwrap();
}

/// Runs a statement on a store's pool.
#[async_trait::async_trait]
pub(crate) trait HasPool {
    async fn execute(&self, sql: &str);
}

#[cfg(feature = "postgres")]
#[async_trait::async_trait]
impl HasPool for justonce_sql::PgStore {
    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(sql).execute(self.pool()).await.unwrap();
    }
}

#[cfg(feature = "mysql")]
#[async_trait::async_trait]
impl HasPool for justonce_sql::MySqlStore {
    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(sql).execute(self.pool()).await.unwrap();
    }
}
