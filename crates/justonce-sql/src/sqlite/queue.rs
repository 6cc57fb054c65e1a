use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    DeadLetterEntry, DeadLetterReason, Delivery, Error, Message, MessageId, Publisher, Receipt,
    Replay, Result, Source,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{connect, NOW_MS};
use crate::queue::{
    dead_letter_entries, message_from_row, move_dead_letters, must_hold, DeadLetter, DeadLetterSql,
    QueueStats,
};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jo_queue (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    queue        TEXT    NOT NULL,
    message_id   TEXT,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    content_type TEXT,
    attempts     INTEGER NOT NULL DEFAULT 0,
    visible_at   INTEGER NOT NULL,
    enqueued_at  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jo_queue_ready ON jo_queue (queue, visible_at);
CREATE TABLE IF NOT EXISTS jo_dead_letter (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    queue            TEXT    NOT NULL,
    message_id       TEXT,
    payload          BLOB    NOT NULL,
    headers          TEXT    NOT NULL,
    content_type     TEXT,
    attempts         INTEGER NOT NULL,
    error            TEXT    NOT NULL,
    consumer         TEXT    NOT NULL,
    dead_lettered_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jo_dead_letter_queue ON jo_dead_letter (queue, seq);
CREATE TABLE IF NOT EXISTS jo_queue_stats (
    queue        TEXT PRIMARY KEY,
    deliveries   INTEGER NOT NULL DEFAULT 0,
    redeliveries INTEGER NOT NULL DEFAULT 0
);
";

/// How a [`SqliteQueue`] behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteQueueOptions {
    /// How long a delivery stays leased to its consumer before it is delivered again.
    pub lease: Duration,
    /// How often an idle receive looks for messages published by other processes
    /// (publishes from this process wake it at once).
    pub poll_interval: Duration,
    /// `synchronous=FULL` (the default): a committed publish or ack survives power loss.
    /// `false` uses `NORMAL`, which survives a process kill but not a power cut.
    pub durable: bool,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Create the queue if the database does not hold it yet (the default). `false` makes
    /// `open` fail, naming the queues the database holds: for tools that must not make a
    /// queue by mistake (`justonce dlq`).
    pub create: bool,
}

crate::options::setters!(SqliteQueueOptions {
    lease: std::time::Duration,
    poll_interval: std::time::Duration,
    durable: bool,
    max_connections: u32,
    create: bool
});

impl Default for SqliteQueueOptions {
    fn default() -> Self {
        SqliteQueueOptions {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(50),
            durable: true,
            max_connections: 4,
            create: true,
        }
    }
}

/// A durable queue in a SQLite file: the embedded default transport.
///
/// Several named queues can share one file. Every state change is one SQLite
/// transaction, so a process killed at any point loses nothing: a leased delivery that is
/// never settled is delivered again when its lease runs out, with its attempt count raised.
///
/// ```no_run
/// use std::time::Duration;
/// use justonce_core::{Message, Publisher, Source};
/// use justonce_sql::{SqliteQueue, SqliteQueueOptions};
///
/// # async fn run() -> justonce_core::Result<()> {
/// let opts = SqliteQueueOptions::default().lease(Duration::from_secs(5));
/// let q = SqliteQueue::open_with("sqlite:queue.db", "orders", opts).await?;
/// q.publish(&Message::new("{}").with_id("ORD-1")?).await?;
/// let batch = q.receive(10, Duration::from_secs(1)).await?;
/// let receipts: Vec<_> = batch.iter().map(|d| &d.receipt).collect();
/// q.ack(&receipts).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteQueue {
    pool: SqlitePool,
    queue: String,
    opts: SqliteQueueOptions,
    notify: Arc<Notify>,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    seq: i64,
    attempt: i64,
}

impl SqliteQueue {
    /// Opens (creating if needed) the queue `queue` in the SQLite file at `url`.
    pub async fn open(url: &str, queue: &str) -> Result<Self> {
        Self::open_with(url, queue, SqliteQueueOptions::default()).await
    }

    /// As [`SqliteQueue::open`], with options.
    pub async fn open_with(url: &str, queue: &str, opts: SqliteQueueOptions) -> Result<Self> {
        if queue.is_empty() {
            return Err(Error::config("queue name is empty"));
        }
        let pool = connect(url, opts.durable, opts.max_connections, true, opts.create).await?;
        if !opts.create {
            must_hold(&pool, &dead_letter_sql(), queue, url).await?;
        }
        sqlx::raw_sql(SCHEMA).execute(&pool).await?;
        sqlx::query("INSERT INTO jo_queue_stats (queue) VALUES (?) ON CONFLICT (queue) DO NOTHING")
            .bind(queue)
            .execute(&pool)
            .await?;
        Ok(SqliteQueue {
            pool,
            queue: queue.to_owned(),
            opts,
            notify: Arc::new(Notify::new()),
        })
    }

    /// The pool, for reading the queue's tables directly.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Counts from the queue's tables.
    pub async fn stats(&self) -> Result<QueueStats> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM jo_queue WHERE queue = ?1),
                    (SELECT COUNT(*) FROM jo_dead_letter WHERE queue = ?1),
                    s.deliveries, s.redeliveries
             FROM jo_queue_stats s WHERE s.queue = ?1",
        )
        .bind(&self.queue)
        .fetch_one(&self.pool)
        .await?;
        Ok(QueueStats {
            pending: row.get::<i64, _>(0) as u64,
            dead_letters: row.get::<i64, _>(1) as u64,
            deliveries: row.get::<i64, _>(2) as u64,
            redeliveries: row.get::<i64, _>(3) as u64,
        })
    }

    /// The dead letters of this queue, oldest first.
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        let entries = dead_letter_entries(&self.pool, &dead_letter_sql(), &self.queue).await?;
        Ok(entries.into_iter().map(|e| e.letter).collect())
    }

    /// Deletes this queue's rows, its dead letters and its counters (the file and the other
    /// queues in it stay).
    pub async fn delete(&self) -> Result<()> {
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        for table in ["jo_queue", "jo_dead_letter", "jo_queue_stats"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE queue = ?"))
                .bind(&self.queue)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn receive_now(&self, max: usize) -> Result<Vec<Delivery>> {
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        let sql = format!(
            "UPDATE jo_queue SET attempts = attempts + 1, visible_at = {NOW_MS} + ?1
             WHERE seq IN (SELECT seq FROM jo_queue WHERE queue = ?2 AND visible_at <= {NOW_MS}
                           ORDER BY visible_at LIMIT ?3)
             RETURNING seq, message_id, payload, headers, content_type, attempts"
        );
        let rows = sqlx::query(&sql)
            .bind(self.opts.lease.as_millis() as i64)
            .bind(&self.queue)
            .bind(max as i64)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.rollback().await?;
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let seq: i64 = r.get("seq");
            let attempt: i64 = r.get("attempts");
            out.push(Delivery {
                message: row_message(r)?,
                attempt: attempt as u32,
                redelivered: attempt > 1,
                receipt: Receipt::new(Token { seq, attempt }),
            });
        }
        out.sort_by_key(|d| d.receipt.downcast_ref::<Token>().map(|t| t.seq));
        let redeliveries = out.iter().filter(|d| d.redelivered).count() as i64;
        sqlx::query(
            "UPDATE jo_queue_stats SET deliveries = deliveries + ?, redeliveries = redeliveries + ?
             WHERE queue = ?",
        )
        .bind(out.len() as i64)
        .bind(redeliveries)
        .bind(&self.queue)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(out)
    }
}

fn row_message(r: &sqlx::sqlite::SqliteRow) -> Result<Message> {
    Ok(message_from_row(
        r.get("message_id"),
        r.get("payload"),
        r.get::<&str, _>("headers"),
        r.get("content_type"),
    ))
}

fn tokens(receipts: &[&Receipt]) -> Result<Vec<Token>> {
    receipts.iter().map(|r| token(r)).collect()
}

fn token(receipt: &Receipt) -> Result<Token> {
    receipt
        .downcast_ref::<Token>()
        .copied()
        .ok_or_else(|| Error::config("receipt does not belong to a SqliteQueue"))
}

#[async_trait]
impl Source for SqliteQueue {
    fn queue(&self) -> &str {
        &self.queue
    }

    fn system(&self) -> &'static str {
        "sqlite"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            let got = self.receive_now(max).await?;
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let nap = self.opts.poll_interval.min(deadline - now);
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let tokens = tokens(receipts)?;
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        for chunk in tokens.chunks(400) {
            let mut qb: QueryBuilder<Sqlite> =
                QueryBuilder::new("DELETE FROM jo_queue WHERE (seq, attempts) IN (VALUES ");
            let mut sep = qb.separated(", ");
            for t in chunk {
                sep.push("(");
                sep.push_bind_unseparated(t.seq);
                sep.push_unseparated(", ");
                sep.push_bind_unseparated(t.attempt);
                sep.push_unseparated(")");
            }
            qb.push(")");
            qb.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = token(receipt)?;
        let sql =
            format!("UPDATE jo_queue SET visible_at = {NOW_MS} + ? WHERE seq = ? AND attempts = ?");
        sqlx::query(&sql)
            .bind(delay.as_millis() as i64)
            .bind(t.seq)
            .bind(t.attempt)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives each delivery's attempt back and makes it visible at once. The receipt's
    /// `(seq, attempts)` then names the row again, which only lets a holder whose lease ran
    /// out settle what it decided (it acks only after its own commit).
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let tokens = tokens(receipts)?;
        let sql = format!(
            "UPDATE jo_queue SET attempts = attempts - 1, visible_at = {NOW_MS}
             WHERE seq = ? AND attempts = ?"
        );
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        for t in &tokens {
            sqlx::query(&sql)
                .bind(t.seq)
                .bind(t.attempt)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.notify.notify_waiters();
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = token(&delivery.receipt)?;
        let m = &delivery.message;
        let headers = serde_json::to_string(m.headers()).map_err(Error::from)?;
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        let sql = format!(
            "INSERT INTO jo_dead_letter (queue, message_id, payload, headers, content_type, attempts,
                                         error, consumer, dead_lettered_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, {NOW_MS})"
        );
        sqlx::query(&sql)
            .bind(&self.queue)
            .bind(m.id().map(MessageId::as_str))
            .bind(m.payload())
            .bind(headers)
            .bind(m.content_type())
            .bind(reason.attempts as i64)
            .bind(&reason.error)
            .bind(&reason.consumer)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM jo_queue WHERE seq = ? AND attempts = ?")
            .bind(t.seq)
            .bind(t.attempt)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    fn redelivery_delay(&self) -> Duration {
        self.opts.lease
    }
}

#[async_trait]
impl Publisher for SqliteQueue {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        let sql = format!(
            "INSERT INTO jo_queue (queue, message_id, payload, headers, content_type, visible_at, enqueued_at)
             VALUES (?, ?, ?, ?, ?, {NOW_MS}, {NOW_MS})"
        );
        let mut tx = crate::begin_with(&self.pool, "BEGIN IMMEDIATE").await?;
        for m in messages {
            let headers = serde_json::to_string(m.headers()).map_err(Error::from)?;
            sqlx::query(&sql)
                .bind(&self.queue)
                .bind(m.id().map(MessageId::as_str))
                .bind(m.payload())
                .bind(headers)
                .bind(m.content_type())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        self.notify.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl justonce_core::Inspect for SqliteQueue {
    async fn pending(&self) -> Result<u64> {
        Ok(self.stats().await?.pending)
    }

    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(self.stats().await?.deliveries))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        SqliteQueue::dead_letters(self).await
    }

    /// Deletes this queue's rows, its dead letters and its counters.
    async fn cleanup(&self) -> Result<()> {
        self.delete().await
    }

    /// Keyed by the dead-letter row's `seq`, with the time it was written.
    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        dead_letter_entries(&self.pool, &dead_letter_sql(), &self.queue).await
    }

    /// In one transaction: each message back into the queue (or into `replay.to`, another
    /// queue of this file), its dead letter deleted.
    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let sql = dead_letter_sql();
        let n = move_dead_letters(&self.pool, &sql, &self.queue, keys, Some(replay)).await?;
        self.notify.notify_waiters();
        Ok(n)
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        move_dead_letters(&self.pool, &dead_letter_sql(), &self.queue, keys, None).await
    }
}

/// The dead-letter statements on SQLite (see [`DeadLetterSql`]).
fn dead_letter_sql() -> DeadLetterSql {
    DeadLetterSql {
        begin: Some("BEGIN IMMEDIATE"),
        entries: "SELECT seq, message_id, payload, headers, content_type, attempts, error, consumer,
                         dead_lettered_at
                  FROM jo_dead_letter WHERE queue = ? ORDER BY seq"
            .into(),
        queues: "SELECT queue, queue FROM jo_queue_stats ORDER BY queue".into(),
        enqueue: format!(
            "INSERT INTO jo_queue (queue, message_id, payload, headers, content_type, visible_at, enqueued_at)
             VALUES (?, ?, ?, ?, ?, {NOW_MS}, {NOW_MS})"
        ),
        delete: "DELETE FROM jo_dead_letter WHERE queue = ? AND seq = ?".into(),
        notify: None,
    }
}
