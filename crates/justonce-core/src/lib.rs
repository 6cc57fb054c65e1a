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
