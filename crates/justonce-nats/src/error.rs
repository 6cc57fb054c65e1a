//! NATS errors as justonce [`Error`]s, classified by who is to blame: an outage or a
//! timeout is transient and never the message's fault.

use justonce_core::{redact_url, Error, ErrorKind};

/// A failed request to the server (an API call, a double ack).
pub(crate) fn request(
    context: impl std::fmt::Display,
    e: async_nats::error::Error<async_nats::RequestErrorKind>,
) -> Error {
    use async_nats::RequestErrorKind as K;
    let kind = match e.kind() {
        K::TimedOut => ErrorKind::Timeout,
        K::NoResponders => ErrorKind::Connect,
        _ => ErrorKind::Io,
    };
    let what = match e.kind() {
        K::NoResponders => format!("{context}: nothing on the server answered (no responders)"),
        _ => context.to_string(),
    };
    Error::with_source(kind, what, e)
}

/// A failed JetStream API call: timeouts are transient, the rest say what the server said.
pub(crate) fn api<K>(context: impl std::fmt::Display, e: async_nats::error::Error<K>) -> Error
where
    K: Clone + std::fmt::Debug + std::fmt::Display + PartialEq + Send + Sync + 'static,
{
    let text = e.to_string();
    let kind = if text.contains("timed out") || text.contains("timeout") {
        ErrorKind::Timeout
    } else if text.contains("no responders") || text.contains("JetStream not enabled") {
        ErrorKind::Connect
    } else if text.contains("insufficient resources") || text.contains("storage") {
        ErrorKind::Resource
    } else if text.contains("permission") || text.contains("authorization") {
        ErrorKind::Permission
    } else {
        ErrorKind::Io
    };
    Error::with_source(kind, context.to_string(), e)
}

/// Whether the server said what was asked for (a stream, a consumer, a message) is not
/// there. A message read by its sequence says "no message found" (error code 10037).
pub(crate) fn not_found(e: &dyn std::fmt::Display) -> bool {
    let text = e.to_string();
    text.contains("not found") || text.contains("no message found")
}

/// Connecting failed: say where, without the password.
pub(crate) fn connect(url: &str, tls: bool, e: async_nats::ConnectError) -> Error {
    use async_nats::ConnectErrorKind as K;
    let kind = match e.kind() {
        K::Authentication | K::AuthorizationViolation => ErrorKind::Permission,
        K::ServerParse => ErrorKind::Config,
        _ => ErrorKind::Connect,
    };
    Error::with_source(
        kind,
        format!(
            "cannot connect to NATS at {}{}",
            redact_url(url),
            if tls {
                " over TLS (never in plaintext)"
            } else {
                ""
            }
        ),
        e,
    )
}

/// A publish that failed or whose PubAck did not come: the message may or may not be
/// stored (publish it again under the same id; the server drops the duplicate).
pub(crate) fn publish(
    subject: &str,
    e: async_nats::error::Error<async_nats::jetstream::context::PublishErrorKind>,
) -> Error {
    use async_nats::jetstream::context::PublishErrorKind as K;
    let (kind, what) = match e.kind() {
        K::TimedOut => (
            ErrorKind::Timeout,
            format!("no PubAck for a publish to `{subject}` in time: it may or may not be stored"),
        ),
        K::StreamNotFound => (
            ErrorKind::Config,
            format!("no stream takes the subject `{subject}`"),
        ),
        K::MaxPayloadExceeded => (
            ErrorKind::InvalidInput,
            format!("a message to `{subject}` is over the server's max_payload"),
        ),
        K::BrokenPipe => (
            ErrorKind::Io,
            format!("the connection broke before the PubAck of a publish to `{subject}` came: it may or may not be stored"),
        ),
        _ => (
            ErrorKind::Io,
            format!("publishing to `{subject}` failed"),
        ),
    };
    Error::with_source(kind, what, e)
}

#[cfg(test)]
mod tests {
    use async_nats::jetstream::stream::{RawMessageError, RawMessageErrorKind};

    /// A message read back by its sequence after another worker removed it (the advisory
    /// of `max_deliver` reaches every worker) is gone, not an error: the lab's soak on NATS
    /// logged hundreds of "reading message … failed" for messages already dead-lettered.
    #[test]
    fn a_message_that_is_gone_is_not_found() {
        assert!(super::not_found(&RawMessageError::new(
            RawMessageErrorKind::NoMessageFound
        )));
        assert!(!super::not_found(&RawMessageError::new(
            RawMessageErrorKind::Other
        )));
    }
}
