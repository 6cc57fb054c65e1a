//! MariaDB / MySQL: the dedup and claim stores, in your business database.

mod claims;
mod guard;
mod outbox;
mod store;

use std::time::Duration;

use justonce_core::{redact_url, Error, Result};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::MySqlPool;

pub use claims::MySqlClaimStore;
pub use guard::{MySqlStateGuard, MySqlVersionGuard};
pub use outbox::MySqlOutbox;
pub use store::{MySqlStore, MySqlStoreOptions, MySqlTx};

/// Opens a pool on a `mysql://` URL.
pub(crate) async fn connect(url: &str, max_connections: u32) -> Result<MySqlPool> {
    if !(url.starts_with("mysql://") || url.starts_with("mariadb://")) {
        return Err(Error::config(format!(
            "`{}` is not a MariaDB/MySQL URL: use mysql://USER@HOST:PORT/DATABASE",
            redact_url(url)
        )));
    }
    let url = url.replacen("mariadb://", "mysql://", 1);
    let unreachable = |e| crate::cannot_connect("MariaDB", &url, e);
    let connect: sqlx::mysql::MySqlConnectOptions = url.parse().map_err(unreachable)?;
    crate::probe(&connect).await.map_err(unreachable)?;
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(connect)
        .await
        .map_err(unreachable)
}
