//! What a sweep comes to: each case's medians over its rounds, the paired ratios the
//! targets are about, and the table and JSON they are printed as.

use std::collections::BTreeMap;

use justonce::backend::{StoreKind, TransportKind};
use serde::{Deserialize, Serialize};

use super::clock::median;
use super::run::RunResult;
use super::{BenchArgs, Case, Variant};

/// A variant's medians, as `--json` prints them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct VariantReport {
    pub(crate) name: String,
    pub(crate) batch: usize,
    pub(crate) concurrency: usize,
    pub(crate) msg_bytes: usize,
    /// Consumer processes (0: in the run's own process).
    pub(crate) workers: usize,
    /// The message ids (`counter`, `uuid7`, `uuid4`).
    pub(crate) ids: String,
    /// Over the `--tls-transport` and `--tls-store` URLs.
    #[serde(default)]
    pub(crate) tls: bool,
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

/// A variant's throughput with other message ids, against the first `--ids` kind.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct IdsCost {
    pub(crate) variant: String,
    pub(crate) ids: String,
    pub(crate) base_ids: String,
    /// Median of the paired ratios of msgs/s (`ids` / `base_ids`).
    pub(crate) ratio: f64,
}

/// A variant's throughput over TLS, against the same run in plaintext.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TlsCost {
    pub(crate) variant: String,
    /// Median of the paired ratios of msgs/s (TLS / plaintext).
    pub(crate) ratio: f64,
    /// Median of the paired differences of p50 latency (TLS - plaintext), in ms.
    pub(crate) p50_added_ms: f64,
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
    /// Each variant's throughput with other message ids (`--ids`).
    pub(crate) ids: Vec<IdsCost>,
    /// Each variant's throughput over TLS (`--tls-transport`, `--tls-store`).
    #[serde(default)]
    pub(crate) tls: Vec<TlsCost>,
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

pub(crate) fn report(
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
                ids: c.ids.as_str().into(),
                tls: c.tls,
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
        ids: args.ids[0],
        tls: false,
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
        ids: args
            .ids
            .iter()
            .skip(1)
            .flat_map(|&ids| {
                args.variants.iter().filter_map(move |&variant| {
                    let base = at(variant, batched);
                    let other = Case { ids, ..base };
                    Some(IdsCost {
                        variant: variant.as_str().into(),
                        ids: ids.as_str().into(),
                        base_ids: args.ids[0].as_str().into(),
                        ratio: paired(other, base, speed)?,
                    })
                })
            })
            .collect(),
        tls: args
            .variants
            .iter()
            .filter_map(|&variant| {
                let plain = at(variant, batched);
                let tls = Case { tls: true, ..plain };
                Some(TlsCost {
                    variant: variant.as_str().into(),
                    ratio: paired(tls, plain, speed)?,
                    p50_added_ms: paired(tls, plain, |x, y| x.p50_ms - y.p50_ms)?,
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

pub(crate) fn table(r: &BenchReport) -> String {
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
        "{:<21} {:>5} {:>4} {:>7} {:>6} {:>7} {:>10} {:>8} {:>8} {:>12} {:>7} {:>9}",
        "variant",
        "batch",
        "conc",
        "workers",
        "bytes",
        "ids",
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
            "{:<21} {:>5} {:>4} {:>7} {:>6} {:>7} {:>10.0} {:>8.2} {:>8.2} {:>12.2} {:>7.1} {:>9}",
            if v.tls {
                format!("{} TLS", v.name)
            } else {
                v.name.clone()
            },
            v.batch,
            v.concurrency,
            if v.workers == 0 {
                "-".to_owned()
            } else {
                v.workers.to_string()
            },
            v.msg_bytes,
            v.ids,
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
    for c in &r.ratios.ids {
        let _ = writeln!(
            s,
            "{} with {} ids / {} ids: {:.3}",
            c.variant, c.ids, c.base_ids, c.ratio
        );
    }
    for c in &r.ratios.tls {
        let _ = writeln!(
            s,
            "{} over TLS / plaintext: {:.3} (p50 added {:.2} ms)",
            c.variant, c.ratio, c.p50_added_ms
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
