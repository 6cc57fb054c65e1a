//! SQLite: the embedded queue and dedup store.

mod claims;
mod guard;
mod outbox;
mod queue;
mod store;

use std::str::FromStr;
use std::time::Duration;

use justonce_core::{redact_url, Error, ErrorKind, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

pub use claims::SqliteClaimStore;
pub use guard::{SqliteStateGuard, SqliteVersionGuard};
pub use outbox::SqliteOutbox;
pub use queue::{SqliteQueue, SqliteQueueOptions};
pub use store::{SqliteStore, SqliteStoreOptions, SqliteTx};

/// The database clock in milliseconds since the Unix epoch, as an SQL expression.
/// Leases and retention use it, never the worker's clock (contract 3 in ARCHITECTURE.md).
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// Opens a pool on a `sqlite:PATH` URL: WAL, `synchronous=FULL` unless `durable` is false;
/// the file is created if missing unless `create` is false.
///
/// `temp_in_memory` keeps the connections' temporary files in memory (`temp_store =
/// MEMORY`); the queue wants it: its receive rewrites a batch of rows in one statement,
/// whose statement journal (the rows' pages as they were, so that the statement can be
/// undone alone) is larger than the 64 KiB SQLite keeps in memory for 100 messages of
/// 1 KB. SQLite then creates, writes and deletes a file in the temporary directory for
/// every batch. A store's pool leaves the setting alone: its connections run the
/// application's own queries, whose temporary data may be large.
///
/// A pool hands out its connections without pinging them first (sqlx's
/// `test_before_acquire`): a SQLite connection is a file handle run by a thread of this
/// process, and the ping is a round trip to that thread that checks nothing else. It
/// took 5–7% of an at-least-once consumer's throughput at batch 100 (one per begin,
/// receive and ack).
async fn connect(
    url: &str,
    durable: bool,
    max_connections: u32,
    temp_in_memory: bool,
    create: bool,
) -> Result<SqlitePool> {
    if !url.starts_with("sqlite:") {
        let url = redact_url(url);
        return Err(Error::config(format!(
            "`{url}` is not a SQLite URL: use sqlite:PATH, for example sqlite:/tmp/justonce.db"
        )));
    }
    let opts = SqliteConnectOptions::from_str(url)
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Config,
                format!("bad SQLite URL `{}`", redact_url(url)),
                e,
            )
        })?
        .create_if_missing(create)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(if durable {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        })
        .busy_timeout(Duration::from_secs(30));
    let opts = if temp_in_memory {
        opts.pragma("temp_store", "memory")
    } else {
        opts
    };
    SqlitePoolOptions::new()
        .test_before_acquire(false)
        .max_connections(max_connections)
        .connect_with(opts)
        .await
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Connect,
                format!("cannot open `{}`", redact_url(url)),
                e,
            )
        })
}
