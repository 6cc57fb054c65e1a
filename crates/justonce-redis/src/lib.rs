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
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! - `claims.rs`: `RedisClaimStore` (`ClaimStore`): `acquire_batch` and `finish_batch` are one
//!   Lua script each (`lua/claim_acquire.lua`, `lua/claim_finish.lua`), loaded at connect;
//!   `purge` scans the prefix (`lua/claim_purge.lua`); `expiry` is the keys' TTL, which
//!   `Consumer::with_claims` holds against the redelivery horizon;
//! - `lua/`: the scripts: leases by `TIME`, fences `max(last + 1, clock in µs)` in
//!   `{prefix}fence`, compare-and-set completion, a claim held by the call's owner nonce
//!   answered as the caller's;
//! - `store.rs`: `RedisStore` (`DedupStore`, and `InspectStore` for the tools: a `SCAN` of the
//!   prefix counted per consumer, `TIME`) and `RedisTx`, which buffers the handler's writes
//!   (the ones Redis can check ahead) and the batch's dedup records; the commit is one script
//!   (`lua/commit.lua`): every dedup key still absent and every write able to run, checked
//!   before the first write, else nothing is written (`Busy`: another batch recorded a key
//!   first; `Schema`: a write cannot run); claims are read in one pipelined round trip, with no
//!   lock;
//! - `scan.rs`: the purges of both stores, a `SCAN` of the prefix with a script per page;
//! - `stream/`: `RedisStream` (`Source`, `Publisher`, `Inspect` on a stream and a consumer
//!   group). `mod.rs`: connect (groups created, or checked with `create(false)`), receive (the
//!   ready script, then a blocking read on a connection of its own, woken at least every half
//!   lease and at the next due retry), publish (`MULTI` of `XADD`s), the heartbeat task (touch
//!   held entries, trim); `options.rs`; `receive.rs` (`lua/stream_ready.lua`: due retries
//!   moved, own pending entries on a first receive, `XAUTOCLAIM` past the lease, new entries;
//!   an entry without a payload dead-lettered at once); `settle.rs` (`lua/stream_settle.lua`:
//!   each receipt checked against the pending list, read with one `XPENDING` between the
//!   smallest and the largest receipt id, which the client computes (id parsing in Lua was most
//!   of the script's time), then ack, a copy into the retry stream or the delayed set, or a
//!   dead letter, with the `XACK` in the same script; the entries of a settle are unheld
//!   whatever its outcome, so a failed one runs out its lease); `admin.rs` (`Inspect`: the
//!   undelivered entries counted in Redis up to a thousand, `lua/stream_count.lua`, Redis's
//!   `lag` only above that and bounded by the stream's length, + pending + retries, dead
//!   letters replayed with `XADD` and `XDEL` in one `MULTI`; `check`, the doctor's links);
//!   `codec.rs` (fields and messages; pure); `reply.rs`; `lua/stream_ids.lua`, the entry-id
//!   comparison prepended to the trim script (Redis scripts share no code otherwise);
//! - `server.rs`: `ServerSettings`, read at connect (`INFO`, `CONFIG GET` where allowed):
//!   persistence and eviction as the doctor's checks and logged warnings;
//! - `connection.rs`: `open`, a `ConnectionManager` with justonce's timeouts; `error.rs`:
//!   redis-rs errors classified, and which are ambiguous (the command may have run);
//! - `harness.rs` (feature `harness`): `OwnServer`, a `redis-server` of the caller's own on a
//!   free port and a temporary directory (`start_durable`: `appendfsync always`), restartable
//!   as after a crash: the tests' and the lab's, never the machine's.
//!
//! **Invariant: every read-decide-write of a claim is one script**: nothing is read in one
//! round trip and written in another.
//!
//! **Invariant: a stream's settlement names its entry and delivery count, and is one script**:
//! no receipt settles an entry another consumer holds, and no dead letter or retry copy exists
//! without its `XACK`.
//!
//! **Invariant: an entry is heartbeated only while a caller holds its delivery**: a settle that
//! fails, a release that stops halfway or an abandon lets the rest go unheld, and their leases
//! run out.
//!
//! **Invariant: nothing but a trim below every group's need removes an entry from a main
//! stream**: retries and dead letters are copies in the group's own keys.
//!
//! **Invariant: a `RedisStore` commit writes everything or nothing**: its script checks every
//! dedup key and every write before its first write (a Redis script keeps the writes made
//! before a failing command).
//!
//! **Invariant: a call that may have run without a reply is asked again with the same owner
//! nonce**, never with a new one (`RedisClaimStore::twice`).
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
