//! SQLite: the embedded queue and dedup store.

mod claims;
mod guard;
mod queue;
mod store;

use std::str::FromStr;
use std::time::Duration;

use justonce_core::{redact_url, Error, ErrorKind, Result};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;

pub use claims::SqliteClaimStore;
pub use guard::{SqliteStateGuard, SqliteVersionGuard};
pub use queue::{SqliteQueue, SqliteQueueOptions};
pub use store::{SqliteStore, SqliteStoreOptions, SqliteTx};

/// The database clock in milliseconds since the Unix epoch, as an SQL expression.
/// Leases and retention use it, never the worker's clock (DESIGN.md invariant 3).
const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// Opens a pool on a `sqlite:PATH` URL: WAL, `synchronous=FULL` unless `durable` is false.
async fn connect(url: &str, durable: bool, max_connections: u32) -> Result<SqlitePool> {
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
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(if durable {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        })
        .busy_timeout(Duration::from_secs(30));
    SqlitePoolOptions::new()
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
