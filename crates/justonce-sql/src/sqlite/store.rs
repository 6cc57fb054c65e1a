use std::sync::Arc;

use justonce_core::{validate_identifier, Result};
use sqlx::{Sqlite, SqlitePool};

use super::{connect, NOW_MS};
use crate::common::{impl_dedup_store, DedupSql, ManyOrder, ManySql};

/// The transaction a handler on a [`SqliteStore`] receives: write through `&mut **tx`.
pub type SqliteTx = sqlx::Transaction<'static, Sqlite>;

fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             consumer     TEXT    NOT NULL,
             message_id   TEXT    NOT NULL,
             fingerprint  TEXT    NOT NULL,
             processed_at INTEGER NOT NULL,
             PRIMARY KEY (consumer, message_id)
         ) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS {table}_processed_at ON {table} (processed_at);"
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
}

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
            fingerprint: format!("SELECT fingerprint FROM {table} WHERE consumer = ? AND message_id = ?"),
            purge: format!(
                "DELETE FROM {table} WHERE (consumer, message_id) IN (
                     SELECT consumer, message_id FROM {table} WHERE processed_at < {NOW_MS} - ? LIMIT ?)"
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
        })
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl_dedup_store!(SqliteStore, SqliteTx, "sqlite", begin: begin_with("BEGIN IMMEDIATE"));
