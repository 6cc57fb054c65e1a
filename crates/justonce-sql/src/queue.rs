//! What the SQL queues (SQLite, PostgreSQL) share: their counts, their dead letters (read,
//! replayed and purged by the same functions on both, over [`Conn`]), and the conversions
//! of their rows.

use std::time::{Duration, UNIX_EPOCH};

use justonce_core::{
    no_such_dead_letter, DeadLetterEntry, DeadLetterReason, Error, Headers, Message, MessageId,
    Replay, Result,
};

use crate::conn::{Arg, Conn, DeadLetterRow};

pub use justonce_core::DeadLetter;

/// Counts read from the queue's own tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Messages not yet acked or dead-lettered (ready, delayed or leased).
    pub pending: u64,
    /// Rows in the dead-letter table for this queue.
    pub dead_letters: u64,
    /// Deliveries made, redeliveries included.
    pub deliveries: u64,
    /// Deliveries of a message that had been delivered before.
    pub redeliveries: u64,
}

/// A message from a queue row's columns (`headers` is JSON; bad JSON reads as no headers,
/// so a row written by an older version is still delivered).
pub(crate) fn message_from_row(
    id: Option<String>,
    payload: Vec<u8>,
    headers: &str,
    content_type: Option<String>,
) -> Message {
    let headers: Headers = serde_json::from_str(headers).unwrap_or_default();
    let mut m = Message::new(payload)
        .with_message_id(id.and_then(|s| MessageId::new(s).ok()))
        .with_headers(headers);
    if let Some(ct) = content_type {
        m = m.with_content_type(ct);
    }
    m
}

/// A SQL queue's dead-letter statements. Parameters, in order:
/// - `entries`: queue (the columns of [`DeadLetterRow`], by `seq`);
/// - `queues`: none (the names of the queues in the database, as a first text column and a
///   second one);
/// - `enqueue`: queue, message id, payload, headers (JSON), content type;
/// - `delete`: queue, seq;
/// - `notify` (run once after a replay, in its transaction): queue.
#[derive(Debug)]
pub(crate) struct DeadLetterSql {
    pub(crate) begin: Option<&'static str>,
    pub(crate) entries: String,
    pub(crate) queues: String,
    pub(crate) enqueue: String,
    pub(crate) delete: String,
    pub(crate) notify: Option<String>,
}

fn entry(r: DeadLetterRow, queue: &str) -> DeadLetterEntry {
    let message = message_from_row(r.message_id, r.payload, &r.headers, r.content_type);
    let reason = DeadLetterReason {
        error: r.error,
        attempts: u32::try_from(r.attempts).unwrap_or(0),
        source_queue: queue.to_owned(),
        consumer: r.consumer,
    };
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(r.at_ms).unwrap_or(0));
    DeadLetterEntry::new(
        r.seq.to_string(),
        justonce_core::DeadLetter::new(message, reason),
        Some(at),
    )
}

/// The dead letters of `queue`, oldest first, keyed by their row's `seq`.
pub(crate) async fn dead_letter_entries<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &DeadLetterSql,
    queue: &str,
) -> Result<Vec<DeadLetterEntry>>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let mut conn = pool.acquire().await?;
    let rows = (*conn)
        .dead_letter_rows(&sql.entries, &[Arg::Text(queue)])
        .await?;
    Ok(rows.into_iter().map(|r| entry(r, queue)).collect())
}

/// The queues the database holds, by name.
pub(crate) async fn queue_names<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &DeadLetterSql,
) -> Result<Vec<String>>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let mut conn = pool.acquire().await?;
    let rows = (*conn).text_pairs(&sql.queues, &[]).await?;
    Ok(rows.into_iter().map(|(q, _)| q).collect())
}

/// Replays (`Some`) or purges (`None`) the dead letters `keys` of `queue` in one
/// transaction: all of them or none, each replayed message enqueued in the transaction that
/// deletes its dead letter. A key that is not there, or a target queue the database does
/// not hold, moves nothing.
pub(crate) async fn move_dead_letters<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &DeadLetterSql,
    queue: &str,
    keys: &[String],
    replay: Option<&Replay>,
) -> Result<u64>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let target = replay.and_then(|r| r.to.as_deref()).unwrap_or(queue);
    if target != queue {
        let queues = queue_names(pool, sql).await?;
        if !queues.iter().any(|q| q == target) {
            return Err(Error::config(format!(
                "no queue {target} in this database to replay into (its queues: {})",
                queues.join(", ")
            )));
        }
    }
    let mut tx = crate::conn::begin_maybe_with(pool, sql.begin).await?;
    let mut rows: Vec<Option<DeadLetterRow>> = (*tx)
        .dead_letter_rows(&sql.entries, &[Arg::Text(queue)])
        .await?
        .into_iter()
        .map(Some)
        .collect();
    let mut chosen = Vec::with_capacity(keys.len());
    for key in keys {
        let found = rows
            .iter()
            .position(|r| r.as_ref().is_some_and(|r| r.seq.to_string() == *key));
        chosen.push(found.ok_or_else(|| no_such_dead_letter(key))?);
    }
    chosen.sort_unstable();
    chosen.dedup();
    for i in &chosen {
        let Some(row) = rows[*i].take() else { continue };
        let seq = row.seq;
        if let Some(replay) = replay {
            let m = entry(row, queue).letter.replay_message(replay);
            let headers = serde_json::to_string(m.headers()).map_err(Error::from)?;
            let args = [
                Arg::Text(target),
                Arg::MaybeText(m.id().map(MessageId::as_str)),
                Arg::Blob(Some(m.payload())),
                Arg::Text(&headers),
                Arg::MaybeText(m.content_type()),
            ];
            (*tx).execute(&sql.enqueue, &args).await?;
        }
        (*tx)
            .execute(&sql.delete, &[Arg::Text(queue), Arg::Int(seq)])
            .await?;
    }
    if let (Some(_), Some(notify)) = (replay, &sql.notify) {
        (*tx).execute(notify, &[Arg::Text(target)]).await?;
    }
    tx.commit().await?;
    Ok(chosen.len() as u64)
}

/// Fails unless the database holds `queue`, before anything is created in it: a database
/// without the queue tables holds none.
pub(crate) async fn must_hold<DB>(
    pool: &sqlx::Pool<DB>,
    sql: &DeadLetterSql,
    queue: &str,
    url: &str,
) -> Result<()>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let queues = match queue_names(pool, sql).await {
        Ok(q) => q,
        Err(e) if e.kind() == justonce_core::ErrorKind::Schema => Vec::new(),
        Err(e) => return Err(e),
    };
    if queues.iter().any(|q| q == queue) {
        return Ok(());
    }
    Err(no_such_queue(queue, url, &queues))
}

/// The error of a queue the database does not hold, when it must not be created.
fn no_such_queue(queue: &str, url: &str, queues: &[String]) -> Error {
    Error::config(format!(
        "no queue {queue} in {} (its queues: {})",
        justonce_core::redact_url(url),
        if queues.is_empty() {
            "none".to_owned()
        } else {
            queues.join(", ")
        }
    ))
}
