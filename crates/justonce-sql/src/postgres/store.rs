use std::sync::Arc;

use justonce_core::{validate_identifier, Result};
use sqlx::{PgPool, Postgres};

use super::{connect, create, MS};
use crate::common::{impl_dedup_store, DedupSql};

/// The transaction a handler on a [`PgStore`] receives: write through `&mut **tx`.
pub type PgTx = sqlx::Transaction<'static, Postgres>;

/// How a [`PgStore`] keeps its dedup records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgStoreOptions {
    /// The dedup table's name (default `jo_dedup`), validated as an SQL identifier.
    pub dedup_table: String,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for PgStoreOptions {
    fn default() -> Self {
        PgStoreOptions {
            dedup_table: "jo_dedup".into(),
            max_connections: 8,
        }
    }
}

/// The dedup store on PostgreSQL, in the same database as your business tables.
///
/// The claim is `INSERT … ON CONFLICT DO NOTHING` in the handler's transaction; a second
/// transaction claiming the same key waits for the first to commit or roll back, then
/// sees the outcome. Records are stamped with the database's clock.
///
/// ```no_run
/// use justonce_sql::PgStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = PgStore::open("postgres://app@127.0.0.1:5432/shop").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    sql: Arc<DedupSql>,
}

impl PgStore {
    /// Connects and creates the dedup table `jo_dedup` if missing.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, PgStoreOptions::default()).await
    }

    /// As [`PgStore::open`], with options.
    pub async fn open_with(url: &str, opts: PgStoreOptions) -> Result<Self> {
        let t = &opts.dedup_table;
        validate_identifier(t)?;
        let pool = connect(url, opts.max_connections).await?;
        create(
            &pool,
            &[
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                         consumer     TEXT        NOT NULL,
                         message_id   TEXT        NOT NULL,
                         fingerprint  TEXT        NOT NULL,
                         processed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         PRIMARY KEY (consumer, message_id))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_processed_at ON {t} (processed_at)"),
            ],
        )
        .await?;
        let sql = DedupSql {
            claim: format!(
                "INSERT INTO {t} (consumer, message_id, fingerprint) VALUES ($1, $2, $3)
                 ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            fingerprint: format!("SELECT fingerprint FROM {t} WHERE consumer = $1 AND message_id = $2"),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN (
                     SELECT ctid FROM {t} WHERE processed_at < clock_timestamp() - $1 * {MS} LIMIT $2)"
            ),
        };
        Ok(PgStore {
            pool,
            sql: Arc::new(sql),
        })
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl_dedup_store!(PgStore, PgTx, "postgres", begin: begin());
