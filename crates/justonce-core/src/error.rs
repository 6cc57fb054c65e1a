//! The one error type of justonce, and its classification.

use std::fmt;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in the terms the runtime needs to decide what to do next.
///
/// [`ErrorKind::is_transient`] lists every variant without a wildcard: a new variant
/// forces a decision about whether it is worth a retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A service could not be reached or the connection was refused.
    Connect,
    /// A connection broke or an I/O operation failed midway.
    Io,
    /// The database is busy (locked, deadlock, serialization failure): try again.
    Busy,
    /// A waiting operation ran out of time.
    Timeout,
    /// The component was shut down or the connection closed.
    Closed,
    /// A unique constraint rejected a write: the unique-key signal for duplicates.
    UniqueViolation,
    /// Any other error reported by the database.
    Database,
    /// A payload could not be decoded (malformed JSON, wrong shape).
    Decode,
    /// A message is unacceptable as it is: missing id, oversized payload, invalid field.
    InvalidInput,
    /// The same message id arrived with a different payload fingerprint.
    Conflict,
    /// The configuration is wrong: a bad URL, an unsupported option, an unsafe retention.
    Config,
    /// An error from the handler's own code that it did not classify further.
    Handler,
}

impl ErrorKind {
    /// Whether trying the same thing again later can succeed.
    ///
    /// The runtime retries a transient handler error with backoff and dead-letters a
    /// permanent one at once.
    pub fn is_transient(self) -> bool {
        match self {
            ErrorKind::Connect => true,
            ErrorKind::Io => true,
            ErrorKind::Busy => true,
            ErrorKind::Timeout => true,
            ErrorKind::Closed => true,
            ErrorKind::UniqueViolation => false,
            ErrorKind::Database => false,
            ErrorKind::Decode => false,
            ErrorKind::InvalidInput => false,
            ErrorKind::Conflict => false,
            ErrorKind::Config => false,
            ErrorKind::Handler => true,
        }
    }

    /// A short lowercase name, used in dead-letter reasons and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Io => "io",
            ErrorKind::Busy => "busy",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Closed => "closed",
            ErrorKind::UniqueViolation => "unique violation",
            ErrorKind::Database => "database",
            ErrorKind::Decode => "decode",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Config => "config",
            ErrorKind::Handler => "handler",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error with its [`ErrorKind`], a message for people, and the underlying cause.
///
/// ```
/// use justonce_core::{Error, ErrorKind};
///
/// let e = Error::new(ErrorKind::Decode, "payload is not valid JSON: expected value at line 1");
/// assert!(!e.kind().is_transient());
/// assert_eq!(e.to_string(), "payload is not valid JSON: expected value at line 1");
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error of `kind` with a message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error of `kind` with a message and the error that caused it.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A configuration error: the message should say what to change.
    pub fn config(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Config, message)
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Shorthand for `self.kind().is_transient()`.
    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }

    /// The message followed by every cause, joined by `": "`.
    pub fn to_chain_string(&self) -> String {
        let mut s = self.message.clone();
        let mut cur = std::error::Error::source(self);
        while let Some(e) = cur {
            let text = e.to_string();
            if !s.ends_with(&text) {
                s.push_str(": ");
                s.push_str(&text);
            }
            cur = e.source();
        }
        s
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::with_source(ErrorKind::Decode, "payload is not the expected JSON", e)
    }
}
