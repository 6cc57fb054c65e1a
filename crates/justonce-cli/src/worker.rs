//! `justonce worker`: the order/payment consumer as a process of its own, so tests and the
//! lab can kill it for real.
//!
//! Fault points: `JUSTONCE_FAULT_PAUSE=POINT:MS[:BATCH]` (POINT one of `after-ack`,
//! `before-commit`, `after-commit`) makes the worker print `justonce-fault-point POINT` on
//! stderr and sleep MS milliseconds at that point of every batch (or only of its BATCH-th
//! batch to reach it), so a test or the lab can SIGKILL it exactly there. Without the
//! variable nothing pauses.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use justonce::backend::{StoreKind, TransportKind};
use justonce::redis::RedisStore;
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::{
    async_trait, Consumer, ConsumerOptions, DeadLetterReason, Delivery, FaultHook, FaultPoint,
    Receipt, Semantics, Source,
};

use crate::lab::protocol;
use crate::orders::{Bank, PaymentHandler, Seen, Strategy, Tables};

/// Arguments of `justonce worker`.
#[derive(clap::Args)]
pub(crate) struct WorkerArgs {
    /// Transport URL (sqlite:PATH, amqp://… or postgres://…).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: String,
    /// Store URL (sqlite:PATH, postgres://… or mysql://…).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: String,
    /// Queue name.
    #[arg(long, default_value = "orders")]
    queue: String,
    /// Consumer name (the first half of every dedup key).
    #[arg(long, default_value = "payments")]
    consumer: String,
    /// at-most-once, at-least-once or effectively-once.
    #[arg(long, default_value = "effectively-once")]
    semantics: Semantics,
    /// Deliveries per batch.
    #[arg(long, default_value_t = 50)]
    batch_size: usize,
    /// Lease of a delivery in milliseconds.
    #[arg(long, default_value_t = 1000)]
    lease_ms: u64,
    /// Prefix of the business tables (`{prefix}_ledger`, …) and the dedup table.
    #[arg(long, default_value = "jo_demo")]
    tables: String,
    /// Ack inside the business transaction: a PostgreSQL queue in the store's database, or
    /// on Kafka the consumer's positions kept in a table of the (SQL) store.
    #[arg(long)]
    ack_in_transaction: bool,
    /// Longest pause after failed batches, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    backoff_max_ms: u64,
    /// Largest payload accepted; larger ones are dead-lettered.
    #[arg(long, default_value_t = 16 * 1024)]
    max_payload_bytes: usize,
    /// Record every delivery received in the `{tables}_deliveries` table (the lab's count of
    /// deliveries and redeliveries, which outlives a killed worker).
    #[arg(long)]
    audit: bool,
    /// Exit 0 once the queue holds nothing (instead of waiting for SIGINT/SIGTERM).
    #[arg(long)]
    exit_when_drained: bool,
    /// Leave the business tables alone (the lab creates them once): a worker that starts
    /// while the lab's schema fault has renamed the accounts table away must not create
    /// a new, empty one.
    #[arg(long)]
    no_setup: bool,
    /// Serve Prometheus metrics on `/metrics`, and `/healthz` and `/readyz`, at this address
    /// (port 0: any free port, printed on stderr).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// This worker's name in a Redis stream's consumer group (default: the host name and
    /// the process id). A name that survives restarts (a pod's, a slot's) lets a restarted
    /// worker take its own pending entries back at once instead of after their lease; no
    /// two live workers may share one.
    #[arg(long, value_name = "NAME")]
    consumer_name: Option<String>,
    /// With --metrics-addr: read the dead-letter and dedup-record gauges from the transport
    /// and the store this often, in seconds (0: never).
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    metrics_poll_secs: u64,
    /// Kafka: read these partitions, assigned by hand, instead of joining the group's
    /// protocol (comma-separated). A worker started again with the same list takes them
    /// back at their stored positions.
    #[arg(long, value_delimiter = ',', value_name = "P,…")]
    kafka_partitions: Option<Vec<i32>>,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

pub(crate) async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    crate::bus::Bus::kind_of(&args.transport)?;
    match StoreKind::from_url(&args.store)? {
        StoreKind::Sqlite => run_on::<SqliteStore>(args).await,
        StoreKind::Postgres => run_on::<PgStore>(args).await,
        StoreKind::MySql => run_on::<MySqlStore>(args).await,
        StoreKind::Redis => run_on::<RedisStore>(args).await,
    }
}

async fn run_on<B: Bank>(args: WorkerArgs) -> anyhow::Result<()> {
    let lease = Duration::from_millis(args.lease_ms);
    let prefetch = (args.batch_size * 2).min(usize::from(u16::MAX)) as u16;
    let kafka = crate::bus::Bus::kind_of(&args.transport)? == TransportKind::Kafka;
    let mut opts = crate::bus::Bus::options(&args.queue, lease, prefetch, &args.topology)?;
    if let Some(name) = &args.consumer_name {
        opts = opts.consumer_name(name.clone());
    }
    if kafka && args.ack_in_transaction {
        // On Kafka the ack in the transaction is the consumer's positions in the store.
        opts.positions = Some(args.store.clone());
    }
    opts.kafka_partitions = args.kafka_partitions.clone();
    let queue = crate::bus::Bus::open_with(&args.transport, &args.queue, &opts).await?;
    let tables = Tables::new(&args.tables)?;
    let dedup_table = tables.dedup.clone();
    let store = B::open(&args.store, &tables).await?;
    if !args.no_setup {
        store.setup(&tables, &[]).await?;
    }
    let mut opts = ConsumerOptions::new(args.consumer);
    opts.semantics = args.semantics;
    opts.batching.size = args.batch_size;
    opts.max_payload_bytes = args.max_payload_bytes;
    opts.retry.backoff_max =
        Duration::from_millis(args.backoff_max_ms).max(opts.retry.backoff_base);
    opts.batching.receive_wait = Duration::from_millis(100);
    let source = if args.audit {
        Arc::new(Audited {
            inner: queue.source()?,
            store: store.clone(),
            tables: tables.clone(),
        })
    } else {
        queue.source()?
    };
    let mut consumer = Consumer::new(
        opts,
        source,
        store,
        PaymentHandler::<B>::new(tables, Strategy::DedupTable, false, None)?,
    )?;
    if args.ack_in_transaction {
        let acker = queue
            .transactional_ack::<B::Tx>()
            .context(
                "--ack-in-transaction needs a postgres:// transport and store, or a kafka:// transport and a SQL store",
            )?;
        consumer = consumer.with_transactional_ack(acker);
    }
    if let Some(pauser) = protocol::Pauser::from_env()? {
        consumer = consumer.with_fault_hook(Arc::new(PauseHook(pauser)));
    }
    if let Some(addr) = args.metrics_addr {
        // The consumer registers its instruments at its first batch: after this.
        let health = consumer.health();
        crate::serve::serve(addr, Arc::new(move || health.ready())).await?;
        if args.metrics_poll_secs > 0 {
            let store = justonce::backend::inspect_store(&args.store, &dedup_table).await?;
            crate::serve::poll_gauges(
                Duration::from_secs(args.metrics_poll_secs),
                args.queue.clone(),
                queue.inspect(),
                store,
            );
        }
    }
    let drained = {
        let queue = queue.clone();
        async move {
            if !args.exit_when_drained {
                return std::future::pending().await;
            }
            // Empty for half a second: a broker requeues a dead consumer's deliveries a
            // moment after its connection drops.
            let mut quiet = 0;
            while quiet < 5 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                quiet = if queue.pending().await.is_ok_and(|n| n == 0) {
                    quiet + 1
                } else {
                    0
                };
            }
        }
    };
    let shutdown = async {
        tokio::select! {
            _ = justonce::shutdown_signal() => {}
            _ = drained => {}
        }
    };
    // The lab starts its publisher once every worker has said this.
    eprintln!("{}", protocol::READY);
    consumer.run_until(shutdown).await?;
    Ok(())
}

/// Pauses at one fault point of every batch (or of one batch), announcing it on stderr.
struct PauseHook(protocol::Pauser);

#[async_trait]
impl FaultHook for PauseHook {
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool {
        let point = protocol::LabPoint::Consumer(point);
        self.0.at(point, batch.len() as u64).await;
        false
    }
}

/// A source that records each delivery it hands out in the store's audit table, outside the
/// consumer's transaction: the lab counts deliveries and redeliveries from it after the
/// workers (and their memory) are gone. A failed write is logged and the deliveries still
/// go to the consumer, so the count is a lower bound, never a reason to lose a message.
struct Audited<B: Bank> {
    inner: Arc<dyn Source>,
    store: B,
    tables: Tables,
}

#[async_trait]
impl<B: Bank> Source for Audited<B> {
    fn queue(&self) -> &str {
        self.inner.queue()
    }

    fn system(&self) -> &'static str {
        self.inner.system()
    }

    async fn receive(&self, max: usize, wait: Duration) -> justonce::Result<Vec<Delivery>> {
        let got = self.inner.receive(max, wait).await?;
        if !got.is_empty() {
            let rows: Vec<Seen> = got
                .iter()
                .map(|d| Seen {
                    id: d.message.id().map(|i| i.as_str().to_owned()),
                    redelivered: d.redelivered,
                    // Kafka marks no record read again by a new member: its position says.
                    at: justonce::kafka::record_at(&d.receipt).map(|(p, o)| format!("{p}:{o}")),
                })
                .collect();
            if let Err(e) = self.store.record_deliveries(&self.tables, &rows).await {
                tracing::warn!(error = %e.to_chain_string(), "could not record deliveries in the audit table");
            }
        }
        Ok(got)
    }

    async fn ack(&self, receipts: &[&Receipt]) -> justonce::Result<()> {
        self.inner.ack(receipts).await
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> justonce::Result<()> {
        self.inner.nack(receipt, delay).await
    }

    async fn release(&self, receipts: &[&Receipt]) -> justonce::Result<()> {
        self.inner.release(receipts).await
    }

    async fn abandon(&self) {
        self.inner.abandon().await
    }

    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &DeadLetterReason,
    ) -> justonce::Result<()> {
        self.inner.dead_letter(delivery, reason).await
    }

    fn redelivery_delay(&self) -> Duration {
        self.inner.redelivery_delay()
    }
}
