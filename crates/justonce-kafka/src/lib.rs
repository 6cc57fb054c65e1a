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
mod url;

pub use options::{KafkaOptions, KafkaSasl, KafkaTls, SaslMechanism, Start, DEFAULT_PARTITIONS};
pub use publish::KafkaPublisher;
pub use source::{KafkaSource, OffsetsAck};

/// Where a delivery of a [`KafkaSource`] sits in its topic: `(partition, offset)`; `None`
/// for a receipt of another transport.
///
/// Kafka keeps no delivery count: a record read again by a new member of the group (after
/// a crash or a rebalance) is not marked `redelivered`, only a record this member hands
/// out again is. Two deliveries at one position are the same record read twice; two
/// positions with one message id are two copies at the broker (a producer's re-send).
///
/// ```
/// # fn log(d: &justonce_core::Delivery) {
/// if let Some((partition, offset)) = justonce_kafka::record_at(&d.receipt) {
///     tracing::info!(partition, offset, "paying");
/// }
/// # }
/// ```
pub fn record_at(receipt: &justonce_core::Receipt) -> Option<(i32, i64)> {
    receipt
        .downcast_ref::<state::Token>()
        .map(|t| (t.partition, t.offset))
}

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
