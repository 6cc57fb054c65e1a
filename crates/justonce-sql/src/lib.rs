//! justonce on SQL, through [sqlx](https://docs.rs/sqlx).
//!
//! - [`SqliteQueue`]: the embedded default transport. A durable queue in a SQLite file (WAL,
//!   `synchronous=FULL`): leases so a delivery whose consumer died comes back, attempts
//!   counted by the queue, delayed nacks, and a dead-letter table with reasons.
//! - [`SqliteStore`]: the dedup store. Its transactions are `sqlx` transactions
//!   ([`SqliteTx`]): your handler's business writes and the dedup record commit together.
//!
//! - With the `postgres` feature: [`PgQueue`] (a queue in PostgreSQL tables: `FOR UPDATE SKIP
//!   LOCKED`, `LISTEN/NOTIFY`, and an ack inside the business transaction), [`PgStore`] (with
//!   optional daily partitions), [`PgClaimStore`] and the guards. With `mysql`: the MariaDB /
//!   MySQL stores and guards.
//!
//! URLs are `sqlite:PATH` (created if missing), `postgres://…`, `mysql://…`.
//!
//! ```no_run
//! use justonce_core::{Message, Publisher};
//! use justonce_sql::SqliteQueue;
//!
//! # async fn run() -> justonce_core::Result<()> {
//! let queue = SqliteQueue::open("sqlite:queue.db", "orders").await?;
//! queue.publish(&Message::new(r#"{"order_id":"ORD-1"}"#).with_id("ORD-1")?).await?;
//! # Ok(()) }
//! ```
//!
//! # Minimum supported Rust version
//!
//! 1.85.

mod claim_logic;
mod common;
mod guard;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod queue;
mod sqlite;

#[cfg(feature = "mysql")]
pub use mysql::{
    MySqlClaimStore, MySqlStateGuard, MySqlStore, MySqlStoreOptions, MySqlTx, MySqlVersionGuard,
};
#[cfg(feature = "postgres")]
pub use postgres::{
    PgClaimStore, PgQueue, PgQueueOptions, PgStateGuard, PgStore, PgStoreOptions, PgTx,
    PgVersionGuard,
};
pub use queue::{DeadLetter, QueueStats};
pub use sqlite::{
    SqliteClaimStore, SqliteQueue, SqliteQueueOptions, SqliteStateGuard, SqliteStore,
    SqliteStoreOptions, SqliteTx, SqliteVersionGuard,
};
