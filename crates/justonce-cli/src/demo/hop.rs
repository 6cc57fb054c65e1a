//! The demo's second hop (`--pipeline two-hop`): the payments consumer sends a receipt for
//! each payment through its outbox, a relay publishes the receipts (crashing now and then
//! between a confirm and its mark, so some go out twice), and a receipts consumer applies
//! them, under seeded crashes and lost acks of its own. Receipts are counted from the
//! business table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use justonce::relay::{Relay, RelayFaultHook, RelayFaultPoint, RelayOptions};
use justonce::{async_trait, Consumer, ConsumerOptions, OutboxRow, OutboxStore, Semantics};
use serde::Serialize;
use tokio::sync::oneshot;

use super::plan::{FaultCounts, Plan, PlanFaults};
use crate::bus::Bus;
use crate::orders::{Bank, ReceiptHandler, Tables};

/// What the receipts' hop came to, read from the receipts table and the receipts queue.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Receipts {
    /// Orders whose payment was applied: each should have exactly one receipt.
    pub(crate) expected: u64,
    /// `null` where the transport does not count deliveries (Kafka).
    pub(crate) deliveries: Option<u64>,
    pub(crate) handler_runs: u64,
    /// Receipt rows.
    pub(crate) effects: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    /// Relay passes crashed after their confirm, and the receipts they had published (each
    /// sent again once the dead pass's lease ran out).
    pub(crate) relay_crashes: u64,
    pub(crate) resent: u64,
    /// The receipts consumer's crashes and lost acks.
    pub(crate) faults_fired: FaultCounts,
}

/// Crashes every 17th relay pass after its confirm.
#[derive(Default)]
struct RelayCrashes {
    passes: AtomicU64,
    crashes: AtomicU64,
    resent: AtomicU64,
}

#[async_trait]
impl RelayFaultHook for RelayCrashes {
    async fn crash_at(&self, point: RelayFaultPoint, rows: &[OutboxRow]) -> bool {
        let n = self.passes.fetch_add(1, Ordering::Relaxed);
        let crash = point == RelayFaultPoint::AfterConfirm && n % 17 == 5;
        if crash {
            self.crashes.fetch_add(1, Ordering::Relaxed);
            self.resent.fetch_add(rows.len() as u64, Ordering::Relaxed);
        }
        crash
    }
}

/// The running second hop.
pub(super) struct SecondHop<B: Bank> {
    bus: Bus,
    outbox: B::Outbox,
    store: B,
    tables: Tables,
    crashes: Arc<RelayCrashes>,
    faults: Arc<PlanFaults>,
    runs: Arc<AtomicU64>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<justonce::Result<()>>,
}

/// What the second hop needs of the payments run.
pub(super) struct HopSetup<'a, B: Bank> {
    pub(super) transport: &'a str,
    pub(super) queue: String,
    pub(super) consumer: String,
    pub(super) semantics: Semantics,
    pub(super) lease: Duration,
    pub(super) batch_size: usize,
    pub(super) seed: u64,
    pub(super) max_payload_bytes: usize,
    pub(super) store: &'a B,
    pub(super) tables: &'a Tables,
    pub(super) plan: &'a Arc<Plan>,
    pub(super) topology: &'a crate::bus::Topology,
}

impl<B: Bank> SecondHop<B> {
    /// Opens the receipts queue and the outbox, and starts the relay and the receipts
    /// consumer. The payments consumer sends through [`SecondHop::outbox`].
    pub(super) async fn start(s: HopSetup<'_, B>) -> anyhow::Result<Self> {
        let prefetch = (s.batch_size * 4).min(usize::from(u16::MAX)) as u16;
        let bus = Bus::open(s.transport, &s.queue, s.lease, prefetch, s.topology).await?;
        let outbox = s.store.outbox(s.tables).await?;
        let relay_lease = s.lease.max(Duration::from_secs(1));
        let crashes = Arc::new(RelayCrashes::default());
        let relay = Relay::new(
            outbox.clone(),
            bus.publisher(),
            RelayOptions::default()
                .name(s.tables.outbox.clone())
                .lease(relay_lease)
                .publish_timeout(relay_lease / 3)
                .poll_interval(Duration::from_millis(100)),
        )?
        .with_fault_hook(crashes.clone());
        // Crash marks of its own (the same order ids, another seed): the payments' marks
        // fall on orders that at-most-once lost before they could send a receipt.
        let marks = Plan::new(
            s.plan.orders.len() as u64,
            s.seed ^ 0x9e37_79b9,
            s.max_payload_bytes,
        );
        let faults = Arc::new(PlanFaults::new(Arc::new(marks), bus.clone()));
        let handler = ReceiptHandler::<B>::new(s.tables.clone());
        let runs = handler.runs();
        let mut opts = ConsumerOptions::new(s.consumer);
        opts.semantics = s.semantics;
        opts.batching.size = s.batch_size;
        opts.batching.receive_wait = Duration::from_millis(100);
        opts.retry.seed = s.seed;
        let consumer = Consumer::new(opts, bus.source()?, s.store.clone(), handler)?
            .with_fault_hook(faults.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let relaying = relay.spawn();
            let consumed = consumer
                .run_until(async {
                    let _ = stopped.await;
                })
                .await;
            consumed.and(relaying.stop().await)
        });
        Ok(SecondHop {
            bus,
            outbox,
            store: s.store.clone(),
            tables: s.tables.clone(),
            crashes,
            faults,
            runs,
            stop,
            task,
        })
    }

    /// The outbox the payments consumer sends its receipts through.
    pub(super) fn outbox(&self) -> B::Outbox {
        self.outbox.clone()
    }

    /// Once the payments are done: waits until the outbox and the receipts queue hold
    /// nothing, stops the relay and the receipts consumer, and counts the receipts against
    /// `paid` (the orders whose payment the ledger holds).
    pub(super) async fn finish(
        self,
        paid: impl Iterator<Item = String>,
        plan: &Plan,
    ) -> anyhow::Result<Receipts> {
        let mut quiet = 0;
        let mut last = (u64::MAX, Instant::now());
        while quiet < 10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (Ok(outbox), Ok(queued)) =
                (self.outbox.outbox_stats().await, self.bus.pending().await)
            else {
                continue;
            };
            let pending = outbox.pending + queued;
            quiet = if pending == 0 { quiet + 1 } else { 0 };
            if pending != last.0 {
                last = (pending, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(60) {
                bail!("the receipts did not drain: {pending} pending for 60 s");
            }
        }
        let _ = self.stop.send(());
        self.task.await??;
        let per_order: HashMap<String, u64> = self.store.receipts(&self.tables).await?;
        let mut expected = 0;
        let (mut lost, mut dups) = (0, 0);
        for id in paid {
            expected += 1;
            match per_order.get(&id).copied().unwrap_or(0) {
                0 => lost += 1,
                n => dups += n - 1,
            }
        }
        let deliveries = self.bus.deliveries().await?;
        self.bus.cleanup().await?;
        Ok(Receipts {
            expected,
            deliveries,
            handler_runs: self.runs.load(Ordering::Relaxed),
            effects: per_order.values().sum(),
            lost,
            duplicate_effects: dups,
            relay_crashes: self.crashes.crashes.load(Ordering::Relaxed),
            resent: self.crashes.resent.load(Ordering::Relaxed),
            faults_fired: self.faults.fired.snapshot(&plan.planned()),
        })
    }
}
