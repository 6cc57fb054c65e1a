//! The vocabulary and contracts of [justonce](https://docs.rs/justonce): what a message,
//! a delivery, a semantics and a handler's outcome are, and the small traits at the seams
//! ([`Source`], [`Publisher`], [`Store`], [`DedupStore`]).
//!
//! Most users depend on the `justonce` crate, which re-exports all of this next to the
//! runtime. Depend on `justonce-core` directly to write a backend.
//!
//! **This crate does no I/O.** The [`memory`] module has in-memory implementations of the
//! traits for tests.
//!
//! # Feature flags
//!
//! - `sqlx`: `From<sqlx::Error>` for [`Error`], classifying busy, connection and unique
//!   violation errors. Enabled by `justonce-sql`.
//!
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! `message.rs`: `Message`, `MessageId` (never empty), `Fingerprint` (128 bits of SHA-256 of
//! the payload).
//! `delivery.rs`, `semantics.rs`: `Delivery`, `Semantics`, `Disposition`, `DeadLetterReason`.
//! `transport.rs`: the seams `Source` (receive, ack, nack, `release`, `abandon`), `Publisher`
//! and `TransactionalAck<Tx>` (`ack_in` inside the transaction, `committed` after its commit).
//! `positions.rs`: `Position`, `Positions` (read a log consumer's positions, and move them
//! outside a transaction) and `PositionsIn<Tx>` (move them forward in a store's transaction),
//! for a log transport whose positions live in the business database.
//! `store.rs`: `Store` (with `take_turn`), `DedupStore` (`claim`, `claim_many`,
//! `begin_with_claims`, `purge`), `ClaimStore` (leases and fencing tokens); `expiry` on both,
//! for a store that forgets by TTL, and `store::defaults`, the building blocks of the provided
//! methods.
//! `inspect.rs`: `Inspect`, what tools count and do on any transport (pending, deliveries, dead
//! letters listed, replayed and purged, cleanup), and `chosen_dead_letters`, the entries a
//! replay or purge names (NATS and Kafka).
//! `inspect_store.rs`: `InspectStore` and `InspectClaims`, what tools read of a store (records
//! per consumer, one record, one claim, its clock, its server's checks) and fix (a claim freed
//! with a higher fence).
//! `check.rs`: `Check` and `CheckStatus`, one link of the chain as the doctor found it.
//! `outbox.rs`: `OutboxStore` (enqueue in the business transaction; `take` with leases, in
//! order per key; `mark_sent`, `mark_failed` with retries then dead, `release`, `outbox_stats`,
//! `wait_for_rows`), `OutboxMove` (a queue in the outbox's own database that rows move into, a
//! batch a transaction: `Relay::moving`), `InspectOutbox` (the tools' object-safe view: stats,
//! lease owners, dead rows, `revive`, `discard`), `check_outgoing` (an id, a size limit) and
//! `outgoing_id` (the consumer outbox's UUIDv5 ids); the memory store implements both
//! (`memory/outbox.rs`).
//! `dead_letters.rs`: `DeadLetterEntry`, `failure_group` (a reason without its ids and
//! numbers), `Replay` and `DeadLetter::replay_message` (the id kept, the history written on);
//! pure.
//! `error.rs`: `Error`, `ErrorKind` with `is_transient()`, `is_message_fault()` and `advice()`;
//! `error_chain`.
//! `sqlx_error.rs` (feature `sqlx`): `From<sqlx::Error>`, by SQLSTATE class, MariaDB error
//! number or SQLite result code.
//! `id.rs`: `IdStrategy`; `machine.rs`: `StateMachine` and `Cas`, pure decisions the guards
//! execute.
//! `memory/`: in-memory source, store and claims, for the core's and the runtime's own tests.
//! `backoff.rs`, `url.rs` (`redact_url`).
//! `Arc<T>` of a `Source`, `Publisher`, `Inspect`, `Store` or `DedupStore` is one too, so a
//! shared backend goes into a consumer as it is.
//!
//! **Invariant: justonce-core does no I/O and knows no backend crate** (sqlx only behind its
//! feature, for the error conversion).
//!
//! # Minimum supported Rust version
//!
//! 1.89 (what redis 1.8 and async-nats 0.51, the next backends, need).

mod backoff;
mod check;
mod dead_letters;
mod delivery;
mod error;
mod id;
mod inspect;
mod inspect_store;
mod machine;
pub mod memory;
mod message;
mod outbox;
mod positions;
mod semantics;
#[cfg(feature = "sqlx")]
mod sqlx_error;
pub mod store;
mod transport;
mod url;

pub use backoff::ExponentialBackoff;
pub use check::{Check, CheckStatus};
pub use dead_letters::{failure_group, DeadLetterEntry, FailureGroup, Replay};
pub use delivery::{Delivery, Receipt};
pub use error::{error_chain, Error, ErrorKind, Result};
pub use id::{canonical_json, IdStrategy, CONTENT_HASH_VERSION};
pub use inspect::{chosen_dead_letters, no_such_dead_letter, DeadLetter, Inspect};
pub use inspect_store::{
    ClaimRecord, ClaimRecordState, ConsumerRecords, DedupRecord, InspectClaims, InspectStore,
};
pub use machine::{Cas, StateMachine, Transition};
pub use message::{Fingerprint, Headers, Message, MessageId, MAX_MESSAGE_ID_BYTES};
pub use outbox::{
    check_outgoing, outgoing_id, DeadOutboxRow, InspectOutbox, OutboxFailure, OutboxMove,
    OutboxOwner, OutboxRow, OutboxStats, OutboxStore,
    DEFAULT_MAX_PAYLOAD as DEFAULT_OUTBOX_MAX_PAYLOAD, OUTGOING_ID_NAMESPACE,
};
pub use positions::{Position, Positions, PositionsIn};
pub use semantics::{validate_consumer_name, DeadLetterReason, Disposition, Semantics};
pub use store::{
    validate_identifier, Claim, ClaimState, ClaimStore, DedupKey, DedupStore, Finish, Store, Turn,
};
pub use transport::{Publisher, Source, TransactionalAck};
pub use url::redact_url;

/// Fails to compile if a seam trait stops being object-safe.
#[allow(dead_code)]
fn _obj_safe(
    _: &dyn Source,
    _: &dyn Publisher,
    _: &dyn DedupStore<Tx = memory::MemoryTx>,
    _: &dyn ClaimStore,
) {
}
