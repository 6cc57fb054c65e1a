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
