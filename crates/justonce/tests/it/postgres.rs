//! The runtime with its dedup records in PostgreSQL, through a PostgreSQL restart.

use std::process::Command;
use std::time::Duration;

use justonce::sql::{PgStore, PgStoreOptions, PgTx, SqliteQueue, SqliteQueueOptions};
use justonce::{
    async_trait, conformance, Consumer, ConsumerOptions, Context, Disposition, Handler, Message,
    Publisher, Result,
};

fn url() -> Option<String> {
    conformance::service_available("PostgreSQL", "127.0.0.1:5432").then(|| {
        std::env::var("JUSTONCE_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
    })
}

struct Ledger {
    table: String,
}

#[async_trait]
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_consume_loses_nothing_and_duplicates_nothing() {
    let Some(url) = url() else { return };
    const ORDERS: usize = 3000;
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
    let msgs: Vec<Message> = (0..ORDERS)
        .map(|i| Message::new("{}").with_id(format!("o-{i:05}")).unwrap())
        .collect();
    queue.publish_batch(&msgs).await.unwrap();

    let mut sopts = PgStoreOptions::default();
    sopts.dedup_table = conformance::unique_name("jo_dedup_rt");
    let dedup = sopts.dedup_table.clone();
    let store = PgStore::open_with(&url, sopts).await.unwrap();
    let ledger = conformance::unique_name("jo_ledger_rt");
    sqlx::query(&format!("CREATE TABLE {ledger} (order_id TEXT NOT NULL)"))
        .execute(store.pool())
        .await
        .unwrap();

    let mut opts = ConsumerOptions::new("ledger");
    opts.batch_size = 50;
    opts.receive_wait = Duration::from_millis(100);
    opts.backoff_base = Duration::from_millis(100);
    opts.backoff_max = Duration::from_secs(1);
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
                    while queue.stats().await.unwrap().pending > 0 {
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
