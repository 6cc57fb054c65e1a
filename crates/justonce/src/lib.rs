//! # justonce
//!
//! Brokers deliver at-least-once: a consumer that crashes between its work and its ack, a
//! lost ack, a publisher retrying after a confirm timeout all deliver a message again.
//! Exactly-once *delivery* is impossible in general; exactly-once *effects* are not:
//! at-least-once delivery plus an idempotent consumer. justonce makes that the default.
//!
//! A [`Consumer`] receives a batch from a [`Source`], opens one transaction of a
//! [`DedupStore`], and for each message claims its dedup key `(consumer, message id)` and
//! runs your [`Handler`] in that same transaction. It commits, and only then acks. A
//! redelivered message finds its key and is acked as a duplicate; its effect is never
//! applied twice.
//!
//! ```no_run
//! use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx};
//! use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Result};
//!
//! #[derive(serde::Deserialize)]
//! struct Payment { account: i64, amount: i64 }
//!
//! struct Credit;
//!
//! impl Handler<SqliteTx> for Credit {
//!     async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
//!         let p: Payment = cx.message().decode_json()?; // undecodable: dead-lettered
//!         sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
//!             .bind(p.amount)
//!             .bind(p.account)
//!             .execute(&mut **tx)
//!             .await?;
//!         Ok(Disposition::Ok)
//!     }
//! }
//!
//! # async fn run() -> Result<()> {
//! let queue = SqliteQueue::open("sqlite:queue.db", "orders").await?;
//! let store = SqliteStore::open("sqlite:app.db").await?;
//! let consumer = Consumer::new(ConsumerOptions::new("billing"), queue, store, Credit)?;
//! consumer.run_until(justonce::shutdown_signal()).await
//! # }
//! ```
//!
//! # Choosing semantics
//!
//! See [`consumer`] for what each [`Semantics`] does and when a crash loses or duplicates.
//!
//! # When it is not the message's fault
//!
//! An error from a handler, a store or a transport that is not about the message (a missing
//! table, a revoked privilege, a full disk, an outage, a deadlock: see
//! [`ErrorKind::is_message_fault`]) never dead-letters it: the batch goes back to the queue
//! without counting an attempt ([`Source::release`]), the consumer logs what is wrong and
//! pauses with backoff, and it goes on by itself once the problem is fixed. A breaker
//! ([`BreakerOptions`]) stops dead-lettering when every message fails for one reason the
//! classification missed. [`Handler::lock_key`] orders each batch by the rows it locks, so
//! that consumers scaled out do not deadlock.
//!
//! # Feature flags
//!
//! - `sqlite` (default): the embedded SQLite queue and dedup store, as `justonce::sql`.
//! - `amqp`: the RabbitMQ transport, as `justonce::amqp`.
//! - `redis`: the Redis claim store, as `justonce::redis`.
//! - `nats`: the NATS JetStream transport, as `justonce::nats`.
//! - `kafka`: the Kafka transport (rdkafka; librdkafka is built from source, which needs a
//!   C compiler), as `justonce::kafka`.
//! - `kafka-tls`: Kafka over TLS and SASL SCRAM (librdkafka with the system's OpenSSL;
//!   `libssl-dev` and `pkg-config` to build).
//! - `postgres`: the PostgreSQL queue, dedup and claim stores, in `justonce::sql`.
//! - `mysql`: the MariaDB / MySQL dedup and claim stores, in `justonce::sql`.
//! - `fault-injection`: `FaultHook` and `Consumer::with_fault_hook`, to crash a consumer at
//!   chosen points in tests (`justonce-test` turns it on for your tests). To watch what
//!   commits in production, use a [`CommitObserver`] instead.
//!
//! A handler writes through the store's sqlx transaction (`&mut **tx`), so your crate also
//! depends on `sqlx` with that driver's feature (`sqlite`, `postgres` or `mysql`; no macros
//! needed), plus `tokio` and, for typed payloads, `serde` with `derive`.
//!
//! # Logging
//!
//! justonce logs through [`tracing`](https://docs.rs/tracing) (a batch handed back, a
//! dead letter, the breaker opening) and prints nothing without a subscriber: install one,
//! such as `tracing_subscriber::fmt().init()`. A `main` that returns [`Result`] prints a
//! failure as one line, each cause once.
//!
//! # Minimum supported Rust version
//!
//! 1.89 (what redis 1.8 and async-nats 0.51, the next backends, need).

pub mod backend;
pub mod consumer;
pub mod doctor;
pub mod relay;
mod shutdown;
mod tasks;

/// `#[async_trait]`, for implementing the object-safe seams (`Source`, `Publisher`,
/// `Store`, `DedupStore`, `ClaimStore`, `Inspect`, `FaultHook`); a [`Handler`] needs none.
pub use async_trait::async_trait;
#[cfg(feature = "fault-injection")]
pub use consumer::FaultHook;
pub use consumer::{
    BatchOptions, BatchReport, BreakerOptions, CommitObserver, ConflictPolicy, Consumer,
    ConsumerOptions, Context, DedupOptions, FaultPoint, Handler, Health, Idempotency, RetryOptions,
};
pub use justonce_core::{
    canonical_json, error_chain, failure_group, memory, outgoing_id, redact_url,
    validate_identifier, Cas, Check, CheckStatus, Claim, ClaimRecord, ClaimRecordState, ClaimState,
    ClaimStore, ConsumerRecords, DeadLetter, DeadLetterEntry, DeadLetterReason, DeadOutboxRow,
    DedupKey, DedupRecord, DedupStore, Delivery, Disposition, Error, ErrorKind, ExponentialBackoff,
    FailureGroup, Fingerprint, Headers, IdStrategy, Inspect, InspectClaims, InspectOutbox,
    InspectStore, Message, MessageId, OutboxFailure, OutboxMove, OutboxOwner, OutboxRow,
    OutboxStats, OutboxStore, Position, Positions, PositionsIn, Publisher, Receipt, Replay, Result,
    Semantics, Source, StateMachine, Store, TransactionalAck, Transition, Turn,
    DEFAULT_OUTBOX_MAX_PAYLOAD,
};
pub use shutdown::shutdown_signal;

/// The SQL backends (SQLite queue and stores), from `justonce-sql`.
#[cfg(feature = "sqlite")]
pub use justonce_sql as sql;

/// The RabbitMQ transport, from `justonce-amqp`.
#[cfg(feature = "amqp")]
pub use justonce_amqp as amqp;
/// The NATS JetStream transport, from `justonce-nats`.
#[cfg(feature = "nats")]
pub use justonce_nats as nats;

/// The Kafka transport, from `justonce-kafka`.
#[cfg(feature = "kafka")]
pub use justonce_kafka as kafka;
/// The Redis claim store, from `justonce-redis`.
#[cfg(feature = "redis")]
pub use justonce_redis as redis;

/// The README and the guides, compiled: each of their Rust snippets is a doctest.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../../../README.md")]
    struct Readme;
    #[doc = include_str!("../../../docs/guide/idempotency.md")]
    struct Idempotency;
    #[cfg(feature = "sqlite")]
    #[doc = include_str!("../../../docs/guide/testing.md")]
    struct Testing;
    #[cfg(feature = "postgres")]
    #[doc = include_str!("../../../docs/guide/failures.md")]
    struct Failures;
    #[doc = include_str!("../../../docs/guide/operations.md")]
    struct Operations;
    #[cfg(all(feature = "amqp", feature = "postgres"))]
    #[doc = include_str!("../../../docs/guide/rabbitmq.md")]
    struct Rabbitmq;
    #[cfg(feature = "postgres")]
    #[doc = include_str!("../../../docs/guide/postgres.md")]
    struct Postgres;
    #[cfg(feature = "sqlite")]
    #[doc = include_str!("../../../docs/guide/outbox.md")]
    struct Outbox;
}
