//! The runtime with its dedup records in PostgreSQL, through a PostgreSQL restart.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use justonce::sql::{
    PgQueue, PgQueueOptions, PgStore, PgStoreOptions, PgTx, SqliteQueue, SqliteQueueOptions,
};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result, Source,
};

fn url() -> Option<String> {
    justonce_test::service_available("PostgreSQL", "127.0.0.1:5432").then(|| {
        std::env::var("JUSTONCE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    })
}

struct Ledger {
    table: String,
}

impl Handler<PgTx> for Ledger {
    async fn handle(&self, cx: &Context<'_>, tx: &mut PgTx) -> Result<Disposition> {
        sqlx::query(&format!(
            "INSERT INTO {} (order_id) VALUES ($1)",
            self.table
        ))
        .bind(cx.message().id().unwrap().as_str())
        .execute(&mut **tx)
        .await?;
        Ok(Disposition::Ok)
    }
}

/// Starts PostgreSQL again however the test ends.
struct StartOnDrop;

impl Drop for StartOnDrop {
    fn drop(&mut self) {
        let _ = pg_ctl("start");
    }
}

fn pg_ctl(action: &str) -> std::io::Result<std::process::Output> {
    let version = std::fs::read_dir("/etc/postgresql")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max()
        .unwrap_or_else(|| "15".into());
    Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", action])
        .output()
}

/// The restart tests restart the one PostgreSQL server: one at a time, and no other test of
/// this file runs meanwhile. Taken before the service check, which a restart in progress
/// would fail.
pub(crate) static RESTARTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where the orders wait: the embedded SQLite queue, or a PostgreSQL queue in the database
/// of the store, acked inside the business transaction.
#[derive(Clone)]
enum Queue {
    Sqlite(SqliteQueue),
    Pg(PgQueue),
}

impl Queue {
    fn source(&self) -> Arc<dyn Source> {
        match self {
            Queue::Sqlite(q) => Arc::new(q.clone()),
            Queue::Pg(q) => Arc::new(q.clone()),
        }
    }

    /// Messages still pending; `None` while the database cannot answer.
    async fn pending(&self) -> Option<u64> {
        match self {
            Queue::Sqlite(q) => q.stats().await.ok().map(|s| s.pending),
            Queue::Pg(q) => q.stats().await.ok().map(|s| s.pending),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_consume_loses_nothing_and_duplicates_nothing() {
    let _one_at_a_time = RESTARTS.lock().await;
    let Some(url) = url() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut qopts = SqliteQueueOptions::default();
    qopts.lease = Duration::from_secs(2);
    let queue = SqliteQueue::open_with(
        &format!("sqlite:{}", dir.path().join("q.db").display()),
        "orders",
        qopts,
    )
    .await
    .unwrap();
    consume_through_a_restart(&url, Queue::Sqlite(queue)).await;
}

/// The queue is in the restarted database too, and acks inside the business transaction:
/// the batch in flight rolls back with its acks, and comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_queue_acking_in_the_transaction_survives_a_restart() {
    let _one_at_a_time = RESTARTS.lock().await;
    let Some(url) = url() else { return };
    let mut qopts = PgQueueOptions::default();
    qopts.lease = Duration::from_secs(2);
    let name = justonce_test::unique_name("jo-rt-pgq");
    let queue = PgQueue::open_with(&url, &name, qopts).await.unwrap();
    consume_through_a_restart(&url, Queue::Pg(queue.clone())).await;
    assert_eq!(queue.stats().await.unwrap().dead_letters, 0);
    queue.delete().await.unwrap();
}

/// Consumes 3000 orders, restarting PostgreSQL once 300 are applied, then checks the
/// ledger: every order exactly once.
async fn consume_through_a_restart(url: &str, queue: Queue) {
    const ORDERS: usize = 3000;
    let msgs: Vec<Message> = (0..ORDERS)
        .map(|i| Message::new("{}").with_id(format!("o-{i:05}")).unwrap())
        .collect();
    match &queue {
        Queue::Sqlite(q) => q.publish_batch(&msgs).await.unwrap(),
        Queue::Pg(q) => q.publish_batch(&msgs).await.unwrap(),
    }

    let mut sopts = PgStoreOptions::default();
    sopts.dedup_table = justonce_test::unique_name("jo_dedup_rt");
    let dedup = sopts.dedup_table.clone();
    let store = PgStore::open_with(url, sopts).await.unwrap();
    let ledger = justonce_test::unique_name("jo_ledger_rt");
    sqlx::query(&format!("CREATE TABLE {ledger} (order_id TEXT NOT NULL)"))
        .execute(store.pool())
        .await
        .unwrap();

    let mut opts = ConsumerOptions::new("ledger");
    opts.batching.size = 50;
    opts.batching.receive_wait = Duration::from_millis(100);
    opts.retry.backoff_base = Duration::from_millis(100);
    opts.retry.backoff_max = Duration::from_secs(1);
    let mut consumer = Consumer::new(
        opts,
        queue.source(),
        store.clone(),
        Ledger {
            table: ledger.clone(),
        },
    )
    .unwrap();
    if let Queue::Pg(q) = &queue {
        consumer = consumer.with_transactional_ack(Arc::new(q.clone()));
    }
    let run = {
        let queue = queue.clone();
        tokio::spawn(async move {
            consumer
                .run_until(async move {
                    while queue.pending().await != Some(0) {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
                .await
        })
    };

    let count = format!("SELECT COUNT(*) FROM {ledger}");
    while sqlx::query_scalar::<_, i64>(&count)
        .fetch_one(store.pool())
        .await
        .unwrap()
        < 300
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = postmaster_start(&store).await;
    let guard = StartOnDrop;
    let out = tokio::task::spawn_blocking(|| pg_ctl("restart"))
        .await
        .unwrap()
        .expect("pg_ctlcluster runs");
    assert!(
        out.status.success(),
        "restart failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(guard);
    tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("drains after the restart")
        .unwrap()
        .unwrap();
    assert_ne!(
        postmaster_start(&store).await,
        started,
        "the server restarted"
    );

    let wrong: Vec<(String, i64)> = sqlx::query_as(&format!(
        "SELECT order_id, COUNT(*) FROM {ledger} GROUP BY order_id HAVING COUNT(*) <> 1"
    ))
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(wrong.is_empty(), "applied more than once: {wrong:?}");
    let applied: i64 =
        sqlx::query_scalar(&format!("SELECT COUNT(DISTINCT order_id) FROM {ledger}"))
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(applied as usize, ORDERS, "every order applied");
    for t in [&ledger, &dedup] {
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// When the server started, read until it answers again.
async fn postmaster_start(store: &PgStore) -> String {
    loop {
        match sqlx::query_scalar::<_, String>("SELECT pg_postmaster_start_time()::text")
            .fetch_one(store.pool())
            .await
        {
            Ok(t) => return t,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A deploy whose migration has not run: the business table is missing. Every good message
/// must stay in the queue (none dead-lettered, no attempt counted), and the consumer applies
/// them all once the table is created. The breaker is off: this is the SQLSTATE
/// classification alone (42P01, undefined table), which a mutation treating it as the
/// message's fault fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_business_table_pauses_the_consumer_instead_of_dead_lettering() {
    let _one_at_a_time = RESTARTS.lock().await;
    let Some(url) = url() else { return };
    const ORDERS: usize = 50;
    let dir = tempfile::tempdir().unwrap();
    let queue = SqliteQueue::open(
        &format!("sqlite:{}", dir.path().join("q.db").display()),
        "orders",
    )
    .await
    .unwrap();
    let msgs: Vec<Message> = (0..ORDERS)
        .map(|i| Message::new("{}").with_id(format!("o-{i:03}")).unwrap())
        .collect();
    queue.publish_batch(&msgs).await.unwrap();

    let mut sopts = PgStoreOptions::default();
    sopts.dedup_table = justonce_test::unique_name("jo_dedup_schema");
    let dedup = sopts.dedup_table.clone();
    let store = PgStore::open_with(&url, sopts).await.unwrap();
    let ledger = justonce_test::unique_name("jo_ledger_schema");

    let mut opts = ConsumerOptions::new("ledger");
    opts.batching.size = 10;
    opts.retry.max_attempts = 2;
    opts.batching.receive_wait = Duration::from_millis(50);
    opts.retry.backoff_base = Duration::from_millis(20);
    opts.retry.backoff_max = Duration::from_millis(100);
    opts.breaker = justonce::BreakerOptions::disabled();
    let consumer = Consumer::new(
        opts,
        queue.clone(),
        store.clone(),
        Ledger {
            table: ledger.clone(),
        },
    )
    .unwrap();
    let run = {
        let queue = queue.clone();
        tokio::spawn(async move {
            consumer
                .run_until(async move {
                    while queue.stats().await.map(|s| s.pending).unwrap_or(1) > 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await
        })
    };

    // Long enough for many batches to fail, and for the attempt limit (2) to have
    // dead-lettered every one of them had a hand-back counted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = queue.stats().await.unwrap();
    let dead = queue.dead_letters().await.unwrap();
    assert_eq!(
        stats.dead_letters,
        0,
        "{}",
        dead.first().map_or("", |d| d.reason.error.as_str())
    );
    assert_eq!(stats.pending, ORDERS as u64, "every order still waits");
    assert!(
        stats.deliveries > ORDERS as u64,
        "the consumer kept trying: {stats:?}"
    );

    sqlx::query(&format!("CREATE TABLE {ledger} (order_id TEXT NOT NULL)"))
        .execute(store.pool())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("drains once the table exists")
        .unwrap()
        .unwrap();
    let applied: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {ledger}"))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(applied as usize, ORDERS, "every order applied once");
    assert_eq!(queue.stats().await.unwrap().dead_letters, 0);
    for t in [&ledger, &dedup] {
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// Credits the account its payload names, records the order in a ledger ([`Ledger`]), and
/// holds its lock a while, as a handler doing more work would. It names no
/// `Handler::lock_key`.
struct Credit {
    accounts: String,
    ledger: Ledger,
}

impl Handler<PgTx> for Credit {
    async fn handle(&self, cx: &Context<'_>, tx: &mut PgTx) -> Result<Disposition> {
        let account: i32 = cx.message().decode_json()?;
        sqlx::query(&format!(
            "UPDATE {} SET balance = balance + 1 WHERE id = $1",
            self.accounts
        ))
        .bind(account)
        .execute(&mut **tx)
        .await?;
        self.ledger.handle(cx, tx).await?;
        sqlx::query("SELECT pg_sleep(0.3)")
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Two consumers on a hot pair of accounts, whose batches lock them in opposite orders,
/// with a handler that names no `lock_key`: the deadlock they close is cut short by the
/// batches' patience (a lock timeout at a quarter of a second, before PostgreSQL's detector
/// at one), a warning names `Handler::lock_key` and the guide's section, the consumers'
/// metric counts the conflict, and every order is applied once, in the consumer's turn.
#[test]
fn a_lock_conflict_between_two_consumers_is_warned_of_counted_and_every_order_applied_once() {
    use justonce::memory::MemoryQueue;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let Some(url) = url() else { return };
    let recorder = DebuggingRecorder::new();
    let logs = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (balances, ledger_rows) = tracing::subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            rt.block_on(async {
                let _one_at_a_time = RESTARTS.lock().await;
                let pool = sqlx::PgPool::connect(&url).await.unwrap();
                let accounts = justonce_test::unique_name("jo_accounts");
                let ledger = justonce_test::unique_name("jo_ledger_hot");
                for ddl in [
                    format!("CREATE TABLE {accounts} (id int PRIMARY KEY, balance int NOT NULL)"),
                    format!("INSERT INTO {accounts} VALUES (1, 0), (2, 0)"),
                    format!("CREATE TABLE {ledger} (order_id text PRIMARY KEY)"),
                ] {
                    sqlx::query(&ddl).execute(&pool).await.unwrap();
                }
                let mut sopts = PgStoreOptions::default();
                sopts.dedup_table = justonce_test::unique_name("jo_dedup_hot");
                let store = PgStore::open_with(&url, sopts).await.unwrap();
                let consumer = |name: &str, order: [i32; 2]| {
                    let q = Arc::new(MemoryQueue::new(name, Duration::from_secs(30)));
                    let msgs: Vec<Message> = order
                        .iter()
                        .map(|a| {
                            Message::new(a.to_string())
                                .with_id(format!("{name}-{a}"))
                                .unwrap()
                        })
                        .collect();
                    let mut o = ConsumerOptions::new("payments");
                    o.batching.size = 2;
                    o.batching.linger = Duration::ZERO;
                    let handler = Credit {
                        accounts: accounts.clone(),
                        ledger: Ledger {
                            table: ledger.clone(),
                        },
                    };
                    let source: Arc<dyn Source> = q.clone();
                    let c = Consumer::new(o, source, store.clone(), handler).unwrap();
                    (q, msgs, c)
                };
                let (qa, ma, a) = consumer("a", [1, 2]);
                let (qb, mb, b) = consumer("b", [2, 1]);
                qa.publish_batch(&ma).await.unwrap();
                qb.publish_batch(&mb).await.unwrap();
                let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
                assert_eq!(ra.unwrap().acked + rb.unwrap().acked, 4);
                let balances: Vec<i32> =
                    sqlx::query_scalar(&format!("SELECT balance FROM {accounts} ORDER BY id"))
                        .fetch_all(&pool)
                        .await
                        .unwrap();
                let rows: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {ledger}"))
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                for t in [&accounts, &ledger] {
                    sqlx::query(&format!("DROP TABLE {t}"))
                        .execute(&pool)
                        .await
                        .unwrap();
                }
                (balances, rows)
            })
        })
    });
    assert_eq!(balances, [2, 2], "each account credited once per order");
    assert_eq!(ledger_rows, 4);
    let conflicts: u64 = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "justonce_lock_conflicts_total")
        .map(|(.., v)| match v {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert!(conflicts >= 1, "the metric counted no conflict");
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let line = logs
        .lines()
        .find(|l| l.contains("lock conflicts in the store"))
        .unwrap_or_else(|| panic!("no warning of the conflict: {logs}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("implement Handler::lock_key"), "{line}");
    assert!(
        line.contains("docs/guide/failures.md#deadlocks-when-you-scale-out"),
        "{line}"
    );
    assert!(
        line.contains("lock timeout"),
        "the server's error, the patience's lock timeout: {line}"
    );
    assert!(line.contains("take turns in the store"), "{line}");
}
