//! `justonce lab`: the order/payment pipeline as real processes (a publisher and K workers,
//! children of the lab) under real faults on a seeded schedule, then a checker that reads
//! the business data and the transport.
//!
//! Faults: SIGKILL of a worker at a chosen point of its batch (announced by the worker's
//! fault hook, `JUSTONCE_FAULT_PAUSE`), SIGSTOP/SIGCONT longer than the lease, a TCP proxy
//! between the processes and the services (cut every connection, add delay, black-hole),
//! RabbitMQ `stop_app`/`start_app`, a crash and restart of a `redis-server`, `nats-server`
//! or tansu (Kafka) the lab started itself, a PostgreSQL restart, a business table renamed away for
//! a few seconds (a deploy whose migration is missing), and duplicate publishes (the plan's,
//! and every re-send after a failed publish).

mod checker;
mod faults;
mod plot;
pub(crate) mod protocol;
mod proxy;
mod run;
mod schedule;
mod scrape;
mod supervisor;
mod upstream;
mod user;

use std::path::PathBuf;

use anyhow::bail;
use justonce::backend::{LocalService, StoreKind, TransportKind};
use justonce::Semantics;
use serde::Serialize;

pub(crate) use run::Scenario;

/// A class of fault the lab injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FaultClass {
    /// SIGKILL of a worker: between commit and ack, before commit, after an early ack
    /// (at-most-once), or at a random moment.
    Kill,
    /// SIGSTOP of a worker for three leases, then SIGCONT: its work is taken over meanwhile.
    Pause,
    /// The TCP proxy closes every connection to the broker or the database.
    Cut,
    /// The TCP proxy delays every packet by 100 ms for 3 s.
    Delay,
    /// The TCP proxy forwards nothing for three leases, refusing nothing either.
    Blackhole,
    /// Three network partitions of three leases each (at least 3 s), one of each kind where
    /// it applies: the workers cut off from the broker only, holding unacked deliveries;
    /// from the database only, with transactions open; and an asymmetric one, in which what
    /// the broker sends arrives and what the workers send (acks, heartbeats) is held, then
    /// lost when the connection is cut at its end.
    Partition,
    /// RabbitMQ `stop_app`, 2 s, `start_app` of the node the URL names (`crate::local`);
    /// on Redis, NATS and Kafka, a SIGKILL of the
    /// lab's own server (a `redis-server` with `appendonly yes`, `appendfsync always`, a
    /// `nats-server`, a tansu; never the machine's), 2 s, and a start on the same port and
    /// directory.
    BrokerRestart,
    /// A restart of each PostgreSQL server the URLs name (`pg_ctlcluster`, or its own
    /// `pg_ctl`).
    DbRestart,
    /// The accounts table renamed away for 4 s, then back: a deploy whose migration has not
    /// run. Every worker must pause and resume by itself, dead-lettering nothing.
    Schema,
    /// The orders placed through a producer outbox and published by two relay processes:
    /// a relay killed between its confirm and its mark (a duplicate at the broker), the
    /// producer killed right after a commit, the broker (RabbitMQ, the lab's own Redis,
    /// NATS or tansu, or PostgreSQL as the transport) restarted while the relays publish.
    Relay,
    /// RabbitMQ only: the lab starts a three-node cluster of its own (quorum queues on every
    /// node, the processes connected through a proxy that picks a live node), and the node
    /// leading the work queue is SIGKILLed, stopped gracefully, or has its app stopped, in
    /// turn, until another node leads, then started again: three leader changes a run. Run
    /// when named (and in the matrix): the cluster takes about 30 s to start.
    Failover,
}

impl FaultClass {
    pub(crate) const ALL: [FaultClass; 11] = [
        FaultClass::Kill,
        FaultClass::Pause,
        FaultClass::Cut,
        FaultClass::Delay,
        FaultClass::Blackhole,
        FaultClass::Partition,
        FaultClass::BrokerRestart,
        FaultClass::DbRestart,
        FaultClass::Schema,
        FaultClass::Relay,
        FaultClass::Failover,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FaultClass::Kill => "kill",
            FaultClass::Pause => "pause",
            FaultClass::Cut => "cut",
            FaultClass::Delay => "delay",
            FaultClass::Blackhole => "blackhole",
            FaultClass::Partition => "partition",
            FaultClass::BrokerRestart => "broker-restart",
            FaultClass::DbRestart => "db-restart",
            FaultClass::Schema => "schema",
            FaultClass::Relay => "relay",
            FaultClass::Failover => "failover",
        }
    }

    /// [`FaultClass::applies`], as the error a run refuses with.
    pub(crate) fn must_apply(
        self,
        transport: TransportKind,
        store: StoreKind,
    ) -> anyhow::Result<()> {
        if !self.applies(transport, store) {
            bail!(
                "the {} fault does not apply to transport {} with store {}",
                self.as_str(),
                transport.as_str(),
                store.as_str()
            );
        }
        Ok(())
    }

    /// Whether the class works through the fault proxies: a cut, a delay, a black hole, a
    /// partition (the classes [`FaultClass::applies`] gives to every networked pair).
    pub(crate) fn is_network(self) -> bool {
        matches!(
            self,
            FaultClass::Cut | FaultClass::Delay | FaultClass::Blackhole | FaultClass::Partition
        )
    }

    /// Whether the class can hit a pipeline on `transport` and `store`.
    pub(crate) fn applies(self, transport: TransportKind, store: StoreKind) -> bool {
        let networked = transport != TransportKind::Sqlite || store != StoreKind::Sqlite;
        let sql_store = store != StoreKind::Redis;
        match self {
            FaultClass::Kill | FaultClass::Pause => true,
            // The producer's outbox lives in a SQL store.
            FaultClass::Relay => sql_store,
            FaultClass::Cut | FaultClass::Delay | FaultClass::Blackhole | FaultClass::Partition => {
                networked
            }
            FaultClass::BrokerRestart => matches!(
                transport,
                TransportKind::Amqp
                    | TransportKind::Redis
                    | TransportKind::Nats
                    | TransportKind::Kafka
            ),
            FaultClass::DbRestart => {
                transport == TransportKind::Postgres || store == StoreKind::Postgres
            }
            FaultClass::Schema => matches!(store, StoreKind::Postgres | StoreKind::MySql),
            FaultClass::Failover => transport == TransportKind::Amqp,
        }
    }
}

/// Arguments of `justonce lab`.
#[derive(clap::Args)]
pub(crate) struct LabArgs {
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
    /// The consumers' semantics.
    #[arg(long, default_value = "effectively-once")]
    semantics: Semantics,
    /// Orders to publish.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Consumer processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Seed of the plan and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fault classes to inject, comma-separated (default: every one that applies but
    /// `relay`, which swaps the publisher for a producer outbox, and `failover`, which
    /// starts a RabbitMQ cluster of the lab's own; they run when named).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultClass>,
    /// Workers SIGKILLed at fault points, at least.
    #[arg(long, default_value_t = 3)]
    kills: u32,
    /// Lease of a delivery on the SQL queues, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    lease_ms: u64,
    /// Run every fault class against every transport/store pair that is reachable, one line
    /// each, and a summary (SQLite, RabbitMQ, PostgreSQL, Redis, NATS and Kafka transports;
    /// SQLite, PostgreSQL, MariaDB and Redis stores, at their default local URLs or
    /// JUSTONCE_AMQP_URL, JUSTONCE_POSTGRES_URL, JUSTONCE_MYSQL_URL, JUSTONCE_REDIS_URL,
    /// JUSTONCE_NATS_URL, JUSTONCE_KAFKA_URL).
    #[arg(long)]
    matrix: bool,
    /// With --matrix, a sample of it chosen by SEED (CI passes the commit hash): every
    /// transport, every store and every fault class appears in it, each class on a pair
    /// that the seed picks, so the pairings rotate from one seed to the next.
    #[arg(long, requires = "matrix", value_name = "SEED")]
    sample: Option<String>,
    /// With --matrix: print the scenarios it would run (one per line, or JSON with --json)
    /// and run none.
    #[arg(long, requires = "matrix")]
    list: bool,
    /// Print one JSON object on stdout (with --matrix: one per line, then the summary).
    #[arg(long)]
    json: bool,
    /// Write throughput over time, with each fault marked, as SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Each worker serves its metrics at this address, port + its slot (port 0: any free
    /// port); the lab scrapes them before it stops a worker and checks their sums against
    /// the data (`metrics` in the report).
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Leave the run's queue, dead letters and tables where they are (the SQLite default's
    /// temporary directory too) and say where (`kept` in the report), to look at them with
    /// `justonce dlq` and `justonce dedup`.
    #[arg(long)]
    keep: bool,
    /// Soak mode: a fault every this many seconds for the whole run (the classes of the mix
    /// in turn), instead of each once; worker 0 is never killed or paused, and its RSS is
    /// sampled every 5 s (`rss` in the report). Needs at least 2 workers.
    #[arg(long, value_name = "SECONDS", conflicts_with_all = ["matrix", "worker"])]
    fault_every_secs: Option<u64>,
    /// Spread the orders over this long (e.g. 90s, 30m, 2h): the publisher paces itself, so
    /// the run lasts about as long, with --fault-every-secs faults throughout.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with_all = ["matrix", "worker"])]
    duration: Option<std::time::Duration>,
    /// Run the lab on your own consumer: this shell command is started as each worker, with
    /// JUSTONCE_TRANSPORT_URL, JUSTONCE_STORE_URL (both through the lab's fault proxies) and
    /// JUSTONCE_WORKER in its environment, killed, paused and cut like the lab's own; the
    /// verdict comes from --effects-sql. Needs --transport, --store and --queue.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["matrix", "plot", "metrics_addr", "keep"])]
    worker: Option<String>,
    /// With --worker: the queue (topic, stream) the lab publishes the orders to; on RabbitMQ
    /// the exchange and routing key come from --exchange and --routing-key.
    #[arg(long, value_name = "NAME", requires = "worker")]
    queue: Option<String>,
    /// With --worker: the payload of each order, with {{id}} (also its message id), {{n}},
    /// {{account}} (1-100) and {{amount}} (1-9) replaced. Default:
    /// {"order_id":"{{id}}","account":{{account}},"amount_cents":{{amount}}}.
    #[arg(long, value_name = "FILE", requires = "worker")]
    publish_template: Option<PathBuf>,
    /// With --worker: a query on the store returning (order id, count of its effects), one
    /// row per order or per effect, e.g. 'SELECT order_id, count(*) FROM ledger GROUP BY
    /// order_id'. Every order must count exactly 1.
    #[arg(long, value_name = "SQL", requires = "worker")]
    effects_sql: Option<String>,
    /// With --worker: orders published per second (the faults land while they flow).
    #[arg(long, default_value_t = 500, requires = "worker")]
    rate: u64,
    /// With --worker: a fault every this many milliseconds while orders are published (and
    /// until --kills workers were killed), the classes taken in turn.
    #[arg(long, default_value_t = 1500, requires = "worker")]
    fault_every_ms: u64,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

/// `90`, `90s`, `30m` or `2h`.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (n, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 90s, 30m or 2h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("`{text}`: the unit is s, m or h")),
    };
    Ok(std::time::Duration::from_secs(secs))
}

impl Rss {
    /// The summary of `kib`, the witness's samples in order, over `seconds`.
    pub(crate) fn of(kib: &[u64], seconds: f64, restarts: u64) -> Rss {
        let max = |k: &[u64]| k.iter().copied().max().unwrap_or(0);
        let (a, b) = kib.split_at(kib.len() / 2);
        Rss {
            first_kib: kib.first().copied().unwrap_or(0),
            last_kib: kib.last().copied().unwrap_or(0),
            max_kib: max(kib),
            first_half_max_kib: max(a),
            second_half_max_kib: max(b),
            samples: kib.len() as u64,
            seconds,
            restarts,
        }
    }

    /// Whether the second half of the run rose above the first: by a quarter again and
    /// more than 16 MiB (allocators keep what a burst took; a leak keeps growing).
    pub(crate) fn grew(&self) -> bool {
        let (a, b) = (self.first_half_max_kib, self.second_half_max_kib);
        self.samples >= 4 && b > a + a / 4 && b - a > 16 * 1024
    }
}

impl FaultCounts {
    /// The progress bar's message: the faults done so far.
    pub(crate) fn progress(&self) -> String {
        format!(
            "kills {} pauses {} cuts {} restarts {}",
            self.kills,
            self.pauses,
            self.cuts,
            self.broker_restarts + self.db_restarts
        )
    }
}

/// A run's progress bar over `len` orders; hidden unless `show` (`--json` quiets it).
pub(crate) fn progress_bar(show: bool, len: u64, prefix: String) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(prefix);
    bar
}

impl LabArgs {
    fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ms)
    }
}

/// What one scenario found, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LabReport {
    pub(crate) scenario: String,
    pub(crate) transport: String,
    pub(crate) store: String,
    pub(crate) semantics: String,
    pub(crate) seed: u64,
    pub(crate) messages: u64,
    pub(crate) workers: usize,
    pub(crate) faults: FaultCounts,
    pub(crate) deliveries: u64,
    pub(crate) redeliveries: u64,
    pub(crate) effects: u64,
    pub(crate) lost: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) dead_lettered: u64,
    /// First deliveries of a message id beyond its first, from the audit table: the
    /// duplicates the broker held (re-sends of a publisher or of a relay).
    pub(crate) broker_duplicates: u64,
    /// The relay class: outbox rows still pending or dead after the drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) outbox_left: Option<u64>,
    pub(crate) drain_seconds: f64,
    pub(crate) msgs_per_sec: f64,
    /// Batches the workers handed back because the schema was wrong, as they logged them.
    pub(crate) schema_pauses: u64,
    /// Workers that exited on their own (and were started again).
    pub(crate) worker_exits: u64,
    /// With `--metrics-addr`: what the workers' metrics said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) metrics: Option<scrape::Scraped>,
    /// Soak mode (`--fault-every-secs`): the RSS of worker 0, never killed or paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rss: Option<Rss>,
    /// With `--keep`: where the run's data was left.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) kept: Option<Kept>,
    pub(crate) verdict: &'static str,
    pub(crate) why: String,
}

/// The resident memory of a soak's witness worker (worker 0), in KiB: the first sample
/// once a fifth of the orders were delivered, the last one, the largest, and the largest of
/// each half of the samples (a leak shows as a second half above the first).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Rss {
    pub(crate) first_kib: u64,
    pub(crate) last_kib: u64,
    pub(crate) max_kib: u64,
    pub(crate) first_half_max_kib: u64,
    pub(crate) second_half_max_kib: u64,
    pub(crate) samples: u64,
    /// How long the witness ran, in seconds.
    pub(crate) seconds: f64,
    /// Times the witness exited on its own and was started again (its RSS with it).
    pub(crate) restarts: u64,
}

/// Where a run kept its data (`--keep`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Kept {
    pub(crate) transport: String,
    pub(crate) queue: String,
    pub(crate) store: String,
    /// The dedup table (`--dedup-table` of `justonce dedup`).
    pub(crate) dedup_table: String,
}

/// Faults that happened in one run (not planned: done).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct FaultCounts {
    pub(crate) kills: u64,
    pub(crate) pauses: u64,
    pub(crate) cuts: u64,
    pub(crate) broker_restarts: u64,
    pub(crate) db_restarts: u64,
    /// Times the accounts table was renamed away (and back).
    pub(crate) schema_breaks: u64,
    pub(crate) duplicate_publishes: u64,
    /// The relay class: relays killed between a confirm and its mark, the producer killed
    /// after a commit.
    pub(crate) relay_kills: u64,
    pub(crate) producer_kills: u64,
    /// The failover class: times the work queue's leader changed (its node killed, stopped
    /// or its app stopped, and another node leading after).
    pub(crate) failovers: u64,
    /// The partition class: partitions begun (from the broker, from the database,
    /// asymmetric).
    pub(crate) partitions: u64,
}

/// The URL of a local service, if it answers.
fn local(service: LocalService) -> Option<String> {
    let addr = service.addr().parse().ok()?;
    if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)).is_err() {
        eprintln!(
            "lab: {} at {} is not reachable; its pairs are left out",
            service.name(),
            service.addr()
        );
        return None;
    }
    Some(service.url())
}

/// Runs the lab until it is done or interrupted. On Ctrl-C or SIGTERM the run is dropped:
/// its workers, publisher, relays and servers of its own are killed as they drop (the
/// user's workers are process groups of their own, out of reach of the terminal's Ctrl-C,
/// and a SIGTERM reaches the lab alone); its queue and tables are left where they are.
pub(crate) async fn run(args: LabArgs) -> anyhow::Result<()> {
    tokio::select! {
        done = run_lab(args) => done,
        () = justonce::shutdown_signal() => {
            bail!("interrupted: the lab's processes were killed; its queue and tables are left")
        }
    }
}

async fn run_lab(args: LabArgs) -> anyhow::Result<()> {
    if args.messages == 0 || args.workers == 0 {
        bail!("--messages and --workers must each be at least 1");
    }
    if let Some(command) = &args.worker {
        let lab = user::UserLab::new(&args, command)?;
        let report = lab.run(!args.json).await?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", user::table(&report));
        }
        if report.verdict != "pass" {
            std::process::exit(2);
        }
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    if !args.matrix {
        let scenario = Scenario::new(
            &args,
            args.transport.clone(),
            args.store.clone(),
            args.faults.clone(),
        )?;
        let report = scenario.run(&exe, !args.json, args.plot.as_deref()).await?;
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            print!("{}", table(std::slice::from_ref(&report)));
        }
        if report.verdict != "pass" {
            std::process::exit(2);
        }
        return Ok(());
    }

    let amqp = local(LocalService::RabbitMq);
    let pg = local(LocalService::Postgres);
    let my = local(LocalService::MariaDb);
    let redis = local(LocalService::Redis);
    let nats = local(LocalService::Nats);
    let kafka = local(LocalService::Kafka);
    // `None` is the embedded SQLite default; an unreachable service is left out.
    let transports: Vec<Option<String>> = [None]
        .into_iter()
        .chain(
            [amqp, pg.clone(), redis.clone(), nats, kafka]
                .into_iter()
                .flatten()
                .map(Some),
        )
        .collect();
    let stores: Vec<Option<String>> = [None]
        .into_iter()
        .chain([pg, my, redis].into_iter().flatten().map(Some))
        .collect();
    let full = matrix(&transports, &stores)?;
    let cells: Vec<Cell> = match &args.sample {
        Some(seed) => sample(&full, seed)?,
        None => full.clone(),
    }
    .into_iter()
    .filter(|c| args.faults.is_empty() || args.faults.contains(&c.2))
    .collect();
    let of = match &args.sample {
        Some(seed) => format!(" (the sample of seed {seed})"),
        None => String::new(),
    };
    eprintln!(
        "lab: {} of the matrix's {} scenarios{of}:",
        cells.len(),
        full.len()
    );
    for cell in &cells {
        eprintln!("lab:   {}", cell_name(cell)?);
    }
    if args.list {
        for cell in &cells {
            if args.json {
                let (t, s, class) = cell_kinds(cell)?;
                println!(
                    "{}",
                    serde_json::json!({"transport": t.as_str(), "store": s.as_str(), "scenario": class.as_str()})
                );
            } else {
                println!("{}", cell_name(cell)?);
            }
        }
        return Ok(());
    }
    let mut reports = Vec::new();
    for (transport, store, class) in cells {
        let scenario = Scenario::new(&args, transport, store, vec![class])?;
        let report = match scenario.run(&exe, false, None).await {
            Ok(r) => r,
            Err(e) => scenario.failed(format!("{e:#}")),
        };
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
        } else {
            println!("{}", line(&report));
        }
        reports.push(report);
    }
    let passed = reports.iter().filter(|r| r.verdict == "pass").count();
    if args.json {
        println!(
            "{}",
            serde_json::json!({"summary": {"scenarios": reports.len(), "passed": passed, "failed": reports.len() - passed}})
        );
    } else {
        println!("\n{passed} of {} scenarios passed", reports.len());
    }
    if passed != reports.len() || reports.is_empty() {
        std::process::exit(2);
    }
    Ok(())
}

/// A transport URL, a store URL (`None`: the embedded SQLite default) and a fault class.
type Cell = (Option<String>, Option<String>, FaultClass);

/// The kinds of a cell's transport, store and class.
fn cell_kinds(cell: &Cell) -> anyhow::Result<(TransportKind, StoreKind, FaultClass)> {
    let t = cell
        .0
        .as_deref()
        .map_or(Ok(TransportKind::Sqlite), TransportKind::from_url)?;
    let s = cell
        .1
        .as_deref()
        .map_or(Ok(StoreKind::Sqlite), StoreKind::from_url)?;
    Ok((t, s, cell.2))
}

/// A cell as `transport store class`, as the plan of a matrix run prints it.
fn cell_name(cell: &Cell) -> anyhow::Result<String> {
    let (t, s, class) = cell_kinds(cell)?;
    Ok(format!(
        "{:<9} {:<9} {}",
        t.as_str(),
        s.as_str(),
        class.as_str()
    ))
}

/// The matrix's scenarios: every class that applies to every transport/store pair.
fn matrix(transports: &[Option<String>], stores: &[Option<String>]) -> anyhow::Result<Vec<Cell>> {
    let mut out = Vec::new();
    for t in transports {
        for s in stores {
            for class in FaultClass::ALL {
                let cell = (t.clone(), s.clone(), class);
                let (tk, sk, _) = cell_kinds(&cell)?;
                if class.applies(tk, sk) {
                    out.push(cell);
                }
            }
        }
    }
    Ok(out)
}

/// The sample of `full` that `seed` chooses: for each fault class, one of its cells, the
/// seed's draw among them; then, for a transport or store that no cell has yet, one of its
/// cells that is neither `relay` nor `failover` (the slow classes), drawn the same way.
/// Each draw is independent of the others (SHA-256 of the seed and what is drawn), so
/// every cell of the matrix comes up as the seed changes (CI passes the commit hash); in
/// the matrix's order.
fn sample(full: &[Cell], seed: &str) -> anyhow::Result<Vec<Cell>> {
    use sha2::{Digest as _, Sha256};
    let kinds = full
        .iter()
        .map(cell_kinds)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let draw = |what: &str, among: &[usize]| -> Option<usize> {
        let digest = Sha256::new()
            .chain_update(seed.as_bytes())
            .chain_update([0])
            .chain_update(what.as_bytes())
            .finalize();
        let mut n = [0; 8];
        n.copy_from_slice(&digest[..8]);
        let len = u64::try_from(among.len()).ok().filter(|&len| len > 0)?;
        among
            .get(usize::try_from(u64::from_le_bytes(n) % len).ok()?)
            .copied()
    };
    let cells = |keep: &dyn Fn(&(TransportKind, StoreKind, FaultClass)) -> bool| -> Vec<usize> {
        (0..full.len()).filter(|&i| keep(&kinds[i])).collect()
    };
    let mut chosen = std::collections::BTreeSet::new();
    for class in FaultClass::ALL {
        chosen.extend(draw(class.as_str(), &cells(&|k| k.2 == class)));
    }
    let quick = |k: &(TransportKind, StoreKind, FaultClass)| {
        !matches!(k.2, FaultClass::Relay | FaultClass::Failover)
    };
    for &(t, _, _) in &kinds {
        if !chosen.iter().any(|&i| kinds[i].0 == t) {
            let what = format!("transport {}", t.as_str());
            chosen.extend(draw(&what, &cells(&|k| k.0 == t && quick(k))));
        }
    }
    for &(_, s, _) in &kinds {
        if !chosen.iter().any(|&i| kinds[i].1 == s) {
            let what = format!("store {}", s.as_str());
            chosen.extend(draw(&what, &cells(&|k| k.1 == s && quick(k))));
        }
    }
    Ok(chosen.into_iter().map(|i| full[i].clone()).collect())
}

/// One line of the matrix.
fn line(r: &LabReport) -> String {
    format!(
        "{:<5} {:<15} {:<9} {:<8} {:<17} kills {} pauses {} cuts {} restarts {}+{} schema {} relay {}+{} failovers {} partitions {} | deliveries {:>6} redelivered {:>5} broker-dup {:>4} effects {:>6} lost {:>4} dup {:>4} dead {:>3} | drain {:>5.1}s {}{}",
        r.verdict.to_uppercase(),
        r.scenario,
        r.transport,
        r.store,
        r.semantics,
        r.faults.kills,
        r.faults.pauses,
        r.faults.cuts,
        r.faults.broker_restarts,
        r.faults.db_restarts,
        r.faults.schema_breaks,
        r.faults.relay_kills,
        r.faults.producer_kills,
        r.faults.failovers,
        r.faults.partitions,
        r.deliveries,
        r.redeliveries,
        r.broker_duplicates,
        r.effects,
        r.lost,
        r.duplicate_effects,
        r.dead_lettered,
        r.drain_seconds,
        if r.why.is_empty() { "" } else { "| " },
        r.why
    )
}

/// The end-of-run table of one scenario.
fn table(reports: &[LabReport]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for r in reports {
        let f = &r.faults;
        let _ = writeln!(
            out,
            "justonce lab: scenario {}, transport {}, store {}, {}, {} orders, {} workers, seed {}",
            r.scenario, r.transport, r.store, r.semantics, r.messages, r.workers, r.seed
        );
        let _ = writeln!(
            out,
            "faults done: {} kills, {} pauses, {} cuts, {} broker restarts, {} database restarts, {} duplicate publishes, {} relays and {} producers killed, {} leader failovers, {} partitions; the broker delivered {} duplicates\n",
            f.kills, f.pauses, f.cuts, f.broker_restarts, f.db_restarts, f.duplicate_publishes,
            f.relay_kills, f.producer_kills, f.failovers, f.partitions, r.broker_duplicates
        );
        let _ = writeln!(
            out,
            "{:>10} {:>12} {:>8} {:>6} {:>10} {:>13} {:>8} {:>8}",
            "deliveries",
            "redeliveries",
            "effects",
            "lost",
            "duplicate",
            "dead-lettered",
            "drain s",
            "msg/s"
        );
        let _ = writeln!(
            out,
            "{:>10} {:>12} {:>8} {:>6} {:>10} {:>13} {:>8.1} {:>8.0}\n",
            r.deliveries,
            r.redeliveries,
            r.effects,
            r.lost,
            r.duplicate_effects,
            r.dead_lettered,
            r.drain_seconds,
            r.msgs_per_sec
        );
        let _ = writeln!(
            out,
            "verdict: {}{}",
            r.verdict.to_uppercase(),
            if r.why.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.why)
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls() -> (Vec<Option<String>>, Vec<Option<String>>) {
        let amqp = Some("amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
        let pg = Some("postgres://postgres@127.0.0.1:5432/test".to_owned());
        let my = Some("mysql://root@127.0.0.1:3306/test".to_owned());
        let redis = Some("redis://127.0.0.1:6379".to_owned());
        let nats = Some("nats://127.0.0.1:4222".to_owned());
        let kafka = Some("kafka://127.0.0.1:9092".to_owned());
        (
            vec![None, amqp, pg.clone(), redis.clone(), nats, kafka],
            vec![None, pg, my, redis],
        )
    }

    fn kinds(cells: &[Cell]) -> Vec<(TransportKind, StoreKind, FaultClass)> {
        cells.iter().map(|c| cell_kinds(c).unwrap()).collect()
    }

    #[test]
    fn memory_is_flat_unless_the_second_half_rises_above_the_first() {
        let burst = Rss::of(&[27_000, 37_000, 30_000, 29_000, 31_000, 49_000], 0.0, 0);
        assert!(!burst.grew(), "{burst:?}");
        let leak: Vec<u64> = (0..20).map(|i| 30_000 + i * 3_000).collect();
        let leak = Rss::of(&leak, 0.0, 0);
        assert!(leak.grew(), "{leak:?}");
    }

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        use std::time::Duration;
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("2d").is_err());
        assert!(parse_duration("m").is_err());
    }

    /// Every sample has every transport, store and class of the matrix, in a tenth of its
    /// scenarios, and the same seed gives the same sample.
    #[test]
    fn a_sample_has_every_transport_store_and_class() {
        let (transports, stores) = urls();
        let full = matrix(&transports, &stores).unwrap();
        assert_eq!(
            full.len(),
            199,
            "the matrix changed: look at the bound below"
        );
        for n in 0..2_000 {
            let seed = format!("{n:040x}");
            let cells = sample(&full, &seed).unwrap();
            assert_eq!(cells, sample(&full, &seed).unwrap());
            assert!(cells.iter().all(|c| full.contains(c)));
            assert!(cells.len() <= full.len() / 10, "{seed}: {}", cells.len());
            let k = kinds(&cells);
            for (t, s, class) in kinds(&full) {
                assert!(k.iter().any(|c| c.0 == t), "{seed}: no {t:?}");
                assert!(k.iter().any(|c| c.1 == s), "{seed}: no {s:?}");
                assert!(k.iter().any(|c| c.2 == class), "{seed}: no {class:?}");
            }
        }
    }

    /// The pairings rotate: two commits' samples differ, and over the samples of a few
    /// hundred commits every scenario of the matrix has come up.
    #[test]
    fn the_samples_of_successive_seeds_differ_and_cover_the_matrix() {
        let (transports, stores) = urls();
        let full = matrix(&transports, &stores).unwrap();
        let a = sample(&full, "6807711").unwrap();
        let b = sample(&full, "9e15574").unwrap();
        assert_ne!(a, b);
        let mut seen = std::collections::HashSet::new();
        let mut seeds = 0;
        while seen.len() < full.len() {
            seen.extend(sample(&full, &format!("{seeds:x}")).unwrap());
            seeds += 1;
            assert!(
                seeds < 1_000,
                "{} of {} after {seeds} seeds",
                seen.len(),
                full.len()
            );
        }
    }
}
