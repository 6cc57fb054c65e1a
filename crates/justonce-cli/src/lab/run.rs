//! One lab scenario: processes, the fault schedule, the drain, and the checker.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use justonce::redis::RedisStore;
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::{OutboxStore, Semantics};
use tokio::sync::mpsc;

use super::faults::{proxied, LabTransport, Proxies, Restarts, SchemaFault};
use super::plot::Samples;
use super::protocol::LabPoint;
use super::scrape::Scraped;
use super::supervisor::{tails, wait_ready, Mark, Worker, WorkerSpec};
use super::upstream::{Upstream, UpstreamSpec};
use super::{checker, schedule, FaultClass, FaultCounts, Kept, LabArgs, LabReport, Rss};
use crate::bus::{Bus, Topology};
use crate::demo::plan::Plan;
use crate::orders::{Bank, Tables};
use justonce::backend::{StoreKind, TransportKind};

/// How long the lab waits for one round of its counts (the data, the transport).
const COUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a run may go with no new delivery or effect (or no count of them) before it
/// fails.
const STALL: Duration = Duration::from_secs(120);

/// The error of a run that made no progress for [`STALL`]: what it knows (`what`), then
/// the last lines of the workers and of upstream.
fn stalled(what: &str, workers: &[Worker], upstream: &Upstream) -> anyhow::Error {
    anyhow::anyhow!(
        "no progress for {} s{what}; the workers said:\n{}\nand upstream:\n{}",
        STALL.as_secs(),
        tails(workers).join("\n"),
        upstream.tails().join("\n")
    )
}

/// The consumers' payload limit (the plan's oversized poison is one byte over).
const MAX_PAYLOAD: usize = 16 * 1024;
/// Leader changes in a run of the failover class.
pub(crate) const FAILOVERS: usize = 3;
/// Partitions in a run of the partition class: one of each kind.
const PARTITIONS: usize = 3;
/// How long nothing may move before the pipeline counts as drained.
const QUIET: Duration = Duration::from_secs(5);

/// One scenario of the lab. No `Debug`: it holds the URLs, passwords and all.
#[derive(Clone)]
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
    metrics: Option<std::net::SocketAddr>,
    keep: bool,
    /// Soak mode: a fault this often, worker 0 spared and its RSS sampled.
    fault_every: Option<Duration>,
    /// The publisher's orders spread over this long.
    duration: Option<Duration>,
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
        if t_kind == TransportKind::Kafka && args.workers > super::supervisor::KAFKA_PARTITIONS {
            bail!(
                "on Kafka the lab's topic has {} partitions, each read by one worker: at most {} workers",
                super::supervisor::KAFKA_PARTITIONS,
                super::supervisor::KAFKA_PARTITIONS
            );
        }
        for f in &faults {
            f.must_apply(t_kind, s_kind)?;
        }
        if args.fault_every_secs.is_some() && args.workers < 2 {
            bail!("--fault-every-secs spares worker 0 to watch its memory: it needs --workers 2 or more");
        }
        let name = match faults.as_slice() {
            [one] => one.as_str().to_owned(),
            _ => "mixed".to_owned(),
        };
        // `relay` swaps the publisher for a producer outbox and its relays, `failover` the
        // broker for a cluster of the lab's own: run when named (and in the matrix), not
        // mixed into the default run.
        let faults = if faults.is_empty() {
            FaultClass::ALL
                .into_iter()
                .filter(|f| {
                    f.applies(t_kind, s_kind)
                        && !matches!(f, FaultClass::Relay | FaultClass::Failover)
                })
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
            metrics: args.metrics_addr,
            keep: args.keep,
            fault_every: args.fault_every_secs.map(|s| Duration::from_secs(s.max(1))),
            duration: args.duration,
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
            broker_duplicates: 0,
            outbox_left: None,
            drain_seconds: 0.0,
            msgs_per_sec: 0.0,
            schema_pauses: 0,
            worker_exits: 0,
            metrics: None,
            rss: None,
            kept: None,
            verdict: "fail",
            why,
        }
    }

    /// The classes the lab fires, once each: the relay class's is a restart of the
    /// transport's server while the relays publish (none on the embedded SQLite queue).
    fn fired(&self) -> Vec<FaultClass> {
        let mut out = Vec::new();
        for f in &self.faults {
            let f = match (f, self.t_kind) {
                (
                    FaultClass::Relay,
                    TransportKind::Amqp
                    | TransportKind::Redis
                    | TransportKind::Nats
                    | TransportKind::Kafka,
                ) => FaultClass::BrokerRestart,
                (FaultClass::Relay, TransportKind::Postgres) => FaultClass::DbRestart,
                (FaultClass::Relay, _) => continue,
                (f, _) => *f,
            };
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    /// The faults fired at milestones: [`Scenario::fired`], with three leader changes a
    /// run and three partitions.
    fn milestone_faults(&self) -> Vec<FaultClass> {
        let mut out = self.fired();
        // Three leader changes a run: a SIGKILL, a graceful stop, an app stopped; and three
        // partitions, one of each kind.
        for (class, n) in [
            (FaultClass::Failover, FAILOVERS),
            (FaultClass::Partition, PARTITIONS),
        ] {
            if out.contains(&class) {
                out.extend(std::iter::repeat_n(class, n - 1));
            }
        }
        out
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
            StoreKind::Redis => self.run_on::<RedisStore>(exe, progress, plot).await,
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
        // A Redis, NATS or Kafka server the lab restarts is one it started itself (a Redis
        // durable as the guide says it must be); the server at the URL given is left alone.
        let run_id = format!("{:08x}", fastrand::u32(..));
        let queue = format!("justonce-lab-{run_id}");
        let LabTransport {
            own: mut own_broker,
            url: transport,
            proxy: t_proxy,
            workers_url: worker_transport,
        } = LabTransport::start(&self.fired(), self.t_kind, &queue, || {
            self.transport.clone().unwrap_or_else(|| in_tmp("queue.db"))
        })
        .await?;
        let store_url = self.store.clone().unwrap_or_else(|| in_tmp("store.db"));
        let restarts = Restarts::resolve(
            &self.fired(),
            (self.t_kind, &transport),
            (self.s_kind, &store_url),
            own_broker.is_some(),
        )
        .await?;
        let tables = Tables::new(&format!("jo_lab_{run_id}"))?;
        let plan = Plan::new(self.messages, self.seed, MAX_PAYLOAD);

        // The checker's own connections, straight to the services.
        let store = B::open(&store_url, &tables).await?;
        store.setup(&tables, &[]).await?;
        let positions_in_store =
            self.t_kind == TransportKind::Kafka && self.s_kind != StoreKind::Redis;
        let sink = Bus::open_publisher_with_positions(
            &transport,
            &queue,
            &self.topology,
            positions_in_store.then_some(store_url.as_str()),
        )
        .await?;

        // The workers' and the publisher's connections go through the fault proxies.
        let (s_proxy, worker_store) = proxied(&store_url, self.s_kind != StoreKind::Sqlite).await?;
        let proxies = Proxies {
            transport: t_proxy,
            store: s_proxy,
        };

        let mut rng = fastrand::Rng::with_seed(self.seed);
        let kill_plan = schedule::kills(self.kills, self.semantics, positions_in_store);
        let point_kills = schedule::points(&kill_plan);
        // Milestones (fractions of the orders delivered) for everything but point kills: a
        // scheduled `Kill` is a kill at a random moment.
        let mut schedule = if self.fault_every.is_some() {
            Vec::new()
        } else {
            schedule::milestones(&kill_plan, &self.milestone_faults(), &mut rng)
        };
        // Soak mode: the classes of the mix in turn, one every `fault_every`.
        let mut soak_turn = 0usize;
        let mix = self.fired();
        let mut witness = self.fault_every.map(|_| Witness::default());

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
            // On Kafka with a SQL store the consumer's positions live in the store and move
            // in its transactions: the design the Kafka guide recommends, proven here.
            positions_in_store,
            kafka_workers: (self.t_kind == TransportKind::Kafka).then_some(self.workers),
            schema_pauses: Arc::default(),
            metrics: self.metrics,
        };
        let schema = SchemaFault {
            url: store_url.clone(),
            table: tables.accounts.clone(),
        };
        let mut worker_exits = 0u64;
        // Exits whose last words were about the schema: the schema fault's failures.
        let mut schema_exits = 0u64;
        let (marks_tx, mut marks_rx) = mpsc::unbounded_channel::<Mark>();
        let mut workers: Vec<Worker> = Vec::new();
        let mut next_point = point_kills.iter();
        for slot in 0..self.workers {
            // Every first worker carries a kill point, so kills happen early in any run; in a
            // soak, worker 0 is the witness of memory over the whole run, and never killed.
            let witness = slot == 0 && self.fault_every.is_some();
            let kill = if witness {
                None
            } else {
                next_point.next().copied()
            };
            let n = rng.u32(1..=3);
            workers.push(spec.spawn(slot, 0, kill.map(|p| (p, n)), marks_tx.clone())?);
        }
        // The publisher (or the producer and its relays) starts once every worker is
        // consuming, so that the first worker's kill point is reached however fast the
        // queue drains.
        wait_ready(&mut marks_rx, &workers).await?;
        let upstream_spec = UpstreamSpec {
            exe,
            transport: &worker_transport,
            store: &spec.store,
            queue: &queue,
            tables: &spec.tables,
            messages: self.messages,
            seed: self.seed,
            topology: self.topology.to_args(),
            // A failover takes seconds: with the orders spread over about 10 s a failover,
            // 25 at a time, each of them lands while orders arrive and are handled.
            pace: if let Some(d) = self.duration {
                let chunks = self.messages.div_ceil(250).max(1) as u32;
                (250, d / chunks)
            } else if self.faults.contains(&FaultClass::Failover) {
                let chunks = self.messages.div_ceil(25).max(1) as u32;
                (25, Duration::from_secs(10 * FAILOVERS as u64) / chunks)
            } else {
                (250, Duration::ZERO)
            },
        };
        // The relay class's outbox, as the checker reads it.
        let outbox = if self.faults.contains(&FaultClass::Relay) {
            Some(store.outbox(&tables).await?)
        } else {
            None
        };
        let mut upstream = match outbox {
            Some(_) => Upstream::relayed(&upstream_spec, self.kills, &mut rng)?,
            None => Upstream::publisher(&upstream_spec)?,
        };

        let bar = super::progress_bar(progress, self.messages, format!("lab {}", self.name));

        let started = Instant::now();
        let mut counts = FaultCounts {
            // The producer places every order once; the broker's duplicates are the relays'.
            duplicate_publishes: if outbox.is_some() {
                0
            } else {
                plan.planned().duplicate_publishes
            },
            ..FaultCounts::default()
        };
        let busy = Arc::new(AtomicUsize::new(0));
        let mut samples = Samples::default();
        let mut last_fault = started;
        let mut quiet = 0;
        let mut last_seen = (u64::MAX, u64::MAX, Instant::now());
        let mut generation = 0u64;
        let mut rounds = 0;
        let mut scraped = self.metrics.map(|_| Scraped::default());
        let drained_at = loop {
            // A worker at its fault point: kill it there, and start its replacement.
            while let Ok(mark) = marks_rx.try_recv() {
                let Mark::FaultPoint(slot, gen) = mark else {
                    continue;
                };
                if workers[slot].generation != gen {
                    continue;
                }
                if let Some(s) = &mut scraped {
                    s.add(&workers[slot]).await;
                }
                workers[slot].kill().await;
                counts.kills += 1;
                let at = workers[slot].kill_point.map_or("?", |p| p.as_str());
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
                    // A kill at a random moment was counted where it was done.
                    if !worker.killed {
                        worker_exits += 1;
                        if worker.exited_on_schema() {
                            schema_exits += 1;
                        }
                        if let (0, Some(w)) = (slot, &mut witness) {
                            w.restarts += 1;
                        }
                        if let Some(s) = &mut scraped {
                            s.unscraped += 1;
                        }
                    }
                    generation += 1;
                    let kill = worker.kill_point.and_then(|p| match p {
                        LabPoint::Consumer(p) => Some((p, rng.u32(1..=3))),
                        _ => None,
                    });
                    *worker = spec.spawn(slot, generation, kill, marks_tx.clone())?;
                }
            }
            for label in upstream.tend(&mut rng, &mut counts).await? {
                samples.mark(started.elapsed(), label);
                last_fault = Instant::now();
            }

            // A count that fails or hangs (a server down, or one that takes requests and
            // answers none) is tried again, and counts as no progress: after 120 s of
            // that the run fails with what the count said, rather than waiting for ever.
            let counted = tokio::time::timeout(COUNT_TIMEOUT, async {
                let outboxed = match &outbox {
                    Some(o) => o.outbox_stats().await.map(|s| s.pending),
                    None => Ok(0),
                };
                (
                    store.delivery_counts(&tables).await.map(|d| d.0),
                    store.ledger_rows(&tables).await,
                    sink.pending().await,
                    outboxed,
                )
            })
            .await;
            let counted = match counted {
                Ok((Ok(d), Ok(e), Ok(q), Ok(o))) => Ok((d, e, q, o)),
                Ok((d, e, q, o)) => Err([
                    d.err().map(|e| format!("the deliveries: {e:#}")),
                    e.err().map(|e| format!("the ledger: {e:#}")),
                    q.err().map(|e| format!("the transport: {e:#}")),
                    o.err().map(|e| format!("the outbox: {e:#}")),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ")),
                Err(_) => Err(format!("a count had no answer in {COUNT_TIMEOUT:?}")),
            };
            let (deliveries, effects, queued, outboxed) = match counted {
                Ok(counts) => counts,
                Err(why) if last_seen.2.elapsed() > STALL => {
                    return Err(stalled(
                        &format!(", and the lab cannot count it ({why})"),
                        &workers,
                        &upstream,
                    ))
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            samples.push(started.elapsed(), effects);
            bar.set_position(effects.min(self.messages));
            bar.set_message(counts.progress());

            let fraction = deliveries as f64 / self.messages as f64;
            // A soak's witness, from a fifth of the orders on.
            if let Some(w) = &mut witness {
                if fraction >= 0.2 && w.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
                    w.last = Some(Instant::now());
                    w.kib.extend(workers[0].pid().and_then(rss_kib));
                }
            }
            // The next fault: in a soak the next class of the mix once `fault_every` has
            // passed (worker 0 spared), for as long as orders are being published or wait
            // on the transport (a fast publisher is done long before the workers are);
            // otherwise the next milestone reached.
            let due = match self.fault_every {
                Some(every) => ((!upstream.done() || queued + outboxed > 0)
                    && last_fault.elapsed() >= every
                    && !mix.is_empty())
                .then(|| {
                    soak_turn += 1;
                    mix[(soak_turn - 1) % mix.len()]
                }),
                None => schedule
                    .last()
                    .is_some_and(|(at, _)| fraction >= *at)
                    .then(|| schedule.pop().map(|(_, e)| e))
                    .flatten(),
            };
            if let Some(event) = due {
                let spared = usize::from(self.fault_every.is_some());
                if let (FaultClass::Kill, Some(s)) = (event, &mut scraped) {
                    s.unscraped += 1;
                }
                let label = event
                    .fire(
                        &mut workers[spared..],
                        &proxies,
                        &schema,
                        &busy,
                        self.lease,
                        own_broker.as_mut(),
                        &restarts,
                        &mut rng,
                        &mut counts,
                    )
                    .await;
                let label = match event {
                    FaultClass::Failover => {
                        format!(
                            "{label}, {deliveries} of {} orders delivered",
                            self.messages
                        )
                    }
                    _ => label,
                };
                samples.mark(started.elapsed(), label);
                last_fault = Instant::now();
            }

            let backlog = queued + outboxed;
            let settled = upstream.done()
                && backlog == 0
                && busy.load(Ordering::SeqCst) == 0
                && schedule.is_empty();
            if (deliveries, effects) != (last_seen.0, last_seen.1) {
                last_seen = (deliveries, effects, Instant::now());
            } else if last_seen.2.elapsed() > STALL {
                let published = if upstream.done() {
                    "everything published"
                } else {
                    "still publishing"
                };
                return Err(stalled(
                    &format!(": {deliveries} deliveries and {effects} effects in the data, {queued} messages waiting on the transport, {outboxed} in the outbox, {published}"),
                    &workers,
                    &upstream,
                ));
            }
            quiet = if settled && last_seen.2.elapsed() > QUIET {
                quiet + 1
            } else {
                0
            };
            if quiet >= 4 {
                // Stop the workers gracefully; what they held comes back to the queue.
                for w in &mut workers {
                    if let Some(s) = &mut scraped {
                        s.add(w).await;
                    }
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
        upstream.stop().await;

        // The checker: everything from the business data and the transport.
        let effects = store.effects(&tables).await?;
        let (lost, duplicate_effects) = effects.check(plan.well_formed());
        let (deliveries, redeliveries) = store.delivery_counts(&tables).await?;
        let broker_duplicates = store.broker_duplicates(&tables).await?;
        let outbox_left = match &outbox {
            Some(o) => {
                let s = o.outbox_stats().await?;
                Some(s.pending + s.dead)
            }
            None => None,
        };
        let letters = sink.dead_letters().await?;
        let dead_lettered = crate::bus::distinct(&letters);
        let backlog = sink.pending().await?;
        let elapsed = started.elapsed().as_secs_f64();
        let poison: std::collections::HashSet<&str> = plan
            .orders
            .iter()
            .filter(|o| o.poison)
            .map(|o| o.order_id.as_str())
            .collect();
        let schema_pauses = spec.schema_pauses.load(Ordering::SeqCst);
        let why = checker::why(&checker::Findings {
            lost,
            duplicate_effects,
            consistent: effects.consistent,
            redeliveries,
            good_dead: checker::good_dead(&letters, &poison),
            backlog,
            schema: self.faults.contains(&FaultClass::Schema).then_some((
                counts.schema_breaks,
                schema_pauses,
                schema_exits,
            )),
            relay: outbox_left.map(|left| checker::Upstream {
                relay_kills: counts.relay_kills,
                producer_kills: counts.producer_kills,
                broker_duplicates,
                outbox_left: left,
                broker_drops_resends: self.t_kind.drops_republished_ids(),
            }),
            metrics: scraped.clone().map(|s| checker::Counted {
                scraped: s,
                effects: effects.total,
                deliveries,
                dead_letters: letters.len() as u64,
            }),
        });
        let mut why = why;
        let rss = witness.map(|w| Rss::of(&w.kib, started.elapsed().as_secs_f64(), w.restarts));
        if let Some(r) = &rss {
            if r.grew() {
                why.push(format!(
                    "worker 0's memory grew: at most {} MiB in the first half of the run, {} MiB in the second",
                    r.first_half_max_kib / 1024,
                    r.second_half_max_kib / 1024
                ));
            }
        }
        if self.faults.contains(&FaultClass::Failover) && counts.failovers < FAILOVERS as u64 {
            why.push(format!(
                "{} leader failovers of the {FAILOVERS} planned",
                counts.failovers
            ));
        }
        if backlog > 0 {
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
            broker_duplicates,
            outbox_left,
            drain_seconds: drained_at.duration_since(last_fault).as_secs_f64(),
            msgs_per_sec: self.messages as f64 / elapsed.max(1e-9),
            schema_pauses,
            worker_exits,
            metrics: scraped,
            rss,
            verdict: if why.is_empty() { "pass" } else { "fail" },
            why: why.join("; "),
            ..self.failed(String::new())
        };
        if let Some(path) = plot {
            std::fs::write(path, samples.svg(&report))
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        if self.keep {
            let _ = tmp.keep();
            return Ok(LabReport {
                // Printed (`--json` too): the passwords stay out.
                kept: Some(Kept {
                    transport: justonce::redact_url(&transport),
                    queue,
                    store: justonce::redact_url(&store_url),
                    dedup_table: tables.dedup.clone(),
                }),
                ..report
            });
        }
        sink.cleanup().await?;
        if self.s_kind != StoreKind::Sqlite {
            store.drop_tables(&tables).await?;
        }
        Ok(report)
    }
}

/// A soak's worker 0, never killed or paused: its memory, sampled every 5 s.
#[derive(Default)]
struct Witness {
    kib: Vec<u64>,
    last: Option<Instant>,
    /// Times it exited on its own and was started again.
    restarts: u64,
}

/// The resident set of process `pid`, in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
