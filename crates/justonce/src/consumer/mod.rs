//! The consumer: receive a batch, handle it in one transaction, commit, then settle.
//!
//! # The three semantics
//!
//! The only difference between them is *when* a delivery is acked relative to its effect
//! (contract 1 in ARCHITECTURE.md):
//!
//! - [`Semantics::AtMostOnce`]: the batch is acked as soon as it arrives, then handled. A
//!   crash in between loses those messages; the consumer itself never applies one twice.
//! - [`Semantics::AtLeastOnce`]: the batch is handled in one transaction, committed, then
//!   acked. A crash after the commit and before the ack (or a lost ack) makes the transport
//!   deliver the batch again, and the effect is applied twice.
//! - [`Semantics::EffectivelyOnce`]: as at-least-once, but each message first claims its
//!   dedup key `(consumer, message id)` in the same transaction. A redelivery finds the key
//!   and is acked as a [`Disposition::Duplicate`] without running the handler.
//!
//! # A batch
//!
//! One transaction per batch; its dedup keys are claimed in one call
//! ([`DedupStore::claim_many`]). A message that fails rolls back alone: the batch rolls
//! back and runs again with a savepoint per message (see
//! [`BatchOptions::optimistic`]). Acks go out only after the commit. Bad input (no id, oversized payload, an id
//! seen before with another payload) is dead-lettered with a reason, never retried.

mod breaker;
mod fault;
mod handler;
mod observe;
mod options;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce_core::{
    Claim, ClaimState, ClaimStore, DeadLetterReason, DedupKey, DedupStore, Delivery, Disposition,
    Error, ErrorKind, ExponentialBackoff, Fingerprint, Finish, Message, MessageId, Receipt, Result,
    Semantics, Source, TransactionalAck,
};
use tokio::sync::watch;
use tracing::{debug, error, warn};

pub use breaker::BreakerOptions;
use breaker::{Breaker, Change, Outcome};
#[cfg(feature = "fault-injection")]
pub use fault::FaultHook;
#[cfg(not(feature = "fault-injection"))]
use fault::FaultHook;
pub use fault::FaultPoint;
pub use handler::{Context, Handler};
pub use observe::CommitObserver;
pub use options::{
    BatchOptions, ConflictPolicy, ConsumerOptions, DedupOptions, Idempotency, RetryOptions,
};

/// A consumer: a [`Source`], a [`DedupStore`] and a [`Handler`] run under
/// [`ConsumerOptions`].
///
/// ```no_run
/// # use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Result};
/// # use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx};
/// # struct MyHandler;
/// # impl Handler<SqliteTx> for MyHandler {
/// #     async fn handle(&self, _: &Context<'_>, _: &mut SqliteTx) -> Result<Disposition> { Ok(Disposition::Ok) }
/// # }
/// # async fn run() -> Result<()> {
/// let queue = SqliteQueue::open("sqlite:queue.db", "orders").await?;
/// let store = SqliteStore::open("sqlite:app.db").await?;
/// let consumer = Consumer::new(ConsumerOptions::new("billing"), queue, store, MyHandler)?;
/// consumer.run_until(justonce::shutdown_signal()).await?;
/// # Ok(()) }
/// ```
pub struct Consumer<S: DedupStore, H> {
    inner: Arc<Inner<S, H>>,
}

struct Inner<S: DedupStore, H> {
    source: Arc<dyn Source>,
    store: Arc<S>,
    handler: H,
    opts: ConsumerOptions,
    backoff: ExponentialBackoff,
    faults: Option<Arc<dyn FaultHook>>,
    observer: Option<Arc<dyn CommitObserver>>,
    claims: Option<Arc<dyn ClaimStore>>,
    tx_ack: Option<Arc<dyn TransactionalAck<S::Tx>>>,
    breaker: Mutex<Breaker>,
}

/// What happened to one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Deliveries in the batch.
    pub received: usize,
    /// Handler runs.
    pub handled: usize,
    /// Deliveries acked (whatever their outcome).
    pub acked: usize,
    /// Acked as duplicates without (or after) running the handler.
    pub duplicates: usize,
    /// Handed back for a later retry.
    pub retried: usize,
    /// Dead-lettered.
    pub dead_lettered: usize,
    /// Handed back without counting an attempt, because the breaker is open for the reason
    /// they failed with (see [`BreakerOptions`]).
    pub released: usize,
    /// The batch was abandoned by a fault hook's crash.
    pub crashed: bool,
}

impl BatchReport {
    /// The report of two batches run one after the other.
    fn merge(self, other: BatchReport) -> BatchReport {
        BatchReport {
            received: self.received + other.received,
            handled: self.handled + other.handled,
            acked: self.acked + other.acked,
            duplicates: self.duplicates + other.duplicates,
            retried: self.retried + other.retried,
            dead_lettered: self.dead_lettered + other.dead_lettered,
            released: self.released + other.released,
            crashed: self.crashed || other.crashed,
        }
    }
}

/// One delivery's state through a batch.
#[derive(Debug)]
struct Slot {
    settle: Settle,
    /// The id the id strategy derived.
    id: Option<MessageId>,
    /// The claim's fencing token (claim mode).
    token: Option<u64>,
    /// Why the message failed (a retry or a dead letter of its own), for the breaker.
    failure: Option<String>,
}

#[derive(Debug)]
enum Settle {
    Pending,
    Ack {
        duplicate: bool,
    },
    /// Acked inside the batch's transaction ([`Consumer::with_transactional_ack`]).
    AckedInTx {
        duplicate: bool,
    },
    Nack(Duration),
    DeadLetter(String),
    /// Handed back without counting an attempt: the breaker is open for its failure.
    Release,
    /// At-most-once: acked before handling, nothing left to do.
    Done,
}

impl<S, H> Consumer<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// A consumer of `source` that runs `handler` in transactions of `store`. A source or
    /// store shared with other parts of the program goes in as an `Arc` (an
    /// `Arc<dyn Source>` from [`Transport`](crate::backend::Transport), an `Arc<PgStore>`).
    ///
    /// Fails when the options are unsafe: an invalid name, a batch size of 0, or a dedup
    /// retention shorter than the redelivery horizon (contract 6 in ARCHITECTURE.md).
    pub fn new(
        opts: ConsumerOptions,
        source: impl Source + 'static,
        store: S,
        handler: H,
    ) -> Result<Self> {
        let source: Arc<dyn Source> = Arc::new(source);
        let store = Arc::new(store);
        justonce_core::validate_consumer_name(&opts.name)?;
        opts.dedup.id_strategy.validate()?;
        if opts.batching.size == 0 || opts.batching.concurrency == 0 || opts.retry.max_attempts == 0
        {
            return Err(Error::config(
                "batch_size, concurrency and max_attempts must each be at least 1",
            ));
        }
        if let Some(retention) = opts.dedup.retention {
            let horizon = opts.redelivery_horizon(source.redelivery_delay());
            if opts.semantics == Semantics::EffectivelyOnce && retention <= horizon {
                return Err(Error::config(format!(
                    "dedup retention of {retention:?} is not longer than the redelivery horizon of \
                     {horizon:?} (retries x backoff_max + attempts x transport delay): a message \
                     redelivered after its record is purged would be applied twice; raise retention \
                     above {horizon:?} or lower max_attempts/backoff_max"
                )));
            }
        }
        let backoff = ExponentialBackoff::new(opts.retry.backoff_base, opts.retry.backoff_max)
            .with_seed(opts.retry.seed);
        let breaker = Mutex::new(Breaker::new(opts.breaker.clone()));
        Ok(Consumer {
            inner: Arc::new(Inner {
                source,
                store,
                handler,
                opts,
                backoff,
                faults: None,
                observer: None,
                claims: None,
                tx_ack: None,
                breaker,
            }),
        })
    }

    /// Installs a fault hook (tests, demo, lab; feature `fault-injection`). Call before
    /// running.
    #[cfg(feature = "fault-injection")]
    pub fn with_fault_hook(self, hook: Arc<dyn FaultHook>) -> Self {
        self.modify(|inner| inner.faults = Some(hook))
    }

    /// Tells `observer` of every batch this consumer commits ([`CommitObserver`]). Call
    /// before running.
    pub fn with_commit_observer(self, observer: Arc<dyn CommitObserver>) -> Self {
        self.modify(|inner| inner.observer = Some(observer))
    }

    /// Sets the claim store that [`Idempotency::Claim`] takes its claims in. Call before running.
    pub fn with_claims(self, claims: Arc<dyn ClaimStore>) -> Self {
        self.modify(|inner| inner.claims = Some(claims))
    }

    /// Acks each batch inside its own transaction, through `acker`: the queue lives in the
    /// store's database (the PostgreSQL queue with the PostgreSQL store), so a delivery is
    /// gone if and only if its effects committed. No crash between commit and ack, no lost
    /// ack, hence no redelivery: exactly-once within that database. Keep effectively-once
    /// semantics with it: the dedup record still absorbs messages *published* twice.
    ///
    /// Dead letters and retries are still settled after the commit. Refused (at run time)
    /// with at-most-once, which acks before the transaction begins. Call before running.
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] mod doc {
    /// # use std::sync::Arc;
    /// # use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Result};
    /// # use justonce::sql::{PgQueue, PgStore, PgTx};
    /// # struct MyHandler;
    /// # impl Handler<PgTx> for MyHandler {
    /// #     async fn handle(&self, _: &Context<'_>, _: &mut PgTx) -> Result<Disposition> { Ok(Disposition::Ok) }
    /// # }
    /// # async fn run() -> Result<()> {
    /// let url = "postgres://app@127.0.0.1:5432/shop";
    /// let queue = PgQueue::open(url, "orders").await?;
    /// let store = PgStore::open(url).await?;
    /// let consumer = Consumer::new(ConsumerOptions::new("billing"), queue.clone(), store, MyHandler)?
    ///     .with_transactional_ack(Arc::new(queue));
    /// consumer.run_until(justonce::shutdown_signal()).await?;
    /// # Ok(()) }
    /// # }
    /// # fn main() {}
    /// ```
    pub fn with_transactional_ack(self, acker: Arc<dyn TransactionalAck<S::Tx>>) -> Self {
        self.modify(|inner| inner.tx_ack = Some(acker))
    }

    fn modify(mut self, f: impl FnOnce(&mut Inner<S, H>)) -> Self {
        // Only `run_until` shares the inner state, with tasks it joins before it returns,
        // and it borrows the consumer: a builder method always holds the only reference.
        let inner = Arc::get_mut(&mut self.inner)
            .unwrap_or_else(|| unreachable!("a Consumer is shared only while it runs"));
        f(inner);
        self
    }

    fn check_ready(&self) -> Result<()> {
        if self.inner.effectively_once(Idempotency::Claim) && self.inner.claims.is_none() {
            return Err(Error::config(
                "idempotency Claim needs a claim store: call Consumer::with_claims before running",
            ));
        }
        if self.inner.tx_ack.is_some() && self.inner.opts.semantics == Semantics::AtMostOnce {
            return Err(Error::config(
                "a transactional ack needs at-least-once or effectively-once semantics: \
                 at-most-once acks before the transaction begins",
            ));
        }
        Ok(())
    }

    /// The options.
    pub fn options(&self) -> &ConsumerOptions {
        &self.inner.opts
    }

    /// Receives one batch (waiting up to `receive_wait` for it) and processes it.
    pub async fn run_once(&self) -> Result<BatchReport> {
        self.check_ready()?;
        let batch = self.inner.receive_batch().await?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        let result = self.inner.process_or_singly(&batch).await;
        if result.is_err() {
            self.inner.give_back(&batch).await;
        }
        result
    }

    /// Runs `concurrency` batch loops until `shutdown` resolves, then stops receiving,
    /// finishes the batches in flight (commit and ack) and returns. A receive under way
    /// when `shutdown` resolves is not cancelled: it returns within `receive_wait`, and
    /// what it got goes back to the queue without counting an attempt.
    pub async fn run_until(&self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        self.check_ready()?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..self.inner.opts.batching.concurrency {
            let inner = self.inner.clone();
            let stop = stop_rx.clone();
            tasks.spawn(async move { inner.worker(worker, stop).await });
        }
        if let Some(retention) = self.inner.opts.dedup.retention {
            let inner = self.inner.clone();
            let stop = stop_rx.clone();
            tasks.spawn(async move { inner.purge_loop(retention, stop).await });
        }
        tokio::pin!(shutdown);
        let mut first_error = None;
        tokio::select! {
            _ = &mut shutdown => {}
            Some(res) = tasks.join_next() => {
                first_error = flatten(res).err();
            }
        }
        let _ = stop_tx.send(true);
        while let Some(res) = tasks.join_next().await {
            if let Err(e) = flatten(res) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

fn flatten(res: std::result::Result<Result<()>, tokio::task::JoinError>) -> Result<()> {
    res.map_err(|e| Error::with_source(ErrorKind::Internal, "a consumer task failed", e))?
}

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    async fn receive_batch(&self) -> Result<Vec<Delivery>> {
        let max = self.opts.batching.size;
        let mut batch = self
            .source
            .receive(max, self.opts.batching.receive_wait)
            .await?;
        if !batch.is_empty() && batch.len() < max && !self.opts.batching.linger.is_zero() {
            tokio::time::sleep(self.opts.batching.linger).await;
            let more = self
                .source
                .receive(max - batch.len(), Duration::ZERO)
                .await?;
            batch.extend(more);
        }
        // Every consumer takes the batch's row locks in one order, so that two batches
        // touching the same rows wait for each other instead of deadlocking. The sort is
        // stable: messages of one key keep their order.
        batch.sort_by_cached_key(|d| self.handler.lock_key(&d.message));
        Ok(batch)
    }

    async fn worker(&self, worker: usize, mut stop: watch::Receiver<bool>) -> Result<()> {
        let mut failures = 0u32;
        while !*stop.borrow() {
            // A receive is not cancelled when the shutdown comes: a SQL queue's receive is a
            // write transaction, and one dropped midway leaves its connection holding the
            // write lock until that connection is used again. It returns within
            // `receive_wait`; what it got then goes back, uncounted.
            let batch = self.receive_batch().await;
            if *stop.borrow() {
                if let Ok(b) = &batch {
                    self.give_back(b).await;
                }
                break;
            }
            let result = match batch {
                Ok(b) if b.is_empty() => continue,
                Ok(b) => {
                    let result = self.process_or_singly(&b).await;
                    if result.is_err() {
                        self.give_back(&b).await;
                    }
                    result
                }
                Err(e) => Err(e),
            };
            // A batch that failed, or whose failures the open breaker handed back, is not
            // the messages' fault: pause, then the next batch is the probe. A consumer
            // never stops on its own; only `shutdown` ends it.
            let failed = match result {
                Ok(report) if report.released == 0 => {
                    failures = 0;
                    continue;
                }
                Ok(_) => None,
                Err(e) => Some(e),
            };
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
            tokio::select! {
                _ = stop.changed() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        Ok(())
    }

    async fn purge_loop(&self, retention: Duration, mut stop: watch::Receiver<bool>) -> Result<()> {
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
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                _ = tokio::time::sleep(self.opts.dedup.purge_interval) => {}
            }
        }
    }

    fn reason(&self, d: &Delivery, error: String) -> DeadLetterReason {
        DeadLetterReason {
            error,
            attempts: d.attempt,
            source_queue: self.source.queue().to_owned(),
            consumer: self.opts.name.clone(),
        }
    }

    fn effectively_once(&self, idempotency: Idempotency) -> bool {
        self.opts.semantics == Semantics::EffectivelyOnce
            && self.opts.dedup.idempotency == idempotency
    }

    /// Bad input is settled before the handler ever sees it; the id is derived here.
    fn screen(&self, d: &Delivery) -> Slot {
        let dead = |reason: String| Slot {
            settle: Settle::DeadLetter(reason.clone()),
            id: None,
            token: None,
            failure: Some(reason),
        };
        let len = d.message.payload().len();
        if len > self.opts.max_payload_bytes {
            return dead(format!(
                "invalid input: payload of {len} bytes exceeds the limit of {} bytes",
                self.opts.max_payload_bytes
            ));
        }
        match self.opts.dedup.id_strategy.derive(&d.message) {
            Ok(Some(id)) => Slot {
                settle: Settle::Pending,
                id: Some(id),
                token: None,
                failure: None,
            },
            Ok(None) => dead(format!(
                "invalid input: message has no id (missing or empty under the {} id strategy); \
                 it cannot be deduplicated",
                self.opts.dedup.id_strategy.describe()
            )),
            Err(e) => dead(format!("invalid input: {}", e.to_chain_string())),
        }
    }

    async fn crash_at(&self, point: FaultPoint, batch: &[Delivery], slots: &[Slot]) -> bool {
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

    /// The disposition of a failed or retried message, with the attempt limit applied.
    fn settle_for(&self, d: &Delivery, disposition: Disposition) -> Settle {
        match disposition {
            Disposition::Ok => Settle::Ack { duplicate: false },
            Disposition::Duplicate => Settle::Ack { duplicate: true },
            Disposition::DeadLetter { reason } => Settle::DeadLetter(reason),
            Disposition::Retry { after, reason } => {
                if d.attempt >= self.opts.retry.max_attempts {
                    Settle::DeadLetter(format!(
                        "gave up after {} attempts (max_attempts {}): {reason}",
                        d.attempt, self.opts.retry.max_attempts
                    ))
                } else {
                    Settle::Nack(after.unwrap_or_else(|| self.backoff.delay(d.attempt)))
                }
            }
        }
    }

    fn conflict(&self, id: &MessageId, stored: Fingerprint, fp: Fingerprint) -> Disposition {
        match self.opts.dedup.on_conflict {
            ConflictPolicy::Ignore => Disposition::Duplicate,
            ConflictPolicy::DeadLetter => Disposition::dead_letter(format!(
                "conflict: message id {id} was already processed with another payload \
                 (stored fingerprint {stored}, this one {fp})"
            )),
        }
    }

    fn context<'a>(&'a self, d: &'a Delivery, slot: &'a Slot) -> Context<'a> {
        Context {
            delivery: d,
            consumer: &self.opts.name,
            id: slot.id.as_ref(),
            token: slot.token,
            result: Mutex::new(None),
        }
    }

    /// Claim mode: takes the claims of the batch, in one call, before its transaction begins.
    async fn acquire_claims(
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
                ClaimState::Acquired { token } => slots[i].token = Some(token),
                // Held by someone else: look again after the backoff (the holder may finish
                // soon) or when its lease runs out, whichever is first. Not an attempt of
                // ours, so no attempt limit applies.
                ClaimState::InProgress { retry_after } => {
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
    async fn finish_claims(
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
        for (i, outcome) in which.into_iter().zip(outcomes) {
            if let Err(e) = outcome {
                warn!(error = %e.to_chain_string(), "claim not finished; the delivery is left to its lease");
                if matches!(slots[i].settle, Settle::Ack { .. }) {
                    slots[i].settle = Settle::Done;
                }
            }
        }
    }

    /// After a failed batch (not a crash): hands its deliveries back at once without
    /// counting an attempt ([`Source::release`]), best effort. Nothing is lost if this
    /// fails too: they come back when their lease runs out or their channel closes.
    /// Receipts already settled are ignored by the transport.
    async fn give_back(&self, batch: &[Delivery]) {
        let receipts: Vec<&Receipt> = batch.iter().map(|d| &d.receipt).collect();
        if let Err(e) = self.source.release(&receipts).await {
            debug!(error = %e.to_chain_string(), "could not hand the batch back; its leases will");
        }
    }

    /// Processes `batch`. A batch that fails on lock contention (a deadlock, a serialization
    /// failure) runs again at once one message per transaction: a transaction that locks
    /// the rows of one message waits for others but cannot close a cycle with them, so the
    /// batch is not failed again and again whole (halving it instead let each half meet the
    /// other consumer's batch again: 0.03x the throughput of one consumer on a hot set,
    /// against 0.16x). A message that still fails so goes back to the queue. At-most-once
    /// batches are acked before they run and are not run again.
    async fn process_or_singly(&self, batch: &[Delivery]) -> Result<BatchReport> {
        match self.process(batch).await {
            Err(e)
                if e.kind() == ErrorKind::Busy
                    && batch.len() > 1
                    && self.opts.semantics != Semantics::AtMostOnce =>
            {
                debug!(batch = batch.len(), error = %e.to_chain_string(), "lock contention: the batch runs again one message per transaction");
                let mut report = BatchReport::default();
                for one in batch.chunks(1) {
                    report = report.merge(self.process(one).await?);
                }
                Ok(report)
            }
            other => other,
        }
    }

    async fn process(&self, batch: &[Delivery]) -> Result<BatchReport> {
        let claims = if self.effectively_once(Idempotency::Claim) {
            Some(self.claims.as_deref().ok_or_else(|| {
                Error::config("idempotency Claim needs a claim store: call Consumer::with_claims")
            })?)
        } else {
            None
        };
        let mut slots: Vec<Slot> = batch.iter().map(|d| self.screen(d)).collect();
        let result = self.transact(batch, &mut slots, claims).await;
        if result.is_err() {
            if let Some(claims) = claims {
                // The batch goes back to the queue: let its claims go with it, or its own
                // next delivery would find them held until their lease runs out.
                for slot in &mut slots {
                    slot.settle = Settle::Release;
                }
                self.finish_claims(claims, &mut slots, &vec![None; batch.len()])
                    .await;
            }
        }
        result
    }

    /// The batch's transaction: claims, handlers, commit, then settle.
    async fn transact(
        &self,
        batch: &[Delivery],
        slots: &mut Vec<Slot>,
        claims: Option<&dyn ClaimStore>,
    ) -> Result<BatchReport> {
        let mut report = BatchReport {
            received: batch.len(),
            ..BatchReport::default()
        };
        let at_most_once = self.opts.semantics == Semantics::AtMostOnce;

        if at_most_once {
            let receipts: Vec<_> = batch
                .iter()
                .zip(slots.iter())
                .filter(|(_, s)| matches!(s.settle, Settle::Pending))
                .map(|(d, _)| &d.receipt)
                .collect();
            self.source.ack(&receipts).await?;
            report.acked += receipts.len();
            if self.crash_at(FaultPoint::AfterAck, batch, slots).await {
                report.crashed = true;
                return Ok(report);
            }
        }
        if let Some(claims) = claims {
            self.acquire_claims(claims, batch, slots).await?;
        }

        let mut results = vec![None; batch.len()];
        // Most batches fail nowhere: run them with no savepoint per message (two round trips
        // each saved) and, only when a message fails, roll the batch back and run it again
        // with a savepoint per message, so that the failing one rolls back alone.
        let optimistic = self.opts.batching.optimistic && claims.is_none();
        let (mut tx, claimed) = if optimistic && self.effectively_once(Idempotency::DedupTable) {
            let (tx, answers) = self.begin_claimed(batch, slots).await?;
            (tx, Some(answers))
        } else {
            (self.store.begin().await?, None)
        };
        let report_before = report;
        let failed = if optimistic {
            self.handle_fast(&mut tx, claimed, batch, slots, &mut results, &mut report)
                .await?
        } else {
            None
        };
        if !optimistic || failed.is_some() {
            let mut failed = failed;
            if optimistic {
                debug!(
                    batch = batch.len(),
                    "a message failed: the batch runs again with a savepoint per message"
                );
                self.store.rollback(tx).await?;
                tx = self.store.begin().await?;
                // Nothing but `screen` set the slots before the transaction (no claims, and
                // at-most-once's early ack leaves them as they were): derive them again.
                *slots = batch.iter().map(|d| self.screen(d)).collect();
                report = report_before;
                results = vec![None; batch.len()];
            }
            for (i, ((d, slot), result)) in batch
                .iter()
                .zip(slots.iter_mut())
                .zip(results.iter_mut())
                .enumerate()
            {
                if !matches!(slot.settle, Settle::Pending) {
                    continue;
                }
                // The message that failed keeps the answer it gave: the messages before it
                // wrote the same things again, so it would give it again.
                if let Some((_, disposition)) = failed.take_if(|(at, _)| *at == i) {
                    report.handled += 1;
                    self.decide(slot, d, disposition);
                    continue;
                }
                self.store.savepoint(&mut tx).await?;
                let disposition = self
                    .handle_one(&mut tx, d, slot, result, &mut report)
                    .await?;
                match disposition {
                    Disposition::Ok => self.store.release_savepoint(&mut tx).await?,
                    _ => self.store.rollback_to_savepoint(&mut tx).await?,
                }
                self.decide(slot, d, disposition);
            }
        }

        if let Some(acker) = &self.tx_ack {
            self.ack_in_tx(acker.as_ref(), &mut tx, batch, slots)
                .await?;
        }
        if self.crash_at(FaultPoint::BeforeCommit, batch, slots).await {
            report.crashed = true;
            return Ok(report); // the transaction is dropped: rolled back
        }
        self.store.commit(tx).await?;
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

    /// Acks the batch's acked deliveries in `tx`; a delivery whose lease ran out fails the
    /// whole batch (its transaction is dropped, so nothing of it commits).
    async fn ack_in_tx(
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

    /// Settles a handled delivery as `disposition` says, noting a failure's reason for
    /// the breaker.
    fn decide(&self, slot: &mut Slot, d: &Delivery, disposition: Disposition) {
        slot.failure = match &disposition {
            Disposition::Retry { reason, .. } | Disposition::DeadLetter { reason } => {
                Some(reason.clone())
            }
            Disposition::Ok | Disposition::Duplicate => None,
        };
        slot.settle = self.settle_after(d, disposition);
    }

    /// The settlement of a handled delivery.
    fn settle_after(&self, d: &Delivery, disposition: Disposition) -> Settle {
        if self.opts.semantics != Semantics::AtMostOnce {
            return self.settle_for(d, disposition);
        }
        match disposition {
            Disposition::DeadLetter { reason } => Settle::DeadLetter(reason),
            Disposition::Retry { reason, .. } => {
                warn!(consumer = %self.opts.name, %reason, "at-most-once: message acked before it failed; it is lost");
                Settle::Done
            }
            _ => Settle::Done,
        }
    }

    /// Begins the batch's transaction with its dedup keys claimed in it (one
    /// `DedupStore::begin_with_claims` call): one answer per pending message with an id.
    async fn begin_claimed(
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

    /// Handles the batch with no savepoints, its dedup keys already claimed (`claimed`, by
    /// [`Inner::begin_claimed`]) when the method is the dedup table. Stops at
    /// the first handler that fails (answers other than `Ok`) and returns its place and
    /// answer: its writes cannot be rolled back alone, so the caller rolls the whole batch
    /// back and runs it with savepoints. Duplicates and conflicts found by the claim wrote
    /// nothing and settle here.
    async fn handle_fast(
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

    async fn handle_one(
        &self,
        tx: &mut S::Tx,
        d: &Delivery,
        slot: &Slot,
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
                Claim::Conflict { stored } => return Ok(self.conflict(id, stored, fp)),
            }
        }
        self.run_handler(tx, d, slot, result, report).await
    }

    /// Runs the handler on one delivery whose dedup key (if any) is claimed.
    async fn run_handler(
        &self,
        tx: &mut S::Tx,
        d: &Delivery,
        slot: &Slot,
        result: &mut Option<Vec<u8>>,
        report: &mut BatchReport,
    ) -> Result<Disposition> {
        report.handled += 1;
        let cx = self.context(d, slot);
        let outcome = self.handler.handle(&cx, tx).await;
        *result = cx.take_result();
        Ok(match outcome {
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

    /// Shows the breaker what the batch came to and, while it is open, turns the failures
    /// it holds into releases.
    fn judge(&self, slots: &mut [Slot]) {
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
            Change::Opened(reason) => error!(
                consumer = %self.opts.name,
                threshold = self.opts.breaker.threshold,
                window = ?self.opts.breaker.window,
                %reason,
                "breaker open: the last messages all failed for the same reason, which looks like \
                 a deploy or configuration mistake rather than bad messages; messages failing \
                 for it are handed back instead of dead-lettered, and the consumer pauses until \
                 a message succeeds"
            ),
            Change::Closed => {
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

    async fn settle(
        &self,
        batch: &[Delivery],
        mut slots: Vec<Slot>,
        report: &mut BatchReport,
    ) -> Result<()> {
        self.judge(&mut slots);
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
                    let reason = self.reason(d, error);
                    warn!(consumer = %self.opts.name, id = ?d.message.id().map(|i| i.as_str()), %reason, "dead-lettered");
                    self.source.dead_letter(d, &reason).await?;
                }
                Settle::Release => released.push(&d.receipt),
                Settle::Done | Settle::Pending => {}
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
