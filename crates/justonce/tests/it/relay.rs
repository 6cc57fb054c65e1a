//! The relay on the real backends: SQLite's in-process wake-up, PostgreSQL's `NOTIFY` from
//! another connection pool, per-key order through three relays, and RabbitMQ (in amqp.rs).

use std::time::Duration;

use justonce::relay::{Relay, RelayOptions};
use justonce::sql::{SqliteQueue, SqliteStore};
use justonce::{Message, OutboxStore, Source, Store};

fn idle_relay() -> RelayOptions {
    // An hour between polls: only a wake-up can deliver within the test's seconds.
    RelayOptions::default()
        .poll_interval(Duration::from_secs(3600))
        .concurrency(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_commit_wakes_the_relay_and_the_row_reaches_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("app.db").display());
    let store = SqliteStore::open(&url).await.unwrap();
    let outbox = store.outbox().await.unwrap();
    let queue = SqliteQueue::open(
        &format!("sqlite:{}", dir.path().join("q.db").display()),
        "receipts",
    )
    .await
    .unwrap();
    let running = Relay::new(outbox.clone(), queue.clone(), idle_relay())
        .unwrap()
        .spawn();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut tx = store.begin().await.unwrap();
    let m = Message::new(r#"{"receipt":1}"#).with_id("r-1").unwrap();
    outbox.enqueue(&mut tx, &m, Some("acct")).await.unwrap();
    // Held open a while: the woken relay must wait for the commit, not miss the row.
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.commit(tx).await.unwrap();

    let got = queue.receive(1, Duration::from_secs(10)).await.unwrap();
    assert_eq!(got.len(), 1, "woken, not polled");
    assert_eq!(got[0].message.id().unwrap().as_str(), "r-1");
    running.stop().await.unwrap();
    // The relay marks after the publish, so the row may still be there when it arrives;
    // once the relay has stopped (its pass finished), it is gone.
    assert_eq!(outbox.outbox_stats().await.unwrap().pending, 0);
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::collections::HashMap;
    use std::time::Duration;

    use justonce::relay::{Relay, RelayOptions};
    use justonce::sql::{PgOutbox, PgQueue, PgStore, PgTx};
    use justonce::{
        Consumer, ConsumerOptions, Context, Disposition, Handler, Message, OutboxStore, Result,
        Source, Store,
    };

    use super::idle_relay;

    fn url() -> Option<String> {
        justonce_test::service_available("PostgreSQL", "127.0.0.1:5432").then(|| {
            std::env::var("JUSTONCE_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_commit_elsewhere_wakes_the_relay_by_notify() {
        // A test of postgres.rs restarts the server: not while this one runs.
        let _one_at_a_time = crate::postgres::RESTARTS.lock().await;
        let Some(url) = url() else { return };
        let table = justonce_test::unique_name("jo_obx_notify").replace('-', "_");
        let relay_store = PgStore::open(&url).await.unwrap();
        let outbox = relay_store
            .outbox_with(justonce::sql::OutboxOptions::default().table(&table))
            .await
            .unwrap();
        let queue = PgQueue::open(&url, &justonce_test::unique_name("receipts"))
            .await
            .unwrap();
        let running = Relay::new(outbox, queue.clone(), idle_relay())
            .unwrap()
            .spawn();
        tokio::time::sleep(Duration::from_millis(300)).await;

        // Another pool, as another process would be.
        let producer = PgStore::open(&url).await.unwrap();
        let producer_outbox = producer
            .outbox_with(justonce::sql::OutboxOptions::default().table(&table))
            .await
            .unwrap();
        let mut tx = producer.begin().await.unwrap();
        let m = Message::new("{}").with_id("r-1").unwrap();
        producer_outbox.enqueue(&mut tx, &m, None).await.unwrap();
        producer.commit(tx).await.unwrap();

        let got = queue.receive(1, Duration::from_secs(10)).await.unwrap();
        assert_eq!(
            got.len(),
            1,
            "NOTIFY woke the relay within 10 s of an hour's poll"
        );
        queue.ack(&[&got[0].receipt]).await.unwrap();
        running.stop().await.unwrap();
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(producer.pool())
            .await
            .unwrap();
    }

    /// Appends each message to `arrivals` in the order it is applied.
    struct Arrivals {
        table: String,
    }

    impl Handler<PgTx> for Arrivals {
        fn lock_key(&self, m: &Message) -> Option<String> {
            let v: serde_json::Value = m.decode_json().ok()?;
            Some(v["key"].as_str()?.to_owned())
        }
        async fn handle(&self, cx: &Context<'_>, tx: &mut PgTx) -> Result<Disposition> {
            let v: serde_json::Value = cx.message().decode_json()?;
            sqlx::query(&format!(
                "INSERT INTO {} (okey, n) VALUES ($1, $2)",
                self.table
            ))
            .bind(v["key"].as_str().unwrap_or_default())
            .bind(v["n"].as_i64().unwrap_or(-1))
            .execute(&mut **tx)
            .await?;
            Ok(Disposition::Ok)
        }
    }

    /// Ten keys of a thousand messages each, enqueued by ten concurrent producers into the
    /// outbox `open` gives, relayed by three relays (each with a pool of its own, as three
    /// processes) into a PostgreSQL queue, applied by one consumer: each key's messages
    /// arrive in the order they were committed, each once. Answers the outbox, to drop.
    async fn ten_keys_through_three_relays<S, O, F, Fut, R, RFut>(url: &str, open: F, relay: R)
    where
        S: Store + Clone,
        O: OutboxStore<Tx = S::Tx> + Clone,
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = (S, O)>,
        R: Fn(O, PgQueue, RelayOptions) -> RFut,
        RFut: std::future::Future<Output = Relay<O>>,
    {
        const KEYS: usize = 10;
        const PER_KEY: usize = 1000;
        let queue_name = justonce_test::unique_name("ordered");
        let arrivals = format!("{}_arrivals", queue_name.replace('-', "_"));
        let pg = PgStore::open(url).await.unwrap();
        sqlx::query(&format!(
            "CREATE TABLE {arrivals} (at BIGSERIAL PRIMARY KEY, okey TEXT NOT NULL, n BIGINT NOT NULL)"
        ))
        .execute(pg.pool())
        .await
        .unwrap();
        let queue = PgQueue::open(url, &queue_name).await.unwrap();
        let (store, outbox) = open().await;

        let mut relays = Vec::new();
        for r in 0..3 {
            let (_, own_outbox) = open().await;
            let own_queue = PgQueue::open(url, &queue_name).await.unwrap();
            let opts = RelayOptions::default()
                .owner(format!("relay-{r}"))
                .batch(50)
                .poll_interval(Duration::from_millis(200));
            relays.push(relay(own_outbox, own_queue, opts).await.spawn());
        }
        let mut producers = tokio::task::JoinSet::new();
        for k in 0..KEYS {
            let store = store.clone();
            let outbox = outbox.clone();
            producers.spawn(async move {
                let key = format!("key-{k}");
                for chunk in 0..PER_KEY / 10 {
                    let mut tx = store.begin().await.unwrap();
                    for i in 0..10 {
                        let n = chunk * 10 + i;
                        let m = Message::new(format!(r#"{{"key":"{key}","n":{n}}}"#))
                            .with_id(format!("{key}-{n}"))
                            .unwrap();
                        outbox.enqueue(&mut tx, &m, Some(&key)).await.unwrap();
                    }
                    store.commit(tx).await.unwrap();
                }
            });
        }
        while let Some(r) = producers.join_next().await {
            r.unwrap();
        }
        let consumer = Consumer::new(
            ConsumerOptions::new(queue_name.as_str()).batch_size(100),
            queue.clone(),
            pg.clone(),
            Arrivals {
                table: arrivals.clone(),
            },
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(240);
        loop {
            consumer.run_once().await.unwrap();
            let (n,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM {arrivals}"))
                .fetch_one(pg.pool())
                .await
                .unwrap();
            if n as usize >= KEYS * PER_KEY {
                break;
            }
            if std::time::Instant::now() > deadline {
                let stats = outbox.outbox_stats().await.unwrap();
                panic!("only {n} arrived in time; outbox: {stats:?}");
            }
        }
        for running in relays {
            running.stop().await.unwrap();
        }
        let rows: Vec<(String, i64)> =
            sqlx::query_as(&format!("SELECT okey, n FROM {arrivals} ORDER BY at"))
                .fetch_all(pg.pool())
                .await
                .unwrap();
        assert_eq!(rows.len(), KEYS * PER_KEY, "each applied once");
        let mut next: HashMap<String, i64> = HashMap::new();
        for (key, n) in rows {
            let want = next.entry(key.clone()).or_insert(0);
            assert_eq!(n, *want, "key {key}: {n} arrived where {want} was due");
            *want += 1;
        }
        assert_eq!(outbox.outbox_stats().await.unwrap().pending, 0);
        sqlx::query(&format!("DROP TABLE {arrivals}"))
            .execute(pg.pool())
            .await
            .unwrap();
    }

    async fn publishing<O: OutboxStore>(o: O, q: PgQueue, opts: RelayOptions) -> Relay<O> {
        Relay::new(o, q, opts).unwrap()
    }

    /// [`ten_keys_through_three_relays`] from a PostgreSQL outbox, through relays that
    /// publish or that move the rows into the queue, in its database.
    async fn postgres_ten_keys(moving: bool) {
        // A test of postgres.rs restarts the server: not while this one runs.
        let _one_at_a_time = crate::postgres::RESTARTS.lock().await;
        let Some(url) = url() else { return };
        let table = justonce_test::unique_name("jo_obx_order").replace('-', "_");
        let open = || async {
            let store = PgStore::open(&url).await.unwrap();
            let ob = justonce::sql::OutboxOptions::default().table(&table);
            let outbox = store.outbox_with(ob).await.unwrap();
            (store, outbox)
        };
        let relay = |o: PgOutbox, q: PgQueue, opts: RelayOptions| async move {
            if !moving {
                return publishing(o, q, opts).await;
            }
            let mover = o.mover_into(&q).await.unwrap();
            Relay::moving(o, mover, opts).unwrap()
        };
        ten_keys_through_three_relays(&url, open, relay).await;
        let (store, _) = open().await;
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ten_keys_through_three_relays_keep_their_order_per_key() {
        postgres_ten_keys(false).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ten_keys_moved_by_three_relays_keep_their_order_per_key() {
        postgres_ten_keys(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_a_running_relay_gives_a_drained_tables_space_back() {
        let _one_at_a_time = crate::postgres::RESTARTS.lock().await;
        let Some(url) = url() else { return };
        let table = justonce_test::unique_name("jo_obx_tidy").replace('-', "_");
        let store = PgStore::open(&url).await.unwrap();
        let ob = justonce::sql::OutboxOptions::default().table(&table);
        let outbox = store.outbox_with(ob).await.unwrap();
        let queue = PgQueue::open(&url, &justonce_test::unique_name("tidy"))
            .await
            .unwrap();
        let pad = "x".repeat(200);
        for b in 0..20 {
            let mut tx = store.begin().await.unwrap();
            for i in 0..500 {
                let m = Message::new(format!(r#"{{"pad":"{pad}"}}"#))
                    .with_id(format!("t-{b}-{i}"))
                    .unwrap();
                outbox.enqueue(&mut tx, &m, None).await.unwrap();
            }
            store.commit(tx).await.unwrap();
        }
        let size = || async {
            let n: i64 = sqlx::query_scalar("SELECT pg_relation_size($1::regclass)")
                .bind(&table)
                .fetch_one(store.pool())
                .await
                .unwrap();
            n
        };
        let full = size().await;
        assert!(full > 1_000_000, "10,000 rows of 200 bytes: {full} bytes");
        let opts = RelayOptions::default()
            .batch(500)
            .tidy_interval(Duration::from_millis(300));
        let running = Relay::new(outbox.clone(), queue.clone(), opts)
            .unwrap()
            .spawn();
        // Ten seconds, against autovacuum's visit once a minute at most: it is the relay's
        // own VACUUM that gives the space back.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut now = full;
        while std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            now = size().await;
            if outbox.outbox_stats().await.unwrap().pending == 0 && now < full / 10 {
                break;
            }
        }
        running.stop().await.unwrap();
        assert_eq!(outbox.outbox_stats().await.unwrap().pending, 0);
        assert!(
            now < full / 10,
            "the relay's VACUUM shrank the drained table: {full} -> {now} bytes"
        );
        queue.delete().await.unwrap();
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }

    #[cfg(feature = "mysql")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mariadb_ten_keys_through_three_relays_keep_their_order_per_key() {
        use justonce::sql::MySqlStore;
        let _one_at_a_time = crate::postgres::RESTARTS.lock().await;
        let Some(url) = url() else { return };
        if !justonce_test::service_available("MariaDB", "127.0.0.1:3306") {
            return;
        }
        let my_url = std::env::var("JUSTONCE_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
        let table = justonce_test::unique_name("jo_obx_order").replace('-', "_");
        let open = || async {
            let store = MySqlStore::open(&my_url).await.unwrap();
            let ob = justonce::sql::OutboxOptions::default().table(&table);
            let outbox = store.outbox_with(ob).await.unwrap();
            (store, outbox)
        };
        ten_keys_through_three_relays(&url, open, publishing).await;
        let (store, _) = open().await;
        for t in [table.clone(), format!("{table}_locks")] {
            sqlx::query(&format!("DROP TABLE {t}"))
                .execute(store.pool())
                .await
                .unwrap();
        }
    }
}
