//! Delivery semantics, handler outcomes and dead-letter reasons.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Error, ErrorKind, Headers};

/// When a consumer acknowledges a delivery, relative to its effect.
///
/// | semantics | order | a crash can | use it for |
/// |---|---|---|---|
/// | at-most-once | ack, then handle | lose the message | metrics you can afford to drop |
/// | at-least-once | handle, commit, then ack | apply it twice | effects that are idempotent by themselves |
/// | effectively-once | dedup record + effect in one transaction, commit, then ack | neither | everything else |
///
/// ```
/// use justonce_core::Semantics;
///
/// let s: Semantics = "effectively-once".parse().unwrap();
/// assert_eq!(s, Semantics::EffectivelyOnce);
/// assert_eq!(s.to_string(), "effectively-once");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Semantics {
    /// Ack before handling: never a duplicate from the consumer, but a crash loses.
    AtMostOnce,
    /// Ack after the handler's transaction commits: never lost, but a crash duplicates.
    AtLeastOnce,
    /// At-least-once plus a dedup record written in the handler's transaction.
    EffectivelyOnce,
}

impl Semantics {
    /// All three, in the order the demo shows them.
    pub const ALL: [Semantics; 3] = [
        Semantics::AtMostOnce,
        Semantics::AtLeastOnce,
        Semantics::EffectivelyOnce,
    ];

    /// The kebab-case name used by the CLI and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Semantics::AtMostOnce => "at-most-once",
            Semantics::AtLeastOnce => "at-least-once",
            Semantics::EffectivelyOnce => "effectively-once",
        }
    }
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Semantics {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Semantics::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                Error::config(format!(
                    "unknown semantics `{s}`: use at-most-once, at-least-once or effectively-once"
                ))
            })
    }
}

/// What the handler decided about one message. A value, never guessed from an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// The effect was applied: commit and ack.
    Ok,
    /// The effect was applied before: roll back this message's writes and ack.
    Duplicate,
    /// A transient failure: roll back this message's writes and deliver it again,
    /// after `after` or the retry policy's backoff. Dead-lettered once the attempts run out.
    Retry {
        /// How long to wait before the next delivery; `None` uses the backoff.
        after: Option<Duration>,
        /// Why, kept for the dead-letter reason if the attempts run out.
        reason: String,
    },
    /// A permanent failure: roll back this message's writes and dead-letter it.
    DeadLetter {
        /// Why, stored with the dead letter.
        reason: String,
    },
}

impl Disposition {
    /// `Retry` with the policy's backoff.
    pub fn retry(reason: impl Into<String>) -> Self {
        Disposition::Retry {
            after: None,
            reason: reason.into(),
        }
    }

    /// `Retry` after a fixed delay.
    pub fn retry_after(after: Duration, reason: impl Into<String>) -> Self {
        Disposition::Retry {
            after: Some(after),
            reason: reason.into(),
        }
    }

    /// `DeadLetter` with a reason.
    pub fn dead_letter(reason: impl Into<String>) -> Self {
        Disposition::DeadLetter {
            reason: reason.into(),
        }
    }

    /// The disposition an error stands for: transient errors and errors that are not the
    /// message's fault ([`ErrorKind::is_message_fault`]) retry, the rest dead-letter. (The
    /// runtime never gets here for an error that is not the message's: a handler returning
    /// one as `Err` fails the whole batch, which is handed back without counting an attempt.)
    ///
    /// ```
    /// use justonce_core::{Disposition, Error, ErrorKind};
    ///
    /// let busy = Error::new(ErrorKind::Busy, "database is locked");
    /// assert!(matches!(Disposition::from_error(&busy), Disposition::Retry { .. }));
    /// let bad = Error::new(ErrorKind::Decode, "not JSON");
    /// assert!(matches!(Disposition::from_error(&bad), Disposition::DeadLetter { .. }));
    /// ```
    pub fn from_error(e: &Error) -> Self {
        let reason = format!("{}: {}", e.kind(), e.to_chain_string());
        if e.kind().is_transient() || !e.kind().is_message_fault() {
            Disposition::retry(reason)
        } else {
            Disposition::dead_letter(reason)
        }
    }
}

/// Why a message was dead-lettered, stored with it as headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterReason {
    /// The error, for people.
    pub error: String,
    /// How many deliveries the message had.
    pub attempts: u32,
    /// The queue it came from.
    pub source_queue: String,
    /// The consumer that gave up on it.
    pub consumer: String,
}

impl DeadLetterReason {
    /// Header carrying [`DeadLetterReason::error`].
    pub const ERROR: &'static str = "x-justonce-error";
    /// Header carrying [`DeadLetterReason::attempts`].
    pub const ATTEMPTS: &'static str = "x-justonce-attempts";
    /// Header carrying [`DeadLetterReason::source_queue`].
    pub const SOURCE_QUEUE: &'static str = "x-justonce-source-queue";
    /// Header carrying [`DeadLetterReason::consumer`].
    pub const CONSUMER: &'static str = "x-justonce-consumer";

    /// The reason as headers, to add to the dead-lettered message.
    pub fn to_headers(&self) -> Headers {
        let mut h = Headers::new();
        h.insert(Self::ERROR.into(), self.error.clone());
        h.insert(Self::ATTEMPTS.into(), self.attempts.to_string());
        h.insert(Self::SOURCE_QUEUE.into(), self.source_queue.clone());
        h.insert(Self::CONSUMER.into(), self.consumer.clone());
        h
    }

    /// Reads a reason back from headers written by [`DeadLetterReason::to_headers`].
    pub fn from_headers(h: &Headers) -> Option<Self> {
        Some(DeadLetterReason {
            error: h.get(Self::ERROR)?.clone(),
            attempts: h.get(Self::ATTEMPTS)?.parse().ok()?,
            source_queue: h.get(Self::SOURCE_QUEUE)?.clone(),
            consumer: h.get(Self::CONSUMER)?.clone(),
        })
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (attempts {}, queue {}, consumer {})",
            self.error, self.attempts, self.source_queue, self.consumer
        )
    }
}

/// Parses a consumer name: non-empty, at most 100 bytes, `[A-Za-z0-9._:-]`.
pub fn validate_consumer_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "consumer name `{name}` is invalid: use 1-100 characters of A-Z a-z 0-9 . _ : -"
            ),
        ))
    }
}
