//! `justonce demo`: the order/payment pipeline under seeded faults, once per semantic.

mod plan;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use justonce::sql::{SqliteClaimStore, SqliteQueue, SqliteQueueOptions, SqliteStore};
use justonce::{Consumer, ConsumerOptions, Publisher, Semantics};

use crate::orders::{self, Effects, PaymentApi, PaymentHandler, Strategy};
pub(crate) use plan::IdStrategy;
use plan::{Plan, PlanFaults};
use report::{Report, Row};

/// Arguments of `justonce demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Transport URL (default: an embedded SQLite queue in a fresh temporary directory).
    #[arg(long, value_name = "URL")]
    transport: Option<String>,
    /// Store URL for the business data and dedup records (default: embedded SQLite).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Orders to publish.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Seed of the fault plan and the retry jitter.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Idempotency strategy of the effectively-once consumer.
    #[arg(long, value_enum, default_value = "dedup-table")]
    strategy: Strategy,
    /// How the publisher gives ids to messages.
    #[arg(long, value_enum, default_value = "message-id")]
    id_strategy: IdStrategy,
    /// Deliveries per consumer batch (one transaction per batch).
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// Batches processed at the same time.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Lease of a delivery: how soon a crashed consumer's deliveries come back.
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// Largest payload the consumer accepts; larger ones are dead-lettered.
    #[arg(long, default_value_t = 16 * 1024)]
    max_payload_bytes: usize,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

/// Where one semantic's run keeps its queue and business data.
struct Target {
    transport: String,
    store: String,
}

pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.messages == 0 {
        bail!("--messages must be at least 1");
    }
    for url in [&args.transport, &args.store].into_iter().flatten() {
        if !url.starts_with("sqlite:") {
            let scheme = url.split(':').next().unwrap_or_default();
            bail!(
                "the {scheme} backend is not built yet: this version of justonce runs the demo on \
                 the embedded SQLite default (sqlite:PATH); RabbitMQ, PostgreSQL, MariaDB, NATS and \
                 Redis backends are on the roadmap in README.md"
            );
        }
    }
    let tmp = tempfile::Builder::new()
        .prefix("justonce-demo-")
        .tempdir()?;
    let run_id = format!("{:08x}", fastrand::u32(..));
    let plan = Arc::new(Plan::new(args.messages, args.seed, args.max_payload_bytes));
    let mut report = Report {
        messages: args.messages,
        seed: args.seed,
        transport: "sqlite".into(),
        store: "sqlite".into(),
        strategy: args.strategy.as_str().into(),
        id_strategy: args.id_strategy.as_str().into(),
        faults: plan.planned(),
        rows: Vec::new(),
    };
    for semantics in Semantics::ALL {
        let dir: PathBuf = tmp.path().join(semantics.as_str());
        std::fs::create_dir_all(&dir)?;
        let target = Target {
            transport: args
                .transport
                .clone()
                .unwrap_or_else(|| format!("sqlite:{}", dir.join("queue.db").display())),
            store: args
                .store
                .clone()
                .unwrap_or_else(|| format!("sqlite:{}", dir.join("store.db").display())),
        };
        let row = run_one(&args, &plan, semantics, &target, &dir, &run_id)
            .await
            .with_context(|| format!("the {semantics} run failed"))?;
        report.rows.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}

async fn run_one(
    args: &DemoArgs,
    plan: &Arc<Plan>,
    semantics: Semantics,
    target: &Target,
    dir: &std::path::Path,
    run_id: &str,
) -> anyhow::Result<Row> {
    let queue_name = format!("demo-{}-{run_id}", semantics.as_str());
    let mut qopts = SqliteQueueOptions::default();
    qopts.lease = Duration::from_millis(args.lease_ms);
    let queue = SqliteQueue::open_with(&target.transport, &queue_name, qopts).await?;
    let store = SqliteStore::open(&target.store).await?;
    let order_ids: Vec<&str> = plan.orders.iter().map(|o| o.order_id.as_str()).collect();
    orders::setup(&store, true, &order_ids).await?;
    let sqlite_in = |file: &str| format!("sqlite:{}", dir.join(file).display());
    let api = match args.strategy {
        Strategy::Claim => Some(PaymentApi::open(&sqlite_in("payment-api.db")).await?),
        _ => None,
    };

    let guarded = semantics == Semantics::EffectivelyOnce;
    let handler = PaymentHandler::new(args.strategy, guarded, api.clone())?;
    let faults = Arc::new(PlanFaults::new(plan.clone()));
    let mut opts = ConsumerOptions::new(format!("demo-{run_id}"));
    opts.semantics = semantics;
    opts.idempotency = args.strategy.idempotency();
    opts.id_strategy = args.id_strategy.consumer();
    opts.claim_lease = Duration::from_millis(args.lease_ms);
    opts.batch_size = args.batch_size;
    opts.concurrency = args.concurrency;
    opts.seed = args.seed;
    opts.max_payload_bytes = args.max_payload_bytes;
    opts.receive_wait = Duration::from_millis(100);
    let mut consumer = Consumer::new(opts, queue.clone(), store.clone(), handler.clone())?
        .with_fault_hook(faults.clone());
    if args.strategy == Strategy::Claim {
        let claims = SqliteClaimStore::open(&sqlite_in("claims.db")).await?;
        consumer = consumer.with_claims(Arc::new(claims));
    }

    let bar = progress_bar(args.json, plan.orders.len() as u64, semantics);
    let started = Instant::now();
    let published = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish_all(
        queue.clone(),
        plan.clone(),
        args.id_strategy,
        published.clone(),
    ));
    let drained = wait_drained(&queue, &publisher, &published, &bar);
    consumer.run_until(drained).await?;
    let sent = publisher.await.context("publisher task failed")??;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();

    let (effects, api_calls) = match &api {
        Some(api) => {
            let (effects, calls) = api.effects().await?;
            (effects, Some(calls))
        }
        None => (Effects::read(&store).await?, None),
    };
    if !effects.consistent {
        bail!("account balances do not add up to the ledger: a transaction was not atomic");
    }
    let (lost, duplicate_effects) = effects.check(plan.well_formed());
    let stats = queue.stats().await?;
    let dead_lettered: i64 = sqlx::query_scalar(
        "SELECT COUNT(DISTINCT COALESCE(message_id, seq)) FROM jo_dead_letter WHERE queue = ?",
    )
    .bind(&queue_name)
    .fetch_one(queue.pool())
    .await?;
    Ok(Row {
        semantics: semantics.as_str().into(),
        sent,
        deliveries: stats.deliveries,
        handler_runs: handler.runs(),
        effects: effects.total,
        lost,
        duplicate_effects,
        dead_lettered: dead_lettered as u64,
        seconds,
        msgs_per_sec: sent as f64 / seconds.max(1e-9),
        faults_fired: faults.fired.snapshot(&plan.planned()),
        api_calls,
    })
}

/// Publishes every order in batches; the orders marked `publish_twice` are published again
/// after their batch, as a publisher does when a confirm is lost. Returns how many distinct
/// message ids it published.
async fn publish_all(
    queue: SqliteQueue,
    plan: Arc<Plan>,
    ids: IdStrategy,
    published: Arc<AtomicU64>,
) -> justonce::Result<u64> {
    let mut distinct = std::collections::HashSet::new();
    for chunk in plan.orders.chunks(250) {
        let first: Vec<_> = chunk.iter().map(|o| plan.message(o, ids)).collect();
        queue.publish_batch(&first).await?;
        let again: Vec<_> = chunk
            .iter()
            .filter(|o| o.publish_twice)
            .map(|o| plan.message(o, ids))
            .collect();
        if !again.is_empty() {
            queue.publish_batch(&again).await?;
        }
        distinct.extend(first.iter().chain(&again).filter_map(|m| m.id().cloned()));
        published.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        tokio::task::yield_now().await;
    }
    Ok(distinct.len() as u64)
}

/// Resolves once the publisher is done and the queue holds nothing: every message was
/// acked or dead-lettered. Read from the queue itself.
async fn wait_drained(
    queue: &SqliteQueue,
    publisher: &tokio::task::JoinHandle<justonce::Result<u64>>,
    published: &AtomicU64,
    bar: &ProgressBar,
) {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let Ok(stats) = queue.stats().await else {
            continue;
        };
        bar.set_position(
            published
                .load(Ordering::Relaxed)
                .saturating_sub(stats.pending),
        );
        if publisher.is_finished() && stats.pending == 0 {
            return;
        }
    }
}

fn progress_bar(quiet: bool, total: u64, semantics: Semantics) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>17} [{bar:40}] {pos}/{len} {per_sec} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(semantics.as_str());
    bar
}
