//! The store seams: transactions the handler writes in, and the dedup record.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Fingerprint, MessageId, Result};

/// A database whose transactions the consumer runs its handler in.
///
/// `Tx` is what the handler receives: for the SQL stores a `sqlx::Transaction`, so the
/// business write and the dedup record commit together.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// An open transaction.
    type Tx: Send + 'static;

    /// A short name of the backend (`sqlite`, `postgres`, `memory`).
    fn backend(&self) -> &'static str;

    /// Begins a transaction.
    async fn begin(&self) -> Result<Self::Tx>;

    /// Commits durably; only after this returns may the deliveries be acked.
    async fn commit(&self, tx: Self::Tx) -> Result<()>;

    /// Rolls back.
    async fn rollback(&self, tx: Self::Tx) -> Result<()>;

    /// Marks a savepoint: one per message of a batch.
    async fn savepoint(&self, tx: &mut Self::Tx) -> Result<()>;

    /// Keeps the writes since the last savepoint.
    async fn release_savepoint(&self, tx: &mut Self::Tx) -> Result<()>;

    /// Undoes the writes since the last savepoint, keeping the rest of the transaction.
    async fn rollback_to_savepoint(&self, tx: &mut Self::Tx) -> Result<()>;
}

/// A dedup key: (consumer, message id). Two consumers of one message never collide
/// (DESIGN.md invariant 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DedupKey<'a> {
    /// The consumer's name.
    pub consumer: &'a str,
    /// The message's id.
    pub message_id: &'a MessageId,
}

/// The answer of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The key was not there: it is now recorded in the transaction; apply the effect.
    Fresh,
    /// The key was there with the same fingerprint: the effect was applied before.
    Duplicate,
    /// The key was there with another fingerprint: not a duplicate, a conflict.
    Conflict {
        /// The fingerprint stored with the key.
        stored: Fingerprint,
    },
}

/// A store that records which messages a consumer has applied, inside the same
/// transaction as the effect.
#[async_trait]
pub trait DedupStore: Store {
    /// Records `key` in `tx`, the transaction the effect is written in. The record is
    /// stamped with the store's clock.
    async fn claim(&self, tx: &mut Self::Tx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim>;

    /// Deletes at most `batch` records older than `retention` by the store's clock;
    /// returns how many it deleted. Call it repeatedly; it never holds locks for long.
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64>;
}
