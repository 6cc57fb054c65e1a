//! One bench run (`justonce bench-run`, hidden): a process of its own, so that its CPU time
//! and peak RSS are its variant's alone.
//!
//! 1. Load: `messages` payments are published (untimed), in chunks, never all in memory.
//! 2. Drain (timed): the consumer starts and applies them all; throughput and CPU time come
//!    from this phase only.
//! 3. Latency: the consumer keeps running while a closed-loop publisher keeps at most
//!    `batch x concurrency` messages in flight; each message's time from just before its
//!    publish to just after its batch's commit is recorded.
//! 4. Check: the ledger (the business table) must hold one row per message published,
//!    or the run fails.
//!
//! With `--workers N` the consumers are N processes of their own (`bench-run --consume`)
//! on the one queue, as a service scaled out is: the drain is timed from the ledger (its
//! highest row number every 10 ms, then its rows) and there is no latency phase. The deadlocks of a run
//! are the store server's own count (`pg_stat_database`, `Innodb_deadlocks`), before and
//! after.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use justonce::redis::RedisStore;
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::{Consumer, ConsumerOptions, Message, Semantics};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::bare::{bare_amqp, bare_kafka, bare_nats, bare_redis, bare_source, joined};
use super::clock::{cpu_seconds, peak_rss_mb, percentile, Clock, CommitClock};
use super::server::{deadlocks, settle};
use super::{Ids, Variant};
use crate::bus::{Bus, Topology};
use crate::orders::{Bank, Payment, PaymentHandler, Strategy, Tables, ACCOUNTS};
use justonce::backend::{StoreKind, TransportKind};

/// Arguments of `justonce bench-run`.
#[derive(Clone, clap::Args)]
pub(crate) struct BenchRunArgs {
    /// Transport URL.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    pub(crate) transport: String,
    /// Store URL.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    pub(crate) store: String,
    /// What consumes.
    #[arg(long, value_enum)]
    pub(crate) variant: Variant,
    /// Deliveries per transaction.
    #[arg(long)]
    pub(crate) batch: usize,
    /// Batches in flight at once.
    #[arg(long)]
    pub(crate) concurrency: usize,
    /// Payload size in bytes.
    #[arg(long)]
    pub(crate) msg_bytes: usize,
    /// Message ids.
    #[arg(long, value_enum, default_value = "counter")]
    pub(crate) ids: Ids,
    /// Messages of the timed drain.
    #[arg(long)]
    pub(crate) messages: u64,
    /// Messages of the closed-loop latency phase.
    #[arg(long)]
    pub(crate) latency_messages: u64,
    /// Queue name and table prefix of this run.
    #[arg(long)]
    pub(crate) name: String,
    /// A savepoint and a claim per message in every batch (the runtime before optimistic
    /// batches), to measure what they cost.
    #[arg(long)]
    pub(crate) careful: bool,
    /// Batches run in the order they arrived, not in the order of their accounts.
    #[arg(long)]
    pub(crate) unordered: bool,
    /// Consumer processes of their own; 0 consumes in this process.
    #[arg(long, default_value_t = 0)]
    pub(crate) workers: usize,
    /// Pay into accounts drawn at random from the first N (a hot set); 0 pays message i
    /// into account i mod 10,000, so that concurrent batches never share an account.
    #[arg(long, default_value_t = 0)]
    pub(crate) accounts: i64,
    /// Be one consumer process of a `--workers` run: say `ready`, start on a line on stdin,
    /// stop when stdin closes, then print the process's CPU time and peak RSS.
    #[arg(long, hide = true)]
    pub(crate) consume: bool,
    /// Serve the consumers' metrics here while the run lasts.
    #[arg(long, value_name = "HOST:PORT")]
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RunResult {
    pub(crate) msgs_per_sec: f64,
    /// `null` (NaN) when the run had no latency phase (`--workers`).
    #[serde(deserialize_with = "nan_if_null")]
    pub(crate) p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub(crate) p99_ms: f64,
    pub(crate) cpu_s_per_100k: f64,
    pub(crate) rss_mb: f64,
    /// Ledger rows after the run (must equal the messages published).
    pub(crate) effects: u64,
    /// Deadlocks the store's server counted during the run (`None` on SQLite, which has
    /// one writer and no deadlocks).
    #[serde(default)]
    pub(crate) deadlocks: Option<u64>,
}

/// serde_json writes a NaN as `null`; read it back as NaN.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// What a consumer process of a `--workers` run reports when it stops.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ConsumerUsage {
    cpu_s: f64,
    rss_mb: f64,
}

/// One payment of the bench, padded to the run's message size (the handlers ignore `pad`).
#[derive(Serialize)]
struct Padded<'a> {
    #[serde(flatten)]
    payment: Payment,
    pad: &'a str,
}

/// Payment `i`. By default it pays into account `i mod 10,000`: consecutive messages touch
/// different rows, so concurrent batches never wait for each other's account locks, which
/// prices the consumer rather than the hot rows. With `accounts` it pays into one of the
/// first `accounts` at random: a hot set, where concurrent batches meet on the same rows.
/// Its message id is `ids`' kind; the order id in the payload (the ledger's) is the counter
/// whatever the ids.
fn message(
    i: u64,
    rng: &mut fastrand::Rng,
    msg_bytes: usize,
    accounts: i64,
    ids: Ids,
) -> anyhow::Result<Message> {
    let order_id = format!("b-{i:09}");
    let account = if accounts > 0 {
        rng.i64(1..=accounts.min(ACCOUNTS))
    } else {
        (i % ACCOUNTS as u64) as i64 + 1
    };
    let mut p = Padded {
        payment: Payment {
            order_id: order_id.clone(),
            account,
            amount: rng.i64(1..=10_000),
            version: 0,
        },
        pad: "",
    };
    let base = serde_json::to_vec(&p)?.len();
    let pad = "x".repeat(msg_bytes.saturating_sub(base));
    p.pad = &pad;
    let id = match ids {
        Ids::Counter => order_id,
        Ids::Uuid7 => uuid::Uuid::now_v7().to_string(),
        Ids::Uuid4 => {
            let mut bytes = [0u8; 16];
            rng.fill(&mut bytes);
            uuid::Builder::from_random_bytes(bytes)
                .into_uuid()
                .to_string()
        }
    };
    Ok(Message::json(&p)?.with_id(id)?)
}

pub(crate) async fn run(args: BenchRunArgs) -> anyhow::Result<()> {
    if args.batch == 0 || args.concurrency == 0 {
        bail!("--batch and --concurrency must be at least 1");
    }
    if let Some(addr) = args.metrics_addr {
        // A bench run is ready as long as it runs.
        crate::serve::serve(addr, std::sync::Arc::new(|| Ok(()))).await?;
    }
    if args.consume {
        return match StoreKind::from_url(&args.store)? {
            StoreKind::Sqlite => consume::<SqliteStore>(&args).await,
            StoreKind::Postgres => consume::<PgStore>(&args).await,
            StoreKind::MySql => consume::<MySqlStore>(&args).await,
            StoreKind::Redis => consume::<RedisStore>(&args).await,
        };
    }
    let result = match StoreKind::from_url(&args.store)? {
        StoreKind::Sqlite => run_with::<SqliteStore>(&args).await,
        StoreKind::Postgres => run_with::<PgStore>(&args).await,
        StoreKind::MySql => run_with::<MySqlStore>(&args).await,
        StoreKind::Redis => run_with::<RedisStore>(&args).await,
    }?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

async fn run_with<B: Bank>(args: &BenchRunArgs) -> anyhow::Result<RunResult> {
    let tables = Tables::new(&args.name)?;
    let bank = B::open(&args.store, &tables)
        .await
        .context("opening the store")?;
    bank.setup(&tables, &[]).await?;
    // On the SQL queues the publisher shares the consumer's queue handle, so a publish
    // wakes a waiting receive at once, as in a process that produces and consumes; a
    // publisher in another process would be seen within the queue's poll interval
    // (SQLite) or by NOTIFY (PostgreSQL).
    let prefetch = u16::try_from((args.batch * args.concurrency * 2).max(10)).unwrap_or(u16::MAX);
    // On RabbitMQ and Kafka the load goes through a publisher that never consumes; the
    // consumer (or the bare lapin or rdkafka loop) opens its own channel, or joins its
    // group, once the load is in.
    let topology = Topology::default();
    let lease = Duration::from_secs(60);
    let (bus, sink) = if publisher_only(&args.transport)? {
        let sink = Bus::open_publisher(&args.transport, &args.name, &topology).await;
        (None, sink.context("opening the transport")?)
    } else {
        let bus = Bus::open(&args.transport, &args.name, lease, prefetch, &topology)
            .await
            .context("opening the transport")?;
        (Some(bus.clone()), bus)
    };
    let deadlocks_before = deadlocks(&args.store).await?;
    let outcome = if args.workers > 0 {
        drop(bus);
        measure_processes(args, &bank, &tables, &sink).await
    } else {
        measure(args, &bank, &tables, bus, prefetch, &sink).await
    };
    let cleanup = async {
        sink.cleanup().await?;
        bank.drop_tables(&tables).await
    };
    let cleaned = cleanup.await;
    let mut result = outcome?;
    cleaned.context("cleaning up the run's queue and tables")?;
    // A server counts a backend's deadlocks when the backend reports its statistics, at
    // the latest when it exits: close the store's connections (where the consumer's
    // transactions ran) before asking.
    bank.close().await;
    result.deadlocks = match (deadlocks_before, deadlocks(&args.store).await?) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok(result)
}

/// The load of a run: `from..to`, published in chunks.
async fn load(
    args: &BenchRunArgs,
    rng: &mut fastrand::Rng,
    sink: &Bus,
    range: std::ops::Range<u64>,
    clock: Option<&Clock>,
) -> anyhow::Result<()> {
    let mut next = range.start;
    while next < range.end {
        let n = (range.end - next).min(500);
        let chunk = (next..next + n)
            .map(|i| message(i, rng, args.msg_bytes, args.accounts, args.ids))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if let Some(clock) = clock {
            clock.sent(&chunk);
        }
        sink.publish(&chunk, &[]).await?;
        next += n;
    }
    Ok(())
}

/// A `--workers` run: the consumers are processes of their own, started after the load,
/// all at once; the drain is timed from the ledger.
async fn measure_processes<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    sink: &Bus,
) -> anyhow::Result<RunResult> {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
    let mut rng = fastrand::Rng::with_seed(7);
    load(args, &mut rng, sink, 0..args.messages, None).await?;
    settle(args).await?;

    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..args.workers {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("bench-run")
            .env("JUSTONCE_TRANSPORT_URL", &args.transport)
            .env("JUSTONCE_STORE_URL", &args.store)
            .args(["--variant", args.variant.as_str()])
            .args(["--batch", &args.batch.to_string()])
            .args(["--concurrency", &args.concurrency.to_string()])
            .args(["--msg-bytes", &args.msg_bytes.to_string()])
            .args(["--messages", "0", "--latency-messages", "0"])
            .args(["--name", &args.name, "--consume"])
            .args(args.careful.then_some("--careful"))
            .args(args.unordered.then_some("--unordered"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting a consumer process")?;
        let stdin = child.stdin.take().context("consumer stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("consumer stdout")?).lines();
        match lines.next_line().await? {
            Some(line) if line == "ready" => {}
            other => bail!("a consumer process did not start: {other:?}"),
        }
        children.push((child, stdin, lines));
    }
    let t0 = Instant::now();
    for (_, stdin, _) in &mut children {
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
    }
    let limit = Duration::from_secs(600);
    loop {
        // The row count only once the highest row number says it can be reached: a
        // COUNT(*) every 10 ms scans the growing ledger on the cores the consumers run on.
        if bank.ledger_high(tables).await? >= args.messages
            && bank.ledger_rows(tables).await? >= args.messages
        {
            break;
        }
        if t0.elapsed() > limit {
            bail!(
                "the consumers did not drain {} messages in {limit:?}",
                args.messages
            );
        }
        for (child, _, _) in &mut children {
            if let Some(status) = child.try_wait()? {
                bail!("a consumer process stopped before the drain finished: {status}");
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (mut cpu, mut rss) = (0.0, 0.0f64);
    for (mut child, stdin, mut lines) in children {
        drop(stdin);
        let line = lines.next_line().await?.unwrap_or_default();
        let usage: ConsumerUsage = serde_json::from_str(&line)
            .with_context(|| format!("a consumer process's report: {line:?}"))?;
        cpu += usage.cpu_s;
        rss = rss.max(usage.rss_mb);
        child.wait().await?;
    }
    let effects = bank.ledger_rows(tables).await?;
    if effects != args.messages {
        bail!(
            "the ledger holds {effects} payments after {} messages: the run is not valid",
            args.messages
        );
    }
    Ok(RunResult {
        msgs_per_sec: args.messages as f64 / seconds,
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        cpu_s_per_100k: cpu / args.messages as f64 * 100_000.0,
        rss_mb: rss,
        effects,
        deadlocks: None,
    })
}

/// One consumer process of a `--workers` run.
async fn consume<B: Bank>(args: &BenchRunArgs) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt as _, BufReader};
    let tables = Tables::new(&args.name)?;
    let bank = B::open(&args.store, &tables).await?;
    let prefetch = u16::try_from((args.batch * args.concurrency * 2).max(10)).unwrap_or(u16::MAX);
    let bus = if publisher_only(&args.transport)? {
        None
    } else {
        let topology = Topology::default();
        let lease = Duration::from_secs(60);
        Some(Bus::open(&args.transport, &args.name, lease, prefetch, &topology).await?)
    };
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    println!("ready");
    if stdin.next_line().await?.is_none() {
        return Ok(());
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let cpu0 = cpu_seconds();
    let clock = Arc::new(Clock::default());
    let consumer = start(args, &bank, &tables, bus, prefetch, clock, stop_rx).await?;
    tokio::select! {
        _ = async { while let Ok(Some(_)) = stdin.next_line().await {} } => {}
        r = consumer_failed(&consumer) => r?,
    }
    let _ = stop_tx.send(true);
    consumer.await.context("consumer task")??;
    let usage = ConsumerUsage {
        cpu_s: cpu_seconds() - cpu0,
        rss_mb: peak_rss_mb(),
    };
    println!("{}", serde_json::to_string(&usage)?);
    Ok(())
}

async fn measure<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    bus: Option<Bus>,
    prefetch: u16,
    sink: &Bus,
) -> anyhow::Result<RunResult> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut next = args.messages;
    // 1. Load.
    load(args, &mut rng, sink, 0..args.messages, None).await?;

    settle(args).await?;

    // 2. Drain.
    let clock = Arc::new(Clock::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let consumer = start(args, bank, tables, bus, prefetch, clock.clone(), stop_rx).await?;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let limit = Duration::from_secs(600);
    let drained = tokio::select! {
        r = clock.wait_for(args.messages, limit) => r,
        r = consumer_failed(&consumer) => r,
    };
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    drained?;

    // 3. Latency, closed loop.
    let window = (args.batch * args.concurrency) as u64;
    let total = args.messages + args.latency_messages;
    while next < total {
        let in_flight = next - clock.committed.load(Ordering::SeqCst);
        if in_flight >= window {
            let notified = clock.progress.notified();
            if next - clock.committed.load(Ordering::SeqCst) >= window {
                let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
            }
            if consumer.is_finished() {
                break;
            }
            continue;
        }
        let n = (window - in_flight).min(total - next);
        load(args, &mut rng, sink, next..next + n, Some(&clock)).await?;
        next += n;
    }
    let waited = tokio::select! {
        r = clock.wait_for(total, limit) => r,
        r = consumer_failed(&consumer) => r,
    };
    let _ = stop_tx.send(true);
    let stopped = consumer.await.context("consumer task")?;
    waited?;
    stopped?;

    // 4. Check, from the business data.
    let effects = bank.ledger_rows(tables).await?;
    if effects != total {
        bail!("the ledger holds {effects} payments after {total} messages: the run is not valid");
    }
    let mut lat = clock
        .latencies_ms
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    lat.sort_by(f64::total_cmp);
    Ok(RunResult {
        msgs_per_sec: args.messages as f64 / seconds,
        p50_ms: percentile(&lat, 50),
        p99_ms: percentile(&lat, 99),
        cpu_s_per_100k: cpu / args.messages as f64 * 100_000.0,
        rss_mb: peak_rss_mb(),
        effects,
        deadlocks: None,
    })
}

pub(crate) type Running = tokio::task::JoinHandle<anyhow::Result<()>>;

/// Whether the bench publishes through a transport that never consumes, the consumer
/// opening its own once the load is in: on RabbitMQ (a channel of its own) and Kafka (a
/// group member would fetch, and the broker serve it, while the load goes in).
fn publisher_only(transport: &str) -> anyhow::Result<bool> {
    Ok(matches!(
        Bus::kind_of(transport)?,
        TransportKind::Amqp | TransportKind::Kafka
    ))
}

/// Resolves only if the consumer stops on its own (an error): the drain cannot finish.
async fn consumer_failed(consumer: &Running) -> anyhow::Result<()> {
    while !consumer.is_finished() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the consumer stopped before the drain finished (see its error above)")
}

/// Starts the variant's consumer.
async fn start<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    bus: Option<Bus>,
    prefetch: u16,
    clock: Arc<Clock>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    let bus = match bus {
        Some(bus) => bus,
        None if args.variant == Variant::Bare => {
            return match Bus::kind_of(&args.transport)? {
                TransportKind::Kafka => bare_kafka(args, bank, tables, clock, stop).await,
                _ => bare_amqp(args, bank, tables, clock, stop).await,
            };
        }
        None => {
            Bus::open(
                &args.transport,
                &args.name,
                Duration::from_secs(60),
                prefetch,
                &Topology::default(),
            )
            .await?
        }
    };
    let semantics = match args.variant {
        Variant::Bare if Bus::kind_of(&args.transport)? == TransportKind::Redis => {
            // The stream and its group exist: the bus made them.
            drop(bus);
            return bare_redis(args, bank, tables, clock, stop).await;
        }
        Variant::Bare if Bus::kind_of(&args.transport)? == TransportKind::Nats => {
            // The stream and its consumer exist: the bus made them.
            drop(bus);
            return bare_nats(args, bank, tables, clock, stop).await;
        }
        Variant::Bare => {
            let mut tasks = Vec::new();
            for _ in 0..args.concurrency {
                let (source, bank, tables, clock, stop) = (
                    bus.source()?,
                    bank.clone(),
                    tables.clone(),
                    clock.clone(),
                    stop.clone(),
                );
                let batch = args.batch;
                tasks.push(tokio::spawn(async move {
                    bare_source(source, bank, tables, batch, clock, stop).await
                }));
            }
            return Ok(joined(tasks));
        }
        Variant::AtMostOnce => Semantics::AtMostOnce,
        Variant::AtLeastOnce => Semantics::AtLeastOnce,
        Variant::EffectivelyOnce => Semantics::EffectivelyOnce,
    };
    let mut opts = ConsumerOptions::new(format!("bench-{}", args.name));
    opts.semantics = semantics;
    opts.batching.size = args.batch;
    opts.batching.concurrency = args.concurrency;
    opts.batching.receive_wait = Duration::from_millis(100);
    opts.max_payload_bytes = args.msg_bytes.max(1024) * 2;
    opts.batching.optimistic = !args.careful;
    let mut handler = PaymentHandler::<B>::new(
        tables.clone(),
        Strategy::DedupTable,
        semantics == Semantics::EffectivelyOnce,
        None,
    )?;
    if args.unordered {
        handler = handler.unordered();
    }
    let consumer = Consumer::new(opts, bus.source()?, bank.clone(), handler)?
        .with_commit_observer(Arc::new(CommitClock(clock)));
    Ok(tokio::spawn(async move {
        consumer
            .run_until(async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await?;
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(kind: Ids) -> Vec<String> {
        let mut rng = fastrand::Rng::with_seed(7);
        (0..300)
            .map(|i| {
                let m = message(i, &mut rng, 200, 0, kind).expect("a message");
                m.id().expect("an id").as_str().to_owned()
            })
            .collect()
    }

    fn sorted(v: &[String]) -> bool {
        v.windows(2).all(|w| w[0] < w[1])
    }

    #[test]
    fn counter_and_uuid7_ids_sort_in_publish_order_and_uuid4_ids_do_not() {
        let (counter, v7, v4) = (ids(Ids::Counter), ids(Ids::Uuid7), ids(Ids::Uuid4));
        assert_eq!(counter[42], "b-000000042");
        assert!(sorted(&counter));
        assert!(sorted(&v7), "{:?}", &v7[..3]);
        assert!(!sorted(&v4), "{:?}", &v4[..3]);
        for (v, version) in [(&v7, 7), (&v4, 4)] {
            let u = uuid::Uuid::parse_str(&v[0]).expect("a UUID");
            assert_eq!(u.get_version_num(), version);
            let distinct: std::collections::HashSet<_> = v.iter().collect();
            assert_eq!(distinct.len(), v.len());
        }
    }
}
