//! justonce on NATS JetStream, through [async-nats](https://docs.rs/async-nats).
//!
//! The first source article lists NATS JetStream among the brokers that choose
//! at-least-once. [`NatsStream`] is a JetStream stream and a durable pull consumer as a
//! justonce transport:
//!
//! - every publish carries `Nats-Msg-Id` (the message id) and waits for its PubAck; the
//!   server drops a second publish of an id inside the stream's `duplicate_window`, which
//!   is checked at connect against how long a publisher may retry;
//! - acks are double acks, sent after the commit, so the server's reply says the ack was
//!   taken; retries are `-NAK` with a delay; long batches are kept with `+WPI`;
//! - dead letters, which JetStream does not have, go to a stream of the consumer's own
//!   before the delivery is terminated, and messages that ran out of `max_deliver` with
//!   no worker left to say why are dead-lettered from the server's advisory.
//!
//! Servers 2.9 and later; features of 2.10 and later are used only where the server has
//! them. The guide: `docs/guide/nats.md`.
//!
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! - `options.rs`: `NatsOptions` (stream, subject, durable consumer, lease = `ack_wait`,
//!   `max_deliver`, `max_ack_pending`, `duplicate_window` against `retry_horizon`, `Retention`,
//!   `create`), checked before anything is sent;
//! - `codec.rs` (pure): a message as NATS headers (`Nats-Msg-Id` = the id; a copy's id in
//!   `Justonce-Id` beside a `Nats-Msg-Id` of its own, and `Justonce-Attempts`); the ack
//!   subject's delivery count and stream sequence;
//! - `stream/`: `NatsStream` (`Source`, `Publisher`, `Inspect`). `mod.rs`: connect (the
//!   server's version and JetStream, then `topology.rs`), the `+WPI` heartbeat task, the
//!   advisory task, and `Inner`'s helpers (a stream handle, a dead letter's reason), which the
//!   advisory task shares with the source; `topology.rs`: `ServerVersion`, the stream, the
//!   durable pull consumer and the dead-letter stream declared (a 2.9 create of an existing
//!   durable updates it), or checked with `create(false)`; `source.rs`: pulls by hand on an
//!   inbox of their own (`no_wait` for the batch; else one message with `expires`, then
//!   `no_wait` for the rest), double acks and naks as requests answered by the server (a
//!   batch's as plain acks with the last one a request, whose reply covers the ones before it
//!   on the same connection; each asked again after a reconnect or a missing reply), a release
//!   as a copy then an ack on a work-queue stream, the last allowed delivery dead-lettered
//!   instead of nacked; `publish.rs`: PubAcks awaited (`Inner::publish_raw` for copies), 512
//!   outstanding at most per batch, duplicates counted; `dead.rs`: `Inner::stored` (a message
//!   by sequence), `Inner::write_dead`, and the `MAX_DELIVERIES` advisory (dead letter, then
//!   the message removed from a work queue); `inspect.rs`: the consumer's `num_pending +
//!   num_ack_pending`, its delivery sequence, dead letters read by sequence (the doctor counts
//!   them from the stream's state), replays under a derived `Nats-Msg-Id`;
//! - `error.rs`: async-nats errors classified; `harness.rs` (feature `harness`): `OwnServer`, a
//!   `nats-server` with JetStream on a free port and a store directory of its own (and a
//!   `max_payload` of the caller's), restartable as after a crash.
//!
//! **Invariant: an ack, nack or term is a request the server answers**: a settlement with no
//! answer is an error, never assumed done.
//!
//! **Invariant: a dead letter or a retry copy has its PubAck before its original is terminated
//! or acked**, and its `Nats-Msg-Id` is derived from what it copies, so a copy written twice is
//! stored once.
//!
//! **Invariant: a receipt of a delivery that came back to this source since settles nothing**
//! (the server would take it: nats-server #4786).
//!
//! # Minimum supported Rust version
//!
//! 1.89.

mod codec;
mod error;
#[cfg(feature = "harness")]
pub mod harness;
mod link;
mod options;
mod stream;

pub use link::NatsConnect;
pub use options::{NatsOptions, Retention};
pub use stream::{NatsStream, ServerVersion};

/// The NATS guide, compiled: its Rust snippets are doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide/nats.md")]
struct Guide;
