//! Redis errors as justonce [`Error`]s, classified by who is to blame.

use justonce_core::{redact_url, Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

/// A Redis error, classified: an outage or a timeout is transient and never the message's
/// fault; a refusal by the server's configuration (no permission, read-only, out of
/// memory) is the operator's.
pub(crate) fn redis(context: impl std::fmt::Display, e: RedisError) -> Error {
    Error::with_source(kind(&e), context.to_string(), e)
}

/// Connecting failed: say where, without the password.
pub(crate) fn connect(url: &str, e: RedisError) -> Error {
    let kind = match kind(&e) {
        ErrorKind::Io | ErrorKind::Timeout | ErrorKind::Closed => ErrorKind::Connect,
        other => other,
    };
    Error::with_source(
        kind,
        format!(
            "cannot connect to Redis at {}{}",
            redact_url(url),
            if crate::connection::is_tls(url) {
                " over TLS (never in plaintext)"
            } else {
                ""
            }
        ),
        e,
    )
}

/// Whether the command may have run although no reply came: the connection dropped or
/// the reply timed out after the command was sent.
pub(crate) fn is_ambiguous(e: &RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped()
}

fn kind(e: &RedisError) -> ErrorKind {
    if e.is_connection_refusal() {
        return ErrorKind::Connect;
    }
    if e.is_timeout() {
        return ErrorKind::Timeout;
    }
    if e.is_io_error() || e.is_connection_dropped() {
        return ErrorKind::Io;
    }
    match e.code() {
        Some("OOM") => return ErrorKind::Resource,
        Some("BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN") => return ErrorKind::Busy,
        Some("WRONGTYPE") => return ErrorKind::Schema,
        Some("NOPERM" | "NOAUTH" | "WRONGPASS" | "READONLY") => return ErrorKind::Permission,
        _ => {}
    }
    match e.kind() {
        redis::ErrorKind::AuthenticationFailed => ErrorKind::Permission,
        redis::ErrorKind::InvalidClientConfig => ErrorKind::Config,
        redis::ErrorKind::Server(ServerErrorKind::NoPerm | ServerErrorKind::ReadOnly) => {
            ErrorKind::Permission
        }
        redis::ErrorKind::Server(ServerErrorKind::BusyLoading | ServerErrorKind::TryAgain) => {
            ErrorKind::Busy
        }
        // A reply justonce did not expect, an unknown script, a server error it does not
        // know: never the message's fault.
        _ => ErrorKind::Internal,
    }
}
