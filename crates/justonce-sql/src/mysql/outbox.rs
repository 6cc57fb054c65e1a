//! The MariaDB outbox: a table in the store's database, written in the business
//! transaction. MariaDB has no `UPDATE … RETURNING`, and a row lock skipped by one relay
//! would let another take the next row of its key: relays take one at a time under a named
//! lock (`GET_LOCK`, released with the session if the relay dies), each take a short
//! transaction, and publish in parallel. Per key, seq order is commit order: an enqueue
//! with a key first locks the key's earlier rows, so a second producer of the key waits
//! for the first one's commit.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use justonce_core::{
    check_outgoing, validate_identifier, Error, Message, MessageId, OutboxFailure, OutboxRow,
    OutboxStats, OutboxStore, Result, DEFAULT_OUTBOX_MAX_PAYLOAD,
};
use sqlx::{MySql, MySqlPool, QueryBuilder, Row};

use super::{MySqlStore, MySqlTx};
use crate::queue::message_from_row;

/// Options of a [`MySqlOutbox`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MySqlOutboxOptions {
    /// The outbox table (default `jo_outbox`), validated as an SQL identifier.
    pub table: String,
    /// The largest payload enqueued; larger ones are refused at enqueue (default 1 MiB).
    pub max_payload_bytes: usize,
}

crate::options::setters!(MySqlOutboxOptions { max_payload_bytes: usize } into { table });

impl Default for MySqlOutboxOptions {
    fn default() -> Self {
        MySqlOutboxOptions {
            table: "jo_outbox".into(),
            max_payload_bytes: DEFAULT_OUTBOX_MAX_PAYLOAD,
        }
    }
}

/// The outbox of a [`MySqlStore`], in its database.
#[derive(Debug, Clone)]
pub struct MySqlOutbox {
    pool: MySqlPool,
    table: String,
    max_payload: usize,
}

impl MySqlStore {
    /// The store's outbox, table `jo_outbox`, created if missing.
    pub async fn outbox(&self) -> Result<MySqlOutbox> {
        self.outbox_with(MySqlOutboxOptions::default()).await
    }

    /// As [`MySqlStore::outbox`], with options.
    pub async fn outbox_with(&self, opts: MySqlOutboxOptions) -> Result<MySqlOutbox> {
        let t = &opts.table;
        validate_identifier(t)?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                 seq          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
                 okey         VARCHAR(255),
                 message_id   VARCHAR(255) NOT NULL,
                 payload      LONGBLOB     NOT NULL,
                 headers      LONGTEXT     NOT NULL,
                 content_type VARCHAR(255),
                 enqueued_at  DATETIME(6)  NOT NULL,
                 due_at       DATETIME(6)  NOT NULL,
                 attempts     INT          NOT NULL DEFAULT 0,
                 owner        VARCHAR(255),
                 leased_until DATETIME(6),
                 last_error   TEXT,
                 dead_reason  TEXT,
                 KEY {t}_okey (okey, seq)
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ))
        .execute(self.pool())
        .await?;
        Ok(MySqlOutbox {
            pool: self.pool().clone(),
            table: opts.table,
            max_payload: opts.max_payload_bytes,
        })
    }
}

/// `head WHERE seq IN (…)`.
fn in_seqs<'a>(head: &str, seqs: &'a [u64]) -> QueryBuilder<'a, MySql> {
    push_in(QueryBuilder::new(head), seqs)
}

fn push_in<'a>(mut q: QueryBuilder<'a, MySql>, seqs: &'a [u64]) -> QueryBuilder<'a, MySql> {
    q.push(" WHERE seq IN (");
    let mut list = q.separated(", ");
    for seq in seqs {
        list.push_bind(*seq as i64);
    }
    q.push(")");
    q
}

#[async_trait]
impl OutboxStore for MySqlOutbox {
    type Tx = MySqlTx;

    async fn enqueue(&self, tx: &mut MySqlTx, message: &Message, key: Option<&str>) -> Result<()> {
        check_outgoing(message, self.max_payload)?;
        let headers = serde_json::to_string(message.headers()).map_err(Error::from)?;
        if let Some(key) = key {
            // The gap lock on the key's index range makes a second producer of the key
            // wait for this transaction, so seqs of a key are drawn in commit order.
            sqlx::query(&format!(
                "SELECT seq FROM {} WHERE okey = ? ORDER BY seq DESC LIMIT 1 FOR UPDATE",
                self.table
            ))
            .bind(key)
            .fetch_optional(&mut **tx)
            .await?;
        }
        sqlx::query(&format!(
            "INSERT INTO {} (okey, message_id, payload, headers, content_type, enqueued_at, due_at)
             VALUES (?, ?, ?, ?, ?, NOW(6), NOW(6))",
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
        let lock = format!("justonce-outbox-take:{t}");
        let mut conn = self.pool.acquire().await?;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 30)")
            .bind(&lock)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(Error::new(
                justonce_core::ErrorKind::Timeout,
                format!("another relay held the take lock of {t} for 30 s"),
            ));
        }
        let taken = async {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let seqs: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT o.seq FROM {t} o
                 WHERE o.dead_reason IS NULL AND o.due_at <= NOW(6)
                   AND (o.leased_until IS NULL OR o.leased_until <= NOW(6))
                   AND (o.okey IS NULL OR NOT EXISTS (
                       SELECT 1 FROM {t} e WHERE e.okey = o.okey AND e.seq < o.seq
                         AND (e.dead_reason IS NOT NULL OR e.due_at > NOW(6)
                              OR e.leased_until > NOW(6))))
                 ORDER BY o.seq LIMIT ?"
            ))
            .bind(max as i64)
            .fetch_all(&mut *tx)
            .await?;
            let seqs: Vec<u64> = seqs.into_iter().map(|s| s as u64).collect();
            if seqs.is_empty() {
                tx.commit().await?;
                return Ok::<_, Error>(Vec::new());
            }
            let mut q: QueryBuilder<MySql> = QueryBuilder::new(format!("UPDATE {t} SET owner = "));
            q.push_bind(owner);
            q.push(", leased_until = NOW(6) + INTERVAL ");
            q.push_bind(lease.as_micros() as i64);
            q.push(" MICROSECOND");
            push_in(q, &seqs).build().execute(&mut *tx).await?;
            let head = format!(
                // A `utf8mb4_bin` column reads back as bytes; converted, as text.
                "SELECT seq, CONVERT(okey USING utf8mb4), CONVERT(message_id USING utf8mb4),
                        payload, CONVERT(headers USING utf8mb4),
                        CONVERT(content_type USING utf8mb4), attempts FROM {t}"
            );
            let rows = in_seqs(&head, &seqs).build().fetch_all(&mut *tx).await?;
            tx.commit().await?;
            Ok(rows
                .into_iter()
                .map(|r| OutboxRow {
                    seq: r.get::<i64, _>(0) as u64,
                    key: r.get(1),
                    message: message_from_row(r.get(2), r.get(3), &r.get::<String, _>(4), r.get(5)),
                    attempts: r.get::<i32, _>(6).max(0) as u32,
                })
                .collect::<Vec<_>>())
        }
        .await;
        let _ = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(&lock)
            .execute(&mut *conn)
            .await;
        let mut out = taken?;
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    async fn mark_sent(&self, done: &[u64]) -> Result<()> {
        for chunk in done.chunks(500) {
            in_seqs(&format!("DELETE FROM {}", self.table), chunk)
                .build()
                .execute(&self.pool)
                .await?;
        }
        Ok(())
    }

    async fn mark_failed(
        &self,
        seq: u64,
        error: &str,
        retry_after: Duration,
        max_attempts: u32,
    ) -> Result<OutboxFailure> {
        // MariaDB assigns left to right: `dead_reason` sees the new `attempts`.
        sqlx::query(&format!(
            "UPDATE {} SET attempts = attempts + 1, owner = NULL, leased_until = NULL,
                 due_at = NOW(6) + INTERVAL ? MICROSECOND, last_error = ?,
                 dead_reason = CASE WHEN attempts >= ? THEN last_error END
             WHERE seq = ?",
            self.table
        ))
        .bind(retry_after.as_micros() as i64)
        .bind(error)
        .bind(i64::from(max_attempts))
        .bind(seq as i64)
        .execute(&self.pool)
        .await?;
        let dead: Option<bool> = sqlx::query_scalar(&format!(
            "SELECT dead_reason IS NOT NULL FROM {} WHERE seq = ?",
            self.table
        ))
        .bind(seq as i64)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match dead {
            Some(true) => OutboxFailure::Dead,
            _ => OutboxFailure::Retrying,
        })
    }

    async fn release(&self, held: &[u64]) -> Result<()> {
        let head = format!(
            "UPDATE {} SET owner = NULL, leased_until = NULL",
            self.table
        );
        for chunk in held.chunks(500) {
            in_seqs(&head, chunk).build().execute(&self.pool).await?;
        }
        Ok(())
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        let r = sqlx::query(&format!(
            "SELECT CAST(COALESCE(SUM(dead_reason IS NULL), 0) AS SIGNED),
                    CAST(COALESCE(SUM(dead_reason IS NULL AND leased_until > NOW(6)), 0) AS SIGNED),
                    CAST(COALESCE(SUM(dead_reason IS NOT NULL), 0) AS SIGNED),
                    CAST(UNIX_TIMESTAMP(MIN(CASE WHEN dead_reason IS NULL THEN enqueued_at END)) * 1000 AS SIGNED)
             FROM {}",
            self.table
        ))
        .fetch_one(&self.pool)
        .await?;
        let oldest: Option<SystemTime> = r
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
