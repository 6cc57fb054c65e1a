//! The relay: publishes an outbox's committed rows through any [`Publisher`], and marks
//! each sent only after its publish is durable (confirm, then mark).
//!
//! - **Several relays at once** (tasks of one relay, relay processes): the outbox leases
//!   each row to one of them ([`OutboxStore::take`]); a relay that dies leaves its rows to
//!   the others when their lease runs out.
//! - **Order per key**: rows of one ordering key go out in the order they were enqueued,
//!   one relay at a time per key; rows of different keys and rows with none in parallel.
//!   A publish is bounded by [`RelayOptions::publish_timeout`], shorter than the lease, so
//!   a key's next rows are never taken while its earlier ones may still be in flight.
//! - **Duplicates, never losses**: a relay that dies between the confirm and the mark (or
//!   whose mark fails) publishes those rows again under the same ids; the next consumer's
//!   dedup absorbs them.
//! - **A row that cannot be published** (unroutable, refused as invalid) is tried again
//!   with backoff and, after [`RelayOptions::max_attempts`], marked dead with its reason:
//!   its key waits behind it, visibly (`justonce outbox status`, the
//!   `justonce_outbox_dead` gauge). An error that is not the row's (the broker or the
//!   database unreachable, a timeout) counts no attempt: the rows go back and the relay
//!   pauses with backoff.
//! - **Pipelined**: each loop publishes a batch while it takes the next one (which marks
//!   the batch before it sent, in the same transaction): one transaction per batch
//!   besides its publish, and the publisher never waits for the database.
//! - **Tidy**: every [`RelayOptions::tidy_interval`] the relay calls
//!   [`OutboxStore::tidy`] (a `VACUUM` on PostgreSQL), so deleted rows do not pile up at
//!   the head of the table between autovacuum's visits.
//! - **Wake-up**: after a take that found nothing, the relay waits on
//!   [`OutboxStore::wait_for_rows`] (PostgreSQL's `NOTIFY`, an in-process notification on
//!   SQLite) and polls every [`RelayOptions::poll_interval`] in any case.
//! - **Moving instead of publishing** ([`Relay::moving`]): when the queue is a table of the
//!   outbox's own database (a PostgreSQL queue beside a PostgreSQL outbox), each batch
//!   moves from the outbox into the queue in one transaction ([`OutboxMove`]): no publish,
//!   no confirm, no lease and no duplicate, at about the cost of a direct publish.
//!
//! ```no_run
//! use justonce::relay::{Relay, RelayOptions};
//! use justonce::sql::{SqliteQueue, SqliteStore};
//!
//! # async fn run() -> justonce::Result<()> {
//! let store = SqliteStore::open("sqlite:app.db").await?;
//! let outbox = store.outbox().await?;
//! let receipts = SqliteQueue::open("sqlite:queue.db", "receipts").await?;
//! let relay = Relay::new(outbox, receipts, RelayOptions::default())?;
//! relay.run_until(justonce::shutdown_signal()).await
//! # }
//! ```

mod options;
mod telemetry;

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use justonce_core::{
    Error, ErrorKind, ExponentialBackoff, Message, OutboxFailure, OutboxMove, OutboxRow,
    OutboxStore, Publisher, Result,
};
use tokio::sync::watch;
use tracing::{debug, warn};

pub use options::RelayOptions;
use telemetry::RelayInstruments;

/// Where a relay can be crashed in tests (feature `fault-injection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RelayFaultPoint {
    /// The rows' publishes are confirmed and not yet marked sent: a relay that dies here
    /// makes a duplicate at the broker.
    AfterConfirm,
}

/// Crashes a relay at a [`RelayFaultPoint`] (tests, the lab; feature `fault-injection`).
#[cfg_attr(not(feature = "fault-injection"), allow(unreachable_pub))]
#[async_trait::async_trait]
pub trait RelayFaultHook: Send + Sync {
    /// Whether to crash at `point` with `rows` in hand. Crashing here means the relay
    /// stops as a killed process would: its rows stay leased, unmarked.
    async fn crash_at(&self, point: RelayFaultPoint, rows: &[OutboxRow]) -> bool;
}

/// What one pass of a relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayReport {
    /// Rows taken.
    pub taken: usize,
    /// Rows published and marked sent.
    pub sent: usize,
    /// Rows whose publish failed and counted an attempt (dead ones included).
    pub failed: usize,
    /// Of them, rows that ran out of attempts and are dead now.
    pub dead: usize,
    /// Rows handed back without an attempt (behind a failed row of their key, or after an
    /// error that was not theirs).
    pub released: usize,
}

/// Publishes the rows of an outbox ([`OutboxStore`]) through a [`Publisher`]. See the
/// [module documentation](self).
pub struct Relay<O: OutboxStore> {
    inner: Arc<Inner<O>>,
}

impl<O: OutboxStore> Clone for Relay<O> {
    fn clone(&self) -> Self {
        Relay {
            inner: self.inner.clone(),
        }
    }
}

/// Where a relay's rows go.
enum Route {
    /// Published, confirmed, then marked sent.
    Publish(Arc<dyn Publisher>),
    /// Moved into a queue of the outbox's database, a batch a transaction.
    Move(Arc<dyn OutboxMove>),
}

struct Inner<O> {
    outbox: O,
    route: Route,
    opts: RelayOptions,
    retry: ExponentialBackoff,
    pause: ExponentialBackoff,
    faults: Option<Arc<dyn RelayFaultHook>>,
    instruments: OnceLock<RelayInstruments>,
}

impl<O: OutboxStore> Relay<O> {
    /// A relay of `outbox` into `publisher`. Fails when the options are unsafe: a batch
    /// or concurrency of 0, no attempts, or a publish timeout not shorter than the lease.
    pub fn new(outbox: O, publisher: impl Publisher + 'static, opts: RelayOptions) -> Result<Self> {
        Self::with_route(outbox, Route::Publish(Arc::new(publisher)), opts)
    }

    /// A relay that moves the rows of `outbox` into a queue of the outbox's own database
    /// through `mover` ([`OutboxMove`]), each batch in one transaction: a row leaves the
    /// outbox exactly when it enters the queue. Nothing is published, so nothing is
    /// confirmed, leased or sent twice; order per key, several relays at once, the
    /// wake-up, the tidy and the metrics are as with [`Relay::new`]. An error (the
    /// database unreachable) pauses a loop with backoff; no row is ever dead, as no row
    /// can be refused. A fault hook never fires: a move has no point between a publish and
    /// its mark.
    ///
    /// ```no_run
    /// use justonce::relay::{Relay, RelayOptions};
    /// use justonce::sql::{PgQueue, PgStore};
    ///
    /// # async fn run() -> justonce::Result<()> {
    /// let url = "postgres://app@127.0.0.1:5432/shop";
    /// let outbox = PgStore::open(url).await?.outbox().await?;
    /// let receipts = PgQueue::open(url, "receipts").await?;
    /// let mover = outbox.mover_into(&receipts).await?; // refused if not in this database
    /// let relay = Relay::moving(outbox, mover, RelayOptions::default().batch(500))?;
    /// relay.run_until(justonce::shutdown_signal()).await
    /// # }
    /// ```
    pub fn moving(outbox: O, mover: impl OutboxMove, opts: RelayOptions) -> Result<Self> {
        Self::with_route(outbox, Route::Move(Arc::new(mover)), opts)
    }

    fn with_route(outbox: O, route: Route, opts: RelayOptions) -> Result<Self> {
        opts.validate()?;
        let retry = ExponentialBackoff::new(opts.retry_base, opts.retry_max);
        let pause = ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(30));
        Ok(Relay {
            inner: Arc::new(Inner {
                outbox,
                route,
                opts,
                retry,
                pause,
                faults: None,
                instruments: OnceLock::new(),
            }),
        })
    }

    /// Installs a fault hook (feature `fault-injection`). Call before running.
    #[cfg(feature = "fault-injection")]
    pub fn with_fault_hook(self, hook: Arc<dyn RelayFaultHook>) -> Self {
        let mut inner = Arc::try_unwrap(self.inner)
            .unwrap_or_else(|_| panic!("with_fault_hook is called before the relay is shared"));
        inner.faults = Some(hook);
        Relay {
            inner: Arc::new(inner),
        }
    }

    /// The options.
    pub fn options(&self) -> &RelayOptions {
        &self.inner.opts
    }

    /// The outbox.
    pub fn outbox(&self) -> &O {
        &self.inner.outbox
    }

    /// Takes up to `batch` rows and publishes them, once.
    pub async fn relay_once(&self) -> Result<RelayReport> {
        self.inner.pass().await
    }

    /// Runs the relay on a task of its own, beside the rest of the program (a consumer, an
    /// HTTP server), until [`RunningRelay::stop`].
    ///
    /// ```no_run
    /// # use justonce::relay::{Relay, RelayOptions};
    /// # use justonce::sql::{SqliteQueue, SqliteStore};
    /// # async fn run() -> justonce::Result<()> {
    /// # let store = SqliteStore::open("sqlite:app.db").await?;
    /// # let receipts = SqliteQueue::open("sqlite:queue.db", "receipts").await?;
    /// let relay = Relay::new(store.outbox().await?, receipts, RelayOptions::default())?.spawn();
    /// // … run the consumers …
    /// relay.stop().await // the pass under way finishes, its rows marked
    /// # }
    /// ```
    pub fn spawn(&self) -> RunningRelay {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let relay = self.clone();
        let task = tokio::spawn(async move {
            relay
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        });
        RunningRelay { stop, task }
    }

    /// Runs `concurrency` relay loops until `shutdown` resolves; a pass under way then
    /// finishes (publish and mark) first. Errors that are not a row's pause a loop with
    /// backoff; the relay never stops on its own.
    pub async fn run_until(&self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let mut tasks = crate::tasks::Supervisor::new();
        for _ in 0..self.inner.opts.concurrency {
            let inner = self.inner.clone();
            tasks.spawn(|stop| async move { inner.run(stop).await });
        }
        let inner = self.inner.clone();
        tasks.spawn(|stop| async move { inner.poll_stats(stop).await });
        let inner = self.inner.clone();
        tasks.spawn(|stop| async move { inner.tidy(stop).await });
        tasks.run_until("a relay task", shutdown).await
    }
}

/// A relay running on a task of its own ([`Relay::spawn`]).
#[derive(Debug)]
pub struct RunningRelay {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl RunningRelay {
    /// Stops the relay: the passes under way finish (publish and mark), then it returns
    /// what [`Relay::run_until`] returned.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| Error::with_source(ErrorKind::Internal, "the relay task failed", e))?
    }
}

/// Rows a loop took, and when its take began (the lease runs from about then).
struct Taken {
    rows: Vec<OutboxRow>,
    at: Instant,
}

impl Taken {
    /// Whether a publish started now ends inside the rows' lease, however slow it is.
    fn publishable(&self, opts: &RelayOptions) -> bool {
        self.at.elapsed() + opts.publish_timeout < opts.lease
    }

    fn seqs(&self) -> Vec<u64> {
        self.rows.iter().map(|r| r.seq).collect()
    }
}

impl<O: OutboxStore> Inner<O> {
    fn instruments(&self) -> &RelayInstruments {
        self.instruments
            .get_or_init(|| RelayInstruments::register(&self.opts.name))
    }

    /// One relay loop, publishing or moving.
    async fn run(&self, stop: watch::Receiver<bool>) -> Result<()> {
        match &self.route {
            Route::Publish(publisher) => self.publish_loop(publisher, stop).await,
            Route::Move(mover) => self.move_loop(mover, stop).await,
        }
    }

    /// One moving loop: a batch a transaction, until a move finds nothing; then it waits
    /// for rows.
    async fn move_loop(
        &self,
        mover: &Arc<dyn OutboxMove>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        let mut failures = 0u32;
        while !*stop.borrow() {
            match self.move_batch(mover).await {
                Ok(moved) => {
                    failures = 0;
                    if moved == 0 {
                        self.idle(&mut stop).await;
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.paused(&e, failures, &mut stop).await;
                }
            }
        }
        Ok(())
    }

    /// Moves a batch and counts it sent.
    async fn move_batch(&self, mover: &Arc<dyn OutboxMove>) -> Result<usize> {
        let moved = mover.move_rows(self.opts.batch).await?;
        self.instruments().sent.increment(moved as u64);
        Ok(moved)
    }

    /// Waits for rows after a take or move that found none, or for the stop.
    async fn idle(&self, stop: &mut watch::Receiver<bool>) {
        tokio::select! {
            _ = self.outbox.wait_for_rows(self.opts.poll_interval) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }

    /// Logs a loop's error and pauses it with backoff.
    async fn paused(&self, e: &Error, failures: u32, stop: &mut watch::Receiver<bool>) {
        let pause = self.pause.delay(failures);
        warn!(
            relay = %self.opts.name,
            error = %e.to_chain_string(),
            advice = e.kind().advice(),
            ?pause,
            "relay pass failed; its rows go back and it pauses"
        );
        self.instruments().pauses.increment(1);
        crate::tasks::sleep_or_stop(pause, stop).await;
    }

    /// One publishing loop. Each batch's publish runs beside the take of the next one,
    /// which marks the batch before it sent: the publisher is never idle while the
    /// database works, and a batch costs one transaction besides its publish. The rows
    /// taken ahead are still leased while the batch before them is in flight, so no key of
    /// that batch is in them.
    async fn publish_loop(
        &self,
        publisher: &Arc<dyn Publisher>,
        mut stop: watch::Receiver<bool>,
    ) -> Result<()> {
        let mut failures = 0u32;
        // Rows published and confirmed, marked sent with the next take.
        let mut unmarked: Vec<u64> = Vec::new();
        // Rows taken while the batch before them was published.
        let mut ahead: Option<Taken> = None;
        while !*stop.borrow() {
            let taken = match ahead.take() {
                Some(t) if t.publishable(&self.opts) => Ok(t),
                Some(t) => {
                    // Held too long behind a slow publish to finish inside the lease.
                    self.give_back(&t.seqs()).await;
                    continue;
                }
                None => self.take(&unmarked).await.inspect(|_| unmarked.clear()),
            };
            let outcome = match taken {
                Ok(t) if t.rows.is_empty() => {
                    failures = 0;
                    if !unmarked.is_empty() {
                        // The last batch is in: mark it now (with a take), not after a wait.
                        continue;
                    }
                    self.idle(&mut stop).await;
                    continue;
                }
                Ok(t) => {
                    let mark = std::mem::take(&mut unmarked);
                    let (published, next) =
                        tokio::join!(self.publish_taken(publisher, t.rows), self.take(&mark));
                    match next {
                        Ok(next) => ahead = Some(next),
                        // Not marked: they go with the next take, which meets the error
                        // again if it lasts.
                        Err(_) => unmarked = mark,
                    }
                    published
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok((report, confirmed)) => {
                    failures = 0;
                    unmarked.extend(confirmed);
                    if report.released > 0 {
                        // Rows behind a failed one of their key went back: let the rest of
                        // the outbox go first rather than taking them again at once.
                        crate::tasks::sleep_or_stop(
                            self.opts.poll_interval.min(Duration::from_millis(50)),
                            &mut stop,
                        )
                        .await;
                    }
                }
                Err(e) => {
                    if let Some(t) = ahead.take() {
                        self.give_back(&t.seqs()).await;
                    }
                    failures = failures.saturating_add(1);
                    self.paused(&e, failures, &mut stop).await;
                }
            }
        }
        if let Some(t) = ahead.take() {
            self.give_back(&t.seqs()).await;
        }
        if !unmarked.is_empty() {
            if let Err(e) = self.mark_sent(&unmarked).await {
                warn!(error = %e, rows = unmarked.len(), "cannot mark the last rows sent; they go out again after their lease");
            }
        }
        Ok(())
    }

    /// Keeps the backlog gauges current.
    async fn poll_stats(&self, mut stop: watch::Receiver<bool>) -> Result<()> {
        while !*stop.borrow() {
            match self.outbox.outbox_stats().await {
                Ok(stats) => self.instruments().stats(&stats),
                Err(e) => debug!(error = %e, "cannot read the outbox's stats"),
            }
            crate::tasks::sleep_or_stop(self.opts.stats_interval, &mut stop).await;
        }
        Ok(())
    }

    /// Tidies the outbox's table now and then; a failure is logged, once until it heals.
    async fn tidy(&self, mut stop: watch::Receiver<bool>) -> Result<()> {
        let mut failing = false;
        while !crate::tasks::sleep_or_stop(self.opts.tidy_interval, &mut stop).await {
            match self.outbox.tidy().await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    warn!(relay = %self.opts.name, error = %e.to_chain_string(), advice = e.kind().advice(),
                          "cannot tidy the outbox's table; deleted rows stay until the database's own vacuum");
                }
                Err(e) => debug!(error = %e, "cannot tidy the outbox's table"),
            }
        }
        Ok(())
    }

    /// One take and its publish, its rows marked at once.
    async fn pass(&self) -> Result<RelayReport> {
        let publisher = match &self.route {
            Route::Publish(publisher) => publisher,
            Route::Move(mover) => {
                let moved = self.move_batch(mover).await?;
                return Ok(RelayReport {
                    taken: moved,
                    sent: moved,
                    ..RelayReport::default()
                });
            }
        };
        let taken = self.take(&[]).await?;
        let (report, confirmed) = self.publish_taken(publisher, taken.rows).await?;
        self.mark_sent(&confirmed).await?;
        Ok(report)
    }

    /// Marks rows sent on their own (not with a take) and counts them.
    async fn mark_sent(&self, seqs: &[u64]) -> Result<()> {
        if !seqs.is_empty() {
            self.outbox.mark_sent(seqs).await?;
            self.instruments().sent.increment(seqs.len() as u64);
        }
        Ok(())
    }

    /// Marks `sent` and takes up to a batch of rows, in one transaction.
    async fn take(&self, sent: &[u64]) -> Result<Taken> {
        let at = Instant::now();
        let (o, max, lease) = (&self.opts.owner, self.opts.batch, self.opts.lease);
        let rows = self.outbox.take_after_sent(sent, o, max, lease).await?;
        self.instruments().sent.increment(sent.len() as u64);
        Ok(Taken { rows, at })
    }

    /// Publishes taken rows; answers the report and the rows confirmed and not yet marked
    /// sent, for the caller to mark (with its next take, or at once).
    async fn publish_taken(
        &self,
        publisher: &Arc<dyn Publisher>,
        rows: Vec<OutboxRow>,
    ) -> Result<(RelayReport, Vec<u64>)> {
        let report = RelayReport {
            taken: rows.len(),
            ..RelayReport::default()
        };
        if rows.is_empty() {
            return Ok((report, Vec::new()));
        }
        let messages: Vec<Message> = rows.iter().map(|r| r.message.clone()).collect();
        let all: Vec<u64> = rows.iter().map(|r| r.seq).collect();
        let outcome = if messages.len() == 1 {
            self.publish(publisher.publish(&messages[0])).await
        } else {
            self.publish(publisher.publish_batch(&messages)).await
        };
        match outcome {
            Ok(()) => {
                self.crash_point(RelayFaultPoint::AfterConfirm, &rows)
                    .await?;
                let report = RelayReport {
                    sent: all.len(),
                    ..report
                };
                Ok((report, all))
            }
            Err(e) if !e.kind().is_message_fault() => {
                self.give_back(&all).await;
                Err(e)
            }
            // One of them is refused: find which, one at a time, in order; `singly` marks
            // the rows it sends itself.
            Err(_) => Ok((self.singly(publisher, rows, report).await?, Vec::new())),
        }
    }

    async fn publish(&self, publish: impl Future<Output = Result<()>>) -> Result<()> {
        match tokio::time::timeout(self.opts.publish_timeout, publish).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "a publish was not confirmed within {:?}",
                    self.opts.publish_timeout
                ),
            )),
        }
    }

    async fn singly(
        &self,
        publisher: &Arc<dyn Publisher>,
        rows: Vec<OutboxRow>,
        mut report: RelayReport,
    ) -> Result<RelayReport> {
        let mut blocked: HashSet<String> = HashSet::new();
        let mut sent = Vec::new();
        let mut back = Vec::new();
        let mut outage = None;
        for row in &rows {
            if outage.is_some() || row.key.as_ref().is_some_and(|k| blocked.contains(k)) {
                back.push(row.seq);
                continue;
            }
            match self.publish(publisher.publish(&row.message)).await {
                Ok(()) => {
                    self.crash_point(RelayFaultPoint::AfterConfirm, std::slice::from_ref(row))
                        .await?;
                    sent.push(row.seq);
                }
                Err(e) if e.kind().is_message_fault() => {
                    if let Some(k) = &row.key {
                        blocked.insert(k.clone());
                    }
                    let reason = e.to_chain_string();
                    let delay = self.retry.delay(row.attempts + 1);
                    let fate = self
                        .outbox
                        .mark_failed(row.seq, &reason, delay, self.opts.max_attempts)
                        .await?;
                    report.failed += 1;
                    if fate == OutboxFailure::Dead {
                        report.dead += 1;
                        warn!(
                            relay = %self.opts.name,
                            seq = row.seq,
                            key = row.key.as_deref(),
                            id = row.message.id().map(|i| i.as_str()),
                            %reason,
                            "outbox row is dead after {} attempts; its key waits behind it",
                            self.opts.max_attempts
                        );
                    } else {
                        debug!(seq = row.seq, %reason, ?delay, "outbox row refused; retrying later");
                    }
                    self.instruments().failed(fate);
                }
                Err(e) => {
                    back.push(row.seq);
                    outage = Some(e);
                }
            }
        }
        self.mark_sent(&sent).await?;
        report.sent = sent.len();
        report.released = back.len();
        self.give_back(&back).await;
        match outage {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// Hands rows back; a hand-back that fails leaves them to their lease.
    async fn give_back(&self, seqs: &[u64]) {
        if seqs.is_empty() {
            return;
        }
        if let Err(e) = self.outbox.release(seqs).await {
            debug!(error = %e, "cannot hand rows back; their lease runs out instead");
        }
    }

    async fn crash_point(&self, point: RelayFaultPoint, rows: &[OutboxRow]) -> Result<()> {
        let Some(hook) = &self.faults else {
            return Ok(());
        };
        if hook.crash_at(point, rows).await {
            return Err(Error::new(
                ErrorKind::Internal,
                format!("fault injected at {point:?}"),
            ));
        }
        Ok(())
    }
}
