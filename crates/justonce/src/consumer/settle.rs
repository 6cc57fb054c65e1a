//! Settling a batch: the breaker's judgement, then acks, nacks, dead letters and releases
//! sent to the source; and the ack inside the transaction, where the queue lives in the
//! store's database.

use justonce_core::{DedupStore, Delivery, Receipt, Result, Semantics, TransactionalAck};
use tracing::{error, warn};

use super::breaker::{Change, Outcome};
use super::{decide, BatchReport, Fate, Handler, Inner, Settle, Slot};

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// Shows the breaker what the batch came to and, while it is open, turns the failures
    /// it holds into releases.
    pub(super) fn judge(&self, slots: &mut [Slot]) {
        if self.opts.semantics == Semantics::AtMostOnce || !self.opts.breaker.enabled {
            return;
        }
        let outcomes = slots.iter().filter_map(|s| match (&s.settle, &s.failure) {
            (Settle::Ack { .. } | Settle::AckedInTx { .. }, _) => Some(Outcome::Success),
            (Settle::Nack(_) | Settle::DeadLetter(_), Some(reason)) => {
                Some(Outcome::Failure(reason.as_str()))
            }
            _ => None,
        });
        let mut breaker = self.breaker.lock().unwrap_or_else(|e| e.into_inner());
        match breaker.record(tokio::time::Instant::now(), outcomes) {
            Change::Opened(reason) => {
                self.health.set_breaker_open(true);
                self.instruments().breaker_open.set(1.0);
                error!(
                consumer = %self.opts.name,
                threshold = self.opts.breaker.threshold,
                window = ?self.opts.breaker.window,
                %reason,
                "breaker open: the last messages all failed for the same reason, which looks like \
                 a deploy or configuration mistake rather than bad messages; messages failing \
                 for it are handed back instead of dead-lettered, and the consumer pauses until \
                 a message succeeds"
                )
            }
            Change::Closed => {
                self.health.set_breaker_open(false);
                self.instruments().breaker_open.set(0.0);
                warn!(consumer = %self.opts.name, "breaker closed: a message succeeded; failures settle as usual again")
            }
            Change::None => {}
        }
        for slot in slots.iter_mut() {
            let held = matches!(slot.settle, Settle::Nack(_) | Settle::DeadLetter(_))
                && slot.failure.as_deref().is_some_and(|r| breaker.holds(r));
            if held {
                slot.settle = Settle::Release;
            }
        }
    }

    pub(super) async fn settle(
        &self,
        batch: &[Delivery],
        mut slots: Vec<Slot>,
        report: &mut BatchReport,
    ) -> Result<()> {
        self.judge(&mut slots);
        self.count(&slots, false);
        if let Some(acker) = &self.tx_ack {
            let in_tx: Vec<&Receipt> = batch
                .iter()
                .zip(&slots)
                .filter(|(_, s)| matches!(s.settle, Settle::AckedInTx { .. }))
                .map(|(d, _)| &d.receipt)
                .collect();
            if !in_tx.is_empty() {
                acker.committed(&in_tx).await;
            }
        }
        let mut acks = Vec::new();
        let mut released = Vec::new();
        for (d, slot) in batch.iter().zip(slots) {
            match slot.settle {
                Settle::Ack { duplicate } => {
                    report.duplicates += usize::from(duplicate);
                    let lost = self.faults.as_ref().is_some_and(|f| f.lose_ack(d));
                    if !lost {
                        acks.push(&d.receipt);
                    }
                }
                Settle::AckedInTx { duplicate } => {
                    report.duplicates += usize::from(duplicate);
                    report.acked += 1;
                }
                Settle::Nack(delay) => {
                    report.retried += 1;
                    self.source.nack(&d.receipt, delay).await?;
                }
                Settle::DeadLetter(error) => {
                    report.dead_lettered += 1;
                    let reason = decide::reason(&self.opts, self.source.queue(), d, error);
                    warn!(consumer = %self.opts.name, id = d.message.id().map_or("(none)", |i| i.as_str()), %reason, "dead-lettered");
                    self.source.dead_letter(d, &reason).await?;
                }
                Settle::Release => released.push(&d.receipt),
                Settle::Done(_) | Settle::Pending => {}
            }
        }
        if !acks.is_empty() {
            self.source.ack(&acks).await?;
            report.acked += acks.len();
        }
        if !released.is_empty() {
            report.released += released.len();
            self.source.release(&released).await?;
        }
        Ok(())
    }

    /// Counts what the batch's deliveries came to: the ones its commit decided (applied,
    /// acked as duplicates, at-most-once's) right after the commit, so that a crash later
    /// cannot leave an effect uncounted; the others (retries, dead letters, releases) once
    /// the breaker has judged them, before they are settled, so that a settlement that fails
    /// does not change what they were.
    pub(super) fn count(&self, slots: &[Slot], committed: bool) {
        let mut counts = [0usize; Fate::ALL.len()];
        for slot in slots {
            let fate = match (&slot.settle, committed) {
                (Settle::Ack { .. } | Settle::AckedInTx { .. } | Settle::Done(_), true)
                | (Settle::DeadLetter(_), false)
                    if slot.conflict =>
                {
                    Fate::Conflict
                }
                (Settle::Ack { duplicate } | Settle::AckedInTx { duplicate }, true) => {
                    if *duplicate {
                        Fate::Duplicate
                    } else {
                        Fate::Applied
                    }
                }
                (Settle::Done(fate), true) => *fate,
                (Settle::Nack(_), false) => Fate::Retry,
                (Settle::DeadLetter(_), false) => Fate::DeadLetter,
                (Settle::Release, false) => Fate::Released,
                _ => continue,
            };
            counts[fate as usize] += 1;
        }
        let instruments = self.instruments();
        for (outcome, n) in Fate::ALL.into_iter().zip(counts) {
            instruments.outcome(outcome, n);
        }
    }

    /// Acks the batch's acked deliveries in `tx`; a delivery whose lease ran out fails the
    /// whole batch (its transaction is dropped, so nothing of it commits).
    pub(super) async fn ack_in_tx(
        &self,
        acker: &dyn TransactionalAck<S::Tx>,
        tx: &mut S::Tx,
        batch: &[Delivery],
        slots: &mut [Slot],
    ) -> Result<()> {
        let receipts: Vec<&Receipt> = batch
            .iter()
            .zip(slots.iter())
            .filter(|(_, s)| matches!(s.settle, Settle::Ack { .. }))
            .map(|(d, _)| &d.receipt)
            .collect();
        if receipts.is_empty() {
            return Ok(());
        }
        acker.ack_in(tx, &receipts).await?;
        for slot in slots {
            if let Settle::Ack { duplicate } = slot.settle {
                slot.settle = Settle::AckedInTx { duplicate };
            }
        }
        Ok(())
    }
}
