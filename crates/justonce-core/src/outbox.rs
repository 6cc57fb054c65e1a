//! The outbox seam, the producer half of the chain: a service writes the messages it must
//! send in its own business transaction ([`OutboxStore::enqueue`]), so they exist if and
//! only if its effects committed; a relay publishes them after the commit, with confirms,
//! and marks each sent only once its publish is durable (confirm, then mark). A relay that
//! dies between the two publishes the row again: a duplicate under the same id, which the
//! next consumer's dedup absorbs. Nothing committed is ever lost.
//!
//! Order: rows that share an ordering key go out in the order they were enqueued, one
//! relay at a time per key; rows of different keys, and rows without a key, in parallel.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{Error, Message, MessageId, Result};

/// A row a relay took to publish.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    /// Its place in the outbox: rows of one key go out in this order.
    pub seq: u64,
    /// The ordering key, if any.
    pub key: Option<String>,
    /// The message, with its id.
    pub message: Message,
    /// Failed publishes so far.
    pub attempts: u32,
}

/// What a failed publish did to its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxFailure {
    /// It is tried again after the delay; its key waits for it.
    Retrying,
    /// It ran out of attempts: dead, with its reason, blocking its key until an operator
    /// acts (`justonce outbox`), never silently.
    Dead,
}

/// What an outbox holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Rows not yet sent and not dead (leased ones included).
    pub pending: u64,
    /// Of them, leased to a relay now.
    pub leased: u64,
    /// Dead rows.
    pub dead: u64,
    /// When the oldest pending row was enqueued, by the store's clock.
    pub oldest: Option<SystemTime>,
}

impl OutboxStats {
    /// Counts of an outbox.
    pub fn new(pending: u64, leased: u64, dead: u64, oldest: Option<SystemTime>) -> Self {
        OutboxStats {
            pending,
            leased,
            dead,
            oldest,
        }
    }
}

/// Where a service's outgoing messages wait for their commit and their relay.
///
/// `Tx` is the business transaction the messages are written in (for the SQL stores the
/// same `sqlx::Transaction` the handler writes its effects in). The relay side runs on the
/// store's own connections, from any number of relay processes at once.
#[async_trait]
pub trait OutboxStore: Send + Sync + 'static {
    /// The business transaction.
    type Tx: Send + 'static;

    /// Writes `message` into the outbox inside `tx`: a relay sees it only once `tx`
    /// commits, and never if it rolls back. `key` orders it after the earlier messages of
    /// that key. A message without an id, or larger than the outbox takes, is refused
    /// ([`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)) and nothing is written.
    async fn enqueue(&self, tx: &mut Self::Tx, message: &Message, key: Option<&str>) -> Result<()>;

    /// Leases up to `max` rows to `owner` for `lease`, in outbox order: rows not dead, due
    /// (a failed one waits out its delay), not leased (or whose lease ran out), and, for a
    /// key, only while no earlier row of that key is leased, waiting or dead.
    async fn take(&self, owner: &str, max: usize, lease: Duration) -> Result<Vec<OutboxRow>>;

    /// The rows `seqs` are published durably: removes them. Idempotent.
    async fn mark_sent(&self, seqs: &[u64]) -> Result<()>;

    /// [`OutboxStore::mark_sent`] of `sent`, then [`OutboxStore::take`]: a relay marks the
    /// rows of its last batch with its next take. A store that can runs both in one
    /// transaction (the SQL stores: one commit per batch saved); the default runs them one
    /// after the other.
    async fn take_after_sent(
        &self,
        sent: &[u64],
        owner: &str,
        max: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxRow>> {
        if !sent.is_empty() {
            self.mark_sent(sent).await?;
        }
        self.take(owner, max, lease).await
    }

    /// The publish of row `seq` failed with `error`: counts an attempt and makes it wait
    /// `retry_after`, or, at `max_attempts`, marks it dead with `error` as its reason.
    async fn mark_failed(
        &self,
        seq: u64,
        error: &str,
        retry_after: Duration,
        max_attempts: u32,
    ) -> Result<OutboxFailure>;

    /// Hands rows back without counting an attempt (the rows of a key after one that
    /// failed, a relay that stops).
    async fn release(&self, seqs: &[u64]) -> Result<()>;

    /// What the outbox holds.
    async fn outbox_stats(&self) -> Result<OutboxStats>;

    /// Waits until rows may have become ready to take, or `max` at the longest: a relay
    /// calls it when a take found nothing. A store that hears of commits wakes it early
    /// (PostgreSQL's `NOTIFY`, sent by the enqueueing transaction and delivered at its
    /// commit; an in-process notification on SQLite and in memory); the default only
    /// sleeps, and the relay polls.
    async fn wait_for_rows(&self, max: Duration) {
        tokio::time::sleep(max).await;
    }

    /// Gives the space of sent rows back, where the database leaves that to its owner: a
    /// running relay calls it every `RelayOptions::tidy_interval` (crate `justonce`). On
    /// PostgreSQL a `VACUUM` of the table (skipped while another one runs), which keeps
    /// takes from wading through deleted rows and lets the table shrink when it empties;
    /// the default does nothing (MariaDB's purge and SQLite's free pages reuse the space
    /// on their own).
    async fn tidy(&self) -> Result<()> {
        Ok(())
    }
}

/// A relay that holds leases now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxOwner {
    /// The relay's owner name.
    pub owner: String,
    /// Rows it holds.
    pub rows: u64,
    /// When the last of its leases runs out, by the store's clock.
    pub until: Option<SystemTime>,
}

/// A dead outbox row: it ran out of attempts, and its key waits behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadOutboxRow {
    /// Its place in the outbox.
    pub seq: u64,
    /// Its ordering key.
    pub key: Option<String>,
    /// Its message's id.
    pub message_id: String,
    /// Publishes tried.
    pub attempts: u32,
    /// The last error, its reason.
    pub reason: String,
}

impl OutboxOwner {
    /// A lease holder.
    pub fn new(owner: String, rows: u64, until: Option<SystemTime>) -> Self {
        OutboxOwner { owner, rows, until }
    }
}

impl DeadOutboxRow {
    /// A dead row.
    pub fn new(
        seq: u64,
        key: Option<String>,
        message_id: String,
        attempts: u32,
        reason: String,
    ) -> Self {
        DeadOutboxRow {
            seq,
            key,
            message_id,
            attempts,
            reason,
        }
    }
}

/// A queue in the outbox's own database that its rows move into, each batch in one
/// transaction of that database: a row leaves the outbox exactly when it enters the queue,
/// so there is no publish to confirm, no lease to run out and no duplicate to absorb. A
/// relay built with `Relay::moving` (crate `justonce`) runs it instead of publishing; the
/// PostgreSQL outbox moves into a PostgreSQL queue of its database
/// (`PgOutbox::mover_into`, crate `justonce-sql`).
///
/// Rows move under the rules of [`OutboxStore::take`]: due, not leased, not dead, and a
/// key's rows only as a run from its first, so a key's rows enter the queue in their
/// outbox order, and movers and publishing relays can run side by side.
#[async_trait]
pub trait OutboxMove: Send + Sync + 'static {
    /// Moves up to `max` rows into the queue, in one transaction; answers how many.
    async fn move_rows(&self, max: usize) -> Result<usize>;
}

/// An outbox seen by the operator's tools (`justonce outbox`): object-safe, whatever the
/// store's transaction type.
#[async_trait]
pub trait InspectOutbox: Send + Sync {
    /// What the outbox holds.
    async fn stats(&self) -> Result<OutboxStats>;

    /// The relays that hold leases now.
    async fn owners(&self) -> Result<Vec<OutboxOwner>>;

    /// Up to `max` dead rows, in outbox order.
    async fn dead_rows(&self, max: usize) -> Result<Vec<DeadOutboxRow>>;

    /// Gives dead rows (`seqs`, or all when `None`) their attempts back: relays take them
    /// again, in their place. Answers how many.
    async fn revive(&self, seqs: Option<&[u64]>) -> Result<u64>;

    /// Removes dead rows (`seqs`, or all when `None`) without sending them: their keys go
    /// on. Answers how many.
    async fn discard(&self, seqs: Option<&[u64]>) -> Result<u64>;
}

/// The namespace of [`outgoing_id`]'s UUIDv5s.
pub const OUTGOING_ID_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x6a75_7374_6f6e_4365_8f75_7467_6f69_6e67);

/// The id of the `ordinal`-th message (from 0) a handler of `consumer` sends while handling
/// the message `incoming`: the UUIDv5, in [`OUTGOING_ID_NAMESPACE`], of the name
/// `consumer` LF `incoming` LF `ordinal` (decimal). A handler that runs twice for one
/// message (a retry, a redelivery after a crash) sends the same ids, so the next
/// consumer's dedup absorbs every copy.
///
/// ```
/// use justonce_core::{outgoing_id, MessageId};
///
/// let incoming = MessageId::new("PAY-1").unwrap();
/// let first = outgoing_id("payments", &incoming, 0);
/// assert_eq!(first, outgoing_id("payments", &incoming, 0));
/// assert_ne!(first, outgoing_id("payments", &incoming, 1));
/// assert_ne!(first, outgoing_id("refunds", &incoming, 0));
/// assert_eq!(first.as_str().len(), 36);
/// ```
pub fn outgoing_id(consumer: &str, incoming: &MessageId, ordinal: u32) -> MessageId {
    let name = format!("{consumer}\n{incoming}\n{ordinal}");
    let id = uuid::Uuid::new_v5(&OUTGOING_ID_NAMESPACE, name.as_bytes());
    MessageId::new(id.hyphenated().to_string()).expect("a UUID is a valid message id")
}

/// The largest payload an outbox takes unless told otherwise: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The check every outbox makes at enqueue: an id (a relay's duplicate must carry it) and
/// a payload within `max_payload_bytes`.
pub fn check_outgoing(message: &Message, max_payload_bytes: usize) -> Result<()> {
    if message.id().is_none() {
        return Err(Error::new(
            crate::ErrorKind::InvalidInput,
            "an outgoing message needs an id: the relay may publish it twice, and only its id \
             lets the consumer's dedup absorb the second copy",
        ));
    }
    let len = message.payload().len();
    if len > max_payload_bytes {
        return Err(Error::new(
            crate::ErrorKind::InvalidInput,
            format!(
                "an outgoing payload of {len} bytes exceeds the outbox's limit of \
                 {max_payload_bytes} bytes"
            ),
        ));
    }
    Ok(())
}
