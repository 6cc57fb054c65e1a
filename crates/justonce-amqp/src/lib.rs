//! justonce on RabbitMQ, through [lapin](https://docs.rs/lapin).
//!
//! The source article's reliability chain, in code:
//!
//! - **durable topology** ([`declare`]): a durable work exchange and queue (quorum by
//!   default), a dead-letter exchange and queue, and one delayed-retry queue per delay tier;
//! - **a confirmed publisher** ([`AmqpPublisher`]): persistent messages, `message_id` always
//!   set, `mandatory` with returns handled, a window of outstanding confirms, re-sends with
//!   the same id;
//! - **a source** ([`AmqpSource`]): manual acks after the commit, prefetch, attempts from
//!   `x-delivery-count` or our own header, retries through the tiers, dead letters with
//!   reason headers, reconnection.
//!
//! Paired with a `DedupStore` by the `justonce` runtime, this turns RabbitMQ's
//! at-least-once delivery into effectively-once effects. Needs RabbitMQ 3.10 or later.
//!
//! # Minimum supported Rust version
//!
//! 1.89 (what redis 1.8 and async-nats 0.51, the next backends, need).

mod acks;
mod admin;
mod codec;
mod connection;
mod doctor;
mod error;
#[cfg(feature = "harness")]
pub mod harness;
mod options;
mod publisher;
mod source;
mod topology;

pub use codec::ATTEMPTS_HEADER;
pub use connection::connect;
pub use doctor::check;
pub use options::{AmqpOptions, AmqpTls, Binding, DeadLetters, Declare, ExchangeType, QueueType};
pub use publisher::AmqpPublisher;
pub use source::AmqpSource;
pub use topology::declare;
