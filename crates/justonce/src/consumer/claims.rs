//! Claim mode ([`Idempotency::Claim`](super::Idempotency::Claim)): the batch's claims taken
//! before its transaction begins, and completed or released after its commit.

use justonce_core::{
    ClaimState, ClaimStore, DedupKey, DedupStore, Delivery, Error, ErrorKind, Fingerprint, Finish,
    Result,
};
use tracing::warn;

use super::{Fate, Handler, Inner, Settle, Slot};

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// Claim mode: takes the claims of the batch, in one call, before its transaction begins.
    pub(super) async fn acquire_claims(
        &self,
        claims: &dyn ClaimStore,
        batch: &[Delivery],
        slots: &mut [Slot],
    ) -> Result<()> {
        let wanted: Vec<usize> = (0..batch.len())
            .filter(|&i| matches!(slots[i].settle, Settle::Pending) && slots[i].id.is_some())
            .collect();
        let keys: Vec<(DedupKey<'_>, Fingerprint)> = wanted
            .iter()
            .filter_map(|&i| {
                let id = slots[i].id.as_ref()?;
                Some((
                    DedupKey {
                        consumer: &self.opts.name,
                        message_id: id,
                    },
                    batch[i].message.fingerprint(),
                ))
            })
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let states = claims
            .acquire_batch(&keys, self.opts.dedup.claim_lease)
            .await?;
        let fps: Vec<Fingerprint> = keys.iter().map(|(_, fp)| *fp).collect();
        for ((i, state), fp) in wanted.into_iter().zip(states).zip(fps) {
            let d = &batch[i];
            match state {
                ClaimState::Acquired { token } => {
                    slots[i].token = Some(token);
                    self.instruments().claims_acquired.increment(1);
                    self.instruments().claims_in_progress.increment(1.0);
                }
                // Held by someone else: look again after the backoff (the holder may finish
                // soon) or when its lease runs out, whichever is first. Not an attempt of
                // ours, so no attempt limit applies.
                ClaimState::InProgress { retry_after } => {
                    self.instruments().claims_held_elsewhere.increment(1);
                    slots[i].settle = Settle::Nack(retry_after.min(self.backoff.delay(d.attempt)))
                }
                ClaimState::Completed { result } => {
                    self.handler
                        .on_duplicate(&self.context(d, &slots[i]), result.as_deref())
                        .await;
                    slots[i].settle = Settle::Ack { duplicate: true };
                }
                ClaimState::Conflict { stored } => {
                    if let Some(id) = slots[i].id.clone() {
                        slots[i].conflict = true;
                        let disposition = self.conflict(&id, stored, fp);
                        self.decide(&mut slots[i], d, disposition);
                    }
                }
            }
        }
        Ok(())
    }

    /// Claim mode, after the commit: completes the claims of applied messages and releases
    /// the others, in one call. A completion refused by the fencing token leaves its
    /// delivery unsettled: its lease runs out and the new holder's outcome decides.
    pub(super) async fn finish_claims(
        &self,
        claims: &dyn ClaimStore,
        slots: &mut [Slot],
        results: &[Option<Vec<u8>>],
    ) {
        let mut items = Vec::new();
        let mut which = Vec::new();
        for (i, (slot, result)) in slots.iter_mut().zip(results).enumerate() {
            // Each claim is finished once: a batch that fails after this releases the rest.
            let (Some(token), Some(id)) = (slot.token.take(), &slot.id) else {
                continue;
            };
            let key = DedupKey {
                consumer: &self.opts.name,
                message_id: id,
            };
            let finish = if matches!(slot.settle, Settle::Ack { .. } | Settle::AckedInTx { .. }) {
                Finish::Complete(result.as_deref())
            } else {
                Finish::Release
            };
            items.push((key, token, finish));
            which.push(i);
        }
        if items.is_empty() {
            return;
        }
        let outcomes: Vec<Result<()>> = match claims.finish_batch(&items).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let text = e.to_chain_string();
                let failed = |_| {
                    Err(Error::new(
                        ErrorKind::Io,
                        format!("finishing claims failed: {text}"),
                    ))
                };
                items.iter().map(failed).collect()
            }
        };
        drop(items);
        let instruments = self.instruments();
        instruments.claims_in_progress.decrement(which.len() as f64);
        for (i, outcome) in which.into_iter().zip(outcomes) {
            if let Err(e) = outcome {
                if e.kind() == ErrorKind::Conflict {
                    instruments.fence_rejections.increment(1);
                }
                warn!(error = %e.to_chain_string(), "claim not finished; the delivery is left to its lease");
                if matches!(slots[i].settle, Settle::Ack { .. }) {
                    // Counted as applied at the commit; settled by no one here.
                    slots[i].settle = Settle::Done(Fate::Applied);
                }
            }
        }
    }
}
