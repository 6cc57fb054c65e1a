//! Opening a connection with the topology declared on it, and closing one that may never
//! answer.

use std::time::Duration;

use lapin::{Channel, Connection, ConnectionProperties};

use justonce_core::Result;

use crate::error::{amqp, connect};
use crate::{topology, AmqpOptions};

/// Opens a connection and a channel, and declares the topology on it.
pub(crate) async fn open(url: &str, opts: &AmqpOptions) -> Result<(Connection, Channel)> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| connect(url, e))?;
    if let Err(e) = topology::declare(&conn, opts).await {
        close_quietly(&conn, 200, "justonce: topology refused").await;
        return Err(e);
    }
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| amqp("opening a channel", e))?;
    Ok((conn, channel))
}

/// Closes a connection, giving up after two seconds: a connection whose socket already
/// broke may never answer the close.
pub(crate) async fn close_quietly(conn: &Connection, code: u16, text: &str) {
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(code, text.into())).await;
}
