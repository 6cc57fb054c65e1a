//! What a running consumer tells the world: its metrics, through the `metrics` facade, and
//! its health, for a readiness probe. Without a recorder installed every instrument is a
//! no-op handle: nothing is recorded and nothing allocates per message.
//!
//! The instruments are registered once per consumer, at its first batch, so a recorder
//! installed any time before that sees them. Names follow Prometheus (`_total`,
//! `_seconds`), labels OpenTelemetry's messaging conventions (`messaging.system`,
//! `messaging.destination.name`, `messaging.consumer.group.name`); the list is in
//! docs/guide/operations.md.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Label};

/// What became of one delivery: every delivery received ends as exactly one outcome, so
/// that the outcomes add up to the deliveries (less those in flight, or lost in a crash
/// before their batch committed or settled: their redeliveries are counted again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub(super) enum Fate {
    /// Its effect committed.
    Applied,
    /// Acked as a duplicate, without its effect.
    Duplicate,
    /// Handed back for a later attempt.
    Retry,
    /// Dead-lettered (a conflict is counted as [`Fate::Conflict`] instead).
    DeadLetter,
    /// Its id was seen before with another payload (dead-lettered or acked, by the policy).
    Conflict,
    /// Handed back without counting an attempt: its batch failed for a reason that is not
    /// the messages', the breaker held it, or the consumer was stopping.
    Released,
    /// At-most-once: acked before it failed, so never applied.
    Lost,
}

impl Fate {
    pub(super) const ALL: [Fate; 7] = [
        Fate::Applied,
        Fate::Duplicate,
        Fate::Retry,
        Fate::DeadLetter,
        Fate::Conflict,
        Fate::Released,
        Fate::Lost,
    ];

    /// The value of the `outcome` label.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Fate::Applied => "applied",
            Fate::Duplicate => "duplicate",
            Fate::Retry => "retry",
            Fate::DeadLetter => "dead_letter",
            Fate::Conflict => "conflict",
            Fate::Released => "released",
            Fate::Lost => "lost",
        }
    }
}

/// A consumer's registered instruments.
pub(super) struct Instruments {
    outcomes: [Counter; Fate::ALL.len()],
    pub(super) received: Counter,
    pub(super) redelivered: Counter,
    pub(super) batch_seconds: Histogram,
    pub(super) handler_seconds: Histogram,
    pub(super) batches_failed: Counter,
    pub(super) claims_acquired: Counter,
    pub(super) claims_held_elsewhere: Counter,
    pub(super) claims_in_progress: Gauge,
    pub(super) fence_rejections: Counter,
    pub(super) breaker_open: Gauge,
    pub(super) workers_paused: Gauge,
    pub(super) lock_conflicts: Contention,
}

impl Instruments {
    pub(super) fn register(system: &'static str, destination: &str, group: &str) -> Self {
        let labels = vec![
            Label::new("messaging.system", system),
            Label::new("messaging.destination.name", destination.to_owned()),
            Label::new("messaging.consumer.group.name", group.to_owned()),
        ];
        let with = |extra: (&'static str, &'static str)| {
            let mut l = labels.clone();
            l.push(Label::new(extra.0, extra.1));
            l
        };
        let l = || labels.clone();
        Instruments {
            outcomes: Fate::ALL.map(|o| {
                metrics::counter!("justonce_deliveries_total", with(("outcome", o.as_str())))
            }),
            received: metrics::counter!("justonce_deliveries_received_total", l()),
            redelivered: metrics::counter!("justonce_redeliveries_total", l()),
            batch_seconds: metrics::histogram!("justonce_batch_duration_seconds", l()),
            handler_seconds: metrics::histogram!("justonce_handler_duration_seconds", l()),
            batches_failed: metrics::counter!("justonce_batches_failed_total", l()),
            claims_acquired: metrics::counter!("justonce_claims_acquired_total", l()),
            claims_held_elsewhere: metrics::counter!("justonce_claims_held_elsewhere_total", l()),
            claims_in_progress: metrics::gauge!("justonce_claims_in_progress", l()),
            fence_rejections: metrics::counter!("justonce_fence_rejections_total", l()),
            breaker_open: metrics::gauge!("justonce_breaker_open", l()),
            workers_paused: metrics::gauge!("justonce_workers_paused", l()),
            lock_conflicts: Contention {
                counter: metrics::counter!("justonce_lock_conflicts_total", l()),
                since: Mutex::new((None, 0)),
            },
        }
    }

    /// Counts `n` deliveries ending as `outcome`.
    pub(super) fn outcome(&self, outcome: Fate, n: usize) {
        if n > 0 {
            self.outcomes[outcome as usize].increment(n as u64);
        }
    }
}

/// How often a consumer logs its lock conflicts at most.
pub(super) const CONTENTION_LOG_EVERY: Duration = Duration::from_secs(60);

/// A consumer's lock conflicts (deadlocks, serialization failures, lock timeouts: errors
/// of kind `Busy`): each counted, and a warning due at the first and then at most once per
/// [`CONTENTION_LOG_EVERY`], carrying the count since the last.
pub(super) struct Contention {
    counter: Counter,
    /// When the last warning was due, and the conflicts since.
    since: Mutex<(Option<Instant>, u64)>,
}

impl Contention {
    /// Counts one conflict; `Some(n)` when a warning is due, `n` the conflicts it reports.
    pub(super) fn note(&self) -> Option<u64> {
        self.counter.increment(1);
        let mut s = self.since.lock().unwrap_or_else(|e| e.into_inner());
        s.1 += 1;
        let now = Instant::now();
        if s.0
            .is_some_and(|t| now.duration_since(t) < CONTENTION_LOG_EVERY)
        {
            return None;
        }
        s.0 = Some(now);
        Some(std::mem::take(&mut s.1))
    }
}

/// Whether a running consumer is ready for work: a readiness probe's answer. Cloned from
/// [`Consumer::health`](super::Consumer::health) before the consumer runs, it follows it.
///
/// ```
/// # use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Result};
/// # use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
/// # struct H;
/// # impl Handler<MemoryTx> for H {
/// #     async fn handle(&self, _: &Context<'_>, _: &mut MemoryTx) -> Result<Disposition> { Ok(Disposition::Ok) }
/// # }
/// let consumer = Consumer::new(ConsumerOptions::new("billing"), MemoryQueue::new("orders", std::time::Duration::from_secs(30)), MemoryStore::new(), H)?;
/// let health = consumer.health();
/// assert_eq!(health.ready(), Err("not running".to_owned()));
/// # Ok::<(), justonce::Error>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct Health {
    inner: Arc<HealthState>,
}

#[derive(Debug, Default)]
struct HealthState {
    running: AtomicBool,
    /// Workers pausing after a batch that failed for a reason not the messages'.
    paused: AtomicUsize,
    breaker_open: AtomicBool,
}

impl Health {
    /// `Ok` while the consumer runs, none of its workers is pausing after a failed batch (an
    /// unreachable transport or store, a missing table) and its breaker is closed; otherwise
    /// why not.
    pub fn ready(&self) -> Result<(), String> {
        let s = &self.inner;
        if !s.running.load(Ordering::Relaxed) {
            return Err("not running".to_owned());
        }
        if s.breaker_open.load(Ordering::Relaxed) {
            return Err("paused: the breaker is open".to_owned());
        }
        match s.paused.load(Ordering::Relaxed) {
            0 => Ok(()),
            n => Err(format!(
                "{n} workers are pausing after batches that failed for a reason that is not the messages' (see the log)"
            )),
        }
    }

    pub(super) fn set_running(&self, running: bool) {
        self.inner.running.store(running, Ordering::Relaxed);
    }

    pub(super) fn set_breaker_open(&self, open: bool) {
        self.inner.breaker_open.store(open, Ordering::Relaxed);
    }

    /// A worker starts (`true`) or ends (`false`) pausing; answers how many pause now.
    pub(super) fn set_paused(&self, paused: bool) -> usize {
        if paused {
            self.inner.paused.fetch_add(1, Ordering::Relaxed) + 1
        } else {
            self.inner.paused.fetch_sub(1, Ordering::Relaxed) - 1
        }
    }
}
