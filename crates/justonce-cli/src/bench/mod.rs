//! `justonce bench`: the price of each semantic, and of the framework itself, side by side
//! in one run.
//!
//! Every variant runs the same order/payment write per message (`balance = balance + amount`
//! and a ledger row) on the same transport and store, each run in a child process of its
//! own (`justonce bench-run`) so its CPU time and peak RSS are its own. Runs are interleaved
//! (A B C D, then B C D A, …) and each number is the median over the repeats; each ratio is
//! the median of the ratios of runs made side by side in the same round.

mod bare;
pub(crate) mod clock;
mod plot;
mod report;
mod run;
mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context as _};

pub(crate) use report::BenchReport;
use report::{report, table};
pub(crate) use run::BenchRunArgs;
use run::RunResult;

use crate::bus::Bus;
use crate::demo::progress_bar;
use crate::orders;
use justonce::backend::StoreKind;

pub(crate) use run::run as run_child;

/// What consumes in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub(crate) enum Variant {
    /// The client crates directly (sqlx, lapin or the SQL queue's own calls), no justonce
    /// runtime: receive, one transaction per batch, commit, ack.
    Bare,
    /// The justonce consumer, acking before the handler.
    AtMostOnce,
    /// The justonce consumer, acking after the commit, no dedup.
    AtLeastOnce,
    /// The justonce consumer with a dedup record in the business transaction.
    EffectivelyOnce,
}

impl Variant {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Variant::Bare => "bare",
            Variant::AtMostOnce => "at-most-once",
            Variant::AtLeastOnce => "at-least-once",
            Variant::EffectivelyOnce => "effectively-once",
        }
    }
}

/// The message ids a run publishes. The dedup table's key ends in the message id, so the
/// order of the ids decides where its inserts land: in one place (ordered ids) or all over
/// its index (random ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub(crate) enum Ids {
    /// `b-000000042`: short, in publish order (the default).
    Counter,
    /// A UUIDv7 (RFC 9562): time-ordered, 36 characters.
    Uuid7,
    /// A UUIDv4: random, 36 characters.
    Uuid4,
}

impl Ids {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ids::Counter => "counter",
            Ids::Uuid7 => "uuid7",
            Ids::Uuid4 => "uuid4",
        }
    }
}

/// Arguments of `justonce bench`.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Transport URL (default: an embedded SQLite queue, a fresh file per run).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: Option<String>,
    /// Store URL for the business data and dedup records (default: embedded SQLite, a
    /// fresh file per run).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: Option<String>,
    /// Messages of each run's timed drain (unbatched runs, ten times slower per message,
    /// drain a tenth of it).
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Messages of each run's closed-loop latency phase (default: a fifth of --messages,
    /// and at least ten windows of batch x concurrency).
    #[arg(long)]
    latency_messages: Option<u64>,
    /// Rounds; every case runs once per round, interleaved with the others.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Variants, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "bare,at-most-once,at-least-once,effectively-once"
    )]
    variants: Vec<Variant>,
    /// Batch sizes swept for every variant (1 is "unbatched"; 100, or the largest given,
    /// is "batched").
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    batch: Vec<usize>,
    /// Concurrencies: the first is used everywhere, the others are swept at the batched size
    /// for at-least-once and effectively-once.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    concurrency: Vec<usize>,
    /// Message sizes in bytes: the first is used everywhere, the others are swept at the
    /// batched size for at-least-once and effectively-once.
    #[arg(long, value_delimiter = ',', default_value = "1000,100,10000")]
    msg_bytes: Vec<usize>,
    /// Message ids: the first is used everywhere, the others are swept at the batched size
    /// for at-least-once and effectively-once (`counter,uuid4` prices random ids).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "counter")]
    ids: Vec<Ids>,
    /// The same transport reached over TLS (`amqps://…`, `postgres://…?sslmode=…`): each
    /// variant also runs on it at the batched size, paired with its plaintext run
    /// (`ratios.tls`). Without it, the TLS runs use --transport.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TLS_TRANSPORT_URL",
        hide_env_values = true
    )]
    tls_transport: Option<String>,
    /// The same store reached over TLS, as --tls-transport; without it, the TLS runs use
    /// --store.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TLS_STORE_URL",
        hide_env_values = true
    )]
    tls_store: Option<String>,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Write throughput by batch size per variant as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Run the justonce variants with a savepoint and a claim per message in every batch
    /// (`BatchOptions::optimistic(false)`), to see what that costs.
    #[arg(long)]
    careful: bool,
    /// Consumer processes on the one queue, as a service scaled out: the first is used
    /// everywhere, the others are swept at the batched size. Without it each run consumes
    /// in its own process, with the latency phase; with it the drain is timed from the
    /// ledger and there is no latency phase.
    #[arg(long, value_delimiter = ',')]
    workers: Vec<usize>,
    /// Run each batch in the order its messages arrived instead of the order of the
    /// accounts they pay into (no `Handler::lock_key`), to see what the ordering buys.
    #[arg(long)]
    unordered: bool,
    /// Pay into accounts drawn at random from the first N (a hot set, at most 10,000), so
    /// that concurrent batches meet on the same rows; without it message i pays into
    /// account i mod 10,000 and batches never share one.
    #[arg(long)]
    accounts: Option<i64>,
    /// Each run serves the metrics of its consumers at this address while it runs
    /// (`/metrics`, `/healthz`, `/readyz`); the runs take turns. The recorder has a cost of
    /// its own: leave it off for the numbers.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// One configuration run by a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Case {
    variant: Variant,
    batch: usize,
    concurrency: usize,
    msg_bytes: usize,
    /// Consumer processes; 0 consumes in the run's own process.
    workers: usize,
    ids: Ids,
    /// Over the --tls-transport and --tls-store URLs.
    tls: bool,
}

fn cases(args: &BenchArgs, batched: usize) -> Vec<Case> {
    // Every sweep changes one thing of the reference case at the batched size.
    let base = |variant: Variant| Case {
        variant,
        batch: batched,
        concurrency: args.concurrency[0],
        msg_bytes: args.msg_bytes[0],
        workers: args.workers.first().copied().unwrap_or(0),
        ids: args.ids[0],
        tls: false,
    };
    let mut out = Vec::new();
    for &batch in &args.batch {
        for &variant in &args.variants {
            out.push(Case {
                batch,
                ..base(variant)
            });
        }
    }
    let swept: Vec<Variant> = args
        .variants
        .iter()
        .copied()
        .filter(|v| matches!(v, Variant::AtLeastOnce | Variant::EffectivelyOnce))
        .collect();
    for &concurrency in &args.concurrency[1..] {
        for &variant in &swept {
            out.push(Case {
                concurrency,
                ..base(variant)
            });
        }
    }
    for &msg_bytes in &args.msg_bytes[1..] {
        for &variant in &swept {
            out.push(Case {
                msg_bytes,
                ..base(variant)
            });
        }
    }
    for &ids in &args.ids[1..] {
        for &variant in &swept {
            out.push(Case {
                ids,
                ..base(variant)
            });
        }
    }
    if args.tls_transport.is_some() || args.tls_store.is_some() {
        for &variant in &args.variants {
            out.push(Case {
                tls: true,
                ..base(variant)
            });
        }
    }
    // The bare baseline handles no failure: the first deadlock between two of its
    // processes stops it. Only the runtime's variants are scaled out.
    for &workers in args.workers.iter().skip(1) {
        for &variant in args.variants.iter().filter(|v| **v != Variant::Bare) {
            out.push(Case {
                workers,
                ..base(variant)
            });
        }
    }
    out.dedup();
    out
}

pub(crate) async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.messages == 0 || args.repeats == 0 {
        bail!("--messages and --repeats must each be at least 1");
    }
    if args.batch.is_empty()
        || args.concurrency.is_empty()
        || args.msg_bytes.is_empty()
        || args.ids.is_empty()
    {
        bail!("--batch, --concurrency, --msg-bytes and --ids each need at least one value");
    }
    if args.batch.contains(&0) || args.concurrency.contains(&0) || args.workers.contains(&0) {
        bail!("batch sizes, concurrencies and workers must be at least 1");
    }
    if args
        .accounts
        .is_some_and(|a| !(1..=orders::ACCOUNTS).contains(&a))
    {
        bail!("--accounts must be between 1 and {}", orders::ACCOUNTS);
    }
    if let Some(t) = &args.transport {
        Bus::kind_of(t)?;
    }
    if let Some(s) = &args.store {
        StoreKind::from_url(s)?;
    }
    for (tls, plain, what) in [
        (&args.tls_transport, &args.transport, "transport"),
        (&args.tls_store, &args.store, "store"),
    ] {
        if let Some(tls) = tls {
            let same = match (what, plain) {
                ("transport", Some(p)) => Bus::kind_of(tls)? == Bus::kind_of(p)?,
                ("store", Some(p)) => StoreKind::from_url(tls)? == StoreKind::from_url(p)?,
                _ => false,
            };
            if !same {
                bail!("--tls-{what} must reach the same kind of {what} as --{what}, over TLS");
            }
        }
    }
    let batched = if args.batch.contains(&100) {
        100
    } else {
        args.batch.iter().copied().max().unwrap_or(1)
    };
    let cases = cases(&args, batched);
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let bar = progress_bar(args.json, (cases.len() * args.repeats) as u64, "bench runs");

    let mut results: BTreeMap<Case, Vec<RunResult>> = BTreeMap::new();
    let mut n = 0usize;
    for round in 0..args.repeats {
        // Interleaved: each round starts one case further on.
        for k in 0..cases.len() {
            let case = cases[(k + round) % cases.len()];
            bar.set_message(format!(
                "{} batch {} x{} {} B, {} ids{}{}",
                case.variant.as_str(),
                case.batch,
                case.concurrency,
                case.msg_bytes,
                case.ids.as_str(),
                match case.workers {
                    0 => String::new(),
                    w => format!(", {w} workers"),
                },
                if case.tls { ", TLS" } else { "" }
            ));
            n += 1;
            let r = child(&exe, &args, dir.path(), case, n).await?;
            results.entry(case).or_default().push(r);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();

    let report = report(&args, batched, &cases, &results);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report));
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, plot::svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        if !args.json {
            println!("plot: {}", path.display());
        }
    }
    Ok(())
}

/// Runs one case in a child process and reads its result line.
async fn child(
    exe: &Path,
    args: &BenchArgs,
    dir: &Path,
    case: Case,
    n: usize,
) -> anyhow::Result<RunResult> {
    let name = format!("jo_bench_{}_{n}", std::process::id());
    let (transport, store) = if case.tls {
        (
            args.tls_transport.as_ref().or(args.transport.as_ref()),
            args.tls_store.as_ref().or(args.store.as_ref()),
        )
    } else {
        (args.transport.as_ref(), args.store.as_ref())
    };
    let transport = transport
        .cloned()
        .unwrap_or_else(|| format!("sqlite:{}", dir.join(format!("queue-{n}.db")).display()));
    let store = store
        .cloned()
        .unwrap_or_else(|| format!("sqlite:{}", dir.join(format!("store-{n}.db")).display()));
    let window = (case.batch * case.concurrency) as u64;
    let messages = drained(args.messages, case.batch);
    let latency = args
        .latency_messages
        .unwrap_or_else(|| (messages / 5).max(10 * window));
    let out = tokio::process::Command::new(exe)
        .arg("bench-run")
        .env("JUSTONCE_TRANSPORT_URL", &transport)
        .env("JUSTONCE_STORE_URL", &store)
        .args(["--variant", case.variant.as_str()])
        .args(["--batch", &case.batch.to_string()])
        .args(["--concurrency", &case.concurrency.to_string()])
        .args(["--msg-bytes", &case.msg_bytes.to_string()])
        .args(["--ids", case.ids.as_str()])
        .args(["--messages", &messages.to_string()])
        .args(["--latency-messages", &latency.to_string()])
        .args(["--name", &name])
        .args(["--workers", &case.workers.to_string()])
        .args(["--accounts", &args.accounts.unwrap_or(0).to_string()])
        .args(args.careful.then_some("--careful"))
        .args(args.unordered.then_some("--unordered"))
        .args(
            args.metrics_addr
                .iter()
                .flat_map(|a| ["--metrics-addr".to_owned(), a.to_string()]),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output()
        .await
        .context("starting a bench run")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str::<RunResult>(line) {
        Ok(r) if out.status.success() => {
            // The run cleaned up after itself; the SQLite files can go now.
            for f in ["queue", "store"] {
                let _ = std::fs::remove_file(dir.join(format!("{f}-{n}.db")));
            }
            Ok(r)
        }
        _ => bail!(
            "bench run {} (batch {}, concurrency {}, {} B, {} workers, {} ids) failed ({}): {}",
            case.variant.as_str(),
            case.batch,
            case.concurrency,
            case.msg_bytes,
            case.workers,
            case.ids.as_str(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// Messages of a run's timed drain: `--messages`, a tenth of it for unbatched runs (at least
/// 100).
fn drained(messages: u64, batch: usize) -> u64 {
    if batch == 1 {
        (messages / 10).max(100.min(messages))
    } else {
        messages
    }
}
