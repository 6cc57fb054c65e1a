use std::sync::Arc;

use justonce_core::{validate_identifier, Result};
use sqlx::MySqlPool;

use super::connect;
use crate::claims::{impl_claim_store, ClaimBackend, ClaimSql};

/// Claims with leases on MariaDB (or MySQL), InnoDB, for effects no transaction covers.
/// Leases run on the database's `NOW(6)`. A batch of claims is one transaction.
///
/// ```no_run
/// use std::sync::Arc;
/// use justonce_sql::MySqlClaimStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let claims = Arc::new(MySqlClaimStore::open("mysql://app@127.0.0.1:3306/shop", "jo_claims").await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlClaimStore {
    pool: MySqlPool,
    sql: Arc<ClaimSql>,
}

impl MySqlClaimStore {
    /// Connects and creates the claims table `table` if missing.
    pub async fn open(url: &str, table: &str) -> Result<Self> {
        validate_identifier(table)?;
        let t = table;
        let pool = connect(url, 8).await?;
        // Keys compare byte for byte (utf8mb4_bin); the columns read back are ASCII, so the
        // driver decodes them as text.
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 consumer     VARCHAR(100) NOT NULL,
                 message_id   VARCHAR(255) NOT NULL,
                 fingerprint  CHAR(32) CHARACTER SET ascii NOT NULL,
                 state        VARCHAR(16) CHARACTER SET ascii NOT NULL,
                 token        BIGINT       NOT NULL,
                 lease_until  DATETIME(6)  NULL,
                 result       LONGBLOB     NULL,
                 completed_at DATETIME(6)  NULL,
                 PRIMARY KEY (consumer, message_id),
                 KEY {t}_completed_at (completed_at)
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ))
        .execute(&pool)
        .await?;
        let ms = "INTERVAL (? * 1000) MICROSECOND";
        let key = "WHERE consumer = ? AND message_id = ?";
        let sql = ClaimSql {
            insert: format!(
                "INSERT IGNORE INTO {t} (consumer, message_id, fingerprint, state, token, lease_until)
                 VALUES (?, ?, ?, 'in_progress', 1, NOW(6) + {ms})"
            ),
            select: format!(
                "SELECT fingerprint, state, token, result,
                        CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_until) DIV 1000 AS SIGNED) AS remaining
                 FROM {t} {key} FOR UPDATE"
            ),
            takeover: format!(
                "UPDATE {t} SET state = 'in_progress', token = ?, fingerprint = ?, lease_until = NOW(6) + {ms}
                 {key}"
            ),
            complete: format!(
                "UPDATE {t} SET state = 'completed', result = ?, completed_at = NOW(6), lease_until = NULL
                 {key} AND token = ? AND state = 'in_progress'"
            ),
            token: format!("SELECT token FROM {t} {key}"),
            release: format!(
                "UPDATE {t} SET state = 'released', lease_until = NULL
                 {key} AND token = ? AND state = 'in_progress'"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE state = 'completed' AND completed_at < NOW(6) - {ms} LIMIT ?"
            ),
            record: format!(
                "SELECT fingerprint, state, CAST(token AS CHAR),
                        CAST(CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_until) DIV 1000 AS SIGNED) AS CHAR),
                        CAST(CAST(UNIX_TIMESTAMP(completed_at) * 1000 AS SIGNED) AS CHAR), HEX(result)
                 FROM {t} {key}"
            ),
            force_release: format!(
                "UPDATE {t} SET state = 'released', token = token + 1, lease_until = NULL
                 {key} AND state = 'in_progress'"
            ),
        };
        Ok(MySqlClaimStore {
            pool,
            sql: Arc::new(sql),
        })
    }
}

impl ClaimBackend for MySqlClaimStore {
    type Db = sqlx::MySql;

    fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    fn sql(&self) -> &ClaimSql {
        &self.sql
    }
}

impl_claim_store!(MySqlClaimStore);
