//! Opening a connection with the topology declared on it, and closing one that may never
//! answer.

use std::time::Duration;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Channel, Connection, ConnectionProperties};

use justonce_core::{redact_url, Error, Result};

use crate::error::{amqp, connect as connect_error};
use crate::{topology, AmqpOptions, AmqpTls};

/// Connects to the broker at `url`, with the TLS it asks for.
///
/// `amqp://` is plaintext; `amqps://` is TLS (rustls), the broker's certificate and host
/// name verified against the system's roots and, with `cacertfile=PATH` in the query (or
/// [`AmqpTls::cacertfile`]), that authority too. `certfile=PATH&keyfile=PATH` present a
/// client certificate; with `auth_mechanism=external` the broker logs the client in by it
/// (its `rabbitmq_auth_mechanism_ssl` plugin), with no password. These are the names of
/// RabbitMQ's own URI spec. Verification cannot be turned off (`verify=verify_none` is
/// refused), and TLS parameters on an `amqp://` URL are an error, never ignored. A
/// `frame_max` below 8,192 is refused too (RabbitMQ 4.1 and later refuse it).
///
/// ```
/// # async fn run() {
/// use justonce_amqp::{connect, AmqpTls};
/// let e = connect("amqp://127.0.0.1:5672/%2f?cacertfile=/ca.pem", &AmqpTls::default())
///     .await
///     .err()
///     .unwrap();
/// assert!(e.to_string().contains("amqps://"));
/// let e = connect("amqp://127.0.0.1:5672/%2f?frame_max=4096", &AmqpTls::default())
///     .await
///     .err()
///     .unwrap();
/// assert!(e.to_string().contains("frame_max below 8192"));
/// # }
/// ```
pub async fn connect(url: &str, tls: &AmqpTls) -> Result<Connection> {
    let bad = |why: &str| {
        Error::config(format!(
            "`{}` is not an AMQP URL justonce takes: {why}",
            redact_url(url)
        ))
    };
    let mut files = tls.clone();
    let query = url.split_once('?').map_or("", |(_, q)| q);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let path = || {
            Some(std::path::PathBuf::from(
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            ))
        };
        match k {
            "cacertfile" => files.cacertfile = path(),
            "certfile" => files.certfile = path(),
            "keyfile" => files.keyfile = path(),
            // RabbitMQ 4.1 refuses a frame_max below 8,192 at the handshake; older brokers
            // take it, and a connection that works today breaks at the upgrade.
            "frame_max" if v.parse::<u32>().is_ok_and(|n| n > 0 && n < 8192) => {
                return Err(bad(
                    "frame_max below 8192 is refused by RabbitMQ 4.1 and later; leave it out \
                     (the broker's own, 128 KiB by default, is used) or ask for 8192 or more",
                ))
            }
            "verify" if v != "verify_peer" => {
                return Err(bad(
                    "verify=verify_none turns certificate verification off; name the \
                     broker's authority with cacertfile=PATH instead",
                ))
            }
            _ => {}
        }
    }
    let amqps = url
        .trim_start()
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"));
    let any = files.cacertfile.is_some() || files.certfile.is_some() || files.keyfile.is_some();
    if any && !amqps {
        return Err(bad(
            "cacertfile, certfile and keyfile are for TLS: use amqps://",
        ));
    }
    if files.certfile.is_some() != files.keyfile.is_some() {
        return Err(bad("a client certificate needs both certfile and keyfile"));
    }
    let read = |path: &std::path::PathBuf| {
        std::fs::read(path).map_err(|e| {
            Error::config(format!(
                "cannot read {} (for {}): {e}",
                path.display(),
                redact_url(url)
            ))
        })
    };
    let config = OwnedTLSConfig {
        cert_chain: files
            .cacertfile
            .as_ref()
            .map(|p| read(p).map(|pem| String::from_utf8_lossy(&pem).into_owned()))
            .transpose()?,
        identity: match (&files.certfile, &files.keyfile) {
            (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
                pem: read(cert)?,
                key: read(key)?,
            }),
            _ => None,
        },
    };
    let runtime = lapin::runtime::default_runtime().map_err(|e| connect_error(url, e))?;
    Connection::connect_with_config(url, ConnectionProperties::default(), config, runtime)
        .await
        .map_err(|e| connect_error(url, e))
}

/// Opens a connection and a channel, and declares the topology on it.
pub(crate) async fn open(url: &str, opts: &AmqpOptions) -> Result<(Connection, Channel)> {
    let conn = connect(url, &opts.tls).await?;
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
