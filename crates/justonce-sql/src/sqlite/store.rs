use std::sync::Arc;
use std::time::Duration;

use justonce_core::{validate_identifier, Result};
use sqlx::{Sqlite, SqlitePool};
use tokio::sync::Mutex;

use super::{connect, NOW_MS};
use crate::common::{impl_dedup_store, DedupSql, ManyOrder, ManySql};

/// The transaction a handler on a [`SqliteStore`] receives: write through `&mut **tx`.
pub type SqliteTx = sqlx::Transaction<'static, Sqlite>;

/// The dedup table: one B-tree in key order, and no index on `processed_at` (it would hold
/// every key a second time and make each batch write about 70% more pages; the purge
/// sweeps the keys instead, see `SqliteStore::sweep`). The index that tables of earlier
/// versions have is dropped: nothing reads it any more.
fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             consumer     TEXT    NOT NULL,
             message_id   TEXT    NOT NULL,
             fingerprint  TEXT    NOT NULL,
             processed_at INTEGER NOT NULL,
             PRIMARY KEY (consumer, message_id)
         ) WITHOUT ROWID;
         DROP INDEX IF EXISTS {table}_processed_at;"
    )
}

/// How a [`SqliteStore`] keeps its dedup records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteStoreOptions {
    /// The dedup table's name (default `jo_dedup`), validated as an SQL identifier.
    pub dedup_table: String,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for SqliteStoreOptions {
    fn default() -> Self {
        SqliteStoreOptions {
            dedup_table: "jo_dedup".into(),
            max_connections: 4,
        }
    }
}

/// The dedup store on SQLite, in the same file as your business tables.
///
/// Transactions start with `BEGIN IMMEDIATE`, so a handler that reads before it writes
/// cannot fail on a stale snapshot under SQLite's single writer.
///
/// ```no_run
/// use justonce_sql::SqliteStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = SqliteStore::open("sqlite:app.db").await?;
/// sqlx::query("CREATE TABLE IF NOT EXISTS ledger (order_id TEXT, cents INTEGER)")
///     .execute(store.pool())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<DedupSql>,
    sweep: Arc<Mutex<Sweep>>,
    /// The sweep's read of one window: `(after, batch)`.
    sweep_read: Arc<str>,
}

/// Where the purge's pass over the dedup table's keys is.
#[derive(Debug, Default)]
struct Sweep {
    /// The last key the pass has looked at; `None` between passes.
    after: Option<(String, String)>,
    /// The store's clock when the pass began: every key it did not see is younger.
    began: i64,
    /// The oldest `processed_at` the pass has kept so far.
    oldest_kept: Option<i64>,
    /// What the last finished pass left: no record is older than this (ms, store clock).
    horizon: Option<i64>,
}

/// A pass waits until the oldest record it may find is this fraction of the retention
/// past its expiry, so that passes are rare (a record is kept for 1 to 1.125 retentions).
const SLACK_DIVISOR: i64 = 8;

impl SqliteStore {
    /// Opens (creating if needed) the SQLite file at `url` and its dedup table `jo_dedup`.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, SqliteStoreOptions::default()).await
    }

    /// As [`SqliteStore::open`], with options.
    pub async fn open_with(url: &str, opts: SqliteStoreOptions) -> Result<Self> {
        let table = &opts.dedup_table;
        validate_identifier(table)?;
        let pool = connect(url, true, opts.max_connections).await?;
        sqlx::raw_sql(&schema(table)).execute(&pool).await?;
        let sql = DedupSql {
            lock: None,
            claim: format!(
                "INSERT INTO {table} (consumer, message_id, fingerprint, processed_at)
                 VALUES (?, ?, ?, {NOW_MS}) ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            fingerprint: format!(
                "SELECT fingerprint FROM {table} WHERE consumer = ? AND message_id = ?"
            ),
            // The sweep's delete of one window: `(after, last, cutoff, batch)`.
            purge: format!(
                "DELETE FROM {table} WHERE (consumer, message_id) IN (
                     SELECT consumer, message_id FROM {table}
                     WHERE (consumer, message_id) > (?1, ?2) AND (consumer, message_id) <= (?3, ?4)
                       AND processed_at < ?5 LIMIT ?6)"
            ),
            many: Some(ManySql::new(
                table,
                (", processed_at", format!(", {NOW_MS}")),
                ManyOrder::StatementRollback,
            )),
        };
        Ok(SqliteStore {
            pool,
            sql: Arc::new(sql),
            sweep: Arc::default(),
            sweep_read: format!(
                "SELECT consumer, message_id, processed_at FROM {table}
                 WHERE (consumer, message_id) > (?, ?) ORDER BY consumer, message_id LIMIT ?"
            )
            .into(),
        })
    }

    /// The purge: a pass over the table in key order, `batch` keys at a time. Each window is
    /// read outside any transaction (WAL readers never wait for the writer), then its expired
    /// records are deleted by one short statement over the window's key range, so a purge
    /// never holds the write lock for longer than one window. A call goes on from where the
    /// last one stopped until it has deleted `batch` records or the pass ends. A finished
    /// pass knows the oldest record it kept; the next pass starts only once that record is
    /// an eighth of the retention past its expiry, so a table with nothing to purge is read
    /// once per eighth of the retention, not once per purge interval.
    async fn sweep(&self, retention: Duration, batch: u32) -> Result<Option<u64>> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&self.pool)
            .await?;
        let cutoff = now.saturating_sub(retention_ms);
        let mut sweep = self.sweep.lock().await;
        if sweep.after.is_none() {
            let due = sweep
                .horizon
                .map(|h| h.saturating_add(retention_ms / SLACK_DIVISOR));
            if due.is_some_and(|due| cutoff <= due) {
                return Ok(Some(0));
            }
            *sweep = Sweep {
                after: Some((String::new(), String::new())),
                began: now,
                oldest_kept: None,
                horizon: sweep.horizon,
            };
        }
        let mut deleted = 0u64;
        while deleted < u64::from(batch) {
            let want = u64::from(batch) - deleted;
            let (c, m) = sweep.after.clone().unwrap_or_default();
            let rows: Vec<(String, String, i64)> = sqlx::query_as(&self.sweep_read)
                .bind(&c)
                .bind(&m)
                .bind(want as i64)
                .fetch_all(&self.pool)
                .await?;
            let expired = rows.iter().any(|r| r.2 < cutoff);
            let kept = rows.iter().map(|r| r.2).filter(|&at| at >= cutoff).min();
            if let Some(k) = kept {
                sweep.oldest_kept = Some(sweep.oldest_kept.map_or(k, |o| o.min(k)));
            }
            let end = (rows.len() as u64) < want;
            if let (true, Some((lc, lm, _))) = (expired, rows.last()) {
                deleted += sqlx::query(&self.sql.purge)
                    .bind(&c)
                    .bind(&m)
                    .bind(lc)
                    .bind(lm)
                    .bind(cutoff)
                    .bind(want as i64)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
            }
            match rows.into_iter().last() {
                Some((lc, lm, _)) if !end => sweep.after = Some((lc, lm)),
                _ => {
                    let began = sweep.began;
                    sweep.horizon = Some(sweep.oldest_kept.map_or(began, |o| o.min(began)));
                    sweep.after = None;
                    break;
                }
            }
        }
        Ok(Some(deleted))
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl_dedup_store!(
    SqliteStore, SqliteTx, "sqlite", begin: begin_with("BEGIN IMMEDIATE"), purge: sweep
);
