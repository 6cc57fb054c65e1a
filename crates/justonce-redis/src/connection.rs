//! Connecting: a [`ConnectionManager`] (one multiplexed connection, opened again after it
//! breaks) with justonce's timeouts, and a clear error with the URL redacted.

use std::time::Duration;

use justonce_core::{redact_url, Error, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::connect;

/// A Redis client for `url`, with the TLS it asks for.
///
/// `redis://` is plaintext; `rediss://` is TLS, verified against the system's roots. The
/// query may add, for `rediss://` only: `tls_ca=PATH` (the authority of the server's
/// certificate, trusted instead of the system's roots), and `tls_cert=PATH&tls_key=PATH`
/// (a client certificate, for a server with `tls-auth-clients yes`). An ACL user and its
/// password go where Redis users write them: `rediss://app:PASSWORD@host:6380/0`.
/// Certificate verification cannot be turned off: the redis crate's `#insecure` is
/// refused, and TLS parameters on a `redis://` URL are an error, never ignored.
///
/// ```
/// let e = justonce_redis::client("redis://127.0.0.1:6379?tls_ca=/ca.pem").err().unwrap();
/// assert!(e.to_string().contains("rediss://"));
/// let e = justonce_redis::client("rediss://app:s3cret@cache:6380/#insecure").err().unwrap();
/// assert!(e.to_string().contains("verification") && !e.to_string().contains("s3cret"));
/// ```
pub fn client(url: &str) -> Result<redis::Client> {
    let bad = |why: String| {
        Error::config(format!(
            "`{}` is not a Redis URL justonce takes: {why}",
            redact_url(url)
        ))
    };
    let (rest, fragment) = url.split_once('#').unwrap_or((url, ""));
    if fragment.eq_ignore_ascii_case("insecure") {
        return Err(bad(
            "#insecure turns certificate verification off; name the server's authority \
             with ?tls_ca=PATH instead"
                .into(),
        ));
    }
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut kept = Vec::new();
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let path = || {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        };
        match k {
            "tls_ca" => ca = Some(path()),
            "tls_cert" => cert = Some(path()),
            "tls_key" => key = Some(path()),
            _ => kept.push(pair),
        }
    }
    let tls = base
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"));
    if !tls && (ca.is_some() || cert.is_some() || key.is_some()) {
        return Err(bad(
            "tls_ca, tls_cert and tls_key are for TLS: use rediss://".into(),
        ));
    }
    if cert.is_some() != key.is_some() {
        return Err(bad(
            "a client certificate needs both tls_cert and tls_key".into()
        ));
    }
    let plain = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let not_redis = |e: redis::RedisError| {
        Error::with_source(
            justonce_core::ErrorKind::Config,
            format!("`{}` is not a Redis URL", redact_url(url)),
            e,
        )
    };
    if ca.is_none() && cert.is_none() {
        return redis::Client::open(plain.as_str()).map_err(not_redis);
    }
    let read = |path: &str| {
        std::fs::read(path).map_err(|e| {
            Error::config(format!("cannot read {path} (for {}): {e}", redact_url(url)))
        })
    };
    let client_tls = match (cert, key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(&cert)?,
            client_key: read(&key)?,
        }),
        _ => None,
    };
    let root_cert = ca.as_deref().map(read).transpose()?;
    redis::Client::build_with_tls(
        plain.as_str(),
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(not_redis)
}

/// Whether `url` is `rediss://`, for an error that says the connection was to be TLS.
pub(crate) fn is_tls(url: &str) -> bool {
    url.trim_start()
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
}

/// Opens a managed connection to `url`, failing within a few seconds when the server is
/// not there.
pub(crate) async fn open(url: &str, response_timeout: Duration) -> Result<ConnectionManager> {
    let client = client(url)?;
    let config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(response_timeout))
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client, config)
        .await
        .map_err(|e| connect(url, e))
}
