use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::{
    redact_url, DeadLetterEntry, DeadLetterReason, Delivery, Error, ErrorKind, Message, MessageId,
    Publisher, Receipt, Replay, Result, Source, TransactionalAck,
};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{PgConnection, PgPool, Row};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{connect, create, listen, AbortOnDrop, PgTx, MS};
use crate::queue::{
    dead_letter_entries, message_from_row, move_dead_letters, must_hold, DeadLetter, DeadLetterSql,
    QueueStats,
};

/// The channel publishes notify on; the payload is the queue's name.
pub(super) const CHANNEL: &str = "jo_queue";

fn schema() -> Vec<String> {
    [
        "CREATE TABLE IF NOT EXISTS jo_queue (
             seq          BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             queue        TEXT        COLLATE \"C\" NOT NULL,
             message_id   TEXT,
             payload      BYTEA       NOT NULL,
             headers      TEXT        NOT NULL,
             content_type TEXT,
             attempts     INTEGER     NOT NULL DEFAULT 0,
             visible_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
             enqueued_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
        "CREATE INDEX IF NOT EXISTS jo_queue_ready ON jo_queue (queue, visible_at)",
        "CREATE TABLE IF NOT EXISTS jo_dead_letter (
             seq              BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             queue            TEXT        NOT NULL,
             message_id       TEXT,
             payload          BYTEA       NOT NULL,
             headers          TEXT        NOT NULL,
             content_type     TEXT,
             attempts         INTEGER     NOT NULL,
             error            TEXT        NOT NULL,
             consumer         TEXT        NOT NULL,
             dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
        "CREATE INDEX IF NOT EXISTS jo_dead_letter_queue ON jo_dead_letter (queue, seq)",
        "CREATE TABLE IF NOT EXISTS jo_queue_stats (
             queue        TEXT   PRIMARY KEY,
             deliveries   BIGINT NOT NULL DEFAULT 0,
             redeliveries BIGINT NOT NULL DEFAULT 0)",
    ]
    .map(String::from)
    .to_vec()
}

/// How a [`PgQueue`] behaves.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgQueueOptions {
    /// How long a delivery stays leased to its consumer before it is delivered again.
    pub lease: Duration,
    /// The longest an idle receive sleeps without a notification. Publishes wake receivers
    /// at once through `LISTEN/NOTIFY`, and a receive sleeps only until the next delayed or
    /// leased message is due; this bounds the wait when a notification is lost (while the
    /// listener reconnects).
    pub poll_interval: Duration,
    /// Connections in the pool (the listener has its own).
    pub max_connections: u32,
    /// Create the queue if the database does not hold it yet (the default). `false` makes
    /// `open` fail, naming the queues the database holds: for tools that must not make a
    /// queue by mistake (`justonce dlq`).
    pub create: bool,
}

crate::options::setters!(PgQueueOptions {
    lease: std::time::Duration,
    poll_interval: std::time::Duration,
    max_connections: u32,
    create: bool
});

impl Default for PgQueueOptions {
    fn default() -> Self {
        PgQueueOptions {
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            max_connections: 8,
            create: true,
        }
    }
}

/// A durable queue in PostgreSQL tables: `FOR UPDATE SKIP LOCKED` receives with leases,
/// `LISTEN/NOTIFY` wake-ups, delayed retries, attempts counted in the row, and a dead-letter
/// table with reasons.
///
/// In the database of your business tables it also acks *inside* the business transaction
/// ([`TransactionalAck`], through `Consumer::with_transactional_ack`): a delivery is gone
/// if and only if its effects committed.
///
/// ```no_run
/// use std::time::Duration;
/// use justonce_core::{Message, Publisher, Source};
/// use justonce_sql::PgQueue;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let q = PgQueue::open("postgres://app@127.0.0.1:5432/shop", "orders").await?;
/// q.publish(&Message::new("{}").with_id("ORD-1")?).await?;
/// let batch = q.receive(10, Duration::from_secs(1)).await?;
/// let receipts: Vec<_> = batch.iter().map(|d| &d.receipt).collect();
/// q.ack(&receipts).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgQueue {
    pool: PgPool,
    queue: String,
    opts: PgQueueOptions,
    notify: Arc<Notify>,
    _listener: Arc<AbortOnDrop>,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    seq: i64,
    attempt: i32,
}

impl PgQueue {
    /// Connects, creates the queue tables if missing, and starts listening for publishes.
    pub async fn open(url: &str, queue: &str) -> Result<Self> {
        Self::open_with(url, queue, PgQueueOptions::default()).await
    }

    /// As [`PgQueue::open`], with options.
    pub async fn open_with(url: &str, queue: &str, opts: PgQueueOptions) -> Result<Self> {
        if queue.is_empty() {
            return Err(Error::config("queue name is empty"));
        }
        let pool = connect(url, opts.max_connections).await?;
        if !opts.create {
            must_hold(&pool, &dead_letter_sql(), queue, url).await?;
        }
        create(&pool, &schema()).await?;
        sqlx::query("INSERT INTO jo_queue_stats (queue) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(queue)
            .execute(&pool)
            .await?;
        let notify = Arc::new(Notify::new());
        let mut listener = PgListener::connect(url).await.map_err(|e| {
            Error::with_source(
                ErrorKind::Connect,
                format!("cannot listen on PostgreSQL at {}", redact_url(url)),
                e,
            )
        })?;
        listener.listen(CHANNEL).await?;
        let wake = notify.clone();
        let task = tokio::spawn(listen(
            listener,
            queue.to_owned(),
            Arc::new(move || wake.notify_waiters()),
        ));
        Ok(PgQueue {
            pool,
            queue: queue.to_owned(),
            opts,
            notify,
            _listener: Arc::new(AbortOnDrop(task)),
        })
    }

    /// The pool, for reading the queue's tables directly.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Counts from the queue's tables.
    pub async fn stats(&self) -> Result<QueueStats> {
        let row = sqlx::query(
            "SELECT (SELECT COUNT(*) FROM jo_queue WHERE queue = $1),
                    (SELECT COUNT(*) FROM jo_dead_letter WHERE queue = $1),
                    s.deliveries, s.redeliveries
             FROM jo_queue_stats s WHERE s.queue = $1",
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

    /// Deletes this queue's rows, dead letters and counts (tests, demos on a shared database).
    pub async fn delete(&self) -> Result<()> {
        let mut tx = crate::begin(&self.pool).await?;
        for table in ["jo_queue", "jo_dead_letter", "jo_queue_stats"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE queue = $1"))
                .bind(&self.queue)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// One statement: lease up to `max` ready rows (skipping rows other consumers hold),
    /// count their attempts and the deliveries.
    async fn receive_now(&self, max: usize) -> Result<Vec<Delivery>> {
        let sql = format!(
            "WITH picked AS (
                 SELECT seq FROM jo_queue
                 WHERE queue = $1 AND visible_at <= clock_timestamp()
                 ORDER BY visible_at, seq LIMIT $2
                 FOR UPDATE SKIP LOCKED),
             leased AS (
                 UPDATE jo_queue q
                 SET attempts = q.attempts + 1, visible_at = clock_timestamp() + $3 * {MS}
                 FROM picked WHERE q.seq = picked.seq
                 RETURNING q.seq, q.message_id, q.payload, q.headers, q.content_type, q.attempts),
             counted AS (
                 UPDATE jo_queue_stats
                 SET deliveries = deliveries + (SELECT COUNT(*) FROM leased),
                     redeliveries = redeliveries + (SELECT COUNT(*) FROM leased WHERE attempts > 1)
                 WHERE queue = $1 AND EXISTS (SELECT 1 FROM leased))
             SELECT * FROM leased ORDER BY seq"
        );
        let rows = sqlx::query(&sql)
            .bind(&self.queue)
            .bind(max as i64)
            .bind(self.opts.lease.as_millis() as i64)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let seq: i64 = r.get("seq");
                let attempt: i32 = r.get("attempts");
                Delivery {
                    message: row_message(r),
                    attempt: attempt as u32,
                    redelivered: attempt > 1,
                    receipt: Receipt::new(Token { seq, attempt }),
                }
            })
            .collect())
    }

    /// How long until the next row of this queue is due (a delayed retry, an expired lease),
    /// if any.
    async fn next_due(&self) -> Result<Option<Duration>> {
        let ms: Option<f64> = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM MIN(visible_at) - clock_timestamp())::float8 * 1000
             FROM jo_queue WHERE queue = $1",
        )
        .bind(&self.queue)
        .fetch_one(&self.pool)
        .await?;
        Ok(ms.map(|ms| Duration::from_millis(ms.max(0.0) as u64)))
    }
}

fn row_message(r: &PgRow) -> Message {
    message_from_row(
        r.get("message_id"),
        r.get("payload"),
        r.get::<&str, _>("headers"),
        r.get("content_type"),
    )
}

fn tokens(receipts: &[&Receipt]) -> Result<(Vec<i64>, Vec<i32>)> {
    let mut seqs = Vec::with_capacity(receipts.len());
    let mut attempts = Vec::with_capacity(receipts.len());
    for r in receipts {
        let t = token(r)?;
        seqs.push(t.seq);
        attempts.push(t.attempt);
    }
    Ok((seqs, attempts))
}

fn token(receipt: &Receipt) -> Result<Token> {
    receipt
        .downcast_ref::<Token>()
        .copied()
        .ok_or_else(|| Error::config("receipt does not belong to a PgQueue"))
}

/// Deletes the rows the receipts still hold; returns how many.
async fn delete_held(conn: &mut PgConnection, receipts: &[&Receipt]) -> Result<u64> {
    let (seqs, attempts) = tokens(receipts)?;
    Ok(sqlx::query(
        "DELETE FROM jo_queue q USING UNNEST($1::bigint[], $2::int[]) AS r(seq, attempts)
         WHERE q.seq = r.seq AND q.attempts = r.attempts",
    )
    .bind(seqs)
    .bind(attempts)
    .execute(conn)
    .await?
    .rows_affected())
}

#[async_trait]
impl Source for PgQueue {
    fn queue(&self) -> &str {
        &self.queue
    }

    fn system(&self) -> &'static str {
        "postgresql"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = self.receive_now(max).await?;
            let now = Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let mut nap = self.opts.poll_interval.min(deadline - now);
            if let Some(due) = self.next_due().await? {
                nap = nap.min(due.max(Duration::from_millis(1)));
            }
            let _ = tokio::time::timeout(nap, notified).await;
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        delete_held(&mut conn, receipts).await?;
        Ok(())
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = token(receipt)?;
        let sql = format!(
            "UPDATE jo_queue SET visible_at = clock_timestamp() + $1 * {MS}
             WHERE seq = $2 AND attempts = $3"
        );
        sqlx::query(&sql)
            .bind(delay.as_millis() as i64)
            .bind(t.seq)
            .bind(t.attempt)
            .execute(&self.pool)
            .await?;
        if delay.is_zero() {
            self.notify.notify_waiters();
        }
        Ok(())
    }

    /// Gives each delivery's attempt back and makes it visible at once, in one statement.
    /// The receipt's `(seq, attempts)` then names the row again, which only lets a holder
    /// whose lease ran out settle what it decided (it acks only after its own commit).
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let (seqs, attempts) = tokens(receipts)?;
        sqlx::query(
            "UPDATE jo_queue q SET attempts = q.attempts - 1, visible_at = clock_timestamp()
             FROM unnest($1::bigint[], $2::int[]) AS r(seq, attempts)
             WHERE q.seq = r.seq AND q.attempts = r.attempts",
        )
        .bind(seqs)
        .bind(attempts)
        .execute(&self.pool)
        .await?;
        self.notify.notify_waiters();
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = token(&delivery.receipt)?;
        let m = &delivery.message;
        let headers = serde_json::to_string(m.headers()).map_err(Error::from)?;
        let mut tx = crate::begin(&self.pool).await?;
        let deleted = sqlx::query("DELETE FROM jo_queue WHERE seq = $1 AND attempts = $2")
            .bind(t.seq)
            .bind(t.attempt)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if deleted == 0 {
            // The lease ran out and the message went to someone else: it is theirs to settle.
            tx.rollback().await?;
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO jo_dead_letter (queue, message_id, payload, headers, content_type,
                                         attempts, error, consumer)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&self.queue)
        .bind(m.id().map(MessageId::as_str))
        .bind(m.payload())
        .bind(headers)
        .bind(m.content_type())
        .bind(reason.attempts as i32)
        .bind(&reason.error)
        .bind(&reason.consumer)
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
impl TransactionalAck<PgTx> for PgQueue {
    async fn ack_in(&self, tx: &mut PgTx, receipts: &[&Receipt]) -> Result<()> {
        if receipts.is_empty() {
            return Ok(());
        }
        let deleted = delete_held(tx, receipts).await?;
        if deleted != receipts.len() as u64 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{} of {} deliveries were leased to another consumer meanwhile (their lease \
                     of {:?} ran out): the batch is rolled back, to be applied once by the new holder",
                    receipts.len() as u64 - deleted,
                    receipts.len(),
                    self.opts.lease
                ),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Publisher for PgQueue {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    /// One transaction: the rows, and a notification delivered when it commits.
    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut tx = crate::begin(&self.pool).await?;
        self.insert(&mut tx, messages).await?;
        tx.commit().await?;
        Ok(())
    }
}

impl PgQueue {
    /// Publishes `messages` inside `tx`, a transaction of the database the queue is in (a
    /// [`PgStore`](crate::PgStore)'s on the same URL): they reach consumers if and only if
    /// `tx` commits, and waiting receivers are woken at the commit. When the queue lives
    /// in the business database this closes the gap between commit and publish with no
    /// outbox and no relay: the queue table is the outbox.
    ///
    /// ```no_run
    /// # async fn run() -> justonce_core::Result<()> {
    /// use justonce_core::{Message, Store};
    /// use justonce_sql::{PgQueue, PgStore};
    ///
    /// let url = "postgres://app@127.0.0.1:5432/shop";
    /// let (store, receipts) = (PgStore::open(url).await?, PgQueue::open(url, "receipts").await?);
    /// let mut tx = store.begin().await?;
    /// // … the business write in `tx` …
    /// let receipt = Message::new(r#"{"receipt":"R-1"}"#).with_id("R-1")?;
    /// receipts.publish_in(&mut tx, &[receipt]).await?;
    /// store.commit(tx).await?; // the receipt is queued if and only if the write committed
    /// # Ok(()) }
    /// ```
    pub async fn publish_in(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        messages: &[Message],
    ) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        self.insert(tx, messages).await
    }

    /// The rows and their notification, in `tx`.
    async fn insert(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        messages: &[Message],
    ) -> Result<()> {
        let mut ids = Vec::with_capacity(messages.len());
        let mut payloads = Vec::with_capacity(messages.len());
        let mut headers = Vec::with_capacity(messages.len());
        let mut types = Vec::with_capacity(messages.len());
        for m in messages {
            ids.push(m.id().map(|i| i.as_str().to_owned()));
            payloads.push(m.payload().to_vec());
            headers.push(serde_json::to_string(m.headers()).map_err(Error::from)?);
            types.push(m.content_type().map(str::to_owned));
        }
        sqlx::query(
            "INSERT INTO jo_queue (queue, message_id, payload, headers, content_type)
             SELECT $1, * FROM UNNEST($2::text[], $3::bytea[], $4::text[], $5::text[])",
        )
        .bind(&self.queue)
        .bind(ids)
        .bind(payloads)
        .bind(headers)
        .bind(types)
        .execute(&mut **tx)
        .await?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(&self.queue)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl justonce_core::Inspect for PgQueue {
    async fn pending(&self) -> Result<u64> {
        Ok(self.stats().await?.pending)
    }

    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(self.stats().await?.deliveries))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        PgQueue::dead_letters(self).await
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
    /// queue of this database), its dead letter deleted, the receivers notified.
    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let sql = dead_letter_sql();
        move_dead_letters(&self.pool, &sql, &self.queue, keys, Some(replay)).await
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        move_dead_letters(&self.pool, &dead_letter_sql(), &self.queue, keys, None).await
    }
}

/// The dead-letter statements on PostgreSQL (see [`DeadLetterSql`]).
fn dead_letter_sql() -> DeadLetterSql {
    DeadLetterSql {
        begin: None,
        entries: "SELECT seq, message_id, payload, headers, content_type, attempts::bigint, error,
                         consumer, (EXTRACT(EPOCH FROM dead_lettered_at) * 1000)::bigint
                  FROM jo_dead_letter WHERE queue = $1 ORDER BY seq"
            .into(),
        queues: "SELECT queue, queue FROM jo_queue_stats ORDER BY queue".into(),
        enqueue: "INSERT INTO jo_queue (queue, message_id, payload, headers, content_type)
                  VALUES ($1, $2, $3, $4, $5)"
            .into(),
        delete: "DELETE FROM jo_dead_letter WHERE queue = $1 AND seq = $2".into(),
        notify: Some(format!("SELECT pg_notify('{CHANNEL}', $1)")),
    }
}
