//! justonce on Kafka, through [rdkafka](https://docs.rs/rdkafka) (librdkafka, built from
//! its bundled source).
//!
//! The second source article is about Kafka's three layers: the idempotent producer,
//! transactions with `read_committed` consumers, and, once the effect is in an external
//! database, an idempotent consumer. justonce builds the third the way the KafkaConsumer
//! documentation recommends for exactly-once into a database, "storing offsets outside
//! Kafka":
//!
//! - [`KafkaPublisher`] publishes through the idempotent producer (`acks=all`), each
//!   publish's delivery report awaited; it joins no group;
//! - [`KafkaSource`] is a member of a consumer group. Its positions live in Kafka's
//!   committed offsets, committed after each ack, or in the business database
//!   ([`KafkaOptions::positions_in`]), where the runtime moves them in the batch's
//!   transaction ([`KafkaSource::acks_in`]) and the source seeks to them on assignment;
//! - poison goes to a dead-letter topic of the consumer's own, with reason headers,
//!   before the position moves past it; retries wait in memory.
//!
//! Tested against [tansu](https://tansu.io), a Kafka-protocol broker, not Apache Kafka.
//! The guide: `docs/guide/kafka.md`.
//!
//! # Minimum supported Rust version
//!
//! 1.89.

mod client;
mod codec;
mod error;
#[cfg(feature = "harness")]
pub mod harness;
mod inspect;
mod options;
mod poll;
mod publish;
mod source;
mod state;

pub use options::{KafkaOptions, Start};
pub use publish::KafkaPublisher;
pub use source::{KafkaSource, OffsetsAck};

/// `host:port,…` from a `kafka://host:port,…` URL or a plain broker list.
pub(crate) fn brokers_of(url: &str) -> String {
    let s = url.trim();
    let s = s.strip_prefix("kafka://").unwrap_or(s);
    s.trim_end_matches('/').to_owned()
}

/// The Kafka guide, compiled: its Rust snippets are doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide/kafka.md")]
struct Guide;
