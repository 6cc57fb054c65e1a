//! The two passes a batch's handlers run in, and the handler call itself. The optimistic
//! pass runs the whole batch with no savepoint (most batches fail nowhere); the careful pass
//! gives each message a savepoint and its own claim, so that one that fails rolls back alone.

use std::sync::Mutex;

use justonce_core::{
    Claim, DedupKey, DedupStore, Delivery, Disposition, Error, ErrorKind, Message, MessageId,
    Result,
};
use tracing::Instrument;

use super::{BatchReport, Context, Handler, Idempotency, Inner, Settle, Slot};

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// Begins the batch's transaction with its dedup keys claimed in it (one
    /// `DedupStore::begin_with_claims` call): one answer per pending message with an id.
    pub(super) async fn begin_claimed(
        &self,
        batch: &[Delivery],
        slots: &[Slot],
    ) -> Result<(S::Tx, Vec<Claim>)> {
        let keys: Vec<(&MessageId, &Message)> = batch
            .iter()
            .zip(slots)
            .filter(|(_, s)| matches!(s.settle, Settle::Pending))
            .filter_map(|(d, s)| Some((s.id.as_ref()?, &d.message)))
            .collect();
        let (tx, answers) = self.store.begin_with_claims(&self.opts.name, &keys).await?;
        if answers.len() != keys.len() {
            return Err(Error::new(
                ErrorKind::Internal,
                format!(
                    "the dedup store answered {} claims for {} keys",
                    answers.len(),
                    keys.len()
                ),
            ));
        }
        Ok((tx, answers))
    }

    /// The optimistic pass: the batch with no savepoints, its dedup keys already claimed
    /// (`claimed`, by [`Inner::begin_claimed`]) when the method is the dedup table. Stops at
    /// the first handler that fails (answers other than `Ok`) and returns its place and
    /// answer: its writes cannot be rolled back alone, so the caller rolls the whole batch
    /// back and runs it with savepoints. Duplicates and conflicts found by the claim wrote
    /// nothing and settle here.
    pub(super) async fn optimistic_pass(
        &self,
        tx: &mut S::Tx,
        claimed: Option<Vec<Claim>>,
        batch: &[Delivery],
        slots: &mut [Slot],
        results: &mut [Option<Vec<u8>>],
        report: &mut BatchReport,
    ) -> Result<Option<(usize, Disposition)>> {
        let mut claimed = claimed.map(Vec::into_iter);
        for (i, ((d, slot), result)) in batch
            .iter()
            .zip(slots.iter_mut())
            .zip(results.iter_mut())
            .enumerate()
        {
            if !matches!(slot.settle, Settle::Pending) {
                continue;
            }
            let disposition = match (&slot.id, claimed.as_mut().map(Iterator::next)) {
                (None, _) => Disposition::dead_letter("invalid input: message has no id"),
                (Some(_), Some(Some(Claim::Duplicate))) => Disposition::Duplicate,
                (Some(id), Some(Some(Claim::Conflict { stored }))) => {
                    slot.conflict = true;
                    self.conflict(id, stored, d.message.fingerprint())
                }
                (Some(_), Some(None)) => {
                    return Err(Error::new(ErrorKind::Internal, "a claim went missing"));
                }
                (Some(_), Some(Some(Claim::Fresh)) | None) => {
                    let disposition = self.run_handler(tx, d, slot, result, report).await?;
                    if !matches!(disposition, Disposition::Ok) {
                        return Ok(Some((i, disposition)));
                    }
                    disposition
                }
            };
            self.decide(slot, d, disposition);
        }
        Ok(None)
    }

    /// The careful pass: each pending message in a savepoint of its own, its dedup key
    /// claimed first, so that a message that fails rolls back alone. `failed` is where the
    /// optimistic pass stopped, with the answer it got there: the messages before it wrote
    /// the same things again, so it would give it again.
    pub(super) async fn careful_pass(
        &self,
        tx: &mut S::Tx,
        mut failed: Option<(usize, Disposition)>,
        batch: &[Delivery],
        slots: &mut [Slot],
        results: &mut [Option<Vec<u8>>],
        report: &mut BatchReport,
    ) -> Result<()> {
        for (i, ((d, slot), result)) in batch
            .iter()
            .zip(slots.iter_mut())
            .zip(results.iter_mut())
            .enumerate()
        {
            if !matches!(slot.settle, Settle::Pending) {
                continue;
            }
            if let Some((_, disposition)) = failed.take_if(|(at, _)| *at == i) {
                report.handled += 1;
                self.decide(slot, d, disposition);
                continue;
            }
            self.store.savepoint(tx).await?;
            let disposition = self.handle_one(tx, d, slot, result, report).await?;
            match disposition {
                Disposition::Ok => self.store.release_savepoint(tx).await?,
                _ => self.store.rollback_to_savepoint(tx).await?,
            }
            self.decide(slot, d, disposition);
        }
        Ok(())
    }

    pub(super) async fn handle_one(
        &self,
        tx: &mut S::Tx,
        d: &Delivery,
        slot: &mut Slot,
        result: &mut Option<Vec<u8>>,
        report: &mut BatchReport,
    ) -> Result<Disposition> {
        let Some(id) = &slot.id else {
            return Ok(Disposition::dead_letter("invalid input: message has no id"));
        };
        if self.effectively_once(Idempotency::DedupTable) {
            let key = DedupKey {
                consumer: &self.opts.name,
                message_id: id,
            };
            let fp = d.message.fingerprint();
            match self.store.claim(tx, key, fp).await? {
                Claim::Fresh => {}
                Claim::Duplicate => return Ok(Disposition::Duplicate),
                Claim::Conflict { stored } => {
                    let disposition = self.conflict(id, stored, fp);
                    slot.conflict = true;
                    return Ok(disposition);
                }
            }
        }
        self.run_handler(tx, d, slot, result, report).await
    }

    /// Runs the handler on one delivery whose dedup key (if any) is claimed.
    pub(super) async fn run_handler(
        &self,
        tx: &mut S::Tx,
        d: &Delivery,
        slot: &Slot,
        result: &mut Option<Vec<u8>>,
        report: &mut BatchReport,
    ) -> Result<Disposition> {
        report.handled += 1;
        let cx = self.context(d, slot);
        let span = tracing::debug_span!(
            "justonce.delivery",
            messaging.message.id = slot.id.as_ref().map(|i| i.as_str()),
            attempt = d.attempt,
            outcome = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let outcome = self.handler.handle(&cx, tx).instrument(span.clone()).await;
        self.instruments()
            .handler_seconds
            .record(started.elapsed().as_secs_f64());
        span.record(
            "outcome",
            match &outcome {
                Ok(Disposition::Ok) => "ok",
                Ok(Disposition::Duplicate) => "duplicate",
                Ok(Disposition::Retry { .. }) => "retry",
                Ok(Disposition::DeadLetter { .. }) => "dead_letter",
                Err(e) if e.kind().is_message_fault() => "error",
                Err(_) => "batch_error",
            },
        );
        *result = cx.take_result();
        let outgoing = cx.take_outgoing();
        Ok(match outcome {
            Ok(Disposition::Ok) if !outgoing.is_empty() => {
                match self.enqueue_outgoing(tx, outgoing).await {
                    Ok(()) => Disposition::Ok,
                    Err(e) if !e.kind().is_message_fault() => return Err(e),
                    Err(e) => Disposition::dead_letter(format!(
                        "a message it sent was refused by the outbox: {}",
                        justonce_core::error_chain(&e)
                    )),
                }
            }
            Ok(disposition) => disposition,
            Err(e)
                if e.kind() == ErrorKind::UniqueViolation
                    && self.effectively_once(Idempotency::UniqueKey) =>
            {
                Disposition::Duplicate
            }
            // An error that is not the message's (an outage, a missing table or privilege,
            // a deadlock) fails the batch: it rolls back whole, goes back to the queue without
            // counting an attempt, and the worker retries after a pause. Dead-lettering would
            // empty the queue into the dead letters over a deploy mistake, and counting it
            // against the message would dead-letter good messages after a long outage (its
            // attempts also count the redeliveries after crashes). A deadlock is the
            // transaction's: rolling back to the savepoint would keep the locks of the batch's
            // earlier messages, and the conflict would repeat for every message after it.
            Err(e) if !e.kind().is_message_fault() => return Err(e),
            Err(e) => Disposition::from_error(&e),
        })
    }

    pub(super) fn context<'a>(&'a self, d: &'a Delivery, slot: &'a Slot) -> Context<'a> {
        Context {
            delivery: d,
            consumer: &self.opts.name,
            id: slot.id.as_ref(),
            token: slot.token,
            result: Mutex::new(None),
            outgoing: self.outbox.as_ref().map(|_| Mutex::new(Vec::new())),
        }
    }

    /// Writes what a handler sent into its transaction, in the order it sent them.
    async fn enqueue_outgoing(
        &self,
        tx: &mut S::Tx,
        outgoing: Vec<super::handler::Outgoing>,
    ) -> Result<()> {
        let Some(outbox) = &self.outbox else {
            // A context has somewhere to send only when the consumer has an outbox.
            return Err(Error::new(
                ErrorKind::Internal,
                "a handler sent with no outbox",
            ));
        };
        for (key, message) in &outgoing {
            outbox.enqueue(tx, message, key.as_deref()).await?;
        }
        Ok(())
    }
}
