//! The breaker (MassTransit's kill switch): the backstop for failures the error
//! classification does not catch.
//!
//! A deploy mistake that surfaces as an error the runtime takes for the message's own (a
//! column a new version of the handler expects, an error text no SQLSTATE classifies)
//! fails every message the same way. Dead-lettering them would empty the queue. The
//! breaker watches what the consumer settles; when the last `threshold` messages within
//! `window` all failed for the same reason, it opens: messages failing for that reason are
//! handed back without counting an attempt instead of being retried or dead-lettered, and
//! the consumer pauses with backoff. Each batch after a pause is a probe: one message that
//! succeeds closes the breaker.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// When the breaker opens. On by default: 20 messages in a row failing for the same
/// reason within 60 s.
///
/// ```
/// use std::time::Duration;
/// use justonce::{BreakerOptions, ConsumerOptions};
///
/// let o = ConsumerOptions::new("billing")
///     .breaker(BreakerOptions::default().threshold(50).window(Duration::from_secs(30)));
/// assert!(o.breaker.enabled);
/// let o = o.breaker(BreakerOptions::disabled()); // every failure settles as decided
/// # let _ = o;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerOptions {
    /// Whether the breaker watches at all.
    pub enabled: bool,
    /// Messages in a row that must fail for the same reason.
    pub threshold: usize,
    /// The time those failures must fall within.
    pub window: Duration,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        BreakerOptions {
            enabled: true,
            threshold: 20,
            window: Duration::from_secs(60),
        }
    }
}

impl BreakerOptions {
    /// A breaker that never opens.
    pub fn disabled() -> Self {
        BreakerOptions {
            enabled: false,
            ..BreakerOptions::default()
        }
    }

    /// Sets [`BreakerOptions::threshold`] (at least 1).
    pub fn threshold(mut self, threshold: usize) -> Self {
        self.threshold = threshold.max(1);
        self
    }

    /// Sets [`BreakerOptions::window`].
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }
}

/// How one settled message counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome<'a> {
    /// Applied, or a duplicate of an applied one.
    Success,
    /// Retried or dead-lettered for this reason.
    Failure(&'a str),
}

/// What the breaker has seen.
#[derive(Debug)]
pub(crate) struct Breaker {
    opts: BreakerOptions,
    /// The last `threshold` outcomes: when, and the failure's reason key (`None` for a success).
    recent: VecDeque<(Instant, Option<String>)>,
    /// The reason key it is open for.
    open: Option<String>,
}

/// What a batch's outcomes did to the breaker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    None,
    /// It opened for this reason key.
    Opened(String),
    /// A success closed it.
    Closed,
}

impl Breaker {
    pub(crate) fn new(opts: BreakerOptions) -> Self {
        Breaker {
            opts,
            recent: VecDeque::new(),
            open: None,
        }
    }

    /// Records a batch's outcomes in order, and says what changed.
    pub(crate) fn record<'a>(
        &mut self,
        now: Instant,
        outcomes: impl IntoIterator<Item = Outcome<'a>>,
    ) -> Change {
        if !self.opts.enabled {
            return Change::None;
        }
        let was_open = self.open.is_some();
        for outcome in outcomes {
            let key = match outcome {
                Outcome::Success => None,
                Outcome::Failure(reason) => Some(reason_key(reason)),
            };
            if key.is_none() {
                self.open = None;
            }
            self.recent.push_back((now, key));
            while self.recent.len() > self.opts.threshold {
                self.recent.pop_front();
            }
            if self.open.is_none() && self.tripped(now) {
                self.open = self.recent.back().and_then(|(_, k)| k.clone());
            }
        }
        match (&self.open, was_open) {
            (Some(key), false) => Change::Opened(key.clone()),
            (None, true) => Change::Closed,
            _ => Change::None,
        }
    }

    /// Whether a failure with `reason` is to be handed back instead of settled.
    pub(crate) fn holds(&self, reason: &str) -> bool {
        self.open.as_deref() == Some(reason_key(reason).as_str())
    }

    fn tripped(&self, now: Instant) -> bool {
        if self.recent.len() < self.opts.threshold {
            return false;
        }
        let Some((oldest, Some(first))) = self.recent.front() else {
            return false;
        };
        now.duration_since(*oldest) <= self.opts.window
            && self
                .recent
                .iter()
                .all(|(_, k)| k.as_deref() == Some(first.as_str()))
    }
}

/// What makes two failures "the same reason": the text with every run of digits taken as
/// one (ids, counts, columns and line numbers differ from message to message).
pub(crate) fn reason_key(reason: &str) -> String {
    let mut key = String::with_capacity(reason.len().min(256));
    let mut in_digits = false;
    for c in reason.chars().take(256) {
        if c.is_ascii_digit() {
            if !in_digits {
                key.push('#');
            }
            in_digits = true;
        } else {
            key.push(c);
            in_digits = false;
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(threshold: usize) -> Breaker {
        Breaker::new(BreakerOptions::default().threshold(threshold))
    }

    #[test]
    fn opens_after_threshold_failures_of_one_reason_and_a_success_closes_it() {
        let now = Instant::now();
        let mut b = breaker(3);
        let f = |id: &str| format!("database: relation \"pay{id}\" is odd at line {id}");
        assert_eq!(
            b.record(now, [Outcome::Failure("x 1"), Outcome::Failure("x 2")]),
            Change::None
        );
        assert!(!b.holds("x 3"));
        assert_eq!(
            b.record(now, [Outcome::Failure("x 3")]),
            Change::Opened("x #".into())
        );
        assert!(b.holds("x 99"), "digits do not make another reason");
        assert!(!b.holds("y 1"), "another reason settles as decided");
        assert_eq!(b.record(now, [Outcome::Failure("x 4")]), Change::None);
        assert_eq!(b.record(now, [Outcome::Success]), Change::Closed);
        assert!(!b.holds("x 5"));
        assert_eq!(reason_key(&f("12")), reason_key(&f("7")));
    }

    #[test]
    fn mixed_reasons_successes_and_slow_failures_do_not_open_it() {
        let now = Instant::now();
        let mut b = breaker(3);
        let mixed = [
            Outcome::Failure("a"),
            Outcome::Failure("b"),
            Outcome::Failure("a"),
        ];
        assert_eq!(b.record(now, mixed), Change::None);
        let broken = [
            Outcome::Failure("a"),
            Outcome::Success,
            Outcome::Failure("a"),
        ];
        assert_eq!(b.record(now, broken), Change::None);

        let mut slow = Breaker::new(
            BreakerOptions::default()
                .threshold(2)
                .window(Duration::from_secs(1)),
        );
        slow.record(now, [Outcome::Failure("a")]);
        let later = now + Duration::from_secs(5);
        assert_eq!(
            slow.record(later, [Outcome::Failure("a")]),
            Change::None,
            "outside the window"
        );

        let mut off = Breaker::new(BreakerOptions::disabled());
        assert_eq!(off.record(now, [Outcome::Failure("a"); 100]), Change::None);
        assert!(!off.holds("a"));
    }

    #[test]
    fn a_batch_that_trips_it_holds_all_of_its_failures_of_that_reason() {
        let now = Instant::now();
        let mut b = breaker(20);
        let batch: Vec<Outcome<'_>> = (0..50)
            .map(|_| Outcome::Failure("no such table: accounts"))
            .collect();
        assert!(matches!(b.record(now, batch), Change::Opened(_)));
        assert!(b.holds("no such table: accounts"));
    }
}
