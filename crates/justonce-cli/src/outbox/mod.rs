//! `justonce outbox`: an outbox's backlog, its relays and its dead rows (`status`), what to
//! do with the dead ones (`revive`, `discard`), and a relay as a process of its own
//! (`relay`), and what the outbox costs (`bench`).

mod bench;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use justonce::backend::{StoreKind, TransportKind};
use justonce::relay::{Relay, RelayFaultHook, RelayFaultPoint, RelayOptions};
use justonce::sql::{MySqlStore, PgOutbox, PgOutboxMove, PgQueue, PgStore, SqliteStore};
use justonce::{ErrorKind, InspectOutbox, OutboxRow, OutboxStore};
use serde_json::json;

use crate::lab::protocol::{LabPoint, Pauser};

/// Arguments of `justonce outbox`.
#[derive(clap::Args)]
pub(crate) struct OutboxArgs {
    #[command(subcommand)]
    command: OutboxCommand,
}

#[derive(clap::Subcommand)]
enum OutboxCommand {
    /// Pending rows, the oldest one's age, dead rows with their reasons, and the relays
    /// holding leases.
    Status {
        #[command(flatten)]
        at: At,
        /// Dead rows listed at most.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Gives dead rows their attempts back: relays send them again, in their place.
    Revive {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        which: Which,
    },
    /// Removes dead rows without sending them; their keys go on.
    Discard {
        #[command(flatten)]
        at: At,
        #[command(flatten)]
        which: Which,
    },
    /// Relays the outbox to a transport until SIGINT/SIGTERM (confirm, then mark).
    Relay(RelayArgs),
    /// The relay's throughput against direct confirmed publishing, the latency the outbox
    /// adds, and the table after a soak, side by side in interleaved rounds.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct At {
    /// Store URL (the outbox's database: sqlite:PATH, postgres://… or mysql://…).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: String,
    /// The outbox table.
    #[arg(long, default_value = "jo_outbox")]
    table: String,
}

#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct Which {
    /// The dead rows' seqs (as `status` lists them).
    #[arg(long, value_delimiter = ',', value_name = "SEQ,…")]
    seq: Vec<u64>,
    /// Every dead row.
    #[arg(long)]
    all: bool,
}

impl Which {
    fn seqs(&self) -> Option<&[u64]> {
        (!self.all).then_some(self.seq.as_slice())
    }
}

#[derive(clap::Args)]
struct RelayArgs {
    #[command(flatten)]
    at: At,
    /// Transport URL to publish to (sqlite:PATH, postgres://… or amqp://…).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: String,
    /// The queue the rows go to.
    #[arg(long)]
    queue: String,
    /// Rows published at once.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Relay loops in this process.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// How long a taken row is this relay's, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Refused publishes of one row before it is dead.
    #[arg(long, default_value_t = 10)]
    max_attempts: u32,
    /// How often to look for rows when nothing woke the relay (PostgreSQL's `NOTIFY`, or an
    /// enqueue in this process), in milliseconds.
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// Exit 0 once the outbox holds nothing to send.
    #[arg(long)]
    exit_when_drained: bool,
    /// Publish the rows even when the transport is a PostgreSQL queue in the outbox's own
    /// database, where the relay otherwise moves each batch from the outbox into the queue
    /// in one transaction (no publish, no confirm, no duplicate).
    #[arg(long)]
    publish: bool,
    /// Serve Prometheus metrics (the `justonce_outbox_*` series) on `/metrics` here.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

pub(crate) async fn run(args: OutboxArgs) -> anyhow::Result<()> {
    match args.command {
        OutboxCommand::Status { at, limit, json } => status(&at, limit, json).await,
        OutboxCommand::Revive { at, which } => {
            let n = open(&at).await?.revive(which.seqs()).await?;
            println!("revived {n} dead row(s)");
            Ok(())
        }
        OutboxCommand::Discard { at, which } => {
            let n = open(&at).await?.discard(which.seqs()).await?;
            println!("discarded {n} dead row(s)");
            Ok(())
        }
        OutboxCommand::Bench(args) => bench::run(args).await,
        OutboxCommand::Relay(args) => match StoreKind::from_url(&args.at.store)? {
            StoreKind::Sqlite => {
                let store = SqliteStore::open(&args.at.store).await?;
                relay(store.outbox_with(table(&args.at)).await?, &args).await
            }
            StoreKind::Postgres => {
                let store = PgStore::open(&args.at.store).await?;
                let outbox = store.outbox_with(table(&args.at)).await?;
                match mover(&outbox, &args.transport, &args.queue, args.publish).await? {
                    Some(mover) => {
                        let relay = Relay::moving(outbox, mover, relay_options(&args))?;
                        run_relay(relay, &args).await
                    }
                    None => relay(outbox, &args).await,
                }
            }
            StoreKind::MySql => {
                let store = MySqlStore::open(&args.at.store).await?;
                relay(store.outbox_with(table(&args.at)).await?, &args).await
            }
            StoreKind::Redis => anyhow::bail!("the outbox needs a SQL store, not Redis"),
        },
    }
}

fn table(at: &At) -> justonce::sql::OutboxOptions {
    justonce::sql::OutboxOptions::default().table(at.table.clone())
}

async fn open(at: &At) -> anyhow::Result<Arc<dyn InspectOutbox>> {
    Ok(justonce::backend::inspect_outbox(&at.store, &at.table).await?)
}

fn age(t: Option<SystemTime>) -> Option<f64> {
    t.map(|t| {
        SystemTime::now()
            .duration_since(t)
            .unwrap_or_default()
            .as_secs_f64()
    })
}

fn secs_until(t: Option<SystemTime>) -> Option<f64> {
    t.map(|t| {
        t.duration_since(SystemTime::now())
            .unwrap_or_default()
            .as_secs_f64()
    })
}

async fn status(at: &At, limit: usize, as_json: bool) -> anyhow::Result<()> {
    let outbox = open(at).await?;
    let stats = outbox.stats().await?;
    let owners = outbox.owners().await?;
    let dead = outbox.dead_rows(limit).await?;
    if as_json {
        let out = json!({
            "store": justonce::redact_url(&at.store),
            "table": at.table,
            "pending": stats.pending,
            "leased": stats.leased,
            "dead": stats.dead,
            "oldest_pending_age_secs": age(stats.oldest),
            "relays": owners.iter().map(|o| json!({
                "owner": o.owner, "rows": o.rows, "lease_left_secs": secs_until(o.until),
            })).collect::<Vec<_>>(),
            "dead_rows": dead.iter().map(|d| json!({
                "seq": d.seq, "key": d.key, "message_id": d.message_id,
                "attempts": d.attempts, "reason": d.reason,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("outbox {} at {}", at.table, justonce::redact_url(&at.store));
    let oldest = age(stats.oldest).map_or("-".into(), |a| format!("{a:.1} s"));
    println!(
        "  pending {}  (leased {})  oldest {}  dead {}",
        stats.pending, stats.leased, oldest, stats.dead
    );
    if owners.is_empty() {
        println!("  relays: none holds a lease");
    }
    for o in &owners {
        let left = secs_until(o.until).map_or("-".into(), |s| format!("{s:.1} s"));
        println!("  relay {}: {} row(s), lease {left} left", o.owner, o.rows);
    }
    if !dead.is_empty() {
        println!("  dead rows (each blocks its key; `justonce outbox revive|discard`):");
    }
    for d in &dead {
        println!(
            "    seq {}  key {}  id {}  after {} attempt(s): {}",
            d.seq,
            d.key.as_deref().unwrap_or("-"),
            d.message_id,
            d.attempts,
            d.reason
        );
    }
    if stats.dead as usize > dead.len() {
        println!("    … and {} more", stats.dead as usize - dead.len());
    }
    Ok(())
}

/// The lab's fault point in a relay process: it waits at `after-confirm` of its n-th pass
/// (its publishes confirmed, not yet marked) for the lab's SIGKILL.
struct PauseAt(Pauser);

#[justonce::async_trait]
impl RelayFaultHook for PauseAt {
    async fn crash_at(&self, point: RelayFaultPoint, rows: &[OutboxRow]) -> bool {
        if point == RelayFaultPoint::AfterConfirm {
            self.0.at(LabPoint::AfterConfirm, rows.len() as u64).await;
        }
        false
    }
}

/// The mover of a PostgreSQL outbox into the queue at `transport`, when that is a
/// PostgreSQL queue of the outbox's own database and `--publish` was not given.
pub(crate) async fn mover(
    outbox: &PgOutbox,
    transport: &str,
    queue: &str,
    publish: bool,
) -> anyhow::Result<Option<PgOutboxMove>> {
    if publish || TransportKind::from_url(transport)? != TransportKind::Postgres {
        return Ok(None);
    }
    let queue = PgQueue::open(transport, queue).await?;
    match outbox.mover_into(&queue).await {
        Ok(mover) => Ok(Some(mover)),
        Err(e) if e.kind() == ErrorKind::Config => {
            tracing::info!(reason = %e, "the relay publishes");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn relay_options(args: &RelayArgs) -> RelayOptions {
    let lease = Duration::from_millis(args.lease_ms);
    RelayOptions::default()
        .batch(args.batch)
        .concurrency(args.concurrency)
        .lease(lease)
        .publish_timeout(lease / 3)
        .max_attempts(args.max_attempts)
        .poll_interval(Duration::from_millis(args.poll_ms.max(1)))
        .name(args.at.table.clone())
}

async fn relay<O: OutboxStore>(outbox: O, args: &RelayArgs) -> anyhow::Result<()> {
    let bus = crate::bus::Bus::open_publisher(&args.transport, &args.queue, &args.topology).await?;
    let mut relay = Relay::new(outbox, bus.publisher(), relay_options(args))?;
    if let Some(pauser) = Pauser::from_env()? {
        relay = relay.with_fault_hook(Arc::new(PauseAt(pauser)));
    }
    run_relay(relay, args).await
}

async fn run_relay<O: OutboxStore>(relay: Relay<O>, args: &RelayArgs) -> anyhow::Result<()> {
    if let Some(addr) = args.metrics_addr {
        crate::serve::serve(addr, Arc::new(|| Ok(()))).await?;
    }
    if args.exit_when_drained {
        loop {
            let r = relay.relay_once().await?;
            if r.taken == 0 {
                let stats = relay.outbox().outbox_stats().await?;
                if stats.pending == 0 {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    relay.run_until(justonce::shutdown_signal()).await?;
    Ok(())
}
