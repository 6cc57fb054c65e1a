//! What the consumer would do with a delivery, given what its store holds for the key:
//! `justonce dedup explain`. Pure, next to the decisions it reports (`decide.rs`): a
//! conflict goes through the same [`ConflictPolicy`] the consumer applies, and the test
//! `explain_says_what_the_consumer_does` (tests/it/sqlite.rs) runs a consumer on each case.

use std::fmt;

use justonce_core::{
    ClaimRecord, ClaimRecordState, DedupRecord, Disposition, Fingerprint, MessageId,
};

use super::{decide, ConflictPolicy};

/// What a delivery would come to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The handler runs, and the key is recorded (or its claim taken) with its effects.
    Applied,
    /// Acked without running the handler.
    Duplicate,
    /// Dead-lettered: the id was used before with another payload.
    Conflict,
    /// Handed back for later: another delivery holds the key's claim.
    Retry,
}

impl Outcome {
    /// The outcome's name in `dedup explain --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Conflict => "conflict",
            Outcome::Retry => "retry",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An [`Outcome`] and why, in a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// What the delivery would come to.
    pub outcome: Outcome,
    /// Why, from the record or the claim.
    pub why: String,
}

fn says(outcome: Outcome, why: impl Into<String>) -> Explanation {
    Explanation {
        outcome,
        why: why.into(),
    }
}

/// What a delivery of message `id` whose payload has fingerprint `fingerprint` would come
/// to, given the key's dedup record and its claim (a consumer in claim mode reads only the
/// claim), under the consumer's conflict policy. Bad input (no id, an oversized payload)
/// is dead-lettered before the store is asked, so it is not this function's question.
pub fn explain(
    id: &MessageId,
    record: Option<&DedupRecord>,
    claim: Option<&ClaimRecord>,
    fingerprint: Fingerprint,
    on_conflict: ConflictPolicy,
) -> Explanation {
    let conflict =
        |stored: Fingerprint| match decide::conflict(on_conflict, id, stored, fingerprint) {
            Disposition::Duplicate => says(
                Outcome::Duplicate,
                format!(
                    "recorded with another payload (fingerprint {stored}, this one {fingerprint}), \
                     which the consumer's on_conflict (Ignore) acks as a duplicate"
                ),
            ),
            Disposition::DeadLetter { reason } => says(
                Outcome::Conflict,
                format!("dead-lettered as a conflict: {reason}"),
            ),
            other => says(Outcome::Conflict, format!("{other:?}")),
        };
    // As every claim store decides (`claims::decide` in justonce-sql, `claim_acquire.lua`):
    // a claim held under a live lease is waited for whatever its payload; a free or lapsed
    // one is taken over; only a completed one is compared with this payload.
    if let Some(c) = claim {
        return match &c.state {
            ClaimRecordState::Completed { .. } if c.fingerprint != fingerprint => {
                conflict(c.fingerprint)
            }
            ClaimRecordState::Completed { .. } => says(
                Outcome::Duplicate,
                "the claim is completed: acked as a duplicate, its stored result returned",
            ),
            ClaimRecordState::InProgress { lease_left } if !lease_left.is_zero() => says(
                Outcome::Retry,
                format!(
                    "another delivery holds the claim for {:.1} s more: this one is retried after it",
                    lease_left.as_secs_f64()
                ),
            ),
            _ => says(
                Outcome::Applied,
                format!(
                    "the claim is free: taken over with a fence above {}, and applied",
                    c.token
                ),
            ),
        };
    }
    match record {
        None => says(
            Outcome::Applied,
            "no dedup record for this consumer and id: applied, and recorded in the same transaction",
        ),
        Some(r) if r.fingerprint == fingerprint => says(
            Outcome::Duplicate,
            "recorded with this payload: acked as a duplicate, no effect",
        ),
        Some(r) => conflict(r.fingerprint),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_explanation_follows_the_record_the_claim_and_the_policy() {
        let id = MessageId::new("m1").unwrap();
        let fp = Fingerprint::of(b"a");
        let other = Fingerprint::of(b"b");
        let record = DedupRecord::new(fp, None);
        let claim = |state| ClaimRecord::new(fp, state, 3, None);
        let held = claim(ClaimRecordState::InProgress {
            lease_left: Duration::from_secs(5),
        });
        let ran_out = claim(ClaimRecordState::InProgress {
            lease_left: Duration::ZERO,
        });
        let done = claim(ClaimRecordState::Completed { at: None });
        let dl = ConflictPolicy::DeadLetter;
        type Case<'a> = (
            Option<&'a DedupRecord>,
            Option<&'a ClaimRecord>,
            Fingerprint,
            ConflictPolicy,
            Outcome,
        );
        let cases: [Case<'_>; 10] = [
            (None, None, fp, dl, Outcome::Applied),
            (Some(&record), None, fp, dl, Outcome::Duplicate),
            (Some(&record), None, other, dl, Outcome::Conflict),
            (
                Some(&record),
                None,
                other,
                ConflictPolicy::Ignore,
                Outcome::Duplicate,
            ),
            (None, Some(&held), fp, dl, Outcome::Retry),
            // Held: waited for, whatever the payload (compared once it completes).
            (None, Some(&held), other, dl, Outcome::Retry),
            (None, Some(&ran_out), fp, dl, Outcome::Applied),
            (None, Some(&done), fp, dl, Outcome::Duplicate),
            (None, Some(&done), other, dl, Outcome::Conflict),
            // Claim mode reads the claim, not a record.
            (Some(&record), Some(&done), fp, dl, Outcome::Duplicate),
        ];
        for (i, (r, c, f, p, want)) in cases.into_iter().enumerate() {
            let got = explain(&id, r, c, f, p);
            assert_eq!(got.outcome, want, "case {i}: {}", got.why);
        }
        let e = explain(&id, None, Some(&ran_out), fp, dl);
        assert!(e.why.contains("fence above 3"), "{}", e.why);
        let e = explain(&id, Some(&record), None, other, dl);
        assert!(
            e.why.contains("m1") && e.why.contains(&other.to_string()),
            "{}",
            e.why
        );
    }
}
