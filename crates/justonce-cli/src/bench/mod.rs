//! `justonce bench`: the price of each semantic, and of the framework itself, side by side
//! in one run.
//!
//! Every variant runs the same order/payment write per message (`balance = balance + amount`
//! and a ledger row) on the same transport and store, each run in a child process of its
//! own (`justonce bench-run`) so its CPU time and peak RSS are its own. Runs are interleaved
//! (A B C D, then B C D A, …) and each number is the median over the repeats; each ratio is
//! the median of the ratios of runs made side by side in the same round.

mod plot;
mod run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

pub(crate) use run::BenchRunArgs;
use run::RunResult;

use crate::bus::Bus;
use crate::demo::progress_bar;
use crate::orders;
use justonce::backend::{StoreKind, TransportKind};

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

/// Arguments of `justonce bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Transport URL (default: an embedded SQLite queue, a fresh file per run).
    #[arg(long, value_name = "URL")]
    transport: Option<String>,
    /// Store URL for the business data and dedup records (default: embedded SQLite, a
    /// fresh file per run).
    #[arg(long, value_name = "URL")]
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
}

/// A variant's medians, as `--json` prints them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct VariantReport {
    pub(crate) name: String,
    pub(crate) batch: usize,
    pub(crate) concurrency: usize,
    pub(crate) msg_bytes: usize,
    /// Consumer processes (0: in the run's own process).
    pub(crate) workers: usize,
    pub(crate) msgs_per_sec: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) cpu_s_per_100k: f64,
    pub(crate) rss_mb: f64,
    /// Messages per second of every repeat, in run order.
    pub(crate) runs: Vec<f64>,
    /// Deadlocks the store's server counted in every repeat (`null` on SQLite).
    pub(crate) deadlocks: Vec<Option<u64>>,
}

/// Throughput with more consumer processes, against the first `--workers` value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Scaling {
    pub(crate) variant: String,
    pub(crate) workers: usize,
    pub(crate) base_workers: usize,
    /// Median of the paired ratios of msgs/s (`workers` / `base_workers`).
    pub(crate) ratio: f64,
}

/// The ratios the targets are about (medians of paired runs); `null` when a run
/// needed for one was not in the sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ratios {
    pub(crate) effectively_vs_at_least_batched: Option<f64>,
    pub(crate) effectively_vs_at_least_unbatched: Option<f64>,
    pub(crate) justonce_vs_bare: Option<f64>,
    /// p50 latency effectively-once minus at-least-once, unbatched, in ms.
    pub(crate) p50_added_ms_unbatched: Option<f64>,
    /// Each variant's throughput with more consumer processes (`--workers`).
    pub(crate) workers_scaling: Vec<Scaling>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BenchReport {
    pub(crate) transport: String,
    pub(crate) store: String,
    pub(crate) messages: u64,
    pub(crate) repeats: usize,
    /// The batch size the "batched" ratios use.
    pub(crate) batched: usize,
    /// The justonce variants ran with a savepoint and a claim per message (`--careful`).
    pub(crate) careful: bool,
    /// The hot set of accounts (`--accounts`); `null`: message i pays into account i mod 10,000.
    pub(crate) accounts: Option<i64>,
    /// Batches ran in arrival order, without lock keys (`--unordered`).
    pub(crate) unordered: bool,
    pub(crate) variants: Vec<VariantReport>,
    pub(crate) ratios: Ratios,
}

fn cases(args: &BenchArgs, batched: usize) -> Vec<Case> {
    let c0 = args.concurrency[0];
    let s0 = args.msg_bytes[0];
    let w0 = args.workers.first().copied().unwrap_or(0);
    let mut out = Vec::new();
    for &batch in &args.batch {
        for &variant in &args.variants {
            out.push(Case {
                variant,
                batch,
                concurrency: c0,
                msg_bytes: s0,
                workers: w0,
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
                variant,
                batch: batched,
                concurrency,
                msg_bytes: s0,
                workers: w0,
            });
        }
    }
    for &msg_bytes in &args.msg_bytes[1..] {
        for &variant in &swept {
            out.push(Case {
                variant,
                batch: batched,
                concurrency: c0,
                msg_bytes,
                workers: w0,
            });
        }
    }
    // The bare baseline handles no failure: the first deadlock between two of its
    // processes stops it. Only the runtime's variants are scaled out.
    for &workers in args.workers.iter().skip(1) {
        for &variant in args.variants.iter().filter(|v| **v != Variant::Bare) {
            out.push(Case {
                variant,
                batch: batched,
                concurrency: c0,
                msg_bytes: s0,
                workers,
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
    if args.batch.is_empty() || args.concurrency.is_empty() || args.msg_bytes.is_empty() {
        bail!("--batch, --concurrency and --msg-bytes each need at least one value");
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
                "{} batch {} x{} {} B{}",
                case.variant.as_str(),
                case.batch,
                case.concurrency,
                case.msg_bytes,
                match case.workers {
                    0 => String::new(),
                    w => format!(", {w} workers"),
                }
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
    let transport = args
        .transport
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", dir.join(format!("queue-{n}.db")).display()));
    let store = args
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite:{}", dir.join(format!("store-{n}.db")).display()));
    let window = (case.batch * case.concurrency) as u64;
    let messages = drained(args.messages, case.batch);
    let latency = args
        .latency_messages
        .unwrap_or_else(|| (messages / 5).max(10 * window));
    let out = tokio::process::Command::new(exe)
        .arg("bench-run")
        .args(["--transport", &transport, "--store", &store])
        .args(["--variant", case.variant.as_str()])
        .args(["--batch", &case.batch.to_string()])
        .args(["--concurrency", &case.concurrency.to_string()])
        .args(["--msg-bytes", &case.msg_bytes.to_string()])
        .args(["--messages", &messages.to_string()])
        .args(["--latency-messages", &latency.to_string()])
        .args(["--name", &name])
        .args(["--workers", &case.workers.to_string()])
        .args(["--accounts", &args.accounts.unwrap_or(0).to_string()])
        .args(args.careful.then_some("--careful"))
        .args(args.unordered.then_some("--unordered"))
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
            "bench run {} (batch {}, concurrency {}, {} B, {} workers) failed ({}): {}",
            case.variant.as_str(),
            case.batch,
            case.concurrency,
            case.msg_bytes,
            case.workers,
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

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn report(
    args: &BenchArgs,
    batched: usize,
    cases: &[Case],
    results: &BTreeMap<Case, Vec<RunResult>>,
) -> BenchReport {
    let runs = |c: &Case| -> Vec<&RunResult> {
        results
            .get(c)
            .map(|v| v.iter().collect())
            .unwrap_or_default()
    };
    let variants = cases
        .iter()
        .map(|c| {
            let r = runs(c);
            let col = |f: fn(&RunResult) -> f64| median(r.iter().map(|x| f(x)).collect());
            VariantReport {
                name: c.variant.as_str().into(),
                batch: c.batch,
                concurrency: c.concurrency,
                msg_bytes: c.msg_bytes,
                workers: c.workers,
                msgs_per_sec: col(|x| x.msgs_per_sec),
                p50_ms: col(|x| x.p50_ms),
                p99_ms: col(|x| x.p99_ms),
                cpu_s_per_100k: col(|x| x.cpu_s_per_100k),
                rss_mb: col(|x| x.rss_mb),
                runs: r.iter().map(|x| x.msgs_per_sec).collect(),
                deadlocks: r.iter().map(|x| x.deadlocks).collect(),
            }
        })
        .collect();
    let w0 = args.workers.first().copied().unwrap_or(0);
    let at = |variant: Variant, batch: usize| Case {
        variant,
        batch,
        concurrency: args.concurrency[0],
        msg_bytes: args.msg_bytes[0],
        workers: w0,
    };
    // Paired: the two runs of one round, made minutes apart at most.
    let paired = |a: Case, b: Case, f: fn(&RunResult, &RunResult) -> f64| -> Option<f64> {
        let (ra, rb) = (results.get(&a)?, results.get(&b)?);
        let v: Vec<f64> = ra.iter().zip(rb).map(|(x, y)| f(x, y)).collect();
        let m = median(v);
        m.is_finite().then_some(m)
    };
    let speed = |x: &RunResult, y: &RunResult| x.msgs_per_sec / y.msgs_per_sec;
    let ratios = Ratios {
        effectively_vs_at_least_batched: paired(
            at(Variant::EffectivelyOnce, batched),
            at(Variant::AtLeastOnce, batched),
            speed,
        ),
        effectively_vs_at_least_unbatched: paired(
            at(Variant::EffectivelyOnce, 1),
            at(Variant::AtLeastOnce, 1),
            speed,
        ),
        justonce_vs_bare: paired(
            at(Variant::AtLeastOnce, batched),
            at(Variant::Bare, batched),
            speed,
        ),
        p50_added_ms_unbatched: paired(
            at(Variant::EffectivelyOnce, 1),
            at(Variant::AtLeastOnce, 1),
            |x, y| x.p50_ms - y.p50_ms,
        ),
        workers_scaling: args
            .workers
            .iter()
            .skip(1)
            .flat_map(|&workers| {
                args.variants.iter().filter_map(move |&variant| {
                    if variant == Variant::Bare {
                        return None;
                    }
                    let base = at(variant, batched);
                    let more = Case { workers, ..base };
                    Some(Scaling {
                        variant: variant.as_str().into(),
                        workers,
                        base_workers: w0,
                        ratio: paired(more, base, speed)?,
                    })
                })
            })
            .collect(),
    };
    let transport = args
        .transport
        .as_deref()
        .map_or(Ok(TransportKind::Sqlite), TransportKind::from_url);
    let store = args
        .store
        .as_deref()
        .map_or(Ok(StoreKind::Sqlite), StoreKind::from_url);
    BenchReport {
        transport: transport.map_or("?", TransportKind::as_str).into(),
        store: store.map_or("?", StoreKind::as_str).into(),
        messages: args.messages,
        repeats: args.repeats,
        batched,
        careful: args.careful,
        accounts: args.accounts,
        unordered: args.unordered,
        variants,
        ratios,
    }
}

fn table(r: &BenchReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "justonce bench: {} transport, {} store; {} messages per run (unbatched: a tenth), medians of {} interleaved repeats{}",
        r.transport,
        r.store,
        r.messages,
        r.repeats,
        if r.careful {
            "; a savepoint and a claim per message (--careful)"
        } else {
            ""
        }
    );
    if let Some(a) = r.accounts {
        let _ = writeln!(s, "payments into a hot set of {a} accounts");
    }
    let _ = writeln!(
        s,
        "{:<17} {:>5} {:>4} {:>7} {:>6} {:>10} {:>8} {:>8} {:>12} {:>7} {:>9}",
        "variant",
        "batch",
        "conc",
        "workers",
        "bytes",
        "msgs/s",
        "p50 ms",
        "p99 ms",
        "cpu s/100k",
        "rss MB",
        "deadlocks"
    );
    for v in &r.variants {
        let deadlocks: Option<u64> = v.deadlocks.iter().copied().sum();
        let _ = writeln!(
            s,
            "{:<17} {:>5} {:>4} {:>7} {:>6} {:>10.0} {:>8.2} {:>8.2} {:>12.2} {:>7.1} {:>9}",
            v.name,
            v.batch,
            v.concurrency,
            if v.workers == 0 {
                "-".to_owned()
            } else {
                v.workers.to_string()
            },
            v.msg_bytes,
            v.msgs_per_sec,
            v.p50_ms,
            v.p99_ms,
            v.cpu_s_per_100k,
            v.rss_mb,
            deadlocks.map_or("-".to_owned(), |d| d.to_string())
        );
    }
    for sc in &r.ratios.workers_scaling {
        let _ = writeln!(
            s,
            "{} with {} workers / {}: {:.3}",
            sc.variant, sc.workers, sc.base_workers, sc.ratio
        );
    }
    let f = |x: Option<f64>| x.map_or("n/a".to_owned(), |x| format!("{x:.3}"));
    let _ = writeln!(
        s,
        "effectively-once / at-least-once: batched ({}) {}, unbatched {} (p50 added {} ms)",
        r.batched,
        f(r.ratios.effectively_vs_at_least_batched),
        f(r.ratios.effectively_vs_at_least_unbatched),
        f(r.ratios.p50_added_ms_unbatched),
    );
    let _ = writeln!(
        s,
        "justonce at-least-once / bare (batch {}): {}",
        r.batched,
        f(r.ratios.justonce_vs_bare)
    );
    s
}
