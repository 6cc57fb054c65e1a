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

/// Connecting failed: say where, without the password.
pub(crate) fn connect(url: &str, e: lapin::Error) -> Error {
    let kind = if e.is_io_error() {
        ErrorKind::Connect
    } else {
        ErrorKind::Config
    };
    Error::with_source(
        kind,
        format!("cannot connect to RabbitMQ at {}", redact_url(url)),
        e,
    )
}
