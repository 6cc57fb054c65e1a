use std::sync::Arc;

use justonce_core::{validate_identifier, Result};
use sqlx::{MySql, MySqlPool};

use super::connect;
use crate::dedup::{impl_dedup_store, DedupBackend, DedupSql};
use crate::inspect::InspectSql;

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
    /// Create the dedup table if it does not exist (the default). `false` makes `open`
    /// fail when it is missing instead: for tools that must not create one by mistake
    /// (`justonce dedup`, `justonce doctor`).
    pub create: bool,
}

crate::options::setters!(MySqlStoreOptions { max_connections: u32, create: bool } into { dedup_table });

impl Default for MySqlStoreOptions {
    fn default() -> Self {
        MySqlStoreOptions {
            dedup_table: "jo_dedup".into(),
            max_connections: 8,
            create: true,
        }
    }
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
    sql: Arc<DedupSql>,
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
        if !opts.create {
            crate::dedup::table_must_exist(&pool, t, url).await?;
        } else {
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
        }
        let sql = DedupSql {
            lock: None,
            claim: format!(
                "INSERT IGNORE INTO {t} (consumer, message_id, fingerprint, processed_at)
                 VALUES (?, ?, ?, NOW(6))"
            ),
            fingerprint: format!(
                "SELECT fingerprint FROM {t} WHERE consumer = ? AND message_id = ? LOCK IN SHARE MODE"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE processed_at < NOW(6) - INTERVAL (? * 1000) MICROSECOND LIMIT ?"
            ),
            // MariaDB has no INSERT … RETURNING that skips duplicates: key by key.
            many: None,
            inspect: InspectSql::new(
                t,
                "CAST(UNIX_TIMESTAMP(processed_at) * 1000 AS SIGNED)",
                // A `utf8mb4_bin` column reads back as bytes; converted, as text.
                "CONVERT({} USING utf8mb4)",
                ["?", "?"],
                "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
            )
            // MariaDB's count (MySQL 8 has neither the table nor the count: the check
            // then says it could not read it).
            .deadlocks(
                "SELECT d.VARIABLE_VALUE, CONCAT('the server started, ', u.VARIABLE_VALUE, ' s ago') \
                 FROM information_schema.GLOBAL_STATUS d, information_schema.GLOBAL_STATUS u \
                 WHERE d.VARIABLE_NAME = 'INNODB_DEADLOCKS' AND u.VARIABLE_NAME = 'UPTIME'",
            ),
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

impl DedupBackend for MySqlStore {
    type Db = MySql;
    const NAME: &'static str = "mysql";

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn sql(&self) -> &DedupSql {
        &self.sql
    }
}

impl_dedup_store!(MySqlStore, MySqlTx);
