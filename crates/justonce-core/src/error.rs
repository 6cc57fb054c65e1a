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
    /// Any other error reported by the database about the statement's data: a foreign key,
    /// check or not-null violation, a value out of range. The message's fault.
    Database,
    /// The database does not know what a statement names (a table, column, function,
    /// schema or database), or the SQL does not parse: a migration not run, a wrong
    /// `search_path`, a deploy that got ahead of its schema. Not the message's fault.
    Schema,
    /// Not allowed: authentication failed, a privilege is missing, the database is
    /// read-only. Not the message's fault.
    Permission,
    /// The server ran out of something or failed: disk full, out of memory, too many
    /// connections, a corrupted file. Not the message's fault.
    Resource,
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
    /// A contract broken inside justonce or a backend (a store answering N claims for M
    /// keys): a bug to report, never the message's fault.
    Internal,
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
            ErrorKind::Schema => false,
            ErrorKind::Permission => false,
            ErrorKind::Resource => true,
            ErrorKind::Decode => false,
            ErrorKind::InvalidInput => false,
            ErrorKind::Conflict => false,
            ErrorKind::Config => false,
            ErrorKind::Handler => true,
            ErrorKind::Internal => false,
        }
    }

    /// Whether the message itself caused the error, so that handling it again the same
    /// way fails again while other messages succeed.
    ///
    /// Only these errors may retry a message against its attempt limit or dead-letter it.
    /// Any other error from a handler, a store or a transport (an outage, a schema or
    /// privilege mistake, a bug) fails the whole batch instead: the batch is handed back
    /// without counting an attempt, and the consumer pauses and tries again.
    ///
    /// ```
    /// use justonce_core::ErrorKind;
    ///
    /// assert!(ErrorKind::Decode.is_message_fault()); // dead-lettered at once
    /// assert!(!ErrorKind::Schema.is_message_fault()); // a missing table pauses the consumer
    /// ```
    pub fn is_message_fault(self) -> bool {
        match self {
            ErrorKind::Connect => false,
            ErrorKind::Io => false,
            ErrorKind::Busy => false,
            ErrorKind::Timeout => false,
            ErrorKind::Closed => false,
            ErrorKind::UniqueViolation => true,
            ErrorKind::Database => true,
            ErrorKind::Schema => false,
            ErrorKind::Permission => false,
            ErrorKind::Resource => false,
            ErrorKind::Decode => true,
            ErrorKind::InvalidInput => true,
            ErrorKind::Conflict => true,
            ErrorKind::Config => false,
            ErrorKind::Handler => true,
            ErrorKind::Internal => false,
        }
    }

    /// What an operator should look at when a consumer pauses on this kind of error.
    pub fn advice(self) -> &'static str {
        match self {
            ErrorKind::Connect | ErrorKind::Io | ErrorKind::Closed | ErrorKind::Timeout => {
                "a service is unreachable or dropped the connection; the consumer retries"
            }
            ErrorKind::Busy => "lock contention (deadlock, serialization failure, lock timeout); the batch runs again",
            ErrorKind::Schema => {
                "the database lacks a table, column or function the code uses, or the SQL does \
                 not parse: run the migrations, check the database name and search_path; \
                 nothing is dead-lettered meanwhile"
            }
            ErrorKind::Permission => {
                "the database user lacks a privilege, cannot log in, or the database is \
                 read-only: grant it or point the consumer at the primary; nothing is \
                 dead-lettered meanwhile"
            }
            ErrorKind::Resource => {
                "the server is out of disk, memory or connections, or failed: free it; \
                 nothing is dead-lettered meanwhile"
            }
            ErrorKind::Config => "the configuration is wrong: the message says what to change",
            ErrorKind::Internal => "a bug in justonce or a backend: please report it",
            ErrorKind::UniqueViolation
            | ErrorKind::Database
            | ErrorKind::Decode
            | ErrorKind::InvalidInput
            | ErrorKind::Conflict
            | ErrorKind::Handler => "the message could not be handled",
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
            ErrorKind::Schema => "schema",
            ErrorKind::Permission => "permission",
            ErrorKind::Resource => "resource",
            ErrorKind::Decode => "decode",
            ErrorKind::InvalidInput => "invalid input",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Config => "config",
            ErrorKind::Handler => "handler",
            ErrorKind::Internal => "internal",
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
///
/// `{:?}` prints the message and its causes on one line, each said once, so that a `main`
/// returning [`Result`] ends with a readable line; `{:#?}` prints the fields.
#[derive(thiserror::Error)]
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

    /// The message followed by every cause, joined by `": "`, each said once: a cause whose
    /// text the line already holds (a wrapper that repeats its source) is left out.
    ///
    /// ```
    /// use justonce_core::{Error, ErrorKind};
    ///
    /// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    /// let e = Error::with_source(ErrorKind::Connect, "cannot connect to PostgreSQL at 127.0.0.1", io);
    /// assert_eq!(e.to_chain_string(), "cannot connect to PostgreSQL at 127.0.0.1: connection refused");
    /// ```
    pub fn to_chain_string(&self) -> String {
        error_chain(self)
    }
}

/// `e` and its causes on one line, joined by `": "`, each said once (see
/// [`Error::to_chain_string`]); for any error, such as the CLI's.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut last = s.clone();
    let mut cur = e.source();
    while let Some(e) = cur {
        let text = e.to_string();
        // Left out: a cause already said, or one that only wraps the last one in more words
        // ("error returned from database: relation … does not exist").
        let repeats =
            text.is_empty() || s.contains(&text) || (!last.is_empty() && text.contains(&last));
        if !repeats {
            s.push_str(": ");
            s.push_str(&text);
            last = text;
        }
        cur = e.source();
    }
    s
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            f.debug_struct("Error")
                .field("kind", &self.kind)
                .field("message", &self.message)
                .field("source", &self.source)
                .finish()
        } else {
            write!(f, "{} ({})", self.to_chain_string(), self.kind)
        }
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::with_source(ErrorKind::Decode, "payload is not the expected JSON", e)
    }
}
