//! The outbox of the three SQL stores, written once over [`Conn`]: each backend gives only
//! its SQL text ([`OutboxSql`]). A row is written in the business transaction; relays take
//! rows under a lease, a key blocked while an earlier row of it is leased, waiting out a
//! retry or dead.
//!
//! Lists of seqs are written into the SQL as integer literals (they come from the table,
//! never from a caller's text), so one statement serves every dialect.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use justonce_core::{
    check_outgoing, DeadOutboxRow, Error, InspectOutbox, Message, MessageId, OutboxFailure,
    OutboxOwner, OutboxRow, OutboxStats, OutboxStore, Result, DEFAULT_OUTBOX_MAX_PAYLOAD,
};

use crate::conn::{Arg, Conn};
use crate::queue::message_from_row;

/// Options of an outbox.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OutboxOptions {
    /// The outbox table (default `jo_outbox`), validated as an SQL identifier.
    pub table: String,
    /// The largest payload enqueued; larger ones are refused at enqueue (default 1 MiB).
    pub max_payload_bytes: usize,
    /// Create the table if missing (default `true`); tools open with `false`.
    pub create: bool,
}

crate::options::setters!(OutboxOptions { max_payload_bytes: usize, create: bool } into { table });

impl Default for OutboxOptions {
    fn default() -> Self {
        OutboxOptions {
            table: "jo_outbox".into(),
            max_payload_bytes: DEFAULT_OUTBOX_MAX_PAYLOAD,
            create: true,
        }
    }
}

/// How a backend takes rows (and marks the rows its relay sent last, in the same
/// transaction).
#[derive(Debug)]
#[cfg_attr(not(all(feature = "mysql", feature = "postgres")), allow(dead_code))]
pub(crate) enum TakeSql {
    /// One statement that leases and returns the rows: owner, lease in ms, max. The sent
    /// rows are deleted before it, in its transaction (SQLite: one writer at a time).
    Returning(String),
    /// One statement that deletes the rows sent and leases and returns the next ones:
    /// owner, lease in ms, max, and the sent rows' seqs as comma-separated text; in a
    /// transaction begun by `begin` (PostgreSQL: its planner settings, in the same round
    /// trip). Takes run side by side.
    MarkAndTake { begin: String, sql: String },
    /// In steps, after `lock` (no parameters; held to the commit: one take at a time,
    /// each reading what the one before it leased, and a take dropped midway rolls back
    /// and frees it) and the delete of the sent rows: `choose` (max) answers the seqs;
    /// `lease` (owner, lease in ms) and `read` end with `{seqs}` (MariaDB).
    Steps {
        lock: String,
        choose: String,
        lease: String,
        read: String,
    },
}

/// How a relay waiting for rows is woken.
#[async_trait]
pub(crate) trait Wake: Send + Sync + 'static {
    /// A row was written in a transaction not yet committed.
    fn enqueued(&self) {}

    /// Waits for a wake-up, `max` at the longest.
    async fn wait(&self, max: Duration);
}

/// No wake-up: relays poll (MariaDB).
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub(crate) struct Poll;

#[async_trait]
impl Wake for Poll {
    async fn wait(&self, max: Duration) {
        tokio::time::sleep(max).await;
    }
}

/// Wakes one relay of this process at each enqueue (SQLite). The enqueue comes before its
/// commit, but the woken relay's take is a write, which waits for the enqueueing
/// transaction's write lock to go: it sees the row once it is committed. Relays in other
/// processes poll.
#[derive(Default)]
pub(crate) struct Local(tokio::sync::Notify);

#[async_trait]
impl Wake for Local {
    fn enqueued(&self) {
        self.0.notify_one();
    }

    async fn wait(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.0.notified()).await;
    }
}

/// A backend's outbox statements. Rows are read as `seq, okey, message_id, payload,
/// headers, content_type, attempts`, the integers as 64-bit. Parameters, in order:
/// - `enqueue_lock` (run before an enqueue with a key, so that seq order is commit order
///   per key): key;
/// - `enqueue`: key, message id, payload, headers (JSON), content type (one statement:
///   PostgreSQL's sends its `NOTIFY` in it);
/// - `fail`: retry delay in ms, error, max attempts, seq; `is_dead`: seq;
/// - `sent` and `release` end with `{seqs}`;
/// - `stats`: none; one row of text: pending, leased, dead, oldest enqueue in ms.
#[derive(Debug)]
pub(crate) struct OutboxSql {
    pub(crate) enqueue_lock: Option<String>,
    pub(crate) enqueue: String,
    pub(crate) take: TakeSql,
    pub(crate) fail: String,
    pub(crate) is_dead: String,
    pub(crate) sent: String,
    pub(crate) release: String,
    pub(crate) stats: String,
    /// Run by [`OutboxStore::tidy`] outside any transaction (none), if any.
    pub(crate) tidy: Option<String>,
    /// For tools, rows of text: `owners` (none): owner, rows, last lease end in ms;
    /// `dead` (max): seq, key, message id, attempts, reason; `revive` and `discard` end
    /// with `{and}` (nothing, or ` AND seq IN (…)`).
    pub(crate) owners: String,
    pub(crate) dead: String,
    pub(crate) revive: String,
    pub(crate) discard: String,
}

/// An outbox in a SQL store's database: [`SqliteOutbox`](crate::SqliteOutbox),
/// [`PgOutbox`](crate::PgOutbox), [`MySqlOutbox`](crate::MySqlOutbox). Enqueue in the
/// store's transactions ([`OutboxStore::enqueue`]); relay from any number of processes.
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
pub struct SqlOutbox<DB: sqlx::Database> {
    pub(crate) pool: sqlx::Pool<DB>,
    /// The table, a validated identifier.
    pub(crate) table: Arc<str>,
    sql: Arc<OutboxSql>,
    max_payload: usize,
    wake: Arc<dyn Wake>,
}

impl<DB: sqlx::Database> Clone for SqlOutbox<DB> {
    fn clone(&self) -> Self {
        SqlOutbox {
            pool: self.pool.clone(),
            table: self.table.clone(),
            sql: self.sql.clone(),
            max_payload: self.max_payload,
            wake: self.wake.clone(),
        }
    }
}

impl<DB: sqlx::Database> std::fmt::Debug for SqlOutbox<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlOutbox")
            .field("max_payload", &self.max_payload)
            .finish()
    }
}

impl<DB: sqlx::Database> SqlOutbox<DB> {
    pub(crate) fn new(
        pool: sqlx::Pool<DB>,
        sql: OutboxSql,
        opts: &OutboxOptions,
        wake: Arc<dyn Wake>,
    ) -> Self {
        SqlOutbox {
            pool,
            table: opts.table.as_str().into(),
            sql: Arc::new(sql),
            max_payload: opts.max_payload_bytes,
            wake,
        }
    }
}

/// `sql` with its `{seqs}` written out.
fn with_seqs(sql: &str, seqs: &[u64]) -> String {
    let list: Vec<String> = seqs.iter().map(u64::to_string).collect();
    sql.replace("{seqs}", &list.join(", "))
}

fn number(s: &Option<String>) -> u64 {
    s.as_deref()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .map_or(0, |f| f.max(0.0) as u64)
}

#[async_trait]
impl<DB> OutboxStore for SqlOutbox<DB>
where
    DB: sqlx::Database<Connection: Conn>,
{
    type Tx = sqlx::Transaction<'static, DB>;

    async fn enqueue(&self, tx: &mut Self::Tx, message: &Message, key: Option<&str>) -> Result<()> {
        check_outgoing(message, self.max_payload)?;
        let headers = serde_json::to_string(message.headers()).map_err(Error::from)?;
        if let (Some(lock), Some(key)) = (&self.sql.enqueue_lock, key) {
            (**tx).text_rows(lock, &[Arg::Text(key)]).await?;
        }
        let args = [
            Arg::MaybeText(key),
            Arg::MaybeText(message.id().map(MessageId::as_str)),
            Arg::Blob(Some(message.payload())),
            Arg::Text(&headers),
            Arg::MaybeText(message.content_type()),
        ];
        (**tx).execute(&self.sql.enqueue, &args).await?;
        self.wake.enqueued();
        Ok(())
    }

    async fn take(&self, owner: &str, max: usize, lease: Duration) -> Result<Vec<OutboxRow>> {
        self.take_after_sent(&[], owner, max, lease).await
    }

    /// Marks `sent` and takes, in one transaction: one commit per batch saved.
    async fn take_after_sent(
        &self,
        sent: &[u64],
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>> {
        let lease = Arg::Int(lease.as_millis() as i64);
        let args = [Arg::Text(owner), lease, Arg::Int(max as i64)];
        let rows = match &self.sql.take {
            // Nothing to mark: one statement, no transaction.
            TakeSql::Returning(sql) if sent.is_empty() => {
                let mut conn = self.pool.acquire().await?;
                (*conn).outbox_rows(sql, &args).await?
            }
            TakeSql::Returning(sql) => {
                let mut tx = crate::begin(&self.pool).await?;
                for_seqs(&mut *tx, &self.sql.sent, sent).await?;
                let rows = (*tx).outbox_rows(sql, &args).await?;
                tx.commit().await?;
                rows
            }
            TakeSql::MarkAndTake { begin, sql } => {
                let sent: Vec<String> = sent.iter().map(u64::to_string).collect();
                let sent = sent.join(",");
                let args = [args[0], args[1], args[2], Arg::Text(&sent)];
                let mut tx = crate::begin_with(&self.pool, begin.clone()).await?;
                let rows = (*tx).outbox_rows(sql, &args).await?;
                tx.commit().await?;
                rows
            }
            TakeSql::Steps {
                lock,
                choose,
                lease: lease_sql,
                read,
            } => {
                let mut tx = crate::begin(&self.pool).await?;
                (*tx).execute(lock, &[]).await?;
                for_seqs(&mut *tx, &self.sql.sent, sent).await?;
                let seqs: Vec<u64> = (*tx)
                    .text_rows(choose, &[Arg::Int(max as i64)])
                    .await?
                    .iter()
                    .map(|r| number(&r[0]))
                    .collect();
                let rows = if seqs.is_empty() {
                    Vec::new()
                } else {
                    let args = [Arg::Text(owner), lease];
                    (*tx).execute(&with_seqs(lease_sql, &seqs), &args).await?;
                    (*tx).outbox_rows(&with_seqs(read, &seqs), &[]).await?
                };
                tx.commit().await?;
                rows
            }
        };
        let mut out: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow {
                seq: r.seq as u64,
                key: r.key,
                message: message_from_row(r.message_id, r.payload, &r.headers, r.content_type),
                attempts: r.attempts.max(0) as u32,
            })
            .collect();
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    async fn mark_sent(&self, seqs: &[u64]) -> Result<()> {
        for_seqs(&mut *self.pool.acquire().await?, &self.sql.sent, seqs).await?;
        Ok(())
    }

    async fn mark_failed(
        &self,
        seq: u64,
        error: &str,
        retry_after: Duration,
        max_attempts: u32,
    ) -> Result<OutboxFailure> {
        let mut conn = self.pool.acquire().await?;
        let args = [
            Arg::Int(retry_after.as_millis() as i64),
            Arg::Text(error),
            Arg::Int(i64::from(max_attempts)),
            Arg::Int(seq as i64),
        ];
        (*conn).execute(&self.sql.fail, &args).await?;
        let dead = (*conn)
            .int(&self.sql.is_dead, &[Arg::Int(seq as i64)])
            .await?;
        Ok(if dead == Some(1) {
            OutboxFailure::Dead
        } else {
            OutboxFailure::Retrying
        })
    }

    async fn release(&self, seqs: &[u64]) -> Result<()> {
        for_seqs(&mut *self.pool.acquire().await?, &self.sql.release, seqs).await?;
        Ok(())
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        let mut conn = self.pool.acquire().await?;
        let rows = (*conn).text_rows(&self.sql.stats, &[]).await?;
        let r = rows
            .first()
            .ok_or_else(|| Error::new(justonce_core::ErrorKind::Internal, "no stats row"))?;
        let oldest = r[3]
            .as_ref()
            .map(|_| UNIX_EPOCH + Duration::from_millis(number(&r[3])));
        Ok(OutboxStats::new(
            number(&r[0]),
            number(&r[1]),
            number(&r[2]),
            oldest,
        ))
    }

    async fn wait_for_rows(&self, max: Duration) {
        self.wake.wait(max).await;
    }

    async fn tidy(&self) -> Result<()> {
        if let Some(sql) = &self.sql.tidy {
            (*self.pool.acquire().await?).execute(sql, &[]).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl<DB> InspectOutbox for SqlOutbox<DB>
where
    DB: sqlx::Database<Connection: Conn>,
{
    async fn stats(&self) -> Result<OutboxStats> {
        self.outbox_stats().await
    }

    async fn owners(&self) -> Result<Vec<OutboxOwner>> {
        let mut conn = self.pool.acquire().await?;
        let rows = (*conn).text_rows(&self.sql.owners, &[]).await?;
        Ok(rows
            .iter()
            .map(|r| {
                let until = r[2]
                    .as_ref()
                    .map(|_| UNIX_EPOCH + Duration::from_millis(number(&r[2])));
                OutboxOwner::new(r[0].clone().unwrap_or_default(), number(&r[1]), until)
            })
            .collect())
    }

    async fn dead_rows(&self, max: usize) -> Result<Vec<DeadOutboxRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = (*conn)
            .text_rows(&self.sql.dead, &[Arg::Int(max as i64)])
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                DeadOutboxRow::new(
                    number(&r[0]),
                    r[1].clone(),
                    r[2].clone().unwrap_or_default(),
                    number(&r[3]) as u32,
                    r[4].clone().unwrap_or_default(),
                )
            })
            .collect())
    }

    async fn revive(&self, seqs: Option<&[u64]>) -> Result<u64> {
        on_dead(&self.pool, &self.sql.revive, seqs).await
    }

    async fn discard(&self, seqs: Option<&[u64]>) -> Result<u64> {
        on_dead(&self.pool, &self.sql.discard, seqs).await
    }
}

/// Runs a statement on dead rows (`sql` ends with `{and}`): all, or `seqs`.
async fn on_dead<DB>(pool: &sqlx::Pool<DB>, sql: &str, seqs: Option<&[u64]>) -> Result<u64>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let mut conn = pool.acquire().await?;
    match seqs {
        None => Ok((*conn).execute(&sql.replace("{and}", ""), &[]).await?),
        Some(seqs) => {
            let sql = sql.replace("{and}", " AND seq IN ({seqs})");
            for_seqs(&mut *conn, &sql, seqs).await
        }
    }
}

/// Runs `sql` (ending with `{seqs}`) for `seqs`, 500 at a time, on `conn` (a pooled
/// connection or a transaction); answers the rows it touched.
async fn for_seqs<C: Conn + Send + ?Sized>(conn: &mut C, sql: &str, seqs: &[u64]) -> Result<u64> {
    let mut n = 0;
    for chunk in seqs.chunks(500) {
        n += conn.execute(&with_seqs(sql, chunk), &[]).await?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqs_are_written_out_and_numbers_read_back() {
        assert_eq!(
            with_seqs("DELETE FROM t WHERE seq IN ({seqs})", &[3, 1, 2]),
            "DELETE FROM t WHERE seq IN (3, 1, 2)"
        );
        assert_eq!(number(&Some("12".into())), 12);
        assert_eq!(number(&Some(" 4.0 ".into())), 4);
        assert_eq!(number(&None), 0);
    }
}
