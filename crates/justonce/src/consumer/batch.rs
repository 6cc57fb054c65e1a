//! A batch's life, as a pipeline of named steps: screen, (at-most-once) ack early, take
//! the claims, run the passes in one transaction, ack inside it, commit, tell the observer,
//! finish the claims, settle. The fault points sit between the steps.

use std::sync::Mutex;
use std::time::Duration;

use justonce_core::{ClaimStore, DedupStore, Delivery, Error, ErrorKind, Result, Semantics, Turn};
use tokio::time::Instant;
use tracing::{debug, field, info_span, warn, Instrument};

use super::{decide, BatchReport, Fate, FaultPoint, Handler, Idempotency, Inner, Settle, Slot};

/// A batch that failed.
struct Failed {
    error: Error,
    /// What its deliveries count as, or `None` when it failed after its commit, once their
    /// outcomes were counted.
    uncounted: Option<Fate>,
}

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// Processes `batch`. A batch that fails on lock contention (a deadlock, a serialization
    /// failure) makes the consumer take turns in the store ([`Turns`]) where the store has
    /// them, and runs again at once, in its turn. Where it has none, or when it fails so
    /// again, it runs one message per transaction: a transaction that locks the rows of one
    /// message waits for others but cannot close a cycle with them, so the batch is not
    /// failed again and again whole (halving it instead let each half meet the other
    /// consumer's batch again: 0.03x the throughput of one consumer on a hot set, against
    /// 0.16x). A message that still fails so goes back to the queue. At-most-once batches
    /// are acked before they run and are not run again.
    ///
    /// A batch that fails goes back to the queue at once ([`Inner::give_back`]), and its
    /// deliveries not yet counted are counted as released (lost, at-most-once).
    pub(super) async fn process_or_singly(&self, batch: &[Delivery]) -> Result<BatchReport> {
        let mut failed = match self.process(batch).await {
            Ok(report) => {
                self.window.widen();
                return Ok(report);
            }
            Err(failed) => failed,
        };
        // A conflict that may run again: before the commit, and not acked already.
        let again = |f: &Failed| {
            f.error.kind() == ErrorKind::Busy
                && f.uncounted.is_some()
                && self.opts.semantics != Semantics::AtMostOnce
        };
        if again(&failed) && self.store.takes_turns() {
            debug!(
                batch = batch.len(),
                "lock contention: the batch runs again in the consumer's turn"
            );
            match self.process(batch).await {
                Ok(report) => return Ok(report),
                Err(f) => failed = f,
            }
        }
        let mut failed_at = 0;
        let singly = again(&failed) && batch.len() > 1;
        let failed = if singly {
            debug!(
                batch = batch.len(),
                "lock contention: the batch runs again one message per transaction"
            );
            let mut report = BatchReport::default();
            let mut failure = None;
            for (i, one) in batch.chunks(1).enumerate() {
                match self.process(one).await {
                    Ok(r) => report = report.merge(r),
                    Err(f) => {
                        failed_at = i;
                        failure = Some(f);
                        break;
                    }
                }
            }
            match failure {
                None => return Ok(report),
                Some(f) => f,
            }
        } else {
            failed
        };
        // What failed from `failed_at` on goes back. Its deliveries are counted here unless
        // the failure came after a commit: then the batch's own are counted (when run one
        // at a time: the one that failed, not the ones after it, which never ran).
        let rest = &batch[failed_at..];
        let i = self.instruments();
        i.batches_failed.increment(1);
        match failed.uncounted {
            Some(outcome) => i.outcome(outcome, rest.len()),
            None if singly => i.outcome(Fate::Released, rest.len() - 1),
            None => {}
        }
        self.give_back(rest).await;
        Err(failed.error)
    }

    /// Counts a lock conflict of `batch`, and says at warn, at most once a minute, what to do
    /// about it: taking turns (or one transaction per message, or smaller batches) hides
    /// the cost, and replicas on a hot set then write one at a time.
    ///
    /// Where the store has turns the consumer takes them for a while ([`Turns`]); where it
    /// has none its batches shrink ([`Window`]).
    fn contended(&self, batch: &[Delivery], error: &Error) {
        let size = self.opts.batching.size.max(1);
        let now = if self.store.takes_turns() {
            let hold = self.turns.hold();
            format!(
                "batches now take turns in the store for {}s, one at a time across replicas",
                hold.as_secs()
            )
        } else {
            let window = self.window.shrink(batch.len());
            format!("batches now take at most {window} of {size} messages, growing back as the conflicts stop")
        };
        let Some(n) = self.instruments().lock_conflicts.note() else {
            return;
        };
        let error = error.to_chain_string();
        let consumer = self.opts.name.as_str();
        if batch
            .iter()
            .any(|d| self.handler.lock_key(&d.message).is_some())
        {
            warn!(
                consumer, conflicts = n, %error,
                "lock conflicts in the store ({n} since the last line; {now}): the batches take their locks in the order of Handler::lock_key, so they meet on rows that key does not name (a second row, an index); make lock_key name the row each message locks first: docs/guide/failures.md#deadlocks-when-you-scale-out"
            );
        } else {
            warn!(
                consumer, conflicts = n, %error,
                "lock conflicts in the store ({n} since the last line; {now}): consumers that update the same rows in different orders deadlock, and replicas that take turns write one at a time; implement Handler::lock_key so that every batch takes its locks in one order: docs/guide/failures.md#deadlocks-when-you-scale-out"
            );
        }
    }

    /// [`Inner::process_batch`] in a span named after OpenTelemetry's messaging
    /// conventions, which records what the batch came to; a lock conflict is counted and
    /// acted on ([`Inner::contended`]).
    async fn process(&self, batch: &[Delivery]) -> std::result::Result<BatchReport, Failed> {
        let span = info_span!(
            "justonce.batch",
            messaging.system = self.source.system(),
            messaging.destination.name = self.source.queue(),
            messaging.consumer.group.name = self.opts.name.as_str(),
            messaging.batch.message_count = batch.len(),
            handled = field::Empty,
            acked = field::Empty,
            duplicates = field::Empty,
            retried = field::Empty,
            dead_lettered = field::Empty,
            released = field::Empty,
            crashed = field::Empty,
            error = field::Empty,
        );
        let started = std::time::Instant::now();
        let result = self.process_batch(batch).instrument(span.clone()).await;
        self.instruments()
            .batch_seconds
            .record(started.elapsed().as_secs_f64());
        match &result {
            Ok(r) => {
                span.record("handled", r.handled);
                span.record("acked", r.acked);
                span.record("duplicates", r.duplicates);
                span.record("retried", r.retried);
                span.record("dead_lettered", r.dead_lettered);
                span.record("released", r.released);
                span.record("crashed", r.crashed);
            }
            Err(f) => {
                span.record("error", field::display(f.error.to_chain_string()));
                if f.error.kind() == ErrorKind::Busy {
                    self.contended(batch, &f.error);
                }
            }
        }
        result
    }

    async fn process_batch(&self, batch: &[Delivery]) -> std::result::Result<BatchReport, Failed> {
        let claims = if self.effectively_once(Idempotency::Claim) {
            let claims = self.claims.as_deref().ok_or_else(|| Failed {
                error: Error::config(
                    "idempotency Claim needs a claim store: call Consumer::with_claims",
                ),
                uncounted: Some(Fate::Released),
            })?;
            Some(claims)
        } else {
            None
        };
        let mut slots: Vec<Slot> = batch
            .iter()
            .map(|d| decide::screen(&self.opts, d))
            .collect();
        let error = match self.transact(batch, &mut slots, claims).await {
            Ok(report) => return Ok(report),
            Err(error) => error,
        };
        // Settling takes the slots: a batch that fails with none left had committed, and
        // its outcomes are counted.
        let uncounted = if slots.is_empty() {
            None
        } else if self.opts.semantics == Semantics::AtMostOnce {
            Some(Fate::Lost)
        } else {
            Some(Fate::Released)
        };
        if let Some(claims) = claims {
            // The batch goes back to the queue: let its claims go with it, or its own
            // next delivery would find them held until their lease runs out.
            for slot in &mut slots {
                slot.settle = Settle::Release;
            }
            self.finish_claims(claims, &mut slots, &vec![None; batch.len()])
                .await;
        }
        Err(Failed { error, uncounted })
    }

    /// The batch's transaction: claims, handlers, commit, then settle.
    pub(super) async fn transact(
        &self,
        batch: &[Delivery],
        slots: &mut Vec<Slot>,
        claims: Option<&dyn ClaimStore>,
    ) -> Result<BatchReport> {
        let mut report = BatchReport {
            received: batch.len(),
            ..BatchReport::default()
        };
        if self.opts.semantics == Semantics::AtMostOnce {
            self.ack_early(batch, slots, &mut report).await?;
            if self.crash_at(FaultPoint::AfterAck, batch, slots).await {
                report.crashed = true;
                return Ok(report);
            }
        }
        if let Some(claims) = claims {
            self.acquire_claims(claims, batch, slots).await?;
        }
        let mut results = vec![None; batch.len()];
        let mut tx = self
            .run_passes(batch, slots, claims.is_none(), &mut results, &mut report)
            .await?;
        if let Some(acker) = &self.tx_ack {
            self.ack_in_tx(acker.as_ref(), &mut tx, batch, slots)
                .await?;
        }
        if self.crash_at(FaultPoint::BeforeCommit, batch, slots).await {
            report.crashed = true;
            return Ok(report); // the transaction is dropped: rolled back
        }
        self.store.commit(tx).await?;
        self.count(slots, true);
        if let Some(observer) = &self.observer {
            observer.committed(&live(batch, slots));
        }
        if self.crash_at(FaultPoint::AfterCommit, batch, slots).await {
            report.crashed = true;
            return Ok(report);
        }
        if let Some(claims) = claims {
            self.finish_claims(claims, slots, &results).await;
        }
        self.settle(batch, std::mem::take(slots), &mut report)
            .await?;
        Ok(report)
    }

    /// At-most-once: acks every pending delivery before anything runs.
    pub(super) async fn ack_early(
        &self,
        batch: &[Delivery],
        slots: &[Slot],
        report: &mut BatchReport,
    ) -> Result<()> {
        let receipts: Vec<_> = batch
            .iter()
            .zip(slots)
            .filter(|(_, s)| matches!(s.settle, Settle::Pending))
            .map(|(d, _)| &d.receipt)
            .collect();
        self.source.ack(&receipts).await?;
        report.acked += receipts.len();
        Ok(())
    }

    /// Begins the batch's transaction and runs its handlers; returns the transaction, not
    /// yet committed. Most batches fail nowhere: where it may (`optimistic`, and never in
    /// claim mode) the batch runs in the optimistic pass, with no savepoint per message (two
    /// round trips each saved); only when a message fails there does the batch roll back and
    /// run again in the careful pass, with a savepoint per message.
    pub(super) async fn run_passes(
        &self,
        batch: &[Delivery],
        slots: &mut Vec<Slot>,
        may_be_optimistic: bool,
        results: &mut [Option<Vec<u8>>],
        report: &mut BatchReport,
    ) -> Result<S::Tx> {
        let optimistic = self.opts.batching.optimistic && may_be_optimistic;
        let (mut tx, claimed) = if optimistic && self.effectively_once(Idempotency::DedupTable) {
            let (tx, answers) = self.begin_claimed(batch, slots).await?;
            (tx, Some(answers))
        } else {
            (self.store.begin().await?, None)
        };
        self.take_turn(&mut tx, batch).await?;
        if !optimistic {
            self.careful_pass(&mut tx, None, batch, slots, results, report)
                .await?;
            return Ok(tx);
        }
        let before = *report;
        let failed = self
            .optimistic_pass(&mut tx, claimed, batch, slots, results, report)
            .await?;
        let Some(failed) = failed else {
            return Ok(tx);
        };
        debug!(
            batch = batch.len(),
            "a message failed: the batch runs again with a savepoint per message"
        );
        self.store.rollback(tx).await?;
        let mut tx = self.store.begin().await?;
        self.take_turn(&mut tx, batch).await?;
        // Nothing but `screen` set the slots before the transaction (no claims, and
        // at-most-once's early ack leaves them as they were): derive them again.
        *slots = batch
            .iter()
            .map(|d| decide::screen(&self.opts, d))
            .collect();
        *report = before;
        results.iter_mut().for_each(|r| *r = None);
        self.careful_pass(&mut tx, Some(failed), batch, slots, results, report)
            .await?;
        Ok(tx)
    }

    /// Takes the consumer's turn in the store ([`Turns`]): alone while it takes turns,
    /// beside the other batches otherwise, so that a replica that takes turns never runs
    /// beside one that does not. A batch that finds the turn taken alone (another replica
    /// met a conflict) takes turns too, from then on, without meeting one itself. A batch
    /// beside the others whose messages name no lock key (nothing orders their locks) waits
    /// at most [`Turns::PATIENCE`] for a row lock: a deadlock then tells in a quarter of a
    /// second rather than the second PostgreSQL's detector takes, while two batches in lock
    /// order wait for each other as long as they need. One statement a batch; a
    /// transaction of one message takes none unless alone. After the dedup claims, which
    /// lock only rows of the batch's own message ids, and before the handlers.
    async fn take_turn(&self, tx: &mut S::Tx, batch: &[Delivery]) -> Result<()> {
        if !self.store.takes_turns() {
            return Ok(());
        }
        let name = &self.opts.name;
        if !self.turns.taking() {
            if batch.len() < 2 {
                return Ok(());
            }
            // `receive_batch` sorted the batch by lock key, the messages without one first:
            // none has one when the last has none.
            let unordered = batch
                .last()
                .is_some_and(|d| self.handler.lock_key(&d.message).is_none());
            let patience = unordered.then_some(Turns::PATIENCE);
            if self
                .store
                .take_turn(tx, name, Turn::Beside { patience })
                .await?
            {
                return Ok(());
            }
            let hold = self.turns.hold();
            debug!(
                hold_s = hold.as_secs(),
                "another replica takes turns: this one does too"
            );
        }
        self.store.take_turn(tx, name, Turn::Alone).await?;
        Ok(())
    }

    pub(super) async fn crash_at(
        &self,
        point: FaultPoint,
        batch: &[Delivery],
        slots: &[Slot],
    ) -> bool {
        let Some(hook) = &self.faults else {
            return false;
        };
        let crash = hook.crash_at(point, &live(batch, slots)).await;
        if crash {
            debug!(
                point = point.as_str(),
                batch = batch.len(),
                "fault hook: consumer crashes"
            );
        }
        crash
    }
}

/// The deliveries of `batch` that are not being dead-lettered.
fn live<'a>(batch: &'a [Delivery], slots: &[Slot]) -> Vec<&'a Delivery> {
    batch
        .iter()
        .zip(slots)
        .filter(|(_, s)| !matches!(s.settle, Settle::DeadLetter(_)))
        .map(|(d, _)| d)
        .collect()
}

/// How many deliveries a consumer's batches take: the configured size, cut to a quarter
/// (down to one) at each lock conflict, grown back by one per [`Window::GROW_EVERY`] while
/// batches commit whole, as congestion control backs off and probes. Two batches of `b`
/// messages among `n` hot rows share about `b * b / n` of them and deadlock when they share
/// two in opposite orders; each deadlock costs a wait (PostgreSQL's `deadlock_timeout`,
/// 1 s), so the window has to settle where they are rare, and grows back slowly.
pub(super) struct Window {
    size: usize,
    /// The window, and when it last changed.
    now: Mutex<(usize, Instant)>,
}

impl Window {
    pub(super) const GROW_EVERY: Duration = Duration::from_secs(1);

    pub(super) fn new(size: usize) -> Self {
        let size = size.max(1);
        Window {
            size,
            now: Mutex::new((size, Instant::now())),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, (usize, Instant)> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn get(&self) -> usize {
        self.state().0
    }

    /// A lock conflict in a batch of `n`: a quarter of it (or of the window, if smaller).
    pub(super) fn shrink(&self, n: usize) -> usize {
        let mut s = self.state();
        *s = ((s.0.min(n) / 4).max(1), Instant::now());
        s.0
    }

    /// A batch committed whole: one more, if the window last changed a while ago.
    pub(super) fn widen(&self) {
        let mut s = self.state();
        if s.0 < self.size && s.1.elapsed() >= Self::GROW_EVERY {
            *s = (s.0 + 1, Instant::now());
        }
    }
}

/// Whether a consumer's batches take its turn in the store alone ([`Store::take_turn`]):
/// from a lock conflict on, or from a batch that found another replica taking it alone, for
/// a hold of [`Turns::FIRST`], renewed by each conflict while it lasts. The others take the
/// turn beside each other, and never run beside one that takes it alone. When the hold ends the
/// batches run side by side again; a conflict within a hold of that doubles the hold (up to
/// [`Turns::LONGEST`]), as a backoff does: on a hot set the probe costs a deadlock per
/// hold, on a spread set the turns end. Batches that take turns run at full size, one
/// at a time across the replicas, so N replicas on a hot set run about as fast as one
/// instead of waiting out the deadlock detector (PostgreSQL's `deadlock_timeout`, 1 s).
///
/// [`Store::take_turn`]: justonce_core::Store::take_turn
#[derive(Default)]
pub(super) struct Turns {
    /// Until when, and for how long the last hold was.
    now: Mutex<Option<(Instant, Duration)>>,
}

impl Turns {
    pub(super) const FIRST: Duration = Duration::from_secs(10);
    /// How long a batch beside the others, in no lock order, waits for a row lock.
    pub(super) const PATIENCE: Duration = Duration::from_millis(250);
    pub(super) const LONGEST: Duration = Duration::from_secs(160);

    fn state(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Duration)>> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn taking(&self) -> bool {
        self.state()
            .is_some_and(|(until, _)| Instant::now() < until)
    }

    /// Takes turns from now on (a lock conflict, or another replica taking them), for how
    /// long it returns.
    pub(super) fn hold(&self) -> Duration {
        let now = Instant::now();
        let mut s = self.state();
        let hold = match *s {
            Some((until, hold)) if now < until => hold,
            Some((until, hold)) if now - until < hold => (hold * 2).min(Self::LONGEST),
            _ => Self::FIRST,
        };
        *s = Some((now + hold, hold));
        hold
    }
}
