use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    ClaimState, ClaimStore, DedupKey, Error, ErrorKind, Fingerprint, Finish, Result,
};
use sqlx::{Row, SqliteConnection, SqlitePool};

use super::{connect, NOW_MS};
use crate::claim_logic::{decide, fenced, ClaimRow, Decision};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jo_claims (
    consumer     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'released', 'completed')),
    token        INTEGER NOT NULL,
    lease_until  INTEGER,
    result       BLOB,
    completed_at INTEGER,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS jo_claims_completed_at ON jo_claims (completed_at);
";

/// Claims with leases on SQLite, for effects no transaction covers.
///
/// Every operation is its own short transaction, by the database clock. Give it a file of
/// its own: SQLite has one writer per file, so claims in the store's file would wait for
/// every batch transaction of every consumer, and a second delivery would only ever see a
/// completed claim, never a held one.
///
/// ```no_run
/// use std::sync::Arc;
/// use justonce_sql::SqliteClaimStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let claims = Arc::new(SqliteClaimStore::open("sqlite:claims.db").await?);
/// // consumer.with_claims(claims)
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteClaimStore {
    pool: SqlitePool,
}

impl SqliteClaimStore {
    /// Opens (creating if needed) the claims table in the SQLite file at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let pool = connect(url, true, 4).await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        Ok(SqliteClaimStore { pool })
    }
}

async fn acquire_in(
    conn: &mut SqliteConnection,
    key: DedupKey<'_>,
    fp: Fingerprint,
    lease: Duration,
) -> Result<ClaimState> {
    let select = format!(
        "SELECT fingerprint, state, token, result, lease_until - {NOW_MS} AS remaining
         FROM jo_claims WHERE consumer = ? AND message_id = ?"
    );
    let row = sqlx::query(&select)
        .bind(key.consumer)
        .bind(key.message_id.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    let lease_ms = lease.as_millis() as i64;
    let Some(r) = row else {
        let insert = format!(
            "INSERT INTO jo_claims (consumer, message_id, fingerprint, state, token, lease_until)
             VALUES (?, ?, ?, 'in_progress', 1, {NOW_MS} + ?)"
        );
        sqlx::query(&insert)
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .bind(fp.to_hex())
            .bind(lease_ms)
            .execute(&mut *conn)
            .await?;
        return Ok(ClaimState::Acquired { token: 1 });
    };
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
            let takeover = format!(
                "UPDATE jo_claims SET state = 'in_progress', token = ?, fingerprint = ?,
                     lease_until = {NOW_MS} + ?
                 WHERE consumer = ? AND message_id = ?"
            );
            sqlx::query(&takeover)
                .bind(token as i64)
                .bind(fp.to_hex())
                .bind(lease_ms)
                .bind(key.consumer)
                .bind(key.message_id.as_str())
                .execute(&mut *conn)
                .await?;
            Ok(ClaimState::Acquired { token })
        }
    }
}

/// Completes or releases one claim. The outer `Result` is the database's; the inner one
/// says whether the token still held the claim.
async fn finish_in(
    conn: &mut SqliteConnection,
    key: DedupKey<'_>,
    token: u64,
    finish: Finish<'_>,
) -> Result<Result<()>> {
    match finish {
        Finish::Complete(result) => {
            let sql = format!(
                "UPDATE jo_claims SET state = 'completed', result = ?, completed_at = {NOW_MS},
                     lease_until = NULL
                 WHERE consumer = ? AND message_id = ? AND token = ? AND state = 'in_progress'"
            );
            let done = sqlx::query(&sql)
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
            let current: Option<i64> = sqlx::query_scalar(
                "SELECT token FROM jo_claims WHERE consumer = ? AND message_id = ?",
            )
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .fetch_optional(&mut *conn)
            .await?;
            Ok(Err(fenced(key, token, current)))
        }
        Finish::Release => {
            sqlx::query(
                "UPDATE jo_claims SET state = 'released', lease_until = NULL
                 WHERE consumer = ? AND message_id = ? AND token = ? AND state = 'in_progress'",
            )
            .bind(key.consumer)
            .bind(key.message_id.as_str())
            .bind(token as i64)
            .execute(&mut *conn)
            .await?;
            Ok(Ok(()))
        }
    }
}

#[async_trait]
impl ClaimStore for SqliteClaimStore {
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
        finish_in(&mut conn, key, token, Finish::Complete(result)).await?
    }

    async fn release(&self, key: DedupKey<'_>, token: u64) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        finish_in(&mut conn, key, token, Finish::Release).await?
    }

    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        let sql = format!(
            "DELETE FROM jo_claims WHERE (consumer, message_id) IN (
                 SELECT consumer, message_id FROM jo_claims
                 WHERE state = 'completed' AND completed_at < {NOW_MS} - ? LIMIT ?)"
        );
        Ok(sqlx::query(&sql)
            .bind(retention.as_millis() as i64)
            .bind(batch as i64)
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
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(keys.len());
        for (key, fp) in keys {
            out.push(acquire_in(&mut tx, *key, *fp, lease).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// One transaction for the whole batch.
    async fn finish_batch(
        &self,
        items: &[(DedupKey<'_>, u64, Finish<'_>)],
    ) -> Result<Vec<Result<()>>> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let mut out = Vec::with_capacity(items.len());
        for (key, token, finish) in items {
            out.push(finish_in(&mut tx, *key, *token, *finish).await?);
        }
        tx.commit().await?;
        Ok(out)
    }
}
