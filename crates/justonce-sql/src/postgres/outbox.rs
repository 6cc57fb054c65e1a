//! The PostgreSQL outbox: a table in the store's database, written in the business
//! transaction. Per key, seq order is commit order: an enqueue with a key takes that key's
//! transaction-scoped advisory lock first, so a second producer of the key waits for the
//! first one's commit before it draws its seq. Relays take rows with `FOR UPDATE SKIP
//! LOCKED` and, per key, a try-lock of their own, so two relays never hold one key at once.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use justonce_core::{
    check_outgoing, validate_identifier, Error, Message, MessageId, OutboxFailure, OutboxRow,
    OutboxStats, OutboxStore, Result, DEFAULT_OUTBOX_MAX_PAYLOAD,
};
use sqlx::{PgPool, Row};

use super::{PgStore, PgTx};
use crate::queue::message_from_row;

/// The advisory lock classes: a producer's per-key lock, and a relay's.
const ENQUEUE_LOCK: i32 = 0x6a6f_0001;
const TAKE_LOCK: i32 = 0x6a6f_0002;

/// Options of a [`PgOutbox`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgOutboxOptions {
    /// The outbox table (default `jo_outbox`), validated as an SQL identifier.
    pub table: String,
    /// The largest payload enqueued; larger ones are refused at enqueue (default 1 MiB).
    pub max_payload_bytes: usize,
}

crate::options::setters!(PgOutboxOptions { max_payload_bytes: usize } into { table });

impl Default for PgOutboxOptions {
    fn default() -> Self {
        PgOutboxOptions {
            table: "jo_outbox".into(),
            max_payload_bytes: DEFAULT_OUTBOX_MAX_PAYLOAD,
        }
    }
}

/// The outbox of a [`PgStore`], in its database: enqueue in the store's transactions
/// ([`OutboxStore::enqueue`]), relay from any number of processes.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    pool: PgPool,
    table: String,
    max_payload: usize,
}

impl PgStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<PgOutbox> {
        self.outbox_with(PgOutboxOptions::default()).await
    }

    /// As [`PgStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: PgOutboxOptions) -> Result<PgOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        super::create(
            self.pool(),
            &[
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                         seq          BIGSERIAL   PRIMARY KEY,
                         okey         TEXT        COLLATE \"C\",
                         message_id   TEXT        NOT NULL,
                         payload      BYTEA       NOT NULL,
                         headers      TEXT        NOT NULL,
                         content_type TEXT,
                         enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         due_at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         attempts     INTEGER     NOT NULL DEFAULT 0,
                         owner        TEXT,
                         leased_until TIMESTAMPTZ,
                         last_error   TEXT,
                         dead_reason  TEXT)"
                ),
                format!(
                    "CREATE INDEX IF NOT EXISTS {t}_okey ON {t} (okey, seq) WHERE okey IS NOT NULL"
                ),
            ],
        )
        .await?;
        Ok(PgOutbox {
            pool: self.pool().clone(),
            table: opts.table,
            max_payload: opts.max_payload_bytes,
        })
    }
}

fn seqs(seqs: &[u64]) -> Vec<i64> {
    seqs.iter().map(|s| *s as i64).collect()
}

#[async_trait]
impl OutboxStore for PgOutbox {
    type Tx = PgTx;

    async fn enqueue(&self, tx: &mut PgTx, message: &Message, key: Option<&str>) -> Result<()> {
        check_outgoing(message, self.max_payload)?;
        let headers = serde_json::to_string(message.headers()).map_err(Error::from)?;
        if let Some(key) = key {
            sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
                .bind(ENQUEUE_LOCK)
                .bind(key)
                .execute(&mut **tx)
                .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {} (okey, message_id, payload, headers, content_type)
             VALUES ($1, $2, $3, $4, $5)",
            self.table
        ))
        .bind(key)
        .bind(message.id().map(MessageId::as_str))
        .bind(message.payload())
        .bind(headers)
        .bind(message.content_type())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    async fn take(&self, owner: &str, max: usize, lease: Duration) -> Result<Vec<OutboxRow>> {
        let t = &self.table;
        let rows = sqlx::query(&format!(
            "WITH chosen AS (
                 SELECT o.seq FROM {t} o
                 WHERE o.dead_reason IS NULL AND o.due_at <= clock_timestamp()
                   AND (o.leased_until IS NULL OR o.leased_until <= clock_timestamp())
                   AND (o.okey IS NULL OR (
                       NOT EXISTS (
                           SELECT 1 FROM {t} e WHERE e.okey = o.okey AND e.seq < o.seq
                             AND (e.dead_reason IS NOT NULL OR e.due_at > clock_timestamp()
                                  OR e.leased_until > clock_timestamp()))
                       AND pg_try_advisory_xact_lock($4, hashtext(o.okey))))
                 ORDER BY o.seq LIMIT $3
                 FOR UPDATE SKIP LOCKED)
             UPDATE {t} SET owner = $1,
                 leased_until = clock_timestamp() + $2 * interval '1 millisecond'
             FROM chosen WHERE {t}.seq = chosen.seq
             RETURNING {t}.seq, {t}.okey, {t}.message_id, {t}.payload, {t}.headers,
                       {t}.content_type, {t}.attempts"
        ))
        .bind(owner)
        .bind(lease.as_millis() as i64)
        .bind(max as i64)
        .bind(TAKE_LOCK)
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow {
                seq: r.get::<i64, _>(0) as u64,
                key: r.get(1),
                message: message_from_row(r.get(2), r.get(3), &r.get::<String, _>(4), r.get(5)),
                attempts: r.get::<i32, _>(6).max(0) as u32,
            })
            .collect();
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    async fn mark_sent(&self, done: &[u64]) -> Result<()> {
        sqlx::query(&format!("DELETE FROM {} WHERE seq = ANY($1)", self.table))
            .bind(seqs(done))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn mark_failed(
        &self,
        seq: u64,
        error: &str,
        retry_after: Duration,
        max_attempts: u32,
    ) -> Result<OutboxFailure> {
        let dead: Option<bool> = sqlx::query_scalar(&format!(
            "UPDATE {} SET attempts = attempts + 1, owner = NULL, leased_until = NULL,
                 due_at = clock_timestamp() + $2 * interval '1 millisecond', last_error = $3,
                 dead_reason = CASE WHEN attempts + 1 >= $4 THEN $3 END
             WHERE seq = $1 RETURNING dead_reason IS NOT NULL",
            self.table
        ))
        .bind(seq as i64)
        .bind(retry_after.as_millis() as i64)
        .bind(error)
        .bind(max_attempts as i32)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match dead {
            Some(true) => OutboxFailure::Dead,
            _ => OutboxFailure::Retrying,
        })
    }

    async fn release(&self, held: &[u64]) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE {} SET owner = NULL, leased_until = NULL WHERE seq = ANY($1)",
            self.table
        ))
        .bind(seqs(held))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        let r = sqlx::query(&format!(
            "SELECT count(*) FILTER (WHERE dead_reason IS NULL),
                    count(*) FILTER (WHERE dead_reason IS NULL AND leased_until > clock_timestamp()),
                    count(*) FILTER (WHERE dead_reason IS NOT NULL),
                    (EXTRACT(EPOCH FROM min(enqueued_at) FILTER (WHERE dead_reason IS NULL)) * 1000)::bigint
             FROM {}",
            self.table
        ))
        .fetch_one(&self.pool)
        .await?;
        let oldest = r
            .get::<Option<i64>, _>(3)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
        Ok(OutboxStats::new(
            r.get::<i64, _>(0) as u64,
            r.get::<i64, _>(1) as u64,
            r.get::<i64, _>(2) as u64,
            oldest,
        ))
    }
}
