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
