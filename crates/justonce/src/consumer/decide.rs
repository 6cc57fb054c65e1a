//! The pure decisions of a batch: what bad input becomes, what a handler's answer settles
//! as (the attempt limit, at-most-once's losses), a conflict's disposition, a dead letter's
//! reason. No store and no transport: the tests below are tables.

use justonce_core::{
    DeadLetterReason, DedupStore, Delivery, Disposition, ExponentialBackoff, Fingerprint,
    MessageId, Semantics,
};
use tracing::warn;

use super::{ConflictPolicy, ConsumerOptions, Fate, Handler, Inner, Settle, Slot};

/// Bad input is settled before the handler ever sees it; the id is derived here.
pub(super) fn screen(opts: &ConsumerOptions, d: &Delivery) -> Slot {
    let dead = |reason: String| Slot {
        settle: Settle::DeadLetter(reason.clone()),
        id: None,
        token: None,
        failure: Some(reason),
        conflict: false,
    };
    let len = d.message.payload().len();
    if len > opts.max_payload_bytes {
        return dead(format!(
            "invalid input: payload of {len} bytes exceeds the limit of {} bytes",
            opts.max_payload_bytes
        ));
    }
    match opts.dedup.id_strategy.derive(&d.message) {
        Ok(Some(id)) => Slot {
            settle: Settle::Pending,
            id: Some(id),
            token: None,
            failure: None,
            conflict: false,
        },
        Ok(None) => dead(format!(
            "invalid input: message has no id (missing or empty under the {} id strategy); \
             it cannot be deduplicated",
            opts.dedup.id_strategy.describe()
        )),
        Err(e) => dead(format!("invalid input: {}", e.to_chain_string())),
    }
}

/// Settles a handled delivery as `disposition` says, noting a failure's reason for the
/// breaker.
pub(super) fn decide(
    opts: &ConsumerOptions,
    backoff: &ExponentialBackoff,
    slot: &mut Slot,
    d: &Delivery,
    disposition: Disposition,
) {
    slot.failure = match &disposition {
        Disposition::Retry { reason, .. } | Disposition::DeadLetter { reason } => {
            Some(reason.clone())
        }
        Disposition::Ok | Disposition::Duplicate => None,
    };
    slot.settle = settle_after(opts, backoff, d, disposition);
}

/// The settlement of a handled delivery. At-most-once acked it before it ran: a retry is
/// then a loss, said in the log.
fn settle_after(
    opts: &ConsumerOptions,
    backoff: &ExponentialBackoff,
    d: &Delivery,
    disposition: Disposition,
) -> Settle {
    if opts.semantics != Semantics::AtMostOnce {
        return settle_for(opts, backoff, d, disposition);
    }
    match disposition {
        Disposition::DeadLetter { reason } => Settle::DeadLetter(reason),
        Disposition::Retry { reason, .. } => {
            warn!(consumer = %opts.name, %reason, "at-most-once: message acked before it failed; it is lost");
            Settle::Done(Fate::Lost)
        }
        Disposition::Duplicate => Settle::Done(Fate::Duplicate),
        Disposition::Ok => Settle::Done(Fate::Applied),
    }
}

/// The settlement of a delivery not yet acked, with the attempt limit applied.
fn settle_for(
    opts: &ConsumerOptions,
    backoff: &ExponentialBackoff,
    d: &Delivery,
    disposition: Disposition,
) -> Settle {
    match disposition {
        Disposition::Ok => Settle::Ack { duplicate: false },
        Disposition::Duplicate => Settle::Ack { duplicate: true },
        Disposition::DeadLetter { reason } => Settle::DeadLetter(reason),
        Disposition::Retry { after, reason } => {
            if d.attempt >= opts.retry.max_attempts {
                Settle::DeadLetter(format!(
                    "gave up after {} attempts (max_attempts {}): {reason}",
                    d.attempt, opts.retry.max_attempts
                ))
            } else {
                Settle::Nack(after.unwrap_or_else(|| backoff.delay(d.attempt)))
            }
        }
    }
}

/// What a message id seen before with another payload becomes.
pub(super) fn conflict(
    policy: ConflictPolicy,
    id: &MessageId,
    stored: Fingerprint,
    fp: Fingerprint,
) -> Disposition {
    match policy {
        ConflictPolicy::Ignore => Disposition::Duplicate,
        ConflictPolicy::DeadLetter => Disposition::dead_letter(format!(
            "conflict: message id {id} was already processed with another payload \
             (stored fingerprint {stored}, this one {fp})"
        )),
    }
}

/// The reason a dead letter carries.
pub(super) fn reason(
    opts: &ConsumerOptions,
    queue: &str,
    d: &Delivery,
    error: String,
) -> DeadLetterReason {
    DeadLetterReason {
        error,
        attempts: d.attempt,
        source_queue: queue.to_owned(),
        consumer: opts.name.clone(),
    }
}

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// [`decide`] under this consumer's options.
    pub(super) fn decide(&self, slot: &mut Slot, d: &Delivery, disposition: Disposition) {
        decide(&self.opts, &self.backoff, slot, d, disposition);
    }

    /// [`conflict`] under this consumer's policy.
    pub(super) fn conflict(
        &self,
        id: &MessageId,
        stored: Fingerprint,
        fp: Fingerprint,
    ) -> Disposition {
        conflict(self.opts.dedup.on_conflict, id, stored, fp)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use justonce_core::{IdStrategy, Message, Receipt};

    use super::super::RetryOptions;
    use super::*;

    fn delivery(message: Message, attempt: u32) -> Delivery {
        Delivery {
            message,
            attempt,
            redelivered: attempt > 1,
            receipt: Receipt::new(()),
        }
    }

    fn with_id(id: &str) -> Message {
        Message::new("{}").with_id(id).unwrap()
    }

    fn backoff() -> ExponentialBackoff {
        ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(30))
    }

    #[test]
    fn screening_dead_letters_bad_input_with_its_reason() {
        let opts = ConsumerOptions::new("c").max_payload_bytes(10);
        let field = ConsumerOptions::new("c").id_strategy(IdStrategy::field("/order"));
        let cases: [(&ConsumerOptions, Message, Option<&str>); 5] = [
            (&opts, with_id("m1"), None),
            (&opts, Message::new("{}"), Some("message has no id")),
            (
                &opts,
                Message::new("x".repeat(11)).with_id("m2").unwrap(),
                Some("payload of 11 bytes exceeds the limit of 10 bytes"),
            ),
            (&field, Message::new(r#"{"order":"A-1"}"#), None),
            (&field, Message::new("not json"), Some("invalid input:")),
        ];
        for (opts, message, dead) in cases {
            let slot = screen(opts, &delivery(message, 1));
            match (dead, &slot.settle) {
                (None, Settle::Pending) => assert!(slot.id.is_some()),
                (Some(want), Settle::DeadLetter(reason)) => {
                    assert!(reason.contains(want), "{reason:?} should say {want:?}");
                    assert_eq!(
                        slot.failure.as_deref(),
                        Some(reason.as_str()),
                        "the breaker sees why"
                    );
                }
                (want, got) => panic!("wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn answers_settle_with_the_attempt_limit_applied() {
        let opts = ConsumerOptions::new("c").retry(RetryOptions::default().max_attempts(3));
        let retry = |after| Disposition::Retry {
            after,
            reason: "busy".into(),
        };
        let second = Duration::from_secs(1);
        let cases = [
            (Disposition::Ok, 1, Settle::Ack { duplicate: false }, None),
            (
                Disposition::Duplicate,
                1,
                Settle::Ack { duplicate: true },
                None,
            ),
            (
                Disposition::dead_letter("bad"),
                1,
                Settle::DeadLetter("bad".into()),
                Some("bad"),
            ),
            (retry(Some(second)), 2, Settle::Nack(second), Some("busy")),
            (
                retry(Some(second)),
                3,
                Settle::DeadLetter("gave up after 3 attempts (max_attempts 3): busy".into()),
                Some("busy"),
            ),
        ];
        for (disposition, attempt, want, failure) in cases {
            let d = delivery(with_id("m"), attempt);
            let mut slot = screen(&opts, &d);
            decide(&opts, &backoff(), &mut slot, &d, disposition);
            assert_eq!(slot.settle, want, "attempt {attempt}");
            assert_eq!(slot.failure.as_deref(), failure);
        }
        // A retry with no delay of its own waits out the backoff: at most its ceiling.
        let d = delivery(with_id("m"), 1);
        let mut slot = screen(&opts, &d);
        decide(&opts, &backoff(), &mut slot, &d, retry(None));
        assert!(
            matches!(slot.settle, Settle::Nack(delay) if delay <= Duration::from_millis(200)),
            "{:?}",
            slot.settle
        );
    }

    #[test]
    fn at_most_once_settles_nothing_but_dead_letters() {
        let opts = ConsumerOptions::new("c").semantics(Semantics::AtMostOnce);
        for (disposition, want) in [
            (Disposition::Ok, Settle::Done(Fate::Applied)),
            (Disposition::Duplicate, Settle::Done(Fate::Duplicate)),
            (
                Disposition::Retry {
                    after: None,
                    reason: "busy".into(),
                },
                Settle::Done(Fate::Lost),
            ),
            (
                Disposition::dead_letter("bad"),
                Settle::DeadLetter("bad".into()),
            ),
        ] {
            let d = delivery(with_id("m"), 1);
            let mut slot = screen(&opts, &d);
            decide(&opts, &backoff(), &mut slot, &d, disposition);
            assert_eq!(slot.settle, want);
        }
    }

    #[test]
    fn a_conflict_is_a_dead_letter_naming_both_payloads_or_ignored() {
        let id = MessageId::new("ORD-1").unwrap();
        let (stored, fp) = (Fingerprint::of(b"a"), Fingerprint::of(b"b"));
        match conflict(ConflictPolicy::DeadLetter, &id, stored, fp) {
            Disposition::DeadLetter { reason } => {
                assert!(reason.starts_with("conflict: message id ORD-1"), "{reason}");
                assert!(
                    reason.contains(&stored.to_string()) && reason.contains(&fp.to_string()),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            conflict(ConflictPolicy::Ignore, &id, stored, fp),
            Disposition::Duplicate
        );
    }

    #[test]
    fn a_dead_letter_names_its_queue_consumer_and_attempts() {
        let r = reason(
            &ConsumerOptions::new("billing"),
            "orders",
            &delivery(with_id("m"), 4),
            "bad".into(),
        );
        assert_eq!(
            (
                r.error.as_str(),
                r.attempts,
                r.source_queue.as_str(),
                r.consumer.as_str()
            ),
            ("bad", 4, "orders", "billing")
        );
    }
}
