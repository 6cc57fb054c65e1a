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
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! `backend.rs`: the one place a URL picks a backend (`TransportKind`, with what a transport
//! does on its own, such as `drops_republished_ids`; `StoreKind`, `Transport`, `LocalService`).
//! `doctor.rs`: `check_transport` and `check_store`, the links of the chain each backend can
//! see, creating nothing (tools open stores with `create(false)`).
//! **Invariant: no URL scheme is matched outside `backend.rs`** (and the stores' own `connect`,
//! which check their URL).
//!
//! `consumer/`, a file per phase of a batch:
//!
//! - `mod.rs`: `Consumer`, its builders, `run_once`, `run_until`;
//! - `options.rs`: `ConsumerOptions`, grouped into `BatchOptions`, `RetryOptions`,
//!   `DedupOptions`, `BreakerOptions`;
//! - `handler.rs`: `Handler<Tx>` (plain `async fn`s), `lock_key`, `Context`;
//! - `run.rs`: the worker and purge loops, `receive_batch` (sorted by `lock_key`; a failed
//!   linger top-up keeps the batch in hand), `give_back` with backoff;
//! - `batch.rs`: `process`, the pipeline of named steps, with the fault points between them;
//!   under lock conflicts `Turns` (the store's `take_turn`) or `Window` (the batch size);
//! - `pass.rs`: the optimistic pass (every key claimed at `begin`, no savepoints) and the
//!   careful pass (a savepoint and a claim per message, after a rollback);
//! - `decide.rs`: the pure decisions (screening bad input, settlements, conflicts, reasons),
//!   unit-tested without a store;
//! - `claims.rs`: claim mode (`Idempotency::Claim`), acquire before `begin`, finish after the
//!   commit;
//! - `settle.rs`: `judge` (through the breaker), `settle` (which first tells a transactional
//!   acker that its transaction committed: `TransactionalAck::committed`), `ack_in_tx`;
//! - `breaker.rs`: stops dead-lettering while failures share one reason; pure;
//! - `explain.rs`: `explain`, what a delivery would come to given its key's dedup record and claim
//!   (`justonce dedup explain`), by the rules the stores and `decide.rs` apply; pure;
//! - `gate.rs`: `Gate`, where a batch waits before its `BEGIN` for the batches of this consumer
//!   that entered before it and share one of its lock keys (at `concurrency` above 1);
//! - `fault.rs` (feature `fault-injection`): `FaultHook`; `observe.rs`: `CommitObserver`, the
//!   bench's clock;
//! - `telemetry.rs`: the instruments (registered at the first batch, through the `metrics`
//!   facade), `Fate` (what became of a delivery), `Health` (readiness).
//!
//! `tasks.rs`: `Supervisor` (the consumer's and the relay's loops: until a shutdown or the
//! first task to end, then stop all and join, first error wins) and `sleep_or_stop`.
//! `relay/`: the outbox's relay. `mod.rs`: `Relay` (`Relay::new` publishes, `Relay::moving`
//! moves through an `OutboxMove` instead: a loop moves a batch a transaction until one finds
//! nothing, then waits for rows, and nothing is leased, confirmed or marked; `run_until`, or
//! `spawn` into a `RunningRelay` stopped with `stop()`; take under a lease, `publish_batch`
//! with a timeout shorter than the lease, then `mark_sent`; a running loop publishes each batch
//! while it takes the next (`tokio::join!`; that take marks the batch before, and a batch taken
//! ahead is published only if its publish can still end inside its lease, else given back); a
//! third task calls `OutboxStore::tidy` every `tidy_interval` (PostgreSQL: `VACUUM
//! (SKIP_LOCKED)`); on a refusal, row by row: `mark_failed` for the refused row, its key's
//! later rows released; an error that is not a row's releases all and pauses), `RelayFaultHook`
//! (`AfterConfirm`); `options.rs`: `RelayOptions`; `telemetry.rs`: the `justonce_outbox_*`
//! instruments.
//! A handler's sends (`Context::send`) are collected in its `Context` and written by
//! `run_handler` into its transaction only when it returns `Ok` (inside its savepoint in the
//! careful pass), through the consumer's `Consumer::with_outbox`.
//!
//! **Invariant: a relay marks a row sent only after its publish returned `Ok`** (a confirm, a
//! committed row): `Inner::publish_taken` answers the seqs it confirmed only after the publish
//! and the `AfterConfirm` fault point; a running relay keeps them in `unmarked` and marks them
//! with its next take (`take_after_sent`, one transaction on the SQL stores) or when it stops;
//! `relay_once` and `Inner::singly` mark at once (`Inner::mark_sent`, which also counts them).
//!
//! **Invariant: every delivery received is counted to one outcome, once.**
//! `applied` and `duplicate` are counted right after the commit (`Inner::count(slots, true)` in
//! `transact`), retries, dead letters and releases once the breaker has judged them (`settle`),
//! and a failed batch's uncounted deliveries as released (or lost, at-most-once) where
//! `process_or_singly` hands them back; a crash before those points counts nothing, and the
//! redelivery is counted again.
//!
//! **Invariant: a delivery is acked only after the commit of its dedup record and its
//! effects.**
//! The only `ack` calls are in `process` (at-most-once, before `begin`), in `settle` (after
//! `commit`) and in `ack_in_tx` (inside the transaction).
//!
//! **Invariant: a failing message's writes never commit; the rest of its batch does.**
//!
//! **Invariant: the runtime never retries bad input**: no id, an oversized payload, a decode
//! error or a fingerprint conflict is dead-lettered on its first delivery, unless the breaker
//! is open for that reason.
//!
//! **Invariant: an error that is not the message's fault never dead-letters, nacks or counts an
//! attempt**: the batch is released and the loop pauses.
//! The only `dead_letter` calls are in `settle`.
//!
//! **Invariant: no claim is taken or finished while the batch transaction is open.**
//!
//! **Invariant: the retention check runs in `Consumer::new`** (with the store's expiry; a claim
//! store's expiry in `Consumer::with_claims`).
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
