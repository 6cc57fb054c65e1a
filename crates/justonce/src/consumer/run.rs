//! The loops a running consumer is made of: a worker per unit of concurrency (receive a
//! batch, process it, pause after a failure that is not the messages'), the purge, and the
//! hand-back of a batch that failed.

use std::time::Duration;

use justonce_core::{DedupStore, Delivery, Receipt, Result};
use tokio::sync::watch;
use tracing::{debug, error, warn};

use super::{Fate, Handler, Inner};

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// A batch, in lock order, and its lock keys as the gate takes them.
    pub(super) async fn receive_batch(&self) -> Result<(Vec<Delivery>, Vec<String>)> {
        let max = self.window.get();
        let mut batch = self
            .source
            .receive(max, self.opts.batching.receive_wait)
            .await?;
        if !batch.is_empty() && batch.len() < max && !self.opts.batching.linger.is_zero() {
            tokio::time::sleep(self.opts.batching.linger).await;
            // The batch in hand is received: a failed top-up must not drop it (its
            // deliveries would stay held, unsettled, until the source let go of them).
            match self.source.receive(max - batch.len(), Duration::ZERO).await {
                Ok(more) => batch.extend(more),
                Err(e) => debug!(error = %e, "topping up the batch failed; it runs as it is"),
            }
        }
        // Every consumer takes the batch's row locks in one order, so that two batches
        // touching the same rows wait for each other instead of deadlocking. The sort is
        // stable: messages of one key keep their order; those without one come first
        // (`Inner::take_turn` reads that).
        let mut keyed: Vec<(Option<String>, Delivery)> = batch
            .into_iter()
            .map(|d| (self.handler.lock_key(&d.message), d))
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let (keys, batch): (Vec<Option<String>>, Vec<Delivery>) = keyed.into_iter().unzip();
        let instruments = self.instruments();
        instruments.received.increment(batch.len() as u64);
        let again = batch.iter().filter(|d| d.redelivered).count();
        instruments.redelivered.increment(again as u64);
        Ok((batch, super::gate::keys(keys)))
    }

    pub(super) async fn worker(
        &self,
        worker: usize,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        let mut failures = 0u32;
        while !*stop.borrow() {
            // A receive is not cancelled when the shutdown comes: a SQL queue's receive is a
            // write transaction, and one dropped midway leaves its connection holding the
            // write lock until that connection is used again. It returns within
            // `receive_wait`; what it got then goes back, uncounted.
            let batch = self.receive_batch().await;
            if *stop.borrow() {
                if let Ok((b, _)) = &batch {
                    self.instruments().outcome(Fate::Released, b.len());
                    self.give_back(b).await;
                }
                break;
            }
            let result = match batch {
                Ok((b, _)) if b.is_empty() => continue,
                // A batch that fails is handed back inside. Batches of this consumer that
                // share a lock key run one after the other (`gate.rs`).
                Ok((b, keys)) => {
                    let _pass = match self.opts.batching.concurrency {
                        1 => None,
                        _ => Some(self.gate.enter(keys).await),
                    };
                    self.process_or_singly(&b).await
                }
                Err(e) => Err(e),
            };
            // A batch that failed, or whose failures the open breaker handed back, is not
            // the messages' fault: pause, then the next batch is the probe. A consumer
            // never stops on its own; only `shutdown` ends it.
            let failed = match result {
                Ok(report) if report.released == 0 => {
                    if failures > 0 {
                        self.pausing(false);
                    }
                    failures = 0;
                    continue;
                }
                Ok(_) => None,
                Err(e) => Some(e),
            };
            if failures == 0 {
                self.pausing(true);
            }
            failures += 1;
            let pause = self.backoff.delay(failures);
            if let Some(e) = failed {
                let kind = e.kind();
                let text = e.to_chain_string();
                if kind.is_transient() {
                    warn!(worker, consumer = %self.opts.name, %kind, error = %text, ?pause, "batch failed and was handed back; retrying after a pause");
                } else {
                    error!(worker, consumer = %self.opts.name, %kind, error = %text, advice = kind.advice(), ?pause, "batch failed for a reason that is not the messages': it was handed back without counting an attempt, and the consumer pauses until this is fixed");
                }
            }
            if crate::tasks::sleep_or_stop(pause, &mut stop).await {
                break;
            }
        }
        if failures > 0 {
            self.pausing(false);
        }
        Ok(())
    }

    /// A worker starts or ends its pauses after failed batches: the readiness and the gauge.
    fn pausing(&self, paused: bool) {
        let now = self.health.set_paused(paused);
        self.instruments().workers_paused.set(now as f64);
    }

    pub(super) async fn purge_loop(
        &self,
        retention: Duration,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        const BATCH: u32 = 1000;
        loop {
            loop {
                match self.store.purge(retention, BATCH).await {
                    Ok(n) if n == u64::from(BATCH) => tokio::task::yield_now().await,
                    Ok(_) => break,
                    Err(e) => {
                        warn!(error = %e.to_chain_string(), "dedup purge failed; will try again");
                        break;
                    }
                }
            }
            if let Some(claims) = &self.claims {
                loop {
                    match claims.purge(retention, BATCH).await {
                        Ok(n) if n == u64::from(BATCH) => tokio::task::yield_now().await,
                        Ok(_) => break,
                        Err(e) => {
                            warn!(error = %e.to_chain_string(), "claim purge failed; will try again");
                            break;
                        }
                    }
                }
            }
            if crate::tasks::sleep_or_stop(self.opts.dedup.purge_interval, &mut stop).await {
                return Ok(());
            }
        }
    }

    /// After a failed batch (not a crash): hands its deliveries back at once without
    /// counting an attempt ([`Source::release`]), best effort. Nothing is lost if this
    /// fails too: they come back when their lease runs out or their channel closes.
    /// Receipts already settled are ignored by the transport.
    pub(super) async fn give_back(&self, batch: &[Delivery]) {
        let receipts: Vec<&Receipt> = batch.iter().map(|d| &d.receipt).collect();
        if let Err(e) = self.source.release(&receipts).await {
            debug!(error = %e.to_chain_string(), "could not hand the batch back; its leases will");
        }
    }
}
