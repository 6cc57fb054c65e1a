use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{validate_identifier, Claim, DedupKey, DedupStore, Fingerprint, Result, Store};
use sqlx::{MySql, MySqlPool};

use super::connect;

/// The transaction a handler on a [`MySqlStore`] receives: write through `&mut **tx`.
pub type MySqlTx = sqlx::Transaction<'static, MySql>;

/// How a [`MySqlStore`] keeps its dedup records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MySqlStoreOptions {
    /// The dedup table's name (default `jo_dedup`), validated as an SQL identifier.
    pub dedup_table: String,
    /// Connections in the pool.
    pub max_connections: u32,
}

impl Default for MySqlStoreOptions {
    fn default() -> Self {
        MySqlStoreOptions {
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

/// The dedup store on MariaDB (or MySQL), InnoDB, in the same database as your business
/// tables.
///
/// The claim is `INSERT IGNORE` in the handler's transaction, decided by its affected rows,
/// as the source article shows. A second transaction claiming the same key waits on the
/// first's row lock; the fingerprint is then read with a locking read, so it sees the
/// committed row whatever the isolation level's snapshot.
///
/// ```no_run
/// use justonce_sql::MySqlStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = MySqlStore::open("mysql://app@127.0.0.1:3306/shop").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    sql: Arc<Sql>,
}

impl MySqlStore {
    /// Connects and creates the dedup table `jo_dedup` if missing.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, MySqlStoreOptions::default()).await
    }

    /// As [`MySqlStore::open`], with options.
    pub async fn open_with(url: &str, opts: MySqlStoreOptions) -> Result<Self> {
        let t = &opts.dedup_table;
        validate_identifier(t)?;
        let pool = connect(url, opts.max_connections).await?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 consumer     VARCHAR(100) NOT NULL,
                 message_id   VARCHAR(255) NOT NULL,
                 fingerprint  CHAR(32) CHARACTER SET ascii NOT NULL,
                 processed_at DATETIME(6)  NOT NULL,
                 PRIMARY KEY (consumer, message_id),
                 KEY {t}_processed_at (processed_at)
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ))
        .execute(&pool)
        .await?;
        let sql = Sql {
            claim: format!(
                "INSERT IGNORE INTO {t} (consumer, message_id, fingerprint, processed_at)
                 VALUES (?, ?, ?, NOW(6))"
            ),
            fingerprint: format!(
                "SELECT fingerprint FROM {t} WHERE consumer = ? AND message_id = ? LOCK IN SHARE MODE"
            ),
            purge: format!("DELETE FROM {t} WHERE processed_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?"),
        };
        Ok(MySqlStore {
            pool,
            sql: Arc::new(sql),
        })
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

#[async_trait]
impl Store for MySqlStore {
    type Tx = MySqlTx;

    fn backend(&self) -> &'static str {
        "mysql"
    }

    async fn begin(&self) -> Result<MySqlTx> {
        Ok(self.pool.begin().await?)
    }

    async fn commit(&self, tx: MySqlTx) -> Result<()> {
        Ok(tx.commit().await?)
    }

    async fn rollback(&self, tx: MySqlTx) -> Result<()> {
        Ok(tx.rollback().await?)
    }

    async fn savepoint(&self, tx: &mut MySqlTx) -> Result<()> {
        sqlx::query("SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn release_savepoint(&self, tx: &mut MySqlTx) -> Result<()> {
        sqlx::query("RELEASE SAVEPOINT jo_message")
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    async fn rollback_to_savepoint(&self, tx: &mut MySqlTx) -> Result<()> {
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
impl DedupStore for MySqlStore {
    async fn claim(&self, tx: &mut MySqlTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
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
            .bind(retention.as_micros() as i64)
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }
}
