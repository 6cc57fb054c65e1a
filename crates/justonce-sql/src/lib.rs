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
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! The algorithms are written once; a backend module gives its DDL, its SQL text and its hooks,
//! nothing else.
//!
//! - `harness.rs` (feature `harness`): `OwnPostgres` and `OwnMariaDb`, servers of a test's own
//!   (a password, TLS when asked; PostgreSQL under root runs as `postgres`);
//! - `conn.rs`: `Conn`, the one place the algorithms meet sqlx (a statement and its `Arg`s on
//!   any connection), and `begin` / `begin_with`, sqlx's begins made safe to cancel (each runs
//!   in a task of its own);
//! - `many.rs`: `ManySql`, a batch's claims in two statements, built once per row count;
//! - `dedup.rs`: `DedupBackend` (pool, `DedupSql`, and hooks with defaults: `begin_claimed`,
//!   `claim_arrays`, `purge_own`) and the dedup algorithm as plain functions (`claim`,
//!   `claim_many`, `begin_with_claims`, `purge`); `impl_dedup_store!` only delegates;
//! - `claims.rs`: `ClaimBackend`, the claim algorithm (insert, read under lock, the pure
//!   `decide`, takeover, fenced completion); `impl_claim_store!` only delegates;
//! - `inspect.rs`: `InspectStore` and `InspectClaims` for every SQL store, over `Conn` (the SQL
//!   casts every value to text), the store's clock and its server's deadlock count included;
//! - `outbox.rs`: `SqlOutbox<DB>` (`OutboxStore` over `Conn`, `OutboxOptions`) and `OutboxSql`,
//!   the text each backend gives (a take is `Returning` one statement, `MarkAndTake` one
//!   statement that also deletes the rows the relay's last batch sent, or `Steps` after a lock;
//!   the others delete those rows first, in the take's transaction); a key is blocked while an
//!   earlier row of it is leased, waiting or dead, and lists of seqs are written as integer
//!   literals. The backends' `*/outbox.rs` hold only the schema and the text
//!   (`SqliteStore::outbox`, `PgStore::outbox`, `MySqlStore::outbox`), and PostgreSQL's
//!   `PgOutbox::mover_into` (a `PgOutboxMove`: one statement takes rows by the take's own CTEs,
//!   `runs`, deletes them and inserts them into `jo_queue` in seq order with the queue's
//!   `NOTIFY`; refused unless both pools see one database, by its name, the server's start and
//!   port and `jo_queue`'s oid): SQLite takes with one `UPDATE … RETURNING` (one writer at a
//!   time); PostgreSQL side by side, `FOR UPDATE SKIP LOCKED`, a key's rows only to the take
//!   that holds its first row and only up to the first row it does not hold, in a transaction
//!   whose `BEGIN` sets the plan (the seq index), a per-key advisory lock at enqueue (seq order
//!   is commit order per key), a table with `fillfactor = 50` (the lease is a HOT update) and a
//!   `NOTIFY`, sent by the enqueue's own insert, that wakes relays at commit (`Listen`, started
//!   at a relay's first wait); MariaDB (no `UPDATE … RETURNING`) in steps, in a transaction
//!   that first locks a row of `{table}_locks` (a take dropped midway rolls back and frees it),
//!   one take at a time, and a producer locks its key's slot in the same table (record locks,
//!   no gap locks: the locking read of a key's last row it used first deadlocked producers of
//!   different keys);
//! - `check.rs`: the doctor's links of the SQLite and PostgreSQL queues (tables, WAL, `fsync`,
//!   `synchronous_commit`);
//! - `positions.rs`: `SqlPositions<DB>` (`Positions` and `PositionsIn` over `Conn`), the table
//!   `jo_positions` of each store (`SqliteStore::positions`, `PgStore::positions`,
//!   `MySqlStore::positions`: one upsert per partition that keeps the larger offset);
//! - `guard.rs`: the state-machine and version guards (statements built with sqlx
//!   `QueryBuilder`, run through `RunGuard`, decided); each backend's `guard.rs` names its
//!   connection and key types;
//! - `queue.rs`: what both SQL queues share: `QueueStats`, the dead letters read, replayed and
//!   purged over `Conn` (a replay enqueues and deletes in one transaction), and `must_hold`,
//!   which a queue opened with `create(false)` runs before any DDL; `options.rs`: the setters
//!   of the options structs;
//! - `sqlite/`: `SqliteQueue` (a leased queue in a SQLite file), `SqliteStore` (a claim that
//!   rides on `BEGIN IMMEDIATE`; the purge sweeps keys in order), `SqliteClaimStore`;
//! - `postgres/` (feature `postgres`): `PgQueue` (`SKIP LOCKED`, `LISTEN/NOTIFY`,
//!   `TransactionalAck`, `publish_in` a business transaction), `PgStore` (claims folded into
//!   `BEGIN`, array inserts, optional daily partitions), `PgClaimStore`;
//! - `mysql/` (feature `mysql`): `MySqlStore` (`INSERT IGNORE`, locking reads),
//!   `MySqlClaimStore`.
//!
//! The macros exist only because the orphan rule forbids `impl<B: DedupBackend> DedupStore for
//! B`.
//!
//! **Invariant: the SQL stores differ only in SQL text and hooks**; a behaviour change goes
//! into `dedup.rs`, `claims.rs`, `guard.rs` or `outbox.rs`, and the conformance suites run it
//! on all three databases.
//!
//! **Invariant: every transaction begins through `justonce_sql::begin` or `begin_with`**, never
//! sqlx's `Pool::begin` or `begin_with`: sqlx 0.8 leaves a transaction open when its future is
//! dropped after the `BEGIN` ran and before sqlx counted it (SQLite: a custom `BEGIN`'s check,
//! which holds the file's write lock for good, `conn::tests`; PostgreSQL and MariaDB: the
//! `BEGIN`'s own round trip, read from sqlx's source).
//!
//! **Invariant: times for leases, delays and retention come from the database clock** (`NOW_MS`
//! in `sqlite/mod.rs`, `clock_timestamp()`, `NOW(6)`).
//!
//! **Invariant: a purge never blocks a claim**: batched deletes, one window of keys on SQLite,
//! or partitions detached concurrently.
//!
//! **Invariant: every batch claim takes its row locks in one order** (`dedup::lock_order`), so
//! two batches of the same keys cannot deadlock on them.
//!
//! # Minimum supported Rust version
//!
//! 1.89 (what redis 1.8 and async-nats 0.51, the next backends, need).

mod check;
mod claims;
mod conn;
mod dedup;
mod guard;
#[cfg(feature = "harness")]
pub mod harness;
mod inspect;
mod many;
#[cfg(feature = "mysql")]
mod mysql;
mod options;
mod outbox;
mod positions;
#[cfg(feature = "postgres")]
mod postgres;
mod queue;
mod sqlite;

pub use conn::{begin, begin_with};
#[cfg(feature = "mysql")]
pub use mysql::{
    MySqlClaimStore, MySqlOutbox, MySqlStateGuard, MySqlStore, MySqlStoreOptions, MySqlTx,
    MySqlVersionGuard,
};
pub use outbox::{OutboxOptions, SqlOutbox};
pub use positions::SqlPositions;
#[cfg(feature = "postgres")]
pub use postgres::{
    PgClaimStore, PgOutbox, PgOutboxMove, PgQueue, PgQueueOptions, PgStateGuard, PgStore,
    PgStoreOptions, PgTx, PgVersionGuard,
};
pub use queue::{DeadLetter, QueueStats};
pub use sqlite::{
    SqliteClaimStore, SqliteOutbox, SqliteQueue, SqliteQueueOptions, SqliteStateGuard, SqliteStore,
    SqliteStoreOptions, SqliteTx, SqliteVersionGuard,
};

/// A database server that could not be reached or refused us, said once: where (without
/// the password), and the server's or the socket's own sentence. Classified as the
/// underlying error is (a wrong password is a permission error), except that a lost or
/// timed-out connection is a connect error here.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn cannot_connect(server: &str, url: &str, e: sqlx::Error) -> justonce_core::Error {
    use justonce_core::{Error, ErrorKind};
    let cause = Error::from(e);
    let kind = match cause.kind() {
        ErrorKind::Io | ErrorKind::Timeout | ErrorKind::Closed => ErrorKind::Connect,
        other => other,
    };
    let over = tls_asked(url).map_or_else(String::new, |mode| {
        format!(" over TLS ({mode}; never in plaintext)")
    });
    Error::with_source(
        kind,
        format!(
            "cannot connect to {server} at {}{over}",
            justonce_core::redact_url(url)
        ),
        cause,
    )
}

/// The TLS a URL insists on, as its query says it: PostgreSQL's `sslmode` or MariaDB's
/// `ssl-mode`, when it is more than `disable`, `allow` or `prefer` (which may end in
/// plaintext, as libpq's do).
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn tls_asked(url: &str) -> Option<String> {
    let (_, query) = url.split_once('?')?;
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(k, _)| k.eq_ignore_ascii_case("sslmode") || k.eq_ignore_ascii_case("ssl-mode"))
        .find(|(_, v)| {
            !["disable", "disabled", "allow", "prefer", "preferred"]
                .iter()
                .any(|weak| v.eq_ignore_ascii_case(weak))
        })
        .map(|(k, v)| format!("{k}={v}"))
}

/// Opens and closes one connection: a pool retries a refused connection until its acquire
/// timeout and then says only "pool timed out"; this says what went wrong, at once.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn probe<O>(options: &O) -> Result<(), sqlx::Error>
where
    O: sqlx::ConnectOptions,
    O::Connection: Sized,
{
    let conn = tokio::time::timeout(std::time::Duration::from_secs(10), options.connect())
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
    let _ = sqlx::Connection::close(conn).await;
    Ok(())
}
