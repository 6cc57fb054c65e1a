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
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! - `options.rs`: `AmqpOptions` (bindings to existing exchanges, dead letters, retry tiers,
//!   `Declare`);
//! - `topology.rs`: `declare`, all-or-nothing, with refusals explained (`Inequivalent`);
//! - `connection.rs`: `open`, `close_quietly`;
//! - `codec.rs`: a message to AMQP properties and back, the attempt, a dead letter's reason;
//!   pure;
//! - `acks.rs`: `plan`, a `multiple` ack over the oldest run of tags; pure;
//! - `publisher.rs`: `AmqpPublisher` (confirm window, re-sends with the same id, `mandatory`);
//! - `source.rs`: `AmqpSource` (a pump task, connection generations, reconnects);
//! - `doctor.rs`: `check`, each part of the topology asked passively, then declared again on a
//!   channel of its own to see whether the broker's settings agree (a no-op when they do,
//!   refused when they differ), and confirm mode;
//! - `admin.rs`: `Inspect`, depths, dead letters read, drained, replayed (confirmed, then acked
//!   off the dead-letter queue) or purged, `delete_topology`.
//! - `harness.rs` (feature `harness`): `Cluster`, RabbitMQ nodes of one's own from the
//!   installed `rabbitmq-server` (own node names, free loopback ports, data directories, an
//!   Erlang cookie of its own), joined; a node SIGKILLed, stopped, app-stopped, started again;
//!   a quorum queue's leader asked of `rabbitmqctl`. The lab's failover class and the cluster
//!   tests use it.
//!
//! Dependencies go one way: `source` on `publisher`, both on `codec` and `connection`, `admin`
//! on all.
//!
//! **Invariant: an ack names only tags outstanding on the current channel, in the order
//! decided.**
//!
//! **Invariant: a release never reaches the broker**, so `x-delivery-count` does not move.
//!
//! **Invariant: a retry copy or a dead letter is confirmed before its original is acked.**
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
