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
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! - `options.rs`: `KafkaOptions` (brokers, topic, group, partitions, dead-letter topic,
//!   positions in a store or in Kafka, `Start`, partitions assigned by hand instead of by the
//!   group (`assign`), session timeout as the lease, record size, prefetch, `key_by_id`,
//!   `create`, librdkafka settings with justonce's own refused);
//! - `client.rs`: `Client`, what a source and a publisher share: the base configuration, the
//!   idempotent producer (`acks=all`), an admin client, the brokers reached at connect and the
//!   topics checked or made; `publish.rs`: `KafkaPublisher` (no group), sends with their
//!   delivery reports awaited, oversized records refused before sending;
//! - `codec.rs` (pure): a message as record headers (`Justonce-Id`, `Content-Type`) and back; a
//!   record without a value or an id says so in headers;
//! - `state.rs` (pure): `State`, what a source holds per assigned partition (records handed out
//!   and not finished, by offset; the position is the first of them), epochs that make records
//!   fetched before a reset or reassignment no one's, hand-out numbers that make stale receipts
//!   settle nothing, attempts counted per record (across resets, and forgotten below where a
//!   reset starts reading), retries and releases to hand out again;
//! - `poll.rs`: the poll thread (a `BaseConsumer` polled off the runtime, records sent through
//!   a bounded channel; while it is full the thread waits for room and polls every 100 ms,
//!   keeping what it gets, and pauses its partitions only when it keeps as many as the channel
//!   holds (librdkafka drops a paused partition's prefetched records); a resume or a seek is
//!   checked partition by partition, since librdkafka answers success and writes a skipped
//!   partition's error into the list, and what did not take is tried again; the consumer's
//!   errors said at warn, each at most once every 30 s with how often it came (`Errors`, which
//!   folds errors that alternate); `Reset` and `Stop` commands) and `Ctx::pre_rebalance`, which
//!   writes the stored positions into the assignment (read with `Handle::block_on`, falling
//!   back to Kafka's committed offsets, never ahead of the store's);
//! - `source.rs`: `KafkaSource` (`Source`, `Publisher`, `Inspect`): receive (redos first, then
//!   fresh records, a short wait for the next fetch response), acks as synchronous offset
//!   commits (positions in Kafka) or as a hint (positions in the store), `OffsetsAck<Tx>`
//!   (`TransactionalAck`: the positions written with `PositionsIn::save_in`, the records
//!   finished at `committed`), `abandon` as a reset to the stored positions, `close`; the
//!   consumer takes answers up to 32 times its fetch limit (`receive_max_bytes`: tansu 0.6.0
//!   answers past the limit it was given);
//! - `inspect.rs`: dead letters as a log folded by key (`{partition}-{offset}`) with tombstones
//!   for replays and purges, the lag (watermarks against the stored or committed positions),
//!   cleanup (the consumer closed first);
//! - `backend.rs` of `justonce` opens it for `kafka://` (`TransportOptions::positions`: a SQL
//!   store's URL whose `jo_positions` keeps the positions; the transport's `transactional_ack`
//!   for that store's `Tx`; `TransportOptions::kafka_key_by_id`, which the CLI's `Bus::options`
//!   sets), and `doctor.rs` runs `KafkaPublisher::check`;
//! - `lib.rs`: `record_at`, the `(partition, offset)` of a delivery (Kafka keeps no redelivered
//!   flag: the lab's audit counts positions read twice);
//! - `error.rs`: librdkafka error codes classified; `harness.rs` (feature `harness`):
//!   `OwnBroker`, a tansu on a free port and a data directory of its own (or, `start_behind`,
//!   on a given port advertising another address: a proxy in front of it), restartable, its
//!   SQLite storage repaired after each start (`STORAGE_REPAIRS`, `tansu_repairs.sql`:
//!   `justonce_header_record`, the index on record headers tansu 0.6.0 lacks, and
//!   `justonce_topic_delete_one`, the trigger that keeps a topic deletion to its topic;
//!   `scripts/services.sh` runs the same file on the machine's broker); `tansu_binary`.
//!
//! **Invariant: a position never passes a record this worker still holds**: `State::ack_in_tx`
//! stops each partition at its first record not in the batch (a retry, a release, another
//! batch's record not yet committed), and a dead letter finishes its record only after its
//! delivery report.
//!
//! **Invariant: a record is finished only by a receipt of its current hand-out**: a reset, a
//! reassignment or a redelivery makes older receipts settle nothing (and fail `ack_in` with
//! `Busy`, so their transaction rolls back).
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
