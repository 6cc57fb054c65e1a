//! The SQLite outbox: a table in the store's database, written in the business
//! transaction, taken by relays with one `UPDATE … RETURNING` (SQLite serialises writers,
//! so relays in several processes never take one row twice while its lease runs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use justonce_core::{
    check_outgoing, validate_identifier, Error, Message, MessageId, OutboxFailure, OutboxRow,
    OutboxStats, OutboxStore, Result, DEFAULT_OUTBOX_MAX_PAYLOAD,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::{SqliteStore, SqliteTx, NOW_MS};
use crate::queue::message_from_row;

/// Options of a [`SqliteOutbox`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteOutboxOptions {
    /// The outbox table (default `jo_outbox`), validated as an SQL identifier.
    pub table: String,
    /// The largest payload enqueued; larger ones are refused at enqueue (default 1 MiB).
    pub max_payload_bytes: usize,
}

crate::options::setters!(SqliteOutboxOptions { max_payload_bytes: usize } into { table });

impl Default for SqliteOutboxOptions {
    fn default() -> Self {
        SqliteOutboxOptions {
            table: "jo_outbox".into(),
            max_payload_bytes: DEFAULT_OUTBOX_MAX_PAYLOAD,
        }
    }
}

/// The outbox of a [`SqliteStore`], in its database: enqueue in the store's transactions
/// ([`OutboxStore::enqueue`]), relay from any process.
///
/// ```no_run
/// # async fn run() -> justonce_core::Result<()> {
/// use justonce_core::{Message, OutboxStore, Store};
/// use justonce_sql::SqliteStore;
///
/// let store = SqliteStore::open("sqlite:app.db").await?;
/// let outbox = store.outbox().await?;
/// let mut tx = store.begin().await?;
/// // … the business write in `tx` …
/// outbox.enqueue(&mut tx, &Message::new(r#"{"receipt":"R-1"}"#).with_id("R-1")?, Some("account-7")).await?;
/// store.commit(tx).await?; // the receipt exists if and only if the write committed
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteOutbox {
    pool: SqlitePool,
    table: String,
    max_payload: usize,
}

impl SqliteStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<SqliteOutbox> {
        self.outbox_with(SqliteOutboxOptions::default()).await
    }

    /// As [`SqliteStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: SqliteOutboxOptions) -> Result<SqliteOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        sqlx::raw_sql(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 seq          INTEGER PRIMARY KEY AUTOINCREMENT,
                 okey         TEXT,
                 message_id   TEXT    NOT NULL,
                 payload      BLOB    NOT NULL,
                 headers      TEXT    NOT NULL,
                 content_type TEXT,
                 enqueued_at  INTEGER NOT NULL,
                 due_at       INTEGER NOT NULL,
                 attempts     INTEGER NOT NULL DEFAULT 0,
                 owner        TEXT,
                 leased_until INTEGER,
                 last_error   TEXT,
                 dead_reason  TEXT
             );
             CREATE INDEX IF NOT EXISTS {t}_okey ON {t} (okey, seq) WHERE okey IS NOT NULL;"
        ))
        .execute(self.pool())
        .await?;
        Ok(SqliteOutbox {
            pool: self.pool().clone(),
            table: opts.table,
            max_payload: opts.max_payload_bytes,
        })
    }
}

fn time(ms: Option<i64>) -> Option<SystemTime> {
    Some(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms?).ok()?))
}

/// `DELETE FROM t WHERE seq IN (…)` and the like: `head` then the list.
async fn for_seqs(pool: &SqlitePool, head: &str, seqs: &[u64]) -> Result<()> {
    for chunk in seqs.chunks(500) {
        let mut q: QueryBuilder<Sqlite> = QueryBuilder::new(head);
        q.push(" WHERE seq IN (");
        let mut list = q.separated(", ");
        for seq in chunk {
            list.push_bind(*seq as i64);
        }
        q.push(")");
        q.build().execute(pool).await?;
    }
    Ok(())
}

#[async_trait]
impl OutboxStore for SqliteOutbox {
    type Tx = SqliteTx;

    async fn enqueue(&self, tx: &mut SqliteTx, message: &Message, key: Option<&str>) -> Result<()> {
        check_outgoing(message, self.max_payload)?;
        let headers = serde_json::to_string(message.headers()).map_err(Error::from)?;
        sqlx::query(&format!(
            "INSERT INTO {} (okey, message_id, payload, headers, content_type, enqueued_at, due_at)
             VALUES (?, ?, ?, ?, ?, {NOW_MS}, {NOW_MS})",
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
            "UPDATE {t} SET owner = ?1, leased_until = {NOW_MS} + ?2
             WHERE seq IN (
                 SELECT o.seq FROM {t} o
                 WHERE o.dead_reason IS NULL AND o.due_at <= {NOW_MS}
                   AND (o.leased_until IS NULL OR o.leased_until <= {NOW_MS})
                   AND (o.okey IS NULL OR NOT EXISTS (
                       SELECT 1 FROM {t} e WHERE e.okey = o.okey AND e.seq < o.seq
                         AND (e.dead_reason IS NOT NULL OR e.due_at > {NOW_MS}
                              OR e.leased_until > {NOW_MS})))
                 ORDER BY o.seq LIMIT ?3)
             RETURNING seq, okey, message_id, payload, headers, content_type, attempts"
        ))
        .bind(owner)
        .bind(lease.as_millis() as i64)
        .bind(max as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut out: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow {
                seq: r.get::<i64, _>(0) as u64,
                key: r.get(1),
                message: message_from_row(r.get(2), r.get(3), &r.get::<String, _>(4), r.get(5)),
                attempts: r.get::<i64, _>(6).max(0) as u32,
            })
            .collect();
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    async fn mark_sent(&self, seqs: &[u64]) -> Result<()> {
        for_seqs(&self.pool, &format!("DELETE FROM {}", self.table), seqs).await
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
                 due_at = {NOW_MS} + ?2, last_error = ?3,
                 dead_reason = CASE WHEN attempts + 1 >= ?4 THEN ?3 END
             WHERE seq = ?1 RETURNING dead_reason IS NOT NULL",
            self.table
        ))
        .bind(seq as i64)
        .bind(retry_after.as_millis() as i64)
        .bind(error)
        .bind(i64::from(max_attempts))
        .fetch_optional(&self.pool)
        .await?;
        Ok(match dead {
            Some(true) => OutboxFailure::Dead,
            _ => OutboxFailure::Retrying,
        })
    }

    async fn release(&self, seqs: &[u64]) -> Result<()> {
        let head = format!(
            "UPDATE {} SET owner = NULL, leased_until = NULL",
            self.table
        );
        for_seqs(&self.pool, &head, seqs).await
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        let r = sqlx::query(&format!(
            "SELECT COALESCE(SUM(dead_reason IS NULL), 0),
                    COALESCE(SUM(dead_reason IS NULL AND leased_until > {NOW_MS}), 0),
                    COALESCE(SUM(dead_reason IS NOT NULL), 0),
                    MIN(CASE WHEN dead_reason IS NULL THEN enqueued_at END)
             FROM {}",
            self.table
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(OutboxStats::new(
            r.get::<i64, _>(0) as u64,
            r.get::<i64, _>(1) as u64,
            r.get::<i64, _>(2) as u64,
            time(r.get(3)),
        ))
    }
}
