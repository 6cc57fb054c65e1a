//! The store seams: transactions the handler writes in, and the dedup record.

use std::time::Duration;

use async_trait::async_trait;

use crate::{Fingerprint, Message, MessageId, Result};

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

    /// Whether [`Store::take_turn`] does anything here. `false` (the default): the store
    /// has no lock for it, and a consumer whose batches meet lock conflicts shrinks them
    /// instead.
    fn takes_turns(&self) -> bool {
        false
    }

    /// Makes `tx` take `consumer`'s turn, a lock named after the consumer held until `tx`
    /// commits or rolls back, across processes (PostgreSQL: an advisory transaction lock).
    /// [`Turn::Alone`] waits until no other transaction of the consumer holds it, and
    /// returns `true`. [`Turn::Beside`] never waits: it takes the turn beside the others
    /// that take it beside, or returns `false`, holding nothing, while one holds it alone
    /// or waits to. A consumer's batches take it beside each other, first thing after their
    /// claims; while they meet other replicas' batches on the same rows and deadlock, or
    /// find another replica taking it alone, they take it alone, and run one after the
    /// other, at full size, instead of waiting out the deadlock detector and running again.
    /// The default does nothing and returns `true`.
    async fn take_turn(&self, _tx: &mut Self::Tx, _consumer: &str, _turn: Turn) -> Result<bool> {
        Ok(true)
    }
}

/// How a transaction takes its consumer's turn ([`Store::take_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Beside the consumer's other transactions that take it beside, never beside one
    /// that takes it alone: without waiting. With `patience`, the transaction gives up a
    /// row lock it has waited for that long (the store's lock timeout: an
    /// [`ErrorKind::Busy`](crate::ErrorKind::Busy) error, a lock conflict), so that a
    /// deadlock tells well before the server's detector does (PostgreSQL's
    /// `deadlock_timeout`, 1 s).
    Beside {
        /// How long a row lock may be waited for; `None`: the store's own setting.
        patience: Option<Duration>,
    },
    /// Alone: while it holds the turn, no other transaction of the consumer does.
    Alone,
}

/// A dedup key: (consumer, message id). Two consumers of one message never collide
/// (contract 2 in ARCHITECTURE.md).
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

    /// Records every key of a batch in `tx` at once: one answer per key, in order. A key
    /// that appears twice answers at its first place as [`DedupStore::claim`] would, and at
    /// the later ones as a [`Claim::Duplicate`] (same fingerprint) or [`Claim::Conflict`] of
    /// the first. The default claims one key after the other; the SQL stores answer in one
    /// statement, plus one for the keys that were there already.
    async fn claim_many(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Vec<Claim>> {
        defaults::claim_each(self, tx, consumer, keys).await
    }

    /// Begins a transaction and claims the messages' keys in it, fingerprinted by their
    /// payloads: one answer per message, in order, as [`DedupStore::claim_many`] gives them.
    /// What the consumer calls for each batch.
    ///
    /// The default ([`defaults::begin_while_hashing`]) sends the `BEGIN`, hashes the
    /// payloads while it waits on the database (the SHA-256 of 100 payloads of 1 KB takes
    /// about as long as the round trip), then calls `claim_many`. A store that can claim in
    /// the same round trip as its `BEGIN` (PostgreSQL and SQLite do, for one key) hashes
    /// first ([`defaults::fingerprints`]) and falls back to [`defaults::begin_then_claim`].
    async fn begin_with_claims(
        &self,
        consumer: &str,
        messages: &[(&MessageId, &Message)],
    ) -> Result<(Self::Tx, Vec<Claim>)> {
        defaults::begin_while_hashing(self, consumer, messages).await
    }

    /// Deletes at most `batch` records older than `retention` by the store's clock;
    /// returns how many it deleted. Call it repeatedly; it never holds locks for long.
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64>;

    /// How long the store keeps a record on its own, by key expiry (Redis), if it does.
    /// The consumer refuses to start when this is not longer than its redelivery horizon
    /// (contract 6), as it does for a purge's retention. `None` (the default): records
    /// stay until [`DedupStore::purge`] removes them.
    fn expiry(&self) -> Option<Duration> {
        None
    }
}

/// The answer of [`ClaimStore::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimState {
    /// The caller holds the claim until its lease runs out. `token` grows on every
    /// takeover: hand it to the effect (a fencing token) and back to
    /// [`ClaimStore::complete`].
    Acquired {
        /// The fencing token.
        token: u64,
    },
    /// Another holder is working on it: try again after `retry_after`, never ack as done.
    InProgress {
        /// Time left on the holder's lease.
        retry_after: Duration,
    },
    /// The effect completed before: ack, and here is what it returned.
    Completed {
        /// The stored result.
        result: Option<Vec<u8>>,
    },
    /// The key completed with another payload: not a duplicate, a conflict.
    Conflict {
        /// The fingerprint stored with the key.
        stored: Fingerprint,
    },
}

/// Claims with leases for effects no transaction covers (an email, a third-party API).
///
/// Weaker than [`DedupStore`]: if the holder dies after the effect and before
/// [`ClaimStore::complete`], the lease runs out and another holder runs the effect again. The
/// effect itself must therefore accept an idempotency key; the claim makes that rare and keeps
/// two holders from running at once.
#[async_trait]
pub trait ClaimStore: Send + Sync {
    /// Takes the claim on `key` for `lease` (by the store's clock), takes over an expired
    /// one with a new token, or reports why not.
    async fn acquire(
        &self,
        key: DedupKey<'_>,
        fp: Fingerprint,
        lease: Duration,
    ) -> Result<ClaimState>;

    /// Marks the claim completed with `result`. Refused with [`crate::ErrorKind::Conflict`]
    /// when `token` no longer holds it (its lease ran out and another holder took over).
    async fn complete(&self, key: DedupKey<'_>, token: u64, result: Option<&[u8]>) -> Result<()>;

    /// Gives the claim up after a failure, so a retry can take it at once. A no-op when
    /// `token` no longer holds it. The token counter is kept: the next holder's is higher.
    async fn release(&self, key: DedupKey<'_>, token: u64) -> Result<()>;

    /// Deletes at most `batch` completed claims older than `retention`; returns how many.
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64>;

    /// How long the store keeps a completed claim on its own, by key expiry (Redis), if it
    /// does. The consumer refuses to start in claim mode when this is not longer than its
    /// redelivery horizon (contract 6), as it does for a purge's retention. `None` (the
    /// default): claims stay until [`ClaimStore::purge`] removes them.
    fn expiry(&self) -> Option<Duration> {
        None
    }

    /// [`ClaimStore::acquire`] for each key, in order. Stores override it to take a
    /// consumer's whole batch in one round trip.
    async fn acquire_batch(
        &self,
        keys: &[(DedupKey<'_>, Fingerprint)],
        lease: Duration,
    ) -> Result<Vec<ClaimState>> {
        let mut out = Vec::with_capacity(keys.len());
        for (key, fp) in keys {
            out.push(self.acquire(*key, *fp, lease).await?);
        }
        Ok(out)
    }

    /// Completes or releases each claim, in order; one result per item (a fenced completion
    /// is an `Err` in its place, not a failure of the batch). Stores override it to finish a
    /// consumer's whole batch in one round trip.
    async fn finish_batch(
        &self,
        items: &[(DedupKey<'_>, u64, Finish<'_>)],
    ) -> Result<Vec<Result<()>>> {
        let mut out = Vec::with_capacity(items.len());
        for (key, token, finish) in items {
            out.push(match finish {
                Finish::Complete(result) => self.complete(*key, *token, *result).await,
                Finish::Release => self.release(*key, *token).await,
            });
        }
        Ok(out)
    }
}

/// How [`ClaimStore::finish_batch`] ends one claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish<'a> {
    /// [`ClaimStore::complete`] with this result.
    Complete(Option<&'a [u8]>),
    /// [`ClaimStore::release`].
    Release,
}

/// Checks an SQL identifier given in configuration (a table or column name): 1-63 characters
/// of `A-Z a-z 0-9 _`, not starting with a digit. Names are spliced into SQL, so nothing
/// else is accepted.
///
/// ```
/// assert!(justonce_core::validate_identifier("billing_dedup").is_ok());
/// assert!(justonce_core::validate_identifier("dedup; DROP TABLE x").is_err());
/// ```
pub fn validate_identifier(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.as_bytes()[0].is_ascii_digit()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(crate::Error::config(format!(
            "`{name}` is not a valid SQL identifier: use 1-63 characters of A-Z a-z 0-9 _, not starting with a digit"
        )))
    }
}

/// The building blocks of [`DedupStore`]'s provided methods, for backend authors who
/// override one of them and fall back to the default for some batches.
pub mod defaults {
    use super::{Claim, DedupKey, Fingerprint, Message, MessageId, Result};

    /// The fingerprints of `messages`, as the claims take them.
    pub fn fingerprints<'a>(
        messages: &[(&'a MessageId, &Message)],
    ) -> Vec<(&'a MessageId, Fingerprint)> {
        messages
            .iter()
            .map(|&(id, m)| (id, m.fingerprint()))
            .collect()
    }

    /// [`super::DedupStore::begin_with_claims`] by [`super::Store::begin`] while the payloads are hashed,
    /// then [`super::DedupStore::claim_many`]: the default. The begin is polled first, so that its round
    /// trip is under way while the hashing runs.
    pub async fn begin_while_hashing<S: super::DedupStore + ?Sized>(
        store: &S,
        consumer: &str,
        messages: &[(&MessageId, &Message)],
    ) -> Result<(S::Tx, Vec<Claim>)> {
        let begin = store.begin();
        tokio::pin!(begin);
        let first = futures_lite::future::poll_once(begin.as_mut()).await;
        let keys = fingerprints(messages);
        let mut tx = match first {
            Some(tx) => tx?,
            None => begin.await?,
        };
        let claims = store.claim_many(&mut tx, consumer, &keys).await?;
        Ok((tx, claims))
    }

    /// [`super::Store::begin`] then [`super::DedupStore::claim_many`] of fingerprinted keys: the fallback of a
    /// store that folds only some claims into its `BEGIN`.
    pub async fn begin_then_claim<S: super::DedupStore + ?Sized>(
        store: &S,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<(S::Tx, Vec<Claim>)> {
        let mut tx = store.begin().await?;
        let claims = store.claim_many(&mut tx, consumer, keys).await?;
        Ok((tx, claims))
    }

    /// [`super::DedupStore::claim_many`] key by key, with [`super::DedupStore::claim`]: the default, and the
    /// fallback of a store that has no batched form for some tables.
    pub async fn claim_each<S: super::DedupStore + ?Sized>(
        store: &S,
        tx: &mut S::Tx,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Vec<Claim>> {
        let mut out = Vec::with_capacity(keys.len());
        for (id, fp) in keys {
            let key = DedupKey {
                consumer,
                message_id: id,
            };
            out.push(store.claim(tx, key, *fp).await?);
        }
        Ok(out)
    }
}

/// A shared store is a store: `Consumer::new(opts, queue, Arc::clone(&store), handler)`.
#[async_trait]
impl<T: Store + ?Sized> Store for std::sync::Arc<T> {
    type Tx = T::Tx;

    fn backend(&self) -> &'static str {
        (**self).backend()
    }
    async fn begin(&self) -> Result<Self::Tx> {
        (**self).begin().await
    }
    async fn commit(&self, tx: Self::Tx) -> Result<()> {
        (**self).commit(tx).await
    }
    async fn rollback(&self, tx: Self::Tx) -> Result<()> {
        (**self).rollback(tx).await
    }
    async fn savepoint(&self, tx: &mut Self::Tx) -> Result<()> {
        (**self).savepoint(tx).await
    }
    async fn release_savepoint(&self, tx: &mut Self::Tx) -> Result<()> {
        (**self).release_savepoint(tx).await
    }
    async fn rollback_to_savepoint(&self, tx: &mut Self::Tx) -> Result<()> {
        (**self).rollback_to_savepoint(tx).await
    }
    fn takes_turns(&self) -> bool {
        (**self).takes_turns()
    }
    async fn take_turn(&self, tx: &mut Self::Tx, consumer: &str, turn: Turn) -> Result<bool> {
        (**self).take_turn(tx, consumer, turn).await
    }
}

/// A shared dedup store is a dedup store; every method goes to the shared one, its
/// overrides included.
#[async_trait]
impl<T: DedupStore + ?Sized> DedupStore for std::sync::Arc<T> {
    async fn claim(&self, tx: &mut Self::Tx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        (**self).claim(tx, key, fp).await
    }
    async fn claim_many(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Vec<Claim>> {
        (**self).claim_many(tx, consumer, keys).await
    }
    async fn begin_with_claims(
        &self,
        consumer: &str,
        messages: &[(&MessageId, &Message)],
    ) -> Result<(Self::Tx, Vec<Claim>)> {
        (**self).begin_with_claims(consumer, messages).await
    }
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        (**self).purge(retention, batch).await
    }
    fn expiry(&self) -> Option<Duration> {
        (**self).expiry()
    }
}
