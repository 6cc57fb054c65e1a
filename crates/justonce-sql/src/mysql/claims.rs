use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    validate_identifier, ClaimState, ClaimStore, DedupKey, Error, ErrorKind, Fingerprint, Finish,
    Result,
};
use sqlx::{MySqlConnection, MySqlPool, Row};

use super::connect;
use crate::claim_logic::{decide, fenced, ClaimRow, Decision};

/// Claims with leases on MariaDB, for effects no transaction covers. Leases run on the
/// database's `NOW(6)`. A batch of claims is one transaction.
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
    sql: Arc<Sql>,
}

#[derive(Debug)]
struct Sql {
    insert: String,
    select: String,
    takeover: String,
    complete: String,
    token: String,
    release: String,
    purge: String,
}

impl MySqlClaimStore {
    /// Connects and creates the claims table `table` if missing.
    pub async fn open(url: &str, table: &str) -> Result<Self> {
        validate_identifier(table)?;
        let t = table;
        let pool = connect(url, 8).await?;
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
        let sql = Sql {
            insert: format!(
                "INSERT IGNORE INTO {t} (consumer, message_id, fingerprint, state, token, lease_until)
                 VALUES (?, ?, ?, 'in_progress', 1, NOW(6) + INTERVAL ? MICROSECOND)"
            ),
            select: format!(
                "SELECT fingerprint, state, token, result,
                        CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), lease_until) DIV 1000 AS SIGNED) AS remaining
                 FROM {t} WHERE consumer = ? AND message_id = ? FOR UPDATE"
            ),
            takeover: format!(
                "UPDATE {t} SET state = 'in_progress', token = ?, fingerprint = ?,
                     lease_until = NOW(6) + INTERVAL ? MICROSECOND
                 WHERE consumer = ? AND message_id = ?"
            ),
            complete: format!(
                "UPDATE {t} SET state = 'completed', result = ?, completed_at = NOW(6), lease_until = NULL
                 WHERE consumer = ? AND message_id = ? AND token = ? AND state = 'in_progress'"
            ),
            token: format!("SELECT token FROM {t} WHERE consumer = ? AND message_id = ?"),
            release: format!(
                "UPDATE {t} SET state = 'released', lease_until = NULL
                 WHERE consumer = ? AND message_id = ? AND token = ? AND state = 'in_progress'"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE state = 'completed'
                 AND completed_at < NOW(6) - INTERVAL ? MICROSECOND LIMIT ?"
            ),
        };
        Ok(MySqlClaimStore {
            pool,
            sql: Arc::new(sql),
        })
    }

    async fn acquire_in(
        &self,
        conn: &mut MySqlConnection,
        key: DedupKey<'_>,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimState> {
        let lease_us = lease.as_micros() as i64;
        let inserted = sqlx::query(&self.sql.insert)
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .bind(fp.to_hex())
            .bind(lease_us)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if inserted == 1 {
            return Ok(ClaimState::Acquired { token: 1 });
        }
        let r = sqlx::query(&self.sql.select)
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .fetch_one(&mut *conn)
            .await?;
        let row = ClaimRow {
            fingerprint: r.get("fingerprint"),
            state: r.get("state"),
            token: r.get("token"),
            remaining_ms: r.get("remaining"),
            result: r.get("result"),
        };
        match decide(row, fp) {
            Decision::Answer(state) => Ok(state),
            Decision::TakeOver { token } => {
                sqlx::query(&self.sql.takeover)
                    .bind(token as i64)
                    .bind(fp.to_hex())
                    .bind(lease_us)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .execute(&mut *conn)
                    .await?;
                Ok(ClaimState::Acquired { token })
            }
        }
    }

    async fn finish_in(
        &self,
        conn: &mut MySqlConnection,
        key: DedupKey<'_>,
        token: u64,
        finish: Finish<'_>,
    ) -> Result<Result<()>> {
        match finish {
            Finish::Complete(result) => {
                let done = sqlx::query(&self.sql.complete)
                    .bind(result)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .bind(token as i64)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                if done == 1 {
                    return Ok(Ok(()));
                }
                let current: Option<i64> = sqlx::query_scalar(&self.sql.token)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .fetch_optional(&mut *conn)
                    .await?;
                Ok(Err(fenced(key, token, current)))
            }
            Finish::Release => {
                sqlx::query(&self.sql.release)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .bind(token as i64)
                    .execute(&mut *conn)
                    .await?;
                Ok(Ok(()))
            }
        }
    }
}

#[async_trait]
impl ClaimStore for MySqlClaimStore {
    async fn acquire(
        &self,
        key: DedupKey<'_>,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimState> {
        let mut states = self.acquire_batch(&[(key, fp)], lease).await?;
        states
            .pop()
            .ok_or_else(|| Error::new(ErrorKind::Database, "acquire returned nothing"))
    }

    async fn complete(&self, key: DedupKey<'_>, token: u64, result: Option<&[u8]>) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        self.finish_in(&mut conn, key, token, Finish::Complete(result))
            .await?
    }

    async fn release(&self, key: DedupKey<'_>, token: u64) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        self.finish_in(&mut conn, key, token, Finish::Release)
            .await?
    }

    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        Ok(sqlx::query(&self.sql.purge)
            .bind(retention.as_micros() as i64)
            .bind(i64::from(batch))
            .execute(&self.pool)
            .await?
            .rows_affected())
    }

    /// One transaction for the whole batch.
    async fn acquire_batch(
        &self,
        keys: &[(DedupKey<'_>, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<ClaimState>> {
        let mut tx = self.pool.begin().await?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, fp) in keys {
            out.push(self.acquire_in(&mut tx, *key, *fp, lease).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// One transaction for the whole batch.
    async fn finish_batch(
        &self,
        items: &[(DedupKey<'_>, u64, Finish<'_>)],
    ) -> Result<Vec<Result<()>>> {
        let mut tx = self.pool.begin().await?;
        let mut out = Vec::with_capacity(items.len());
        for (key, token, finish) in items {
            out.push(self.finish_in(&mut tx, *key, *token, *finish).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}
