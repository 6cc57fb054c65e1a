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
//! use justonce::{async_trait, Consumer, ConsumerOptions, Context, Disposition, Handler, Result};
//!
//! struct Credit;
//!
//! #[async_trait]
//! impl Handler<SqliteTx> for Credit {
//!     async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
//!         let order: serde_json::Value = cx.message().decode_json()?;
//!         sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
//!             .bind(order["amount"].as_i64())
//!             .bind(order["account"].as_i64())
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
//! # Feature flags
//!
//! - `sqlite` (default): the embedded SQLite queue and dedup store, as `justonce::sql`.
//! - `amqp`: the RabbitMQ transport, as `justonce::amqp`.
//!
//! # Minimum supported Rust version
//!
//! 1.85.

pub mod consumer;
mod shutdown;

pub use async_trait::async_trait;
pub use consumer::{
    BatchReport, BreakerOptions, ConflictPolicy, Consumer, ConsumerOptions, Context, FaultHook,
    FaultPoint, Handler, Idempotency,
};
pub use justonce_core::{
    canonical_json, conformance, error_chain, memory, redact_url, validate_identifier, Cas, Claim,
    ClaimState, ClaimStore, DeadLetterReason, DedupKey, DedupStore, Delivery, Disposition, Error,
    ErrorKind, ExponentialBackoff, Fingerprint, Headers, IdStrategy, Message, MessageId, Publisher,
    Receipt, Result, Semantics, Source, StateMachine, Store, TransactionalAck, Transition,
};
pub use shutdown::shutdown_signal;

/// The SQL backends (SQLite queue and stores), from `justonce-sql`.
#[cfg(feature = "sqlite")]
pub use justonce_sql as sql;

/// The RabbitMQ transport, from `justonce-amqp`.
#[cfg(feature = "amqp")]
pub use justonce_amqp as amqp;
