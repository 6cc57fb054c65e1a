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
//!   and is acked as a [`Disposition::Duplicate`](justonce_core::Disposition::Duplicate)
//!   without running the handler.
//!
//! # A batch
//!
//! One transaction per batch; its dedup keys are claimed in one call
//! ([`DedupStore::claim_many`]). A message that fails rolls back alone: the batch rolls
//! back and runs again with a savepoint per message (see
//! [`BatchOptions::optimistic`]). Acks go out only after the commit. Bad input (no id, oversized payload, an id
//! seen before with another payload) is dead-lettered with a reason, never retried.
//!
//! # Where things are
//!
//! This file holds the type, its builders and the run entry points. `run.rs`: the worker
//! and purge loops, receive, hand-back. `batch.rs`: a batch's pipeline of steps and its
//! fault points. `pass.rs`: the optimistic and the careful pass, and the handler call.
//! `decide.rs`: the pure decisions (screening, settlements, conflicts, reasons).
//! `claims.rs`: claim mode. `settle.rs`: the breaker's judgement, settling, the ack inside
//! the transaction.

mod batch;
mod breaker;
mod claims;
mod decide;
mod explain;
mod fault;
mod gate;
mod handler;
mod observe;
mod options;
mod pass;
mod run;
mod settle;
mod telemetry;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use justonce_core::{
    ClaimStore, DedupStore, Error, ExponentialBackoff, MessageId, OutboxStore, Result, Semantics,
    Source, TransactionalAck,
};

use breaker::Breaker;
pub use breaker::BreakerOptions;
pub use explain::{explain, Explanation, Outcome};
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
pub use telemetry::Health;
use telemetry::{Fate, Instruments};

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
    outbox: Option<Arc<dyn OutboxStore<Tx = S::Tx>>>,
    breaker: Mutex<Breaker>,
    /// How many deliveries a batch takes now ([`batch::Window`]).
    window: batch::Window,
    /// Whether batches take the consumer's turn in the store now ([`batch::Turns`]).
    turns: batch::Turns,
    /// Batches that share a lock key run one after the other ([`gate::Gate`]).
    gate: gate::Gate,
    /// Registered at the first batch, so that a recorder installed before it sees them.
    instruments: OnceLock<Instruments>,
    health: Health,
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
    /// Its id was seen before with another payload (for the metrics' outcome).
    conflict: bool,
}

#[derive(Debug, PartialEq)]
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
    /// Nothing left to do: at-most-once acked it before handling, or claim mode left it to
    /// its lease. What became of it, for the metrics.
    Done(Fate),
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
        let horizon = opts.redelivery_horizon(source.redelivery_delay());
        if let Some(retention) = opts.dedup.retention {
            if opts.semantics == Semantics::EffectivelyOnce && retention <= horizon {
                return Err(Error::config(format!(
                    "dedup retention of {retention:?} is not longer than the redelivery horizon of \
                     {horizon:?} (retries x backoff_max + attempts x transport delay): a message \
                     redelivered after its record is purged would be applied twice; raise retention \
                     above {horizon:?} or lower max_attempts/backoff_max"
                )));
            }
        }
        if let Some(expiry) = store.expiry() {
            if opts.semantics == Semantics::EffectivelyOnce && expiry <= horizon {
                return Err(Error::config(format!(
                    "the store keeps dedup records for {expiry:?} (their expiry), not longer than \
                     the redelivery horizon of {horizon:?} (retries x backoff_max + attempts x \
                     transport delay): a message redelivered after its record expired would be \
                     applied twice; raise the store's expiry above {horizon:?} or lower \
                     max_attempts/backoff_max"
                )));
            }
        }
        let backoff = ExponentialBackoff::new(opts.retry.backoff_base, opts.retry.backoff_max)
            .with_seed(opts.retry.seed);
        let breaker = Mutex::new(Breaker::new(opts.breaker.clone()));
        let window = batch::Window::new(opts.batching.size);
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
                outbox: None,
                breaker,
                window,
                turns: batch::Turns::default(),
                gate: gate::Gate::default(),
                instruments: OnceLock::new(),
                health: Health::default(),
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

    /// Gives the handlers an outbox to send follow-up messages through
    /// ([`Context::send`]): what a handler sends is written in its batch's transaction, in
    /// the same database as its effects and its dedup record, and leaves only after the
    /// commit, by a [`Relay`](crate::relay::Relay) of that outbox. Call before running.
    ///
    /// ```no_run
    /// use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx};
    /// use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Result};
    ///
    /// struct Pay;
    ///
    /// impl Handler<SqliteTx> for Pay {
    ///     async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
    ///         // … apply the payment in `tx` …
    ///         # let _ = tx;
    ///         cx.send_keyed("account-7", Message::new(r#"{"receipt":"for the payment"}"#))?;
    ///         Ok(Disposition::Ok)
    ///     }
    /// }
    ///
    /// # async fn run() -> Result<()> {
    /// let store = SqliteStore::open("sqlite:app.db").await?;
    /// let outbox = store.outbox().await?;
    /// let payments = SqliteQueue::open("sqlite:queue.db", "payments").await?;
    /// let consumer = Consumer::new(ConsumerOptions::new("payments"), payments, store, Pay)?
    ///     .with_outbox(outbox);
    /// # Ok(()) }
    /// ```
    pub fn with_outbox(self, outbox: impl OutboxStore<Tx = S::Tx>) -> Self {
        let outbox: Arc<dyn OutboxStore<Tx = S::Tx>> = Arc::new(outbox);
        self.modify(|inner| inner.outbox = Some(outbox))
    }

    /// Sets the claim store that [`Idempotency::Claim`] takes its claims in. Call before running.
    ///
    /// Fails when the store forgets completed claims by expiry ([`ClaimStore::expiry`], a
    /// Redis key's TTL) no later than the redelivery horizon (contract 6): a message
    /// delivered again after its claim expired would have its effect twice.
    pub fn with_claims(self, claims: Arc<dyn ClaimStore>) -> Result<Self> {
        if let Some(expiry) = claims.expiry() {
            let horizon = self
                .inner
                .opts
                .redelivery_horizon(self.inner.source.redelivery_delay());
            if expiry <= horizon {
                return Err(Error::config(format!(
                    "the claim store keeps completed claims for {expiry:?}, not longer than the \
                     redelivery horizon of {horizon:?} (retries x backoff_max + attempts x \
                     transport delay): a message redelivered after its claim expired would \
                     have its effect again; raise the store's expiry above {horizon:?} or lower \
                     max_attempts/backoff_max"
                )));
            }
        }
        Ok(self.modify(|inner| inner.claims = Some(claims)))
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

    /// Its readiness, for a probe: ready while it runs, no worker pauses after a failed
    /// batch and the breaker is closed ([`Health::ready`]). Take it before running.
    pub fn health(&self) -> Health {
        self.inner.health.clone()
    }

    /// The options.
    pub fn options(&self) -> &ConsumerOptions {
        &self.inner.opts
    }

    /// Receives one batch (waiting up to `receive_wait` for it) and processes it.
    pub async fn run_once(&self) -> Result<BatchReport> {
        self.check_ready()?;
        let (batch, _) = self.inner.receive_batch().await?;
        if batch.is_empty() {
            return Ok(BatchReport::default());
        }
        self.inner.process_or_singly(&batch).await
    }

    /// Runs `concurrency` batch loops until `shutdown` resolves, then stops receiving,
    /// finishes the batches in flight (commit and ack) and returns. A receive under way
    /// when `shutdown` resolves is not cancelled: it returns within `receive_wait`, and
    /// what it got goes back to the queue without counting an attempt.
    pub async fn run_until(&self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        self.check_ready()?;
        self.inner.health.set_running(true);
        let result = self.run_tasks(shutdown).await;
        self.inner.health.set_running(false);
        result
    }

    async fn run_tasks(&self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        let mut tasks = crate::tasks::Supervisor::new();
        for worker in 0..self.inner.opts.batching.concurrency {
            let inner = self.inner.clone();
            tasks.spawn(|stop| async move { inner.worker(worker, stop).await });
        }
        if let Some(retention) = self.inner.opts.dedup.retention {
            let inner = self.inner.clone();
            tasks.spawn(|stop| async move { inner.purge_loop(retention, stop).await });
        }
        tasks.run_until("a consumer task", shutdown).await
    }
}

impl<S, H> Inner<S, H>
where
    S: DedupStore,
    H: Handler<S::Tx>,
{
    /// The consumer's instruments, registered at the first call.
    pub(super) fn instruments(&self) -> &Instruments {
        self.instruments.get_or_init(|| {
            Instruments::register(self.source.system(), self.source.queue(), &self.opts.name)
        })
    }

    pub(super) fn effectively_once(&self, idempotency: Idempotency) -> bool {
        self.opts.semantics == Semantics::EffectivelyOnce
            && self.opts.dedup.idempotency == idempotency
    }
}
