//! A simulated third-party payment API, in a SQLite database of its own: it records every
//! call and charges once per idempotency key, as payment APIs do.

use std::collections::HashMap;

use justonce::Result;
use sqlx::{Row, SqlitePool};

use super::{Effects, Payment};

/// A simulated third-party payment API in a database of its own: it records every call,
/// and charges once per idempotency key, as payment APIs do.
#[derive(Debug, Clone)]
pub(crate) struct PaymentApi {
    pool: SqlitePool,
}

impl PaymentApi {
    /// Opens the API's own database. It stands in for a remote service whose disk is not
    /// what the demo tests, so it does not fsync (`synchronous=OFF`): its writes survive our
    /// process dying, which is the fault the demo injects, but not an OS crash.
    pub(crate) async fn open(url: &str) -> Result<Self> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let opts = url
            .parse::<SqliteConnectOptions>()
            .map_err(|e| justonce::Error::config(format!("bad payment API URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Off)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = SqlitePool::connect_with(opts).await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS api_calls (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL,
                 order_id TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS api_charges (
                 idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL,
                 account INTEGER NOT NULL, amount INTEGER NOT NULL);",
        )
        .execute(&pool)
        .await?;
        Ok(PaymentApi { pool })
    }

    /// One call: recorded, and charged unless the key was charged before.
    pub(crate) async fn charge(&self, key: &str, p: &Payment) -> Result<()> {
        let mut tx = justonce::sql::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO api_calls (idempotency_key, order_id) VALUES (?, ?)")
            .bind(key)
            .bind(&p.order_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO api_charges (idempotency_key, order_id, account, amount) VALUES (?, ?, ?, ?)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(&p.order_id)
        .bind(p.account)
        .bind(p.amount)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Charges per order, and the calls the API received.
    pub(crate) async fn effects(&self) -> Result<(Effects, u64)> {
        let (per_order, total) = per_order(&self.pool, "api_charges").await?;
        let calls: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_calls")
            .fetch_one(&self.pool)
            .await?;
        Ok((
            Effects {
                per_order,
                total,
                consistent: true,
            },
            calls as u64,
        ))
    }
}

/// Rows per order id in `table` (the ledger, or the API's charges), and their total.
async fn per_order(pool: &SqlitePool, table: &str) -> Result<(HashMap<String, u64>, u64)> {
    let rows = sqlx::query(&format!(
        "SELECT order_id, COUNT(*) FROM {table} GROUP BY order_id"
    ))
    .fetch_all(pool)
    .await?;
    let per_order: HashMap<String, u64> = rows
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
        .collect();
    let total = per_order.values().sum();
    Ok((per_order, total))
}
