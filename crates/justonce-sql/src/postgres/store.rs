use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{validate_identifier, Claim, DedupKey, DedupStore, Fingerprint, Result, Store};
use sqlx::{PgPool, Postgres};

use super::{connect, create};

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

#[derive(Debug)]
struct Sql {
    claim: String,
    fingerprint: String,
    purge: String,
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
    sql: Arc<Sql>,
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
        let sql = Sql {
            claim: format!(
                "INSERT INTO {t} (consumer, message_id, fingerprint) VALUES ($1, $2, $3)
                 ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            fingerprint: format!("SELECT fingerprint FROM {t} WHERE consumer = $1 AND message_id = $2"),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN (
                     SELECT ctid FROM {t}
                     WHERE processed_at < clock_timestamp() - ($1::double precision * interval '1 millisecond')
                     LIMIT $2)"
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

#[async_trait]
impl Store for PgStore {
    type Tx = PgTx;

    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn begin(&self) -> Result<PgTx> {
        Ok(self.pool.begin().await?)
    }

    async fn commit(&self, tx: PgTx) -> Result<()> {
        Ok(tx.commit().await?)
    }

    async fn rollback(&self, tx: PgTx) -> Result<()> {
        Ok(tx.rollback().await?)
    }

    async fn savepoint(&self, tx: &mut PgTx) -> Result<()> {
        sqlx::query("SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn release_savepoint(&self, tx: &mut PgTx) -> Result<()> {
        sqlx::query("RELEASE SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&self, tx: &mut PgTx) -> Result<()> {
        sqlx::query("ROLLBACK TO SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        sqlx::query("RELEASE SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl DedupStore for PgStore {
    async fn claim(&self, tx: &mut PgTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        let inserted = sqlx::query(&self.sql.claim)
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .bind(fp.to_hex())
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if inserted == 1 {
            return Ok(Claim::Fresh);
        }
        let stored: String = sqlx::query_scalar(&self.sql.fingerprint)
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .fetch_one(&mut **tx)
            .await?;
        Ok(match Fingerprint::from_hex(&stored) {
            Some(s) if s == fp => Claim::Duplicate,
            Some(s) => Claim::Conflict { stored: s },
            None => Claim::Conflict {
                stored: Fingerprint::of(stored.as_bytes()),
            },
        })
    }

    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        Ok(sqlx::query(&self.sql.purge)
            .bind(retention.as_millis() as f64)
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}
