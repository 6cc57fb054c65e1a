//! justonce on Redis, through [redis-rs](https://docs.rs/redis).
//!
//! Both source articles keep dedup records in Redis (`SET key EX 86400`, `SET NX`). Done
//! naively (`SET NX`, then the effect) that is false idempotency: a crash between the two
//! leaves the mark without the effect, and the redelivery is skipped forever. This crate
//! does it so that the known failures of Redis idempotency layers cannot happen:
//!
//! - [`RedisClaimStore`], a [`ClaimStore`](justonce_core::ClaimStore) for effects outside
//!   any database: one Lua script per batch takes the claims or answers with what is there
//!   (held with its time left, completed with its result, a conflict), leases by the
//!   server's clock, fencing tokens that grow across a restart of a server that keeps
//!   nothing, compare-and-set completion, ambiguous replies resolved by owner, retention by
//!   key expiry;
//! - [`RedisStore`], a [`DedupStore`](justonce_core::DedupStore) whose business data lives
//!   in Redis: the handler's writes ([`RedisTx`]) and the batch's dedup records commit in
//!   one script, all or nothing, so a Redis-only handler is effectively-once with no
//!   database;
//! - [`ServerSettings`]: what the server keeps on disk and may evict, read at connect,
//!   logged when it weakens the guarantee, and answered to `justonce doctor`.
//!
//! # Minimum supported Rust version
//!
//! 1.89.

mod claims;
mod connection;
mod error;
#[cfg(feature = "harness")]
pub mod harness;
mod scan;
mod server;
mod store;
mod stream;

pub use claims::{RedisClaimOptions, RedisClaimStore};
pub use connection::client;
pub use server::ServerSettings;
pub use store::{RedisStore, RedisStoreOptions, RedisTx};
pub use stream::{RedisStream, RedisStreamOptions, StartAt};

/// The Redis guide, compiled: its Rust snippets are doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide/redis.md")]
struct Guide;
