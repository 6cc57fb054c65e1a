//! `justonce outbox bench`: what the outbox costs, measured side by side on one transport
//! and one store, in interleaved rounds.
//!
//! - **Throughput**: `messages` published directly with confirms (`concurrency` tasks,
//!   `publish_batch` of `batch`), against the same messages, already committed to the
//!   outbox, drained by a relay of `concurrency` loops taking `batch` rows; the paired
//!   ratio relay / direct per round, and its median.
//! - **Ceiling** (`--ceiling`): in each round also a relay into a publisher that sends
//!   nothing and confirms at once, so that only the outbox's own work is timed (take,
//!   lease, read, mark); ceiling / direct is about the highest relay / direct this
//!   store allows on this machine, whatever the transport. It is a publishing relay's,
//!   also where the relay moves the rows.
//! - **Latency**: with the relay idle (its poll at 1 s, so only a wake-up is fast), one
//!   message at a time: from the business commit to its arrival at a consumer, through the
//!   outbox, against a publish right after the commit; the p50 the outbox adds.
//! - **Soak** (`--soak N`): producers enqueue N messages while the relay runs; the largest
//!   backlog seen, and the rows and bytes the table holds at the end.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use justonce::backend::StoreKind;
use justonce::relay::{Relay, RelayOptions};
use justonce::sql::{MySqlStore, PgOutbox, PgStore, SqliteStore};
use justonce::{Message, OutboxStore};
use serde::Serialize;

use crate::bench::clock::{median, percentile};
use crate::bus::Bus;
use crate::orders::{Bank, Tables};

/// Arguments of `justonce outbox bench`.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Store URL of the outbox (default: embedded SQLite in a temporary directory).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: Option<String>,
    /// Transport URL the messages go to (default: an embedded SQLite queue).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: Option<String>,
    /// Messages per throughput run.
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Interleaved rounds (direct and relay in each, their order alternating).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Rows (and messages) per take and per publish.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Rows per take (and messages per publish) of the relay alone (default: --batch).
    #[arg(long, value_name = "N")]
    relay_batch: Option<usize>,
    /// Relay loops, and direct publishing tasks.
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// Messages timed one by one for the latency.
    #[arg(long, default_value_t = 200)]
    latency_samples: usize,
    /// Also enqueue this many messages while the relay runs, and report the table after.
    #[arg(long, default_value_t = 0)]
    soak: usize,
    /// Relay by publishing even into a PostgreSQL queue in the outbox's database (where
    /// the relay otherwise moves the rows in one transaction).
    #[arg(long)]
    publish: bool,
    /// Also time, in each round, a relay into a publisher that sends nothing: the
    /// outbox's own rate, about the most any relay of it reaches.
    #[arg(long)]
    ceiling: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

#[derive(Debug, Serialize)]
struct Report {
    transport: String,
    store: String,
    messages: usize,
    batch: usize,
    relay_batch: usize,
    concurrency: usize,
    /// How the relay sent the rows: `publish`, or `move` (into a PostgreSQL queue in the
    /// outbox's database, a batch a transaction).
    relay_mode: &'static str,
    /// Messages per second of each round.
    direct: Vec<f64>,
    relay: Vec<f64>,
    direct_median: f64,
    relay_median: f64,
    /// Median of the paired per-round ratios relay / direct.
    ratio_median: f64,
    /// With `--ceiling`: messages per second of each round's relay into a publisher that
    /// sends nothing, their median, and the median of the paired ratios ceiling / direct.
    #[serde(skip_serializing_if = "Option::is_none")]
    ceiling: Option<Ceiling>,
    latency_direct_p50_ms: f64,
    latency_outbox_p50_ms: f64,
    latency_outbox_p99_ms: f64,
    /// p50 through the outbox less p50 of the direct publish.
    latency_added_p50_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    soak: Option<Soak>,
}

#[derive(Debug, Serialize)]
struct Ceiling {
    rounds: Vec<f64>,
    median: f64,
    ratio_median: f64,
}

#[derive(Debug, Serialize)]
struct Soak {
    messages: usize,
    seconds: f64,
    /// The largest backlog (pending rows) seen, sampled every 100 ms.
    max_pending: u64,
    /// Rows left at the end (0 when everything was sent).
    rows_left: u64,
    /// The outbox table's size on disk at the end, as the database reports it.
    table_bytes: Option<u64>,
    /// Its size after one more tidy (what a running relay does every `tidy_interval`).
    table_bytes_tidied: Option<u64>,
    /// Tidies it took: on PostgreSQL one more each 2 s while the size stayed the same (a
    /// tidy skips the table while autovacuum holds it), five at most; elsewhere one.
    tidies: u32,
}

impl BenchArgs {
    fn relay_batch(&self) -> usize {
        self.relay_batch.unwrap_or(self.batch)
    }
}

pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.messages == 0
        || args.rounds == 0
        || args.batch == 0
        || args.relay_batch == Some(0)
        || args.concurrency == 0
    {
        bail!("--messages, --rounds, --batch, --relay-batch and --concurrency must each be at least 1");
    }
    let tmp = tempfile::Builder::new()
        .prefix("justonce-outbox-bench-")
        .tempdir()?;
    let sqlite = |f: &str| format!("sqlite:{}", tmp.path().join(f).display());
    let store = args.store.clone().unwrap_or_else(|| sqlite("store.db"));
    let transport = args.transport.clone().unwrap_or_else(|| sqlite("queue.db"));
    let report = match StoreKind::from_url(&store)? {
        StoreKind::Sqlite => run_on::<SqliteStore>(&args, &store, &transport).await?,
        StoreKind::Postgres => run_on::<PgStore>(&args, &store, &transport).await?,
        StoreKind::MySql => run_on::<MySqlStore>(&args, &store, &transport).await?,
        StoreKind::Redis => anyhow::bail!("the outbox needs a SQL store, not Redis"),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(())
}

fn table(r: &Report) -> String {
    let mut out = format!(
        "justonce outbox bench: transport {}, store {}, {} messages, batch {} (relay {}, \
         {}), concurrency {}\n\n",
        r.transport, r.store, r.messages, r.batch, r.relay_batch, r.relay_mode, r.concurrency
    );
    out += &format!(
        "throughput (msg/s, median of {} interleaved rounds): direct {:.0}, relay {:.0}; \
         relay/direct {:.2} (median of paired ratios)\n",
        r.direct.len(),
        r.direct_median,
        r.relay_median,
        r.ratio_median
    );
    out += &format!(
        "latency commit -> arrival (ms): direct p50 {:.2}; outbox p50 {:.2}, p99 {:.2}; \
         added p50 {:.2}\n",
        r.latency_direct_p50_ms,
        r.latency_outbox_p50_ms,
        r.latency_outbox_p99_ms,
        r.latency_added_p50_ms
    );
    if let Some(c) = &r.ceiling {
        out += &format!(
            "ceiling (a relay into a publisher that sends nothing): {:.0} msg/s; \
             ceiling/direct {:.2}, about the highest relay/direct this store allows here\n",
            c.median, c.ratio_median
        );
    }
    if let Some(s) = &r.soak {
        out += &format!(
            "soak: {} messages in {:.1} s while relaying; largest backlog {} rows; left {} rows, \
             table {} ({} after tidies: {})\n",
            s.messages,
            s.seconds,
            s.max_pending,
            s.rows_left,
            kib(s.table_bytes),
            kib(s.table_bytes_tidied),
            s.tidies,
        );
    }
    out
}

fn kib(bytes: Option<u64>) -> String {
    bytes.map_or("size unknown".into(), |b| {
        format!("{:.1} KiB", b as f64 / 1024.0)
    })
}

fn messages(run: &str, n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            Message::new(format!(
                r#"{{"n":{i},"pad":"0123456789abcdef0123456789abcdef"}}"#
            ))
            .with_id(format!("{run}-{i}"))
            .expect("a valid id")
        })
        .collect()
}

async fn run_on<B: Bank>(
    args: &BenchArgs,
    store_url: &str,
    transport: &str,
) -> anyhow::Result<Report> {
    let run = format!("{:08x}", fastrand::u32(..));
    let tables = Tables::new(&format!("jo_obench_{run}"))?;
    let store = B::open(store_url, &tables).await?;
    let outbox = store.outbox(&tables).await?;
    let relay_mode = {
        let any: &dyn std::any::Any = &outbox;
        let queue = format!("jo-obench-{run}-latency");
        match any.downcast_ref::<PgOutbox>() {
            Some(pg)
                if super::mover(pg, transport, &queue, args.publish)
                    .await?
                    .is_some() =>
            {
                "move"
            }
            _ => "publish",
        }
    };
    let mut phases = vec![Phase::Direct, Phase::Relay];
    if args.ceiling {
        phases.push(Phase::Ceiling);
    }
    let bar = crate::demo::progress_bar(args.json, (args.rounds * phases.len()) as u64, "rounds");
    let (mut direct, mut relay, mut ceiling) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..args.rounds {
        let msgs = messages(&format!("{run}-{r}"), args.messages);
        // Each phase goes first in turn.
        let mut order = phases.clone();
        order.rotate_left(r % phases.len());
        for phase in order {
            let queue = format!("jo-obench-{run}-{r}-{}", phase.name());
            let bus = Bus::open_publisher(transport, &queue, &args.topology)
                .await
                .with_context(|| format!("round {r}, {}: opening the queue", phase.name()))?;
            let at = (&bus, transport, queue.as_str());
            let (rate, into) = match phase {
                Phase::Direct => (publish_direct(&bus, &msgs, args).await, &mut direct),
                Phase::Relay => (
                    drain_by_relay(&store, &outbox, &tables.outbox, at, &msgs, args, false).await,
                    &mut relay,
                ),
                Phase::Ceiling => (
                    drain_by_relay(&store, &outbox, &tables.outbox, at, &msgs, args, true).await,
                    &mut ceiling,
                ),
            };
            let rate = rate.with_context(|| format!("round {r}, {}", phase.name()))?;
            bus.cleanup()
                .await
                .with_context(|| format!("round {r}, {}: removing the queue", phase.name()))?;
            into.push(rate);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let paired = |xs: &[f64]| -> Vec<f64> { xs.iter().zip(&direct).map(|(x, d)| x / d).collect() };
    let ratios = paired(&relay);
    let ceiling = args.ceiling.then(|| Ceiling {
        median: median(ceiling.clone()),
        ratio_median: median(paired(&ceiling)),
        rounds: ceiling,
    });
    let (lat_direct, lat_outbox) = latency(&store, &outbox, transport, &run, args)
        .await
        .context("the latency phase")?;
    let soak = if args.soak > 0 {
        Some(
            soak(&store, &outbox, transport, &run, &tables, args)
                .await
                .context("the soak")?,
        )
    } else {
        None
    };
    store
        .drop_tables(&tables)
        .await
        .context("dropping the bench's tables")?;
    Ok(Report {
        transport: redact(transport),
        store: redact(store_url),
        messages: args.messages,
        batch: args.batch,
        relay_batch: args.relay_batch(),
        relay_mode,
        concurrency: args.concurrency,
        direct_median: median(direct.clone()),
        relay_median: median(relay.clone()),
        direct,
        relay,
        ratio_median: median(ratios),
        ceiling,
        latency_direct_p50_ms: percentile(&lat_direct, 50),
        latency_outbox_p50_ms: percentile(&lat_outbox, 50),
        latency_outbox_p99_ms: percentile(&lat_outbox, 99),
        latency_added_p50_ms: percentile(&lat_outbox, 50) - percentile(&lat_direct, 50),
        soak,
    })
}

fn redact(url: &str) -> String {
    justonce::redact_url(url)
}

/// Publishes `msgs` with confirms from `concurrency` tasks; answers msg/s.
async fn publish_direct(bus: &Bus, msgs: &[Message], args: &BenchArgs) -> anyhow::Result<f64> {
    let started = Instant::now();
    let chunks: Vec<Vec<Message>> = msgs.chunks(args.batch).map(<[Message]>::to_vec).collect();
    let chunks = Arc::new(Mutex::new(chunks.into_iter()));
    let mut tasks: tokio::task::JoinSet<justonce::Result<()>> = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let publisher = bus.publisher();
        let chunks = chunks.clone();
        tasks.spawn(async move {
            loop {
                let next = chunks.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some(chunk) = next else { return Ok(()) };
                publisher.publish_batch(&chunk).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    Ok(msgs.len() as f64 / started.elapsed().as_secs_f64())
}

/// A relay of `outbox` into `queue` at `transport` (opened as `bus`): one that moves the
/// rows when the queue is a PostgreSQL queue in the outbox's database (unless
/// `--publish`), one that publishes them otherwise.
async fn relay_of<O: OutboxStore + Clone>(
    outbox: &O,
    bus: &Bus,
    (transport, queue): (&str, &str),
    opts: RelayOptions,
    args: &BenchArgs,
) -> anyhow::Result<Relay<O>> {
    let any: &dyn std::any::Any = outbox;
    if let Some(pg) = any.downcast_ref::<PgOutbox>() {
        if let Some(mover) = super::mover(pg, transport, queue, args.publish).await? {
            return Ok(Relay::moving(outbox.clone(), mover, opts)?);
        }
    }
    Ok(Relay::new(outbox.clone(), bus.publisher(), opts)?)
}

/// The relay of the throughput runs and the soak.
fn busy_relay(args: &BenchArgs) -> RelayOptions {
    RelayOptions::default()
        .batch(args.relay_batch())
        .concurrency(args.concurrency)
}

/// The phases of a throughput round.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Publishing directly, with confirms.
    Direct,
    /// The relay, into the transport.
    Relay,
    /// The relay, into [`Discard`].
    Ceiling,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Direct => "direct",
            Phase::Relay => "relay",
            Phase::Ceiling => "ceiling",
        }
    }
}

/// A publisher that sends nothing and confirms every message at once: a relay into it
/// does only the outbox's own work.
struct Discard;

#[justonce::async_trait]
impl justonce::Publisher for Discard {
    async fn publish(&self, _message: &Message) -> justonce::Result<()> {
        Ok(())
    }

    async fn publish_batch(&self, _messages: &[Message]) -> justonce::Result<()> {
        Ok(())
    }
}

/// Commits `msgs` to the outbox (untimed), then times a relay draining them (into
/// [`Discard`] when `discard`); msg/s.
async fn drain_by_relay<B: Bank>(
    store: &B,
    outbox: &B::Outbox,
    outbox_table: &str,
    (bus, transport, queue): (&Bus, &str, &str),
    msgs: &[Message],
    args: &BenchArgs,
    discard: bool,
) -> anyhow::Result<f64> {
    for chunk in msgs.chunks(args.batch) {
        let mut tx = store.begin().await?;
        for m in chunk {
            outbox.enqueue(&mut tx, m, None).await?;
        }
        store.commit(tx).await?;
    }
    let relay = if discard {
        Relay::new(outbox.clone(), Discard, busy_relay(args))?
    } else {
        relay_of(outbox, bus, (transport, queue), busy_relay(args), args).await?
    };
    let started = Instant::now();
    let running = relay.spawn();
    // The first row, by its key, every 5 ms; the count only once that is gone. A count
    // scans the table: 40 a second took a fifth of the machine's CPU from the relay it
    // timed (51 against 65 µs of CPU a message on PostgreSQL).
    loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if !store.outbox_has_rows(outbox_table).await? && outbox.outbox_stats().await?.pending == 0
        {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the relay did not drain {} rows in 10 minutes", msgs.len());
        }
    }
    let rate = msgs.len() as f64 / started.elapsed().as_secs_f64();
    running.stop().await?;
    Ok(rate)
}

/// Receives from `queue` and notes when each id arrived.
fn arrivals(
    bus: Bus,
) -> (
    Arc<Mutex<HashMap<String, Instant>>>,
    tokio::task::JoinHandle<()>,
) {
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let noted = seen.clone();
    let task = tokio::spawn(async move {
        let Ok(source) = bus.source() else { return };
        loop {
            let Ok(got) = source.receive(100, Duration::from_millis(200)).await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let now = Instant::now();
            {
                let mut seen = noted.lock().unwrap_or_else(|e| e.into_inner());
                for d in &got {
                    if let Some(id) = d.message.id() {
                        seen.entry(id.to_string()).or_insert(now);
                    }
                }
            }
            let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
            let _ = source.ack(&receipts).await;
        }
    });
    (seen, task)
}

/// Waits for `id`'s arrival; answers the milliseconds since `since`.
async fn arrival_ms(
    seen: &Mutex<HashMap<String, Instant>>,
    id: &str,
    since: Instant,
) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(t) = seen.lock().unwrap_or_else(|e| e.into_inner()).get(id) {
            return Ok(t.saturating_duration_since(since).as_secs_f64() * 1000.0);
        }
        if Instant::now() > deadline {
            bail!("message {id} did not arrive within 30 s");
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// One message at a time, alternating: a publish right after a commit, and an enqueue in
/// the commit; each timed from the commit to its arrival. Sorted milliseconds of each.
async fn latency<B: Bank>(
    store: &B,
    outbox: &B::Outbox,
    transport: &str,
    run: &str,
    args: &BenchArgs,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let queue = format!("jo-obench-{run}-latency");
    let consumer = Bus::open(
        transport,
        &queue,
        Duration::from_secs(30),
        200,
        &args.topology,
    )
    .await?;
    let publisher = Bus::open_publisher(transport, &queue, &args.topology).await?;
    let (seen, receiving) = arrivals(consumer.clone());
    // An idle relay: its poll is a second, so only a wake-up delivers fast.
    let idle = RelayOptions::default().concurrency(1);
    let relay = relay_of(outbox, &publisher, (transport, queue.as_str()), idle, args).await?;
    let running = relay.spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut direct, mut through) = (Vec::new(), Vec::new());
    for i in 0..args.latency_samples {
        let m = Message::new("{}").with_id(format!("{run}-lat-d-{i}"))?;
        let since = Instant::now();
        publisher.publisher().publish(&m).await?;
        direct.push(arrival_ms(&seen, &format!("{run}-lat-d-{i}"), since).await?);

        let id = format!("{run}-lat-o-{i}");
        let m = Message::new("{}").with_id(id.clone())?;
        let mut tx = store.begin().await?;
        outbox.enqueue(&mut tx, &m, None).await?;
        store.commit(tx).await?;
        let since = Instant::now();
        through.push(arrival_ms(&seen, &id, since).await?);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.stop().await?;
    receiving.abort();
    consumer.cleanup().await?;
    direct.sort_by(f64::total_cmp);
    through.sort_by(f64::total_cmp);
    Ok((direct, through))
}

/// Producers enqueue `args.soak` messages while the relay runs.
async fn soak<B: Bank>(
    store: &B,
    outbox: &B::Outbox,
    transport: &str,
    run: &str,
    tables: &Tables,
    args: &BenchArgs,
) -> anyhow::Result<Soak> {
    let queue = format!("jo-obench-{run}-soak");
    let bus = Bus::open(
        transport,
        &queue,
        Duration::from_secs(30),
        500,
        &args.topology,
    )
    .await?;
    let (_seen, receiving) = arrivals(bus.clone());
    let at = (transport, queue.as_str());
    let running = relay_of(outbox, &bus, at, busy_relay(args), args)
        .await?
        .spawn();
    let bar = crate::demo::progress_bar(args.json, args.soak as u64, "soak");
    let started = Instant::now();
    let mut producers: tokio::task::JoinSet<justonce::Result<()>> = tokio::task::JoinSet::new();
    let per = args.soak.div_ceil(2);
    for p in 0..2 {
        let (store, outbox) = (store.clone(), outbox.clone());
        let (run, batch, total) = (run.to_owned(), args.batch, args.soak);
        producers.spawn(async move {
            let mut i = p * per;
            while i < ((p + 1) * per).min(total) {
                let mut tx = store.begin().await?;
                for _ in 0..batch.min((p + 1) * per - i) {
                    let m = Message::new("{}").with_id(format!("{run}-soak-{i}"))?;
                    outbox.enqueue(&mut tx, &m, None).await?;
                    i += 1;
                }
                store.commit(tx).await?;
            }
            Ok(())
        });
    }
    let mut max_pending = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pending = outbox
            .outbox_stats()
            .await
            .context("reading the outbox's stats")?
            .pending;
        max_pending = max_pending.max(pending);
        bar.set_position((args.soak as u64).min(started.elapsed().as_millis() as u64));
        if producers.is_empty() && pending == 0 {
            break;
        }
        while let Some(r) = producers.try_join_next() {
            r?.context("a producer")?;
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    running.stop().await.context("the relay")?;
    receiving.abort();
    bus.cleanup().await.context("removing the queue")?;
    let stats = outbox
        .outbox_stats()
        .await
        .context("reading the outbox's stats")?;
    let table_bytes = store.table_bytes(&tables.outbox).await.ok();
    // PostgreSQL's tidy skips the table while another vacuum (autovacuum's) holds it; a
    // running relay would tidy again after its interval: here after 2 s, five times at
    // most. Elsewhere a tidy does nothing, and once is enough.
    let tries = if B::KIND == StoreKind::Postgres { 5 } else { 1 };
    let (mut tidies, mut tidied) = (0, table_bytes);
    while tidies < tries && tidied == table_bytes {
        if tidies > 0 {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        outbox.tidy().await.context("tidying the outbox")?;
        tidies += 1;
        tidied = store.table_bytes(&tables.outbox).await.ok();
    }
    Ok(Soak {
        messages: args.soak,
        seconds,
        max_pending,
        rows_left: stats.pending + stats.dead,
        table_bytes,
        table_bytes_tidied: tidied,
        tidies,
    })
}
