use justonce_core::{redact_url, Error, ErrorKind};

/// A lapin error as a justonce [`Error`], classified for retry decisions.
pub(crate) fn amqp(context: impl std::fmt::Display, e: lapin::Error) -> Error {
    let kind = match e.kind() {
        lapin::ErrorKind::IOError(_) | lapin::ErrorKind::RuntimeShutdownError(_) => ErrorKind::Io,
        lapin::ErrorKind::MissingHeartbeatError => ErrorKind::Io,
        lapin::ErrorKind::ProtocolError(_) if e.is_amqp_soft_error() => ErrorKind::Config,
        lapin::ErrorKind::ProtocolError(_) => ErrorKind::Closed,
        lapin::ErrorKind::InvalidChannelState(..)
        | lapin::ErrorKind::InvalidConnectionState(_)
        | lapin::ErrorKind::InvalidChannel(_)
        | lapin::ErrorKind::ChannelsLimitReached => ErrorKind::Closed,
        _ => ErrorKind::Database,
    };
    Error::with_source(kind, context.to_string(), e)
}

/// Connecting failed: say where, without the password, and over what.
pub(crate) fn connect(url: &str, e: lapin::Error) -> Error {
    let kind = if e.is_io_error() {
        ErrorKind::Connect
    } else {
        ErrorKind::Config
    };
    let over = if url
        .trim_start()
        .get(..8)
        .is_some_and(|s| s.eq_ignore_ascii_case("amqps://"))
    {
        " over TLS (amqps://; nothing is sent in plaintext: is the port a TLS listener, \
         5671 by RabbitMQ's default, and is its certificate one the system trusts?)"
    } else {
        ""
    };
    Error::with_source(
        kind,
        format!("cannot connect to RabbitMQ at {}{over}", redact_url(url)),
        e,
    )
}
