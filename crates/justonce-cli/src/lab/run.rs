//! One lab scenario: processes, the fault schedule, the drain, and the checker.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use indicatif::{ProgressBar, ProgressStyle};
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::Semantics;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::plot::Samples;
use super::proxy::{through, FaultProxy};
use super::{FaultClass, FaultCounts, LabArgs, LabReport};
use crate::bus::{Bus, Topology};
use crate::demo::plan::Plan;
use crate::orders::{Bank, Tables};
use justonce::backend::{StoreKind, TransportKind};

/// The consumers' payload limit (the plan's oversized poison is one byte over).
const MAX_PAYLOAD: usize = 16 * 1024;
/// Deliveries per worker batch: small, so that the workers' transactions, which pay into the
/// same 100 accounts, deadlock each other less often.
const BATCH: usize = 20;
/// The workers' longest pause after failed batches. A pausing worker on RabbitMQ still holds
/// the deliveries it prefetched, so the drain waits longer than this before it calls the
/// pipeline quiet.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long nothing may move before the pipeline counts as drained.
const QUIET: Duration = Duration::from_secs(5);

/// Where a kill lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KillAt {
    /// At a fault point of the runtime, announced by the worker.
    Point(&'static str),
    /// Whenever the schedule says, wherever the worker is.
    Random,
}

/// One scenario of the lab.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    name: String,
    transport: Option<String>,
    store: Option<String>,
    t_kind: TransportKind,
    s_kind: StoreKind,
    semantics: Semantics,
    messages: u64,
    workers: usize,
    seed: u64,
    faults: Vec<FaultClass>,
    kills: u32,
    lease: Duration,
    topology: Topology,
}

impl Scenario {
    pub(crate) fn new(
        args: &LabArgs,
        transport: Option<String>,
        store: Option<String>,
        faults: Vec<FaultClass>,
    ) -> anyhow::Result<Self> {
        let t_kind = transport
            .as_deref()
            .map_or(Ok(TransportKind::Sqlite), TransportKind::from_url)?;
        let s_kind = store
            .as_deref()
            .map_or(Ok(StoreKind::Sqlite), StoreKind::from_url)?;
        for f in &faults {
            if !f.applies(t_kind, s_kind) {
                bail!(
                    "the {} fault does not apply to transport {} with store {}",
                    f.as_str(),
                    t_kind.as_str(),
                    s_kind.as_str()
                );
            }
        }
        let name = match faults.as_slice() {
            [one] => one.as_str().to_owned(),
            _ => "mixed".to_owned(),
        };
        let faults = if faults.is_empty() {
            FaultClass::ALL
                .into_iter()
                .filter(|f| f.applies(t_kind, s_kind))
                .collect()
        } else {
            faults
        };
        // In the matrix each line is about its own class; one kill still makes every run
        // prove redelivery. A single run kills as often as asked.
        let kills = if args.matrix { 1 } else { args.kills.max(1) };
        Ok(Scenario {
            name,
            transport,
            store,
            t_kind,
            s_kind,
            semantics: args.semantics,
            messages: args.messages,
            workers: args.workers,
            seed: args.seed,
            faults,
            kills,
            lease: Duration::from_millis(args.lease_ms),
            topology: args.topology.clone(),
        })
    }

    /// The report of a scenario that could not run to the end; with its counts filled in,
    /// the base of every report.
    pub(crate) fn failed(&self, why: String) -> LabReport {
        LabReport {
            scenario: self.name.clone(),
            transport: self.t_kind.as_str().into(),
            store: self.s_kind.as_str().into(),
            semantics: self.semantics.as_str().into(),
            seed: self.seed,
            messages: self.messages,
            workers: self.workers,
            faults: FaultCounts::default(),
            deliveries: 0,
            redeliveries: 0,
            effects: 0,
            lost: 0,
            duplicate_effects: 0,
            dead_lettered: 0,
            drain_seconds: 0.0,
            msgs_per_sec: 0.0,
            schema_pauses: 0,
            worker_exits: 0,
            verdict: "fail",
            why,
        }
    }

    pub(crate) async fn run(
        &self,
        exe: &Path,
        progress: bool,
        plot: Option<&Path>,
    ) -> anyhow::Result<LabReport> {
        match self.s_kind {
            StoreKind::Sqlite => self.run_on::<SqliteStore>(exe, progress, plot).await,
            StoreKind::Postgres => self.run_on::<PgStore>(exe, progress, plot).await,
            StoreKind::MySql => self.run_on::<MySqlStore>(exe, progress, plot).await,
        }
    }

    async fn run_on<B: Bank>(
        &self,
        exe: &Path,
        progress: bool,
        plot: Option<&Path>,
    ) -> anyhow::Result<LabReport> {
        let tmp = tempfile::Builder::new().prefix("justonce-lab-").tempdir()?;
        let in_tmp = |f: &str| format!("sqlite:{}", tmp.path().join(f).display());
        let transport = self.transport.clone().unwrap_or_else(|| in_tmp("queue.db"));
        let store_url = self.store.clone().unwrap_or_else(|| in_tmp("store.db"));
        let run_id = format!("{:08x}", fastrand::u32(..));
        let queue = format!("justonce-lab-{run_id}");
        let tables = Tables::new(&format!("jo_lab_{run_id}"))?;
        let plan = Plan::new(self.messages, self.seed, MAX_PAYLOAD);

        // The checker's own connections, straight to the services.
        let store = B::open(&store_url, &tables).await?;
        store.setup(&tables, &[]).await?;
        let sink = Bus::open_publisher(&transport, &queue, &self.topology).await?;

        // The workers' and the publisher's connections go through the fault proxies.
        let (t_proxy, worker_transport) =
            proxied(&transport, self.t_kind != TransportKind::Sqlite).await?;
        let (s_proxy, worker_store) = proxied(&store_url, self.s_kind != StoreKind::Sqlite).await?;
        let proxies: Vec<Arc<FaultProxy>> = [t_proxy, s_proxy].into_iter().flatten().collect();

        let mut rng = fastrand::Rng::with_seed(self.seed);
        let mut kill_plan: Vec<KillAt> = Vec::new();
        let points: &[&'static str] = if self.semantics == Semantics::AtMostOnce {
            &["after-ack", "before-commit", "after-ack"]
        } else {
            &["after-commit", "before-commit", "after-commit"]
        };
        for i in 0..self.kills as usize {
            kill_plan.push(if i % 4 == 3 {
                KillAt::Random
            } else {
                KillAt::Point(points[i % points.len()])
            });
        }
        let point_kills: Vec<&'static str> = kill_plan
            .iter()
            .filter_map(|k| match k {
                KillAt::Point(p) => Some(*p),
                KillAt::Random => None,
            })
            .collect();
        // Milestones (fractions of the orders delivered) for everything but point kills: a
        // scheduled `Kill` is a kill at a random moment.
        let mut events: Vec<FaultClass> = kill_plan
            .iter()
            .filter(|k| **k == KillAt::Random)
            .map(|_| FaultClass::Kill)
            .chain(
                self.faults
                    .iter()
                    .copied()
                    .filter(|f| *f != FaultClass::Kill),
            )
            .collect();
        rng.shuffle(&mut events);
        let n = events.len().max(1) as f64;
        let mut schedule: Vec<(f64, FaultClass)> = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (0.1 + 0.6 * (i as f64 + 0.5) / n, e))
            .collect();
        schedule.reverse(); // popped from the end, earliest first

        let spec = WorkerSpec {
            exe: exe.to_owned(),
            transport: worker_transport.clone(),
            store: worker_store,
            queue: queue.clone(),
            consumer: format!("lab-{run_id}"),
            tables: format!("jo_lab_{run_id}"),
            semantics: self.semantics,
            lease: self.lease,
            topology: self.topology.to_args(),
            schema_pauses: Arc::default(),
        };
        let schema = SchemaFault {
            url: store_url.clone(),
            table: tables.accounts.clone(),
        };
        let mut worker_exits = 0u64;
        let (marks_tx, mut marks_rx) = mpsc::unbounded_channel::<Mark>();
        let mut workers: Vec<Worker> = Vec::new();
        let mut next_point = point_kills.iter();
        for slot in 0..self.workers {
            // Every first worker carries a kill point, so kills happen early in any run.
            let kill = next_point.next().copied();
            let n = rng.u32(1..=3);
            workers.push(spec.spawn(slot, 0, kill.map(|p| (p, n)), marks_tx.clone())?);
        }
        // The publisher starts once every worker is consuming, so that the first worker's
        // kill point is reached however fast the queue drains.
        wait_ready(&mut marks_rx, &workers).await?;
        let mut publisher = Command::new(exe)
            .args([
                "publish",
                "--transport",
                &worker_transport,
                "--queue",
                &queue,
            ])
            .args([
                "--messages",
                &self.messages.to_string(),
                "--seed",
                &self.seed.to_string(),
            ])
            .args(self.topology.to_args())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the publisher process")?;

        let bar = if progress {
            let bar = ProgressBar::new(self.messages);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(format!("lab {}", self.name));
            bar
        } else {
            ProgressBar::hidden()
        };

        let started = Instant::now();
        let mut counts = FaultCounts {
            duplicate_publishes: plan.planned().duplicate_publishes,
            ..FaultCounts::default()
        };
        let busy = Arc::new(AtomicUsize::new(0));
        let mut samples = Samples::default();
        let mut last_fault = started;
        let mut publisher_done = false;
        let mut quiet = 0;
        let mut last_seen = (u64::MAX, u64::MAX, Instant::now());
        let mut generation = 0u64;
        let mut rounds = 0;
        let drained_at = loop {
            // A worker at its fault point: kill it there, and start its replacement.
            while let Ok(mark) = marks_rx.try_recv() {
                let Mark::FaultPoint(slot, gen) = mark else {
                    continue;
                };
                if workers[slot].generation != gen {
                    continue;
                }
                workers[slot].kill().await;
                counts.kills += 1;
                let at = workers[slot].kill_point.unwrap_or("?");
                samples.mark(started.elapsed(), format!("kill {at}"));
                last_fault = Instant::now();
                generation += 1;
                let kill = next_point.next().copied().map(|p| (p, rng.u32(1..=3)));
                workers[slot] = spec.spawn(slot, generation, kill, marks_tx.clone())?;
            }
            // A worker that died on its own (it cannot start while a service is down):
            // start it again.
            for (slot, worker) in workers.iter_mut().enumerate() {
                if let Ok(Some(_)) = worker.child.try_wait() {
                    worker_exits += 1;
                    generation += 1;
                    let kill = worker.kill_point.map(|p| (p, rng.u32(1..=3)));
                    *worker = spec.spawn(slot, generation, kill, marks_tx.clone())?;
                }
            }
            if !publisher_done {
                if let Ok(Some(status)) = publisher.try_wait() {
                    if !status.success() {
                        bail!("the publisher process failed ({status})");
                    }
                    publisher_done = true;
                }
            }

            let (Ok(deliveries), Ok(effects), Ok(backlog)) = (
                store.delivery_counts(&tables).await.map(|d| d.0),
                store.ledger_rows(&tables).await,
                sink.pending().await,
            ) else {
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            };
            samples.push(started.elapsed(), effects);
            bar.set_position(effects.min(self.messages));
            bar.set_message(format!(
                "kills {} pauses {} cuts {} restarts {}",
                counts.kills,
                counts.pauses,
                counts.cuts,
                counts.broker_restarts + counts.db_restarts
            ));

            let fraction = deliveries as f64 / self.messages as f64;
            if schedule.last().is_some_and(|(at, _)| fraction >= *at) {
                if let Some((_, event)) = schedule.pop() {
                    let label = event
                        .fire(
                            &mut workers,
                            &proxies,
                            &schema,
                            &busy,
                            self.lease,
                            &mut rng,
                            &mut counts,
                        )
                        .await;
                    samples.mark(started.elapsed(), label);
                    last_fault = Instant::now();
                }
            }

            let settled = publisher_done
                && backlog == 0
                && busy.load(Ordering::SeqCst) == 0
                && schedule.is_empty();
            if (deliveries, effects) != (last_seen.0, last_seen.1) {
                last_seen = (deliveries, effects, Instant::now());
            } else if last_seen.2.elapsed() > Duration::from_secs(120) {
                let tails = tails(&workers);
                bail!(
                    "no progress for 120 s: {backlog} messages waiting on the transport; the workers said:\n{}",
                    tails.join("\n")
                );
            }
            quiet = if settled && last_seen.2.elapsed() > QUIET {
                quiet + 1
            } else {
                0
            };
            if quiet >= 4 {
                // Stop the workers gracefully; what they held comes back to the queue.
                for w in &mut workers {
                    w.terminate().await;
                }
                if sink.pending().await.unwrap_or(1) == 0 || rounds >= 10 {
                    break Instant::now();
                }
                rounds += 1;
                for (slot, worker) in workers.iter_mut().enumerate() {
                    generation += 1;
                    *worker = spec.spawn(slot, generation, None, marks_tx.clone())?;
                }
                // Quiet again only after the new workers have had their chance: they take
                // what came back at once (so nothing looks ready) and need time to start.
                wait_ready(&mut marks_rx, &workers).await?;
                last_seen.2 = Instant::now();
                quiet = 0;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        bar.finish_and_clear();
        let _ = publisher.start_kill();

        // The checker: everything from the business data and the transport.
        let effects = store.effects(&tables).await?;
        let (lost, duplicate_effects) = effects.check(plan.well_formed());
        let (deliveries, redeliveries) = store.delivery_counts(&tables).await?;
        let letters = sink.dead_letters().await?;
        let dead_lettered = crate::bus::distinct(&letters);
        let backlog = sink.pending().await?;
        let elapsed = started.elapsed().as_secs_f64();
        let mut why = Vec::new();
        let poison: std::collections::HashSet<&str> = plan
            .orders
            .iter()
            .filter(|o| o.poison)
            .map(|o| o.order_id.as_str())
            .collect();
        let well_formed = |d: &&justonce::DeadLetter| {
            d.message
                .id()
                .is_some_and(|id| !poison.contains(id.as_str()))
        };
        let good_dead = letters.iter().filter(well_formed).count();
        if good_dead > 0 && lost == 0 {
            why.push(format!(
                "{good_dead} well-formed orders dead-lettered (and applied all the same)"
            ));
        }
        if lost > 0 {
            why.push(format!("{lost} orders lost"));
            // Well-formed orders in the dead-letter queue are not silently lost: say why.
            let mut reasons: Vec<String> = letters
                .iter()
                .filter(well_formed)
                .map(|d| d.reason.error.clone())
                .collect();
            if !reasons.is_empty() {
                let n = reasons.len();
                reasons.sort();
                reasons.dedup();
                why.push(format!(
                    "{n} of them dead-lettered: {}",
                    reasons.join(" / ")
                ));
            }
        }
        if duplicate_effects > 0 {
            why.push(format!("{duplicate_effects} duplicate effects"));
        }
        if !effects.consistent {
            why.push("balances do not add up to the ledger".to_owned());
        }
        if redeliveries == 0 {
            why.push("the faults caused no redelivery: the run proves nothing".to_owned());
        }
        let schema_pauses = spec.schema_pauses.load(Ordering::SeqCst);
        if self.faults.contains(&FaultClass::Schema) {
            if counts.schema_breaks == 0 {
                why.push("the accounts table was never renamed away".to_owned());
            } else if schema_pauses == 0 {
                why.push("no worker met the renamed table: the run proves nothing".to_owned());
            }
            if worker_exits > 0 {
                why.push(format!(
                    "{worker_exits} workers exited instead of pausing until the table came back"
                ));
            }
        }
        if backlog > 0 {
            why.push(format!("{backlog} messages never drained"));
            let tails = tails(&workers);
            eprintln!("lab: the last workers said:\n{}", tails.join("\n"));
        }
        let report = LabReport {
            faults: counts,
            deliveries,
            redeliveries,
            effects: effects.total,
            lost,
            duplicate_effects,
            dead_lettered,
            drain_seconds: drained_at.duration_since(last_fault).as_secs_f64(),
            msgs_per_sec: self.messages as f64 / elapsed.max(1e-9),
            schema_pauses,
            worker_exits,
            verdict: if why.is_empty() { "pass" } else { "fail" },
            why: why.join("; "),
            ..self.failed(String::new())
        };
        if let Some(path) = plot {
            std::fs::write(path, samples.svg(&report))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        sink.cleanup().await?;
        if self.s_kind != StoreKind::Sqlite {
            store.drop_tables(&tables).await?;
        }
        Ok(report)
    }
}

/// Waits until every worker has said it is consuming; fault-point marks that arrive
/// meanwhile are dropped (their workers are gone or will be replaced).
async fn wait_ready(
    marks: &mut mpsc::UnboundedReceiver<Mark>,
    workers: &[Worker],
) -> anyhow::Result<()> {
    let mut ready = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready < workers.len() {
        match tokio::time::timeout_at(deadline.into(), marks.recv()).await {
            Ok(Some(Mark::Ready)) => ready += 1,
            Ok(Some(Mark::FaultPoint(..))) => {}
            _ => {
                let tails = tails(workers);
                bail!(
                    "the workers did not start within 60 s:\n{}",
                    tails.join("\n")
                );
            }
        }
    }
    Ok(())
}

/// A proxy in front of `url`'s server, and the URL through it; none when the backend has
/// no server (SQLite).
async fn proxied(url: &str, networked: bool) -> anyhow::Result<(Option<Arc<FaultProxy>>, String)> {
    if !networked {
        return Ok((None, url.to_owned()));
    }
    let probe: SocketAddr = "127.0.0.1:0".parse()?;
    let (_, hostport) = through(url, probe).context("cannot find host:port in the URL")?;
    let upstream = tokio::net::lookup_host(&hostport)
        .await?
        .next()
        .with_context(|| format!("cannot resolve {hostport}"))?;
    let proxy = Arc::new(FaultProxy::start(upstream).await?);
    let (via, _) = through(url, proxy.addr()).context("cannot rewrite the URL")?;
    Ok((Some(proxy), via))
}

/// How to start a worker.
struct WorkerSpec {
    exe: std::path::PathBuf,
    transport: String,
    store: String,
    queue: String,
    consumer: String,
    tables: String,
    semantics: Semantics,
    lease: Duration,
    /// The RabbitMQ topology flags.
    topology: Vec<String>,
    /// Batches handed back for a schema error, as the workers logged them.
    schema_pauses: Arc<std::sync::atomic::AtomicU64>,
}

impl WorkerSpec {
    /// Starts a worker in `slot`; with `kill`, it stops at that point of its n-th batch and
    /// says so on stderr, where a reader task passes it on as `(slot, generation)`.
    fn spawn(
        &self,
        slot: usize,
        generation: u64,
        kill: Option<(&'static str, u32)>,
        marks: mpsc::UnboundedSender<Mark>,
    ) -> anyhow::Result<Worker> {
        let mut cmd = Command::new(&self.exe);
        cmd.args([
            "worker",
            "--transport",
            &self.transport,
            "--store",
            &self.store,
        ])
        .args([
            "--queue",
            &self.queue,
            "--consumer",
            &self.consumer,
            "--tables",
            &self.tables,
        ])
        .args([
            "--semantics",
            self.semantics.as_str(),
            "--batch-size",
            &BATCH.to_string(),
        ])
        .args([
            "--lease-ms",
            &self.lease.as_millis().to_string(),
            "--audit",
            "--no-setup",
        ])
        .args(["--backoff-max-ms", &BACKOFF_MAX.as_millis().to_string()])
        .args(&self.topology)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        match kill {
            Some((point, n)) => cmd.env("JUSTONCE_FAULT_PAUSE", format!("{point}:600000:{n}")),
            None => cmd.env_remove("JUSTONCE_FAULT_PAUSE"),
        };
        let mut child = cmd.spawn().context("cannot start a worker process")?;
        let stderr = child.stderr.take().context("worker stderr")?;
        let tail = Arc::new(Mutex::new(Vec::<String>::new()));
        let tail2 = tail.clone();
        let schema_pauses = self.schema_pauses.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("kind=schema") {
                    schema_pauses.fetch_add(1, Ordering::SeqCst);
                }
                if line.starts_with("justonce-fault-point ") {
                    let _ = marks.send(Mark::FaultPoint(slot, generation));
                } else if line.starts_with("justonce-worker ready") {
                    let _ = marks.send(Mark::Ready);
                }
                let mut t = tail2.lock().unwrap_or_else(|e| e.into_inner());
                t.push(line);
                let n = t.len();
                if n > 20 {
                    t.drain(..n - 20);
                }
            }
        });
        Ok(Worker {
            child,
            generation,
            kill_point: kill.map(|(p, _)| p),
            tail,
        })
    }
}

/// The last stderr lines of each worker, for an error message.
fn tails(workers: &[Worker]) -> Vec<String> {
    workers.iter().map(Worker::tail).collect()
}

/// What a worker says on stderr that the lab acts on.
#[derive(Debug, Clone, Copy)]
enum Mark {
    /// It is consuming.
    Ready,
    /// It stopped at its fault point: kill it now. `(slot, generation)`.
    FaultPoint(usize, u64),
}

/// A running worker process.
struct Worker {
    child: Child,
    generation: u64,
    kill_point: Option<&'static str>,
    tail: Arc<Mutex<Vec<String>>>,
}

impl Worker {
    /// The last lines the worker wrote on stderr.
    fn tail(&self) -> String {
        let t = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        format!(
            "  [{}]\n    {}",
            self.pid().map_or("exited".into(), |p| p.to_string()),
            t.join("\n    ")
        )
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGKILL, and wait for it.
    async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM: finish the batch in flight, commit, ack, exit; SIGKILL after 15 s.
    async fn terminate(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, "TERM");
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Sends a signal with kill(1) (the workspace forbids `unsafe`, so no libc::kill).
fn signal(pid: u32, name: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl FaultClass {
    /// Does it at its milestone; returns its label for the plot. Faults with a duration (pause, delay, black
    /// hole) end in a task of their own, counted in `busy` until they have.
    #[allow(clippy::too_many_arguments)]
    async fn fire(
        self,
        workers: &mut [Worker],
        proxies: &[Arc<FaultProxy>],
        schema: &SchemaFault,
        busy: &Arc<AtomicUsize>,
        lease: Duration,
        rng: &mut fastrand::Rng,
        counts: &mut FaultCounts,
    ) -> String {
        let slot = rng.usize(..workers.len());
        match self {
            FaultClass::Kill => {
                workers[slot].kill().await;
                counts.kills += 1;
                "kill (random moment)".into()
            }
            FaultClass::Pause => {
                let span = (lease * 3).max(Duration::from_secs(2));
                if let Some(pid) = workers[slot].pid() {
                    signal(pid, "STOP");
                    busy.fetch_add(1, Ordering::SeqCst);
                    let busy = busy.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(span).await;
                        signal(pid, "CONT");
                        busy.fetch_sub(1, Ordering::SeqCst);
                    });
                    counts.pauses += 1;
                }
                format!("pause {:.1}s", span.as_secs_f64())
            }
            FaultClass::Cut => {
                for p in proxies {
                    p.cut_all();
                }
                counts.cuts += 1;
                "cut".into()
            }
            FaultClass::Delay => {
                timed(proxies, busy, Duration::from_secs(3), |p, on| {
                    p.set_delay(if on {
                        Duration::from_millis(100)
                    } else {
                        Duration::ZERO
                    })
                });
                "delay 100ms x 3s".into()
            }
            FaultClass::Blackhole => {
                let span = (lease * 3).max(Duration::from_secs(3));
                timed(proxies, busy, span, |p, on| p.set_blackhole(on));
                counts.cuts += 1;
                format!("blackhole {:.1}s", span.as_secs_f64())
            }
            FaultClass::BrokerRestart => {
                let stopped = rabbitmqctl("stop_app").await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                let started = rabbitmqctl("start_app").await;
                if stopped && started {
                    counts.broker_restarts += 1;
                }
                "broker restart".into()
            }
            FaultClass::DbRestart => {
                if pg_restart().await {
                    counts.db_restarts += 1;
                }
                "db restart".into()
            }
            FaultClass::Schema => {
                let span = Duration::from_secs(4);
                match schema.rename(false).await {
                    Ok(()) => {
                        counts.schema_breaks += 1;
                        busy.fetch_add(1, Ordering::SeqCst);
                        let (busy, schema) = (busy.clone(), schema.clone());
                        tokio::spawn(async move {
                            tokio::time::sleep(span).await;
                            // The table must come back, or nothing drains; a server that is
                            // down for a while is waited for, but not for ever: a scenario
                            // whose table never returns fails on its drain, and the matrix
                            // goes on.
                            for attempt in 1..=60 {
                                match schema.rename(true).await {
                                    Ok(()) => break,
                                    Err(e) if attempt == 60 => {
                                        eprintln!("lab: the accounts table could not be renamed back; giving up: {e:#}")
                                    }
                                    Err(e) => {
                                        eprintln!(
                                            "lab: the accounts table did not come back yet: {e:#}"
                                        );
                                        tokio::time::sleep(Duration::from_millis(500)).await;
                                    }
                                }
                            }
                            busy.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    Err(e) => eprintln!("lab: could not rename the accounts table: {e:#}"),
                }
                format!("schema {:.0}s", span.as_secs_f64())
            }
        }
    }
}

/// The deploy mistake of the `schema` fault: the accounts table renamed away, then back,
/// with a connection of the lab's own, straight to the store.
#[derive(Debug, Clone)]
struct SchemaFault {
    url: String,
    table: String,
}

impl SchemaFault {
    /// Renames the table away (`back` false) or back.
    async fn rename(&self, back: bool) -> anyhow::Result<()> {
        use sqlx::Connection as _;
        let away = format!("{}_away", self.table);
        let (from, to) = if back {
            (away.as_str(), self.table.as_str())
        } else {
            (self.table.as_str(), away.as_str())
        };
        match StoreKind::from_url(&self.url)? {
            StoreKind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await?;
                sqlx::query(&format!("ALTER TABLE {from} RENAME TO {to}"))
                    .execute(&mut c)
                    .await?;
                c.close().await?;
            }
            StoreKind::MySql => {
                let url = self.url.replacen("mariadb://", "mysql://", 1);
                let mut c = sqlx::MySqlConnection::connect(&url).await?;
                sqlx::query(&format!("RENAME TABLE {from} TO {to}"))
                    .execute(&mut c)
                    .await?;
                c.close().await?;
            }
            StoreKind::Sqlite => {
                anyhow::bail!("the schema fault needs a PostgreSQL or MariaDB store")
            }
        }
        Ok(())
    }
}

/// Turns a proxy switch on for `span`, then off, in a task counted in `busy`.
fn timed(
    proxies: &[Arc<FaultProxy>],
    busy: &Arc<AtomicUsize>,
    span: Duration,
    set: fn(&FaultProxy, bool),
) {
    for p in proxies {
        set(p, true);
    }
    busy.fetch_add(1, Ordering::SeqCst);
    let proxies = proxies.to_vec();
    let busy = busy.clone();
    tokio::spawn(async move {
        tokio::time::sleep(span).await;
        for p in &proxies {
            set(p, false);
        }
        busy.fetch_sub(1, Ordering::SeqCst);
    });
}

async fn rabbitmqctl(action: &'static str) -> bool {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("rabbitmqctl")
            .arg(action)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
    .await
    .unwrap_or(false)
}

/// Restarts the local PostgreSQL cluster; starts it if the restart failed midway.
async fn pg_restart() -> bool {
    tokio::task::spawn_blocking(|| {
        let version = std::fs::read_dir("/etc/postgresql")
            .ok()
            .and_then(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .max()
            })
            .unwrap_or_else(|| "15".into());
        let run = |action: &str| {
            std::process::Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &version, "main", action])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let ok = run("restart");
        if !ok {
            run("start");
        }
        ok
    })
    .await
    .unwrap_or(false)
}
