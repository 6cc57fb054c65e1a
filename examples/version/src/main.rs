//! Version / CAS: each change carries the version it expects. The guard bumps the version
//! only if it matches; a replay finds a newer version (stale: a duplicate), and a change
//! that arrives before its predecessor finds an older one (ahead: retried later, never
//! mistaken for a duplicate).
//!
//! `cargo run -p example-version`

use std::time::Duration;

use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx, SqliteVersionGuard};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Idempotency, Message,
    Publisher, Result, RetryOptions,
};

struct SetLimit {
    guard: SqliteVersionGuard,
}

impl Handler<SqliteTx> for SetLimit {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let change: serde_json::Value = cx.message().decode_json()?;
        let expected = change["expected_version"].as_i64().unwrap_or(-1);
        if let Some(done) = self
            .guard
            .bump(tx, "acct-1", expected)
            .await?
            .to_disposition(expected)
        {
            return Ok(done);
        }
        sqlx::query("UPDATE accounts SET credit_limit = ? WHERE id = 'acct-1'")
            .bind(change["limit"].as_i64())
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::config(e.to_string()))?;
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("queue.db"), "limits").await?;
    let store = SqliteStore::open(&url("app.db")).await?;
    sqlx::raw_sql(
        "CREATE TABLE accounts (id TEXT PRIMARY KEY, credit_limit INTEGER, version INTEGER NOT NULL);
         INSERT INTO accounts VALUES ('acct-1', 100, 0);",
    )
    .execute(store.pool())
    .await?;

    let change = |v: i64, limit: i64| -> Result<Message> {
        Message::new(format!(r#"{{"expected_version":{v},"limit":{limit}}}"#))
            .with_id(format!("chg-{v}"))
    };
    // Out of order, and the first change replayed.
    queue
        .publish_batch(&[change(1, 300)?, change(0, 200)?, change(0, 200)?])
        .await?;

    let opts = ConsumerOptions::new("limits")
        .idempotency(Idempotency::Guard)
        .batch_size(1)
        .retry(RetryOptions::default().backoff(Duration::from_millis(50), Duration::from_secs(30)));
    let consumer = Consumer::new(
        opts,
        queue.clone(),
        store.clone(),
        SetLimit {
            guard: SqliteVersionGuard::new("accounts", "id", "version")?,
        },
    )?;
    while queue.stats().await?.pending > 0 {
        consumer.run_once().await?;
    }

    let (limit, version): (i64, i64) = sqlx::query_as("SELECT credit_limit, version FROM accounts")
        .fetch_one(store.pool())
        .await?;
    println!("credit limit {limit} at version {version}");
    if (limit, version) != (300, 2) {
        return Err(Error::config(format!(
            "expected (300, 2), got ({limit}, {version})"
        )));
    }
    Ok(())
}
