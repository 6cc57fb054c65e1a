use std::sync::Arc;

use justonce_core::{validate_identifier, Result};
use sqlx::PgPool;

use super::{connect, create, MS};
use crate::claims::{impl_claim_store, ClaimBackend, ClaimSql};

/// Claims with leases on PostgreSQL, for effects no transaction covers. Leases run on the
/// database's `clock_timestamp()`. A batch of claims is one transaction.
///
/// ```no_run
/// use std::sync::Arc;
/// use justonce_sql::PgClaimStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let claims = Arc::new(PgClaimStore::open("postgres://app@127.0.0.1:5432/shop", "jo_claims").await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgClaimStore {
    pool: PgPool,
    sql: Arc<ClaimSql>,
}

impl PgClaimStore {
    /// Connects and creates the claims table `table` if missing.
    pub async fn open(url: &str, table: &str) -> Result<Self> {
        validate_identifier(table)?;
        let t = table;
        let pool = connect(url, 8).await?;
        create(
            &pool,
            &[
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                         consumer     TEXT        COLLATE \"C\" NOT NULL,
                         message_id   TEXT        COLLATE \"C\" NOT NULL,
                         fingerprint  TEXT        NOT NULL,
                         state        TEXT        NOT NULL CHECK (state IN ('in_progress', 'released', 'completed')),
                         token        BIGINT      NOT NULL,
                         lease_until  TIMESTAMPTZ,
                         result       BYTEA,
                         completed_at TIMESTAMPTZ,
                         PRIMARY KEY (consumer, message_id))"
                ),
                format!("CREATE INDEX IF NOT EXISTS {t}_completed_at ON {t} (completed_at)"),
            ],
        )
        .await?;
        let sql = ClaimSql {
            insert: format!(
                "INSERT INTO {t} (consumer, message_id, fingerprint, state, token, lease_until)
                 VALUES ($1, $2, $3, 'in_progress', 1, clock_timestamp() + $4 * {MS})
                 ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            select: format!(
                "SELECT fingerprint, state, token, result,
                        (EXTRACT(EPOCH FROM (lease_until - clock_timestamp())) * 1000)::bigint AS remaining
                 FROM {t} WHERE consumer = $1 AND message_id = $2 FOR UPDATE"
            ),
            takeover: format!(
                "UPDATE {t} SET state = 'in_progress', token = $1, fingerprint = $2,
                     lease_until = clock_timestamp() + $3 * {MS}
                 WHERE consumer = $4 AND message_id = $5"
            ),
            complete: format!(
                "UPDATE {t} SET state = 'completed', result = $1, completed_at = clock_timestamp(),
                     lease_until = NULL
                 WHERE consumer = $2 AND message_id = $3 AND token = $4 AND state = 'in_progress'"
            ),
            token: format!("SELECT token FROM {t} WHERE consumer = $1 AND message_id = $2"),
            release: format!(
                "UPDATE {t} SET state = 'released', lease_until = NULL
                 WHERE consumer = $1 AND message_id = $2 AND token = $3 AND state = 'in_progress'"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN (
                     SELECT ctid FROM {t} WHERE state = 'completed'
                     AND completed_at < clock_timestamp() - $1 * {MS} LIMIT $2)"
            ),
            record: format!(
                "SELECT fingerprint, state, token::text,
                        ((EXTRACT(EPOCH FROM (lease_until - clock_timestamp())) * 1000)::bigint)::text,
                        ((EXTRACT(EPOCH FROM completed_at) * 1000)::bigint)::text,
                        encode(result, 'hex')
                 FROM {t} WHERE consumer = $1 AND message_id = $2"
            ),
            force_release: format!(
                "UPDATE {t} SET state = 'released', token = token + 1, lease_until = NULL
                 WHERE consumer = $1 AND message_id = $2 AND state = 'in_progress'"
            ),
        };
        Ok(PgClaimStore {
            pool,
            sql: Arc::new(sql),
        })
    }
}

impl ClaimBackend for PgClaimStore {
    type Db = sqlx::Postgres;

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn sql(&self) -> &ClaimSql {
        &self.sql
    }
}

impl_claim_store!(PgClaimStore);
