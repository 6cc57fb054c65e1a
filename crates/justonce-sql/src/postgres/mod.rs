//! PostgreSQL: the queue, and the dedup and claim stores, in your business database.

mod claims;
mod guard;
mod outbox;
mod queue;
mod store;

use std::sync::Arc;
use std::time::Duration;

use justonce_core::{redact_url, Error, Result};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use claims::PgClaimStore;
pub use guard::{PgStateGuard, PgVersionGuard};
pub use outbox::{PgOutbox, PgOutboxMove};
pub use queue::{PgQueue, PgQueueOptions};
pub use store::{PgStore, PgStoreOptions, PgTx};

/// Serialises schema creation: concurrent `CREATE TABLE IF NOT EXISTS` of one table can
/// fail in PostgreSQL with a unique violation on its catalog.
const SCHEMA_LOCK: i64 = 0x6a75_7374_6f6e_6365; // "justonce"

/// One millisecond, to multiply a `bigint` parameter of milliseconds by.
const MS: &str = "interval '1 millisecond'";

/// Opens a pool on a `postgres://` URL.
pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<PgPool> {
    connect_with(url, max_connections, None).await
}

/// As [`connect`]; `setup` runs on every new connection of the pool (a `PREPARE`). A setup
/// that fails is logged and leaves the connection as it is: what it prepares is an
/// optimisation, and a table dropped under a live pool must not stop it from connecting.
pub(crate) async fn connect_with(
    url: &str,
    max_connections: u32,
    setup: Option<String>,
) -> Result<PgPool> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(Error::config(format!(
            "`{}` is not a PostgreSQL URL: use postgres://USER@HOST:PORT/DATABASE",
            redact_url(url)
        )));
    }
    let mut options = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10));
    if let Some(setup) = setup {
        let setup: std::sync::Arc<str> = setup.into();
        options = options.after_connect(move |conn, _| {
            let setup = setup.clone();
            Box::pin(async move {
                if let Err(e) = sqlx::Executor::execute(conn, &*setup).await {
                    tracing::debug!(error = %e, "a connection's setup failed");
                }
                Ok(())
            })
        });
    }
    let unreachable = |e| crate::cannot_connect("PostgreSQL", url, e);
    let connect: sqlx::postgres::PgConnectOptions = url.parse().map_err(unreachable)?;
    crate::probe(&connect).await.map_err(unreachable)?;
    options.connect_with(connect).await.map_err(unreachable)
}

/// Runs DDL statements under the schema lock.
pub(crate) async fn create(pool: &PgPool, statements: &[String]) -> Result<()> {
    let mut tx = crate::begin(pool).await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(SCHEMA_LOCK)
        .execute(&mut *tx)
        .await?;
    for s in statements {
        sqlx::query(s).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Stops a listener task when the last clone of its owner goes.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Calls `wake` on each notification whose payload is `payload`. A lost connection is
/// re-established by the listener; notifications sent meanwhile are lost, so `wake` is
/// called after a reconnect too, and the woken poll in any case.
pub(crate) async fn listen(
    mut listener: PgListener,
    payload: String,
    wake: Arc<dyn Fn() + Send + Sync>,
) {
    loop {
        match listener.try_recv().await {
            Ok(Some(n)) => {
                if n.payload() == payload {
                    wake();
                }
            }
            Ok(None) => {
                debug!(%payload, "LISTEN connection re-established; waking");
                wake();
            }
            Err(e) => {
                warn!(%payload, error = %e, "LISTEN connection failed; polling until it is back");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
