//! `justonce demo`: the order/payment pipeline under seeded faults, once per semantic.

mod hop;
pub(crate) mod plan;
mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use justonce::backend::{StoreKind, TransportKind};
use justonce::redis::RedisStore;
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::{Consumer, ConsumerOptions, Semantics};

use crate::bus::Bus;
use crate::orders::{Bank, PaymentApi, PaymentHandler, Strategy, Tables};
pub(crate) use plan::IdStrategy;
use plan::{Plan, PlanFaults};
use report::{Report, Row, EXACTLY_ONCE};

/// Arguments of `justonce demo`.
#[derive(clap::Args)]
pub(crate) struct DemoArgs {
    /// Transport URL (default: an embedded SQLite queue in a fresh temporary directory).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: Option<String>,
    /// Store URL for the business data and dedup records (default: embedded SQLite).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
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
    /// Batches processed at the same time (default: 2 on SQLite, 1 on PostgreSQL and
    /// MariaDB, where two batches paying into the same accounts in opposite orders would
    /// deadlock each other; the runtime survives that by retrying the batch, slowly).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Lease of a delivery: how soon a crashed consumer's deliveries come back.
    #[arg(long, default_value_t = 500)]
    lease_ms: u64,
    /// Largest payload the consumer accepts; larger ones are dead-lettered.
    #[arg(long, default_value_t = 16 * 1024)]
    max_payload_bytes: usize,
    /// `one-hop`: orders to payments. `two-hop`: the payments consumer also sends a receipt
    /// per payment through its outbox; a relay (crashing now and then between a confirm
    /// and its mark) publishes them, and a receipts consumer applies them, under the same
    /// faults; the receipts are counted from their table.
    #[arg(long, value_enum, default_value = "one-hop")]
    pipeline: Pipeline,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

/// The demo's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Pipeline {
    /// Orders to payments.
    OneHop,
    /// Orders to payments, receipts through the outbox to a second consumer.
    TwoHop,
}

/// Where one row's run keeps its queue and business data.
struct Target {
    transport: String,
    store: String,
}

/// One row of the demo: a semantic, and whether the ack is written in the business
/// transaction (the fourth row, on a PostgreSQL queue in the store's database).
#[derive(Debug, Clone, Copy)]
struct Variant {
    semantics: Semantics,
    ack_in_tx: bool,
}

impl Variant {
    fn name(self) -> &'static str {
        if self.ack_in_tx {
            EXACTLY_ONCE
        } else {
            self.semantics.as_str()
        }
    }

    /// For queue, consumer and table names.
    fn slug(self) -> &'static str {
        if self.ack_in_tx {
            "exactly-once"
        } else {
            self.semantics.as_str()
        }
    }
}

pub(crate) async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.messages == 0 {
        bail!("--messages must be at least 1");
    }
    let transport = match &args.transport {
        Some(url) => Bus::kind_of(url)?,
        None => TransportKind::Sqlite,
    };
    let store = match &args.store {
        Some(url) => StoreKind::from_url(url)?,
        None => StoreKind::Sqlite,
    };
    // Refused before any row runs: the SQL-only strategies need a table to guard.
    if store == StoreKind::Redis
        && matches!(
            args.strategy,
            Strategy::UniqueKey | Strategy::StateMachine | Strategy::Version
        )
    {
        bail!(
            "--strategy {} needs a SQL store (it guards a row); with --store redis:// use \
             dedup-table (the dedup key commits with the Redis writes) or claim",
            args.strategy.as_str()
        );
    }
    if store == StoreKind::Redis && args.pipeline == Pipeline::TwoHop {
        bail!(
            "--pipeline two-hop needs a SQL store: its receipts leave through an outbox \
             written in the payment's transaction"
        );
    }
    let tmp = tempfile::Builder::new()
        .prefix("justonce-demo-")
        .tempdir()?;
    let run_id = format!("{:08x}", fastrand::u32(..));
    let plan = Arc::new(Plan::new(args.messages, args.seed, args.max_payload_bytes));
    let mut report = Report {
        messages: args.messages,
        seed: args.seed,
        transport: transport.as_str().into(),
        store: store.as_str().into(),
        strategy: args.strategy.as_str().into(),
        id_strategy: args.id_strategy.as_str().into(),
        faults: plan.planned(),
        rows: Vec::new(),
        broker_dedup: transport.drops_republished_ids(),
    };
    let mut variants: Vec<Variant> = Semantics::ALL
        .into_iter()
        .map(|semantics| Variant {
            semantics,
            ack_in_tx: false,
        })
        .collect();
    // The queue (or, on Kafka, the consumer's positions) and the business data in one
    // database: the ack can join the transaction.
    let same_database = match transport {
        TransportKind::Postgres => args.transport == args.store,
        TransportKind::Kafka => store != StoreKind::Redis,
        _ => false,
    };
    if same_database {
        variants.push(Variant {
            semantics: Semantics::EffectivelyOnce,
            ack_in_tx: true,
        });
    }
    for variant in variants {
        let dir: PathBuf = tmp.path().join(variant.slug());
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
        let row = match store {
            StoreKind::Sqlite => {
                run_one::<SqliteStore>(&args, &plan, variant, &target, &dir, &run_id).await
            }
            StoreKind::Postgres => {
                run_one::<PgStore>(&args, &plan, variant, &target, &dir, &run_id).await
            }
            StoreKind::MySql => {
                run_one::<MySqlStore>(&args, &plan, variant, &target, &dir, &run_id).await
            }
            StoreKind::Redis => {
                run_one::<RedisStore>(&args, &plan, variant, &target, &dir, &run_id).await
            }
        }
        .with_context(|| format!("the {} run failed", variant.name()))?;
        report.rows.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}

async fn run_one<B: Bank>(
    args: &DemoArgs,
    plan: &Arc<Plan>,
    variant: Variant,
    target: &Target,
    dir: &std::path::Path,
    run_id: &str,
) -> anyhow::Result<Row> {
    let semantics = variant.semantics;
    let queue_name = format!("justonce-demo-{}-{run_id}", variant.slug());
    let lease = Duration::from_millis(args.lease_ms);
    let prefetch =
        (args.batch_size * args.concurrency.unwrap_or(2) * 2).min(u16::MAX as usize) as u16;
    let bus = if variant.ack_in_tx && Bus::kind_of(&target.transport)? == TransportKind::Kafka {
        Bus::open_with_positions(
            &target.transport,
            &queue_name,
            lease,
            prefetch,
            &args.topology,
            &target.store,
        )
        .await?
    } else {
        Bus::open(
            &target.transport,
            &queue_name,
            lease,
            prefetch,
            &args.topology,
        )
        .await?
    };
    // Each row has tables of its own: on a shared server, runs and rows never meet.
    let tables = Tables::new(&format!(
        "jo_demo_{run_id}_{}",
        variant.slug().replace('-', "_")
    ))?;
    let store = B::open(&target.store, &tables).await?;
    let order_ids: Vec<&str> = plan.orders.iter().map(|o| o.order_id.as_str()).collect();
    store.setup(&tables, &order_ids).await?;
    let sqlite_in = |file: &str| format!("sqlite:{}", dir.join(file).display());
    let api = match args.strategy {
        Strategy::Claim => Some(PaymentApi::open(&sqlite_in("payment-api.db")).await?),
        _ => None,
    };

    let guarded = semantics == Semantics::EffectivelyOnce;
    let mut handler =
        PaymentHandler::<B>::new(tables.clone(), args.strategy, guarded, api.clone())?;
    let runs = handler.runs();
    let consumer_name = format!("demo-{run_id}-{}", variant.slug());
    let second = match args.pipeline {
        Pipeline::OneHop => None,
        Pipeline::TwoHop => {
            handler = handler.sending_receipts();
            Some(
                hop::SecondHop::start(hop::HopSetup {
                    transport: &target.transport,
                    queue: format!("{queue_name}-receipts"),
                    consumer: format!("{consumer_name}-receipts"),
                    semantics,
                    lease,
                    batch_size: args.batch_size,
                    seed: args.seed,
                    max_payload_bytes: args.max_payload_bytes,
                    store: &store,
                    tables: &tables,
                    plan,
                    topology: &args.topology,
                })
                .await?,
            )
        }
    };
    let faults = Arc::new(PlanFaults::new(plan.clone(), bus.clone()));
    let mut opts = ConsumerOptions::new(consumer_name);
    opts.semantics = semantics;
    opts.dedup.idempotency = args.strategy.idempotency();
    opts.dedup.id_strategy = args.id_strategy.consumer();
    opts.dedup.claim_lease = Duration::from_millis(args.lease_ms);
    opts.batching.size = args.batch_size;
    opts.batching.concurrency = args.concurrency.unwrap_or(match B::KIND {
        StoreKind::Sqlite | StoreKind::Redis => 2,
        StoreKind::Postgres | StoreKind::MySql => 1,
    });
    opts.retry.seed = args.seed;
    opts.max_payload_bytes = args.max_payload_bytes;
    opts.batching.receive_wait = Duration::from_millis(100);
    let mut consumer =
        Consumer::new(opts, bus.source()?, store.clone(), handler)?.with_fault_hook(faults.clone());
    if args.strategy == Strategy::Claim {
        let url = match B::KIND {
            StoreKind::Sqlite => sqlite_in("claims.db"),
            StoreKind::Postgres | StoreKind::MySql | StoreKind::Redis => target.store.clone(),
        };
        consumer = consumer.with_claims(store.claims(&url, &tables).await?)?;
    }
    if let Some(second) = &second {
        consumer = consumer.with_outbox(second.outbox());
    }
    if variant.ack_in_tx {
        let acker = bus
            .transactional_ack::<B::Tx>()
            .context("the transport cannot ack inside this store's transactions")?;
        consumer = consumer.with_transactional_ack(acker);
    }

    let bar = progress_bar(args.json, plan.orders.len() as u64, variant.name());
    let started = Instant::now();
    let published = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish_all(
        bus.clone(),
        plan.clone(),
        args.id_strategy,
        published.clone(),
    ));
    let stalled = std::sync::Mutex::new(None);
    let drained = wait_drained(&bus, &publisher, &published, &bar, &stalled);
    consumer.run_until(drained).await?;
    let stalled = stalled.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(why) = stalled {
        let _ = bus.cleanup().await;
        bail!("the queue did not drain: {why}");
    }
    let sent = publisher.await.context("publisher task failed")??;
    let seconds = started.elapsed().as_secs_f64();
    bar.finish_and_clear();

    let (effects, api_calls) = match &api {
        Some(api) => {
            let (effects, calls) = api.effects().await?;
            (effects, Some(calls))
        }
        None => (store.effects(&tables).await?, None),
    };
    if !effects.consistent {
        bail!("account balances do not add up to the ledger: a transaction was not atomic");
    }
    let (lost, duplicate_effects) = effects.check(plan.well_formed());
    let receipts = match second {
        Some(second) => {
            let paid = effects
                .per_order
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(id, _)| id.clone());
            Some(second.finish(paid, plan).await?)
        }
        None => None,
    };
    let deliveries = bus.deliveries().await?;
    let dead_lettered = bus.dead_lettered().await?;
    bus.cleanup().await?;
    if B::KIND != StoreKind::Sqlite {
        store.drop_tables(&tables).await?;
    }
    Ok(Row {
        semantics: variant.name().into(),
        sent,
        deliveries,
        handler_runs: runs.load(Ordering::Relaxed),
        effects: effects.total,
        lost,
        duplicate_effects,
        dead_lettered,
        seconds,
        msgs_per_sec: sent as f64 / seconds.max(1e-9),
        faults_fired: faults.fired.snapshot(&plan.planned()),
        api_calls,
        receipts,
    })
}

/// Publishes every order in batches; the orders marked `publish_twice` are published again
/// after their batch, as a publisher does when a confirm is lost. Returns how many distinct
/// message ids it published.
async fn publish_all(
    bus: Bus,
    plan: Arc<Plan>,
    ids: IdStrategy,
    published: Arc<AtomicU64>,
) -> justonce::Result<u64> {
    let mut distinct = std::collections::HashSet::new();
    for chunk in plan.orders.chunks(250) {
        let first: Vec<_> = chunk.iter().map(|o| plan.message(o, ids)).collect();
        let again: Vec<_> = chunk
            .iter()
            .filter(|o| o.publish_twice)
            .map(|o| plan.message(o, ids))
            .collect();
        bus.publish(&first, &again).await?;
        distinct.extend(first.iter().chain(&again).filter_map(|m| m.id().cloned()));
        published.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        tokio::task::yield_now().await;
    }
    Ok(distinct.len() as u64)
}

/// Resolves once the publisher is done and the queue holds nothing: every message was
/// acked or dead-lettered. Read from the queue itself.
async fn wait_drained(
    bus: &Bus,
    publisher: &tokio::task::JoinHandle<justonce::Result<u64>>,
    published: &AtomicU64,
    bar: &ProgressBar,
    stalled: &std::sync::Mutex<Option<String>>,
) {
    let mut quiet = 0;
    let mut last = (u64::MAX, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = match bus.pending().await {
            Ok(pending) => pending,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the queue depth; retrying");
                continue;
            }
        };
        bar.set_position(published.load(Ordering::Relaxed).saturating_sub(pending));
        // Empty for a while, not for an instant: a broker requeues a closed channel's
        // deliveries a moment after the close, and until then they are counted nowhere.
        quiet = if publisher.is_finished() && pending == 0 {
            quiet + 1
        } else {
            0
        };
        if quiet >= 10 {
            return;
        }
        if pending != last.0 {
            last = (pending, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(60) {
            *stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                "no progress for 60 s with {pending} messages pending"
            ));
            return;
        }
    }
}

/// A progress bar on the terminal, hidden when `quiet` (`--json`).
pub(crate) fn progress_bar(quiet: bool, total: u64, name: &'static str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>17} [{bar:40}] {pos}/{len} {per_sec} {elapsed} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_prefix(name);
    bar
}
