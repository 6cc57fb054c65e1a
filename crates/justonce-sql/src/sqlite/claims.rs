use std::sync::Arc;

use justonce_core::Result;
use sqlx::SqlitePool;

use super::{connect, NOW_MS};
use crate::claims::{impl_claim_store, ClaimBackend, ClaimSql};

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
/// Every operation is a short transaction, by the database clock; a batch of claims is one.
/// Give it a file of its own: SQLite has one writer per file, so claims in the store's file
/// would wait for every batch transaction of every consumer, and a second delivery would
/// only ever see a completed claim, never a held one.
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
    sql: Arc<ClaimSql>,
}

impl SqliteClaimStore {
    /// Opens (creating if needed) the claims table `jo_claims` in the SQLite file at `url`.
    pub async fn open(url: &str) -> Result<Self> {
        let pool = connect(url, true, 4, false, true).await?;
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        let key = "WHERE consumer = ? AND message_id = ?";
        let sql = ClaimSql {
            insert: format!(
                "INSERT INTO jo_claims (consumer, message_id, fingerprint, state, token, lease_until)
                 VALUES (?, ?, ?, 'in_progress', 1, {NOW_MS} + ?) ON CONFLICT DO NOTHING"
            ),
            select: format!(
                "SELECT fingerprint, state, token, result, lease_until - {NOW_MS} AS remaining
                 FROM jo_claims {key}"
            ),
            takeover: format!(
                "UPDATE jo_claims SET state = 'in_progress', token = ?, fingerprint = ?,
                     lease_until = {NOW_MS} + ? {key}"
            ),
            complete: format!(
                "UPDATE jo_claims SET state = 'completed', result = ?, completed_at = {NOW_MS},
                     lease_until = NULL {key} AND token = ? AND state = 'in_progress'"
            ),
            token: format!("SELECT token FROM jo_claims {key}"),
            release: format!(
                "UPDATE jo_claims SET state = 'released', lease_until = NULL
                 {key} AND token = ? AND state = 'in_progress'"
            ),
            purge: format!(
                "DELETE FROM jo_claims WHERE (consumer, message_id) IN (
                     SELECT consumer, message_id FROM jo_claims
                     WHERE state = 'completed' AND completed_at < {NOW_MS} - ? LIMIT ?)"
            ),
            record: format!(
                "SELECT fingerprint, state, CAST(token AS TEXT), CAST(lease_until - {NOW_MS} AS TEXT),
                        CAST(completed_at AS TEXT),
                        CASE WHEN result IS NULL THEN NULL ELSE hex(result) END
                 FROM jo_claims {key}"
            ),
            force_release: format!(
                "UPDATE jo_claims SET state = 'released', token = token + 1, lease_until = NULL
                 {key} AND state = 'in_progress'"
            ),
        };
        Ok(SqliteClaimStore {
            pool,
            sql: Arc::new(sql),
        })
    }
}

impl ClaimBackend for SqliteClaimStore {
    type Db = sqlx::Sqlite;
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn sql(&self) -> &ClaimSql {
        &self.sql
    }
}

impl_claim_store!(SqliteClaimStore);
