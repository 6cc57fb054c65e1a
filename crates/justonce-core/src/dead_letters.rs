//! What the dead-letter tools (`justonce dlq`) work with on every transport: a dead letter
//! where it lies ([`DeadLetterEntry`]), the failure it belongs to ([`failure_group`]), and
//! the message a replay publishes ([`DeadLetter::replay_message`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::{DeadLetter, DeadLetterReason, Message, MessageId};

/// A dead letter as it lies in the transport, with the handle the tools take it by.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetterEntry {
    /// The transport's handle for it: a row number, a position in the dead-letter queue.
    /// Opaque; valid until the dead letters change.
    pub key: String,
    /// The message and its reason.
    pub letter: DeadLetter,
    /// When it was dead-lettered, where the transport records it.
    pub dead_lettered_at: Option<SystemTime>,
}

impl DeadLetterEntry {
    /// An entry.
    pub fn new(key: impl Into<String>, letter: DeadLetter, at: Option<SystemTime>) -> Self {
        DeadLetterEntry {
            key: key.into(),
            letter,
            dead_lettered_at: at,
        }
    }

    /// The failure this dead letter belongs to: [`failure_group`] of its reason.
    pub fn group(&self) -> FailureGroup {
        failure_group(&self.letter.reason.error)
    }
}

/// Dead letters that failed the same way: the reason with its ids and numbers taken out.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailureGroup {
    /// Eight hex digits of the SHA-256 of [`FailureGroup::pattern`]: what `--group` takes.
    pub id: String,
    /// The reason with every number written `#` and every quoted part `'…'`.
    pub pattern: String,
}

/// The failure group of a dead letter's error text. Numbers become `#` (in an id such as
/// `ORD-00042` its digits; a UUID or a hash whole), quoted parts become `'…'`, so "account 99999999 does not exist (order ORD-00042)" and "account 7
/// does not exist (order ORD-9)" are one group: `account # does not exist (order ORD-#)`.
///
/// ```
/// use justonce_core::failure_group;
///
/// let a = failure_group("account 99999999 does not exist (order ORD-00042)");
/// let b = failure_group("account 7 does not exist (order ORD-9)");
/// assert_eq!(a, b);
/// assert_eq!(a.pattern, "account # does not exist (order ORD-#)");
/// assert_ne!(a, failure_group("payload is not JSON: expected value at line 1"));
/// ```
pub fn failure_group(error: &str) -> FailureGroup {
    let mut pattern = String::with_capacity(error.len());
    let mut chars = error.chars().peekable();
    while let Some(c) = chars.next() {
        if matches!(c, '\'' | '"' | '`') {
            let quoted: String = chars.clone().take_while(|n| *n != c).collect();
            if chars.clone().nth(quoted.chars().count()) == Some(c) {
                chars.nth(quoted.chars().count());
                pattern.extend([c, '…', c]);
            } else {
                pattern.push(c); // unterminated: an apostrophe, kept with what follows
            }
        } else if is_word(c) {
            let mut word = String::from(c);
            while let Some(n) = chars.next_if(|n| is_word(*n)) {
                word.push(n);
            }
            push_word(&mut pattern, &word);
        } else {
            pattern.push(c);
        }
    }
    let digest = Sha256::digest(pattern.as_bytes());
    let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    FailureGroup { id, pattern }
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

/// A word of the reason: `#` if it is a number or made of hex digits and dashes with a
/// digit among them (a UUID, a hash); otherwise each run of digits in it becomes `#`.
fn push_word(pattern: &mut String, word: &str) {
    let has_digit = word.bytes().any(|b| b.is_ascii_digit());
    if has_digit && word.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') && word.len() >= 8 {
        pattern.push('#');
        return;
    }
    let mut in_number = false;
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                pattern.push('#');
            }
            in_number = true;
        } else {
            pattern.push(c);
            in_number = false;
        }
    }
}

/// How a replay publishes a dead letter again.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Replay {
    /// The queue to publish to; `None` for the queue it was dead-lettered from.
    pub to: Option<String>,
    /// Give each message a new id ([`DeadLetter::replay_message`] says which). Off by
    /// default: with its own id, a message that had in fact been applied is acked as a
    /// duplicate, never applied twice.
    pub new_id: bool,
    /// When the replay happens, recorded in the message.
    pub at: SystemTime,
}

impl Default for Replay {
    fn default() -> Self {
        Replay {
            to: None,
            new_id: false,
            at: SystemTime::now(),
        }
    }
}

impl Replay {
    /// A replay to the source queue, keeping the ids, stamped now.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`Replay::to`].
    #[must_use]
    pub fn to(mut self, queue: impl Into<String>) -> Self {
        self.to = Some(queue.into());
        self
    }

    /// Sets [`Replay::new_id`].
    #[must_use]
    pub fn new_id(mut self, new_id: bool) -> Self {
        self.new_id = new_id;
        self
    }
}

impl DeadLetter {
    /// Header: how many times the message has been replayed.
    pub const REPLAYS: &'static str = "x-justonce-replays";
    /// Header: when it was last replayed, in milliseconds since the Unix epoch.
    pub const REPLAYED_AT: &'static str = "x-justonce-replayed-at";
    /// Header: the error it was dead-lettered with before its last replay.
    pub const LAST_ERROR: &'static str = "x-justonce-last-error";
    /// Header: the id it had before a replay with [`Replay::new_id`].
    pub const REPLAYED_FROM: &'static str = "x-justonce-replayed-from";

    /// How many times this message has been replayed before.
    pub fn replays(&self) -> u32 {
        header_number(self, Self::REPLAYS).unwrap_or(0) as u32
    }

    /// When it was last replayed.
    pub fn replayed_at(&self) -> Option<SystemTime> {
        header_number(self, Self::REPLAYED_AT).map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// The message a replay publishes: the original with its reason headers taken off and
    /// its history written on ([`DeadLetter::REPLAYS`] one higher, [`DeadLetter::REPLAYED_AT`],
    /// [`DeadLetter::LAST_ERROR`]), so that if it fails again it comes back to the dead
    /// letters with that history.
    ///
    /// The id stays, unless [`Replay::new_id`]: then it is `{id}~replay{n}` (`n` the replay's
    /// number), or `replay{n}~{fingerprint}` for a message that had none, and the old id is
    /// kept in [`DeadLetter::REPLAYED_FROM`]. Both are derived, not drawn: a replay that is
    /// interrupted after its publish and run again publishes the same id, which the
    /// consumer's dedup catches.
    pub fn replay_message(&self, replay: &Replay) -> Message {
        let n = self.replays() + 1;
        let mut headers = self.message.headers().clone();
        for h in [
            DeadLetterReason::ERROR,
            DeadLetterReason::ATTEMPTS,
            DeadLetterReason::SOURCE_QUEUE,
            DeadLetterReason::CONSUMER,
        ] {
            headers.remove(h);
        }
        headers.insert(Self::REPLAYS.into(), n.to_string());
        let at = replay.at.duration_since(UNIX_EPOCH).unwrap_or_default();
        headers.insert(Self::REPLAYED_AT.into(), at.as_millis().to_string());
        headers.insert(Self::LAST_ERROR.into(), self.reason.error.clone());
        let mut id = self.message.id().cloned();
        if replay.new_id {
            let fresh = match &id {
                Some(old) => {
                    headers.insert(Self::REPLAYED_FROM.into(), old.as_str().to_owned());
                    format!("{old}~replay{n}")
                }
                None => format!("replay{n}~{}", self.message.fingerprint().to_hex()),
            };
            id = MessageId::new(fresh).ok();
        }
        self.message
            .clone()
            .with_headers(headers)
            .with_message_id(id)
    }
}

fn header_number(letter: &DeadLetter, name: &str) -> Option<u64> {
    letter.message.headers().get(name)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(id: Option<&str>, error: &str) -> DeadLetter {
        let m = Message::new("{}").with_message_id(id.map(|i| MessageId::new(i).unwrap()));
        DeadLetter::new(
            m,
            DeadLetterReason {
                error: error.into(),
                attempts: 3,
                source_queue: "orders".into(),
                consumer: "payments".into(),
            },
        )
    }

    #[test]
    fn ids_numbers_and_quotes_leave_the_group() {
        let cases = [
            (
                "attempt 3 of 5 failed: 'ORD-1' timed out",
                "attempt # of # failed: '…' timed out",
            ),
            (
                "no row 550e8400-e29b-41d4-a716-446655440000 in accounts",
                "no row # in accounts",
            ),
            ("hash deadbeef00112233 differs", "hash # differs"),
            ("a face of cafe", "a face of cafe"),
            ("unterminated \"quote", "unterminated \"quote"),
        ];
        for (error, pattern) in cases {
            assert_eq!(failure_group(error).pattern, pattern, "{error}");
        }
        assert_eq!(failure_group("x 1").id.len(), 8);
    }

    #[test]
    fn a_replay_keeps_the_id_and_writes_the_history() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let first = letter(Some("ORD-1"), "account 9 does not exist");
        let m = first.replay_message(&Replay {
            at,
            ..Replay::new()
        });
        assert_eq!(m.id().unwrap().as_str(), "ORD-1");
        assert!(m.headers().get(DeadLetterReason::ERROR).is_none());
        assert_eq!(m.headers()[DeadLetter::REPLAYS], "1");
        assert_eq!(
            m.headers()[DeadLetter::LAST_ERROR],
            "account 9 does not exist"
        );
        // It fails again: the second dead letter carries the first replay.
        let again = DeadLetter::new(m, first.reason);
        assert_eq!(again.replays(), 1);
        assert_eq!(again.replayed_at(), Some(at));
        assert_eq!(
            again.replay_message(&Replay::new()).headers()[DeadLetter::REPLAYS],
            "2"
        );
    }

    #[test]
    fn a_new_id_is_derived_so_a_rerun_replay_makes_the_same_one() {
        let l = letter(Some("ORD-1"), "boom");
        let r = Replay::new().new_id(true);
        let m = l.replay_message(&r);
        assert_eq!(m.id().unwrap().as_str(), "ORD-1~replay1");
        assert_eq!(m.headers()[DeadLetter::REPLAYED_FROM], "ORD-1");
        assert_eq!(l.replay_message(&r).id(), m.id());
        let none = letter(None, "missing id");
        assert!(none.replay_message(&Replay::new()).id().is_none());
        assert!(none
            .replay_message(&r)
            .id()
            .unwrap()
            .as_str()
            .starts_with("replay1~"));
    }
}
