//! State machines as an idempotency guard: a transition to a state the entity is already in
//! (or already past) is a duplicate.

use std::fmt;

use crate::{Disposition, Error, Result};

/// A declared transition table, such as `PENDING -> PAID -> SHIPPED`.
///
/// ```
/// use justonce_core::{StateMachine, Transition};
///
/// let orders = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED"), ("PENDING", "CANCELLED")])?;
/// assert_eq!(orders.decide("PENDING", "PAID"), Transition::Apply);
/// assert_eq!(orders.decide("PAID", "PAID"), Transition::AlreadyDone);
/// assert_eq!(orders.decide("SHIPPED", "PAID"), Transition::AlreadyDone, "SHIPPED is past PAID");
/// assert!(matches!(orders.decide("CANCELLED", "PAID"), Transition::Invalid { .. }));
/// # Ok::<(), justonce_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMachine {
    edges: Vec<(String, String)>,
}

/// What a requested transition means for an entity in some state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The transition is allowed: apply it.
    Apply,
    /// The entity is already in the target state, or in a state reachable from it: a duplicate.
    AlreadyDone,
    /// The transition is not allowed from the current state: a permanent error.
    Invalid {
        /// The entity's state.
        from: String,
        /// The requested state.
        to: String,
        /// The states from which `to` may be reached.
        allowed_from: Vec<String>,
    },
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transition::Apply => f.write_str("apply"),
            Transition::AlreadyDone => f.write_str("already done"),
            Transition::Invalid {
                from,
                to,
                allowed_from,
            } => write!(
                f,
                "invalid transition {from} -> {to}: {to} may only be reached from {}",
                if allowed_from.is_empty() {
                    "nowhere".to_owned()
                } else {
                    allowed_from.join(", ")
                }
            ),
        }
    }
}

impl Transition {
    /// What a guard's answer means for the message: `None` to go on with the effect,
    /// `Duplicate` when already done, `DeadLetter` (with the states) when not allowed.
    pub fn to_disposition(&self) -> Option<Disposition> {
        match self {
            Transition::Apply => None,
            Transition::AlreadyDone => Some(Disposition::Duplicate),
            Transition::Invalid { .. } => Some(Disposition::dead_letter(self.to_string())),
        }
    }
}

/// The answer of a version check (compare-and-set): `UPDATE … SET version = version + 1
/// WHERE id = ? AND version = ?`, decided by its affected rows and the current version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cas {
    /// The version matched and was bumped: apply the effect.
    Applied,
    /// The entity is already past the expected version: this change was applied before.
    Stale {
        /// The entity's version.
        current: i64,
    },
    /// The entity is behind the expected version: an earlier change has not been applied
    /// yet. Retry later; never treat it as a duplicate.
    Ahead {
        /// The entity's version.
        current: i64,
    },
}

impl Cas {
    /// Decides from the current version when the conditional update changed nothing.
    pub fn decide(current: i64, expected: i64) -> Self {
        if current > expected {
            Cas::Stale { current }
        } else if current < expected {
            Cas::Ahead { current }
        } else {
            Cas::Applied
        }
    }

    /// `None` to go on with the effect, `Duplicate` when stale, `Retry` when ahead.
    pub fn to_disposition(&self, expected: i64) -> Option<Disposition> {
        match self {
            Cas::Applied => None,
            Cas::Stale { .. } => Some(Disposition::Duplicate),
            Cas::Ahead { current } => Some(Disposition::retry(format!(
                "version {current} is behind the expected {expected}: an earlier change has not been applied yet"
            ))),
        }
    }
}

impl StateMachine {
    /// A machine with these `(from, to)` edges. Fails on an empty table, a self-loop or
    /// a cycle (a cycle would make "already past" ambiguous).
    pub fn new<S: Into<String>>(edges: impl IntoIterator<Item = (S, S)>) -> Result<Self> {
        let edges: Vec<(String, String)> = edges
            .into_iter()
            .map(|(a, b)| (a.into(), b.into()))
            .collect();
        if edges.is_empty() {
            return Err(Error::config(
                "a state machine needs at least one transition",
            ));
        }
        let m = StateMachine { edges };
        for (from, to) in &m.edges {
            if from == to || m.reachable(to, from) {
                return Err(Error::config(format!(
                    "the transition {from} -> {to} closes a cycle: a state machine guard needs an acyclic table"
                )));
            }
        }
        Ok(m)
    }

    /// The states a transition to `to` may start from.
    pub fn sources_of(&self, to: &str) -> Vec<&str> {
        self.edges
            .iter()
            .filter(|(_, b)| b == to)
            .map(|(a, _)| a.as_str())
            .collect()
    }

    /// Whether `to` can be reached from `from` in one or more steps.
    pub fn reachable(&self, from: &str, to: &str) -> bool {
        let mut seen = vec![from];
        let mut i = 0;
        while i < seen.len() {
            let cur = seen[i];
            for (a, b) in &self.edges {
                if a == cur && !seen.contains(&b.as_str()) {
                    if b == to {
                        return true;
                    }
                    seen.push(b);
                }
            }
            i += 1;
        }
        false
    }

    /// What a request to move an entity in `current` to `target` means.
    pub fn decide(&self, current: &str, target: &str) -> Transition {
        if self.edges.iter().any(|(a, b)| a == current && b == target) {
            Transition::Apply
        } else if current == target || self.reachable(target, current) {
            Transition::AlreadyDone
        } else {
            Transition::Invalid {
                from: current.to_owned(),
                to: target.to_owned(),
                allowed_from: self
                    .sources_of(target)
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            }
        }
    }
}
