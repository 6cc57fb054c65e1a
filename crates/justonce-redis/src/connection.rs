//! Connecting: a [`ConnectionManager`] (one multiplexed connection, opened again after it
//! breaks) with justonce's timeouts, and a clear error with the URL redacted.

use std::time::Duration;

use justonce_core::{redact_url, Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::connect;

/// Opens a managed connection to `url`, failing within a few seconds when the server is
/// not there.
pub(crate) async fn open(url: &str, response_timeout: Duration) -> Result<ConnectionManager> {
    let client = redis::Client::open(url).map_err(|e| {
        Error::with_source(
            justonce_core::ErrorKind::Config,
            format!("`{}` is not a Redis URL", redact_url(url)),
            e,
        )
    })?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| connect(url, e))
}
