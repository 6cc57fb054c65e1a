//! The `justonce` command. Thin over the libraries: argument parsing, output, exit codes.
//!
//! # Module map
//!
//! What each module holds, and the invariants this crate keeps (ARCHITECTURE.md, at the
//! repository's root, is the map of the whole).
//!
//! - `main.rs`: clap, errors printed with `error_chain`; `logging.rs`: tracing to stderr, text or
//!   JSON lines, without lapin's errors for the passive checks that find nothing (`QuietChecks`);
//! - `secrets.rs`: every URL flag also from `JUSTONCE_*_URL` and a file (`--X-file`,
//!   `JUSTONCE_*_URL_FILE`), read before clap parses; a warning for a secret typed as a flag.
//!   **Invariant: a child process gets its URLs in those variables, never as arguments;**
//! - `bus.rs`: `Bus`, what the demo, worker and lab do with any transport; `Topology`, the
//!   RabbitMQ flags;
//! - `orders/`: the demo's payment pipeline (`mod.rs`: payment, strategies, tables, checker;
//!   `bank.rs`: the business SQL per database; `redis_bank.rs`: the same `Bank` on Redis
//!   (balances in a hash, ledger and audit in lists, the dedup-table and claim strategies; the
//!   row-guarding ones, the outbox and the bare baseline refused as configuration errors);
//!   `handler.rs`; `api.rs`: the simulated payment API);
//! - `demo/`: the plan of faults from the seed, one run per semantic, the report; `hop.rs`: the
//!   two-hop pipeline's second hop (the payments consumer's outbox, a relay crashing between
//!   confirm and mark, the receipts consumer under marks of its own seed, receipts counted from
//!   their table);
//! - `outbox/`: `justonce outbox status|revive|discard` over `InspectOutbox` only, and `relay`
//!   (it moves when the transport is a PostgreSQL queue in the store's database, `mover`,
//!   unless `--publish`; the lab's relay class passes `--publish`, as a move has no window to
//!   kill in); `bench.rs`: `outbox bench`, whose relay moves or publishes as `relay` would, and
//!   with `--ceiling` also relays into `Discard`, a publisher that sends nothing (the outbox's
//!   own rate);
//! - `worker.rs`, `publish.rs`, `produce.rs`: the consumer, the publisher and the producer
//!   (orders placed through a producer outbox, for the lab's relay class) as processes of their
//!   own;
//! - `doctor.rs`: `justonce doctor`, over `justonce::doctor`, with the links only the flags can
//!   judge (retention against the horizon, `consumer_timeout` through `rabbitmqctl`);
//! - `local.rs`: the server a URL names on this machine, for `doctor` and the lab's restarts;
//! - `serve.rs`: `--metrics-addr` (the Prometheus recorder, one hyper listener for `/metrics`,
//!   `/healthz`, `/readyz`), the worker's polled gauges, a scrape client and a parser of
//!   Prometheus text;
//! - `dlq.rs`: `justonce dlq list|show|replay|purge`, over `Inspect` only;
//! - `dedup.rs`: `justonce dedup stats|show|explain|release|purge`, over `InspectStore` and
//!   `InspectClaims` only;
//! - `lab/`: `schedule.rs` (pure), `protocol.rs` (the fault points of the workers, the producer
//!   and the relays, the `Pauser` all three call at them, and their stderr lines,
//!   `about_schema` among them), `supervisor.rs` (any child process: start, read, kill, pause,
//!   stop, its `last_words` once its stderr is read to the end; every line kept under
//!   `logs_dir()`, `JUSTONCE_LAB_LOGS`, where the lab's own tansu leaves its log too;
//!   `Worker::start_plain` for a process with no fault point, `Worker::start_group` for a
//!   user's command, signalled and killed on drop as a process group; a kill by the lab is not
//!   counted as the worker's own exit, and only an exit whose last words were a missing table
//!   counts against the schema fault), `upstream.rs` (where the orders come from: a publisher,
//!   or the producer and its relays; each a `Worker`, so its last lines are in the error that
//!   reports its death), `faults.rs` (`LabTransport::start`: the run's transport, its own
//!   server where it needs one, and the fault proxy with the URL the workers get; `KafkaFront`:
//!   on Kafka, for the network faults and the broker restart, the proxy is made first and the
//!   lab's own tansu advertises it, since a Kafka client talks to the advertised address after
//!   its bootstrap; `OwnBroker::for_faults`: the server a run restarts is its own; the broker
//!   restart on Redis, NATS and Kafka: the lab's own server, `OwnBroker`, SIGKILLed and started
//!   again; the failover class's three-node RabbitMQ cluster, `OwnCluster`, whose work-queue
//!   leader is SIGKILLed, stopped or app-stopped in turn and started again once another node
//!   leads; on Kafka with a SQL store the workers keep their positions there,
//!   `--ack-in-transaction`, and each reads partitions assigned by hand, `--kafka-partitions`),
//!   `proxy.rs` (`start_many`: the first live of several upstreams, the failover class's front
//!   to its cluster), `checker.rs` (pure), `run.rs` (also the soak mode, `--fault-every-secs`:
//!   faults on a timer while orders are published or wait, worker 0 spared and its RSS sampled;
//!   each round of counts bounded by `COUNT_TIMEOUT`, a failed or timed-out round counting as
//!   no progress, and `stalled` the one error of a run that moved nothing for `STALL`),
//!   `plot.rs` (`Samples::mark`, which every fault fired passes, also logs it at debug),
//!   `scrape.rs` (the workers' metrics summed before each stops); `user.rs` (`--worker CMD`:
//!   the user's program as the workers, started by `Worker::start_group`, orders from a
//!   template, the same `FaultClass::fire` on a timer, the verdict from the user's
//!   `--effects-sql`); `mod.rs`: Ctrl-C or SIGTERM drops the whole run, so every process and
//!   server of its own is killed as it drops (a RabbitMQ or PostgreSQL restart runs on a
//!   blocking thread, which the runtime waits for, so it always ends started); the classes,
//!   which pairs each applies to, and the matrix (every cell, or `--sample SEED`: every class
//!   on a pair the seed draws, every transport and store);
//! - `bench/`: `mod.rs` (cases, interleaved repeats), `run.rs` (one run; its message ids a
//!   counter, UUIDv7s or UUIDv4s: `--ids`), `bare.rs` (the sqlx, lapin, redis-rs, async-nats
//!   and rdkafka baselines, joined by `joined`; the lapin and rdkafka loops take their batches
//!   with `next_batch`: the first awaited, more for 5 ms), `clock.rs`, `server.rs`, `report.rs`
//!   (medians, ratios), `plot.rs`.
//!
//! **Invariant: only justonce-cli knows clap, anyhow and indicatif.**
//!
//! **Invariant: a replay moves a dead letter only once its publish is durable, and keeps its id
//! unless asked (`--new-id`).**
//!
//! **Invariant: every count the demo, lab and bench report comes from the data** (the ledger,
//! the receipts, the transport, the audit table), never from the runtime's counters; the lab's
//! scraped metrics are held against the data, never used in its place.

mod bench;
mod bus;
mod dedup;
mod demo;
mod dlq;
mod doctor;
mod doctor_link;
mod lab;
mod local;
mod logging;
mod orders;
mod outbox;
mod produce;
mod publish;
mod secrets;
mod serve;
mod worker;

use clap::{Parser, Subcommand};

/// Exactly-once effects on at-least-once brokers: the demo, the lab and the bench.
#[derive(Parser)]
#[command(name = "justonce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// A file holding the transport URL on one line (a mounted secret), instead of
    /// --transport; also JUSTONCE_TRANSPORT_URL_FILE.
    #[arg(long, global = true, value_name = "PATH")]
    transport_file: Option<std::path::PathBuf>,
    /// A file holding the store URL, instead of --store; also JUSTONCE_STORE_URL_FILE.
    #[arg(long, global = true, value_name = "PATH")]
    store_file: Option<std::path::PathBuf>,
    /// A file holding the claim store's URL, instead of --claims; also
    /// JUSTONCE_CLAIMS_URL_FILE.
    #[arg(long, global = true, value_name = "PATH")]
    claims_file: Option<std::path::PathBuf>,
}

impl Cli {
    /// A `--X-file` given to a command that takes no `--X` is an error, not ignored.
    fn check_url_files(&self, matches: &clap::ArgMatches) -> anyhow::Result<()> {
        use clap::CommandFactory as _;
        let mut command = Cli::command();
        let mut m = matches;
        while let Some((name, sub)) = m.subcommand() {
            let Some(next) = command.find_subcommand(name).cloned() else {
                break;
            };
            command = next;
            m = sub;
        }
        for (flag, given) in [
            ("transport", self.transport_file.is_some()),
            ("store", self.store_file.is_some()),
            ("claims", self.claims_file.is_some()),
        ] {
            if given && !command.get_arguments().any(|a| a.get_long() == Some(flag)) {
                anyhow::bail!(
                    "`justonce {}` takes no --{flag}, so --{flag}-file means nothing to it",
                    command.get_name()
                );
            }
        }
        Ok(())
    }
}

#[derive(Subcommand)]
enum Command {
    /// The order/payment pipeline under seeded faults, once per semantic, with a table of
    /// lost and duplicated effects counted from the business data.
    Demo(demo::DemoArgs),
    /// Real faults on real processes: a publisher and K consumer workers under kills,
    /// pauses, network cuts and restarts, checked from the business data.
    Lab(lab::LabArgs),
    /// The price of each semantic and of the framework: at-most-once, at-least-once,
    /// effectively-once and a bare baseline side by side, swept over batch size,
    /// concurrency and message size.
    Bench(bench::BenchArgs),
    /// Dead letters on any transport: list them grouped by failure, show one, replay them
    /// (keeping their ids, so what was applied is not applied again), purge them.
    Dlq(dlq::DlqArgs),
    /// Dedup state of any store: records per consumer, one key's record and claim, what a
    /// delivery of a payload would do, a stuck claim freed, the retention purge now.
    Dedup(dedup::DedupArgs),
    /// Every link of the chain checked against the real services (a durable queue,
    /// confirms, dead letters with somewhere to go, the consumer timeout, the dedup table,
    /// its retention against the redelivery horizon, the store's clock): pass, warn or
    /// fail, with what to change; exit 1 on a fail.
    Doctor(doctor::DoctorArgs),
    /// An outbox: its backlog, relays and dead rows (`status`), the dead rows revived or
    /// discarded, and a relay process (`relay`: confirm, then mark).
    Outbox(crate::outbox::OutboxArgs),
    /// One bench run as its own process (used by `bench`).
    #[command(hide = true)]
    BenchRun(bench::BenchRunArgs),
    /// The demo's payment consumer as a process of its own (the lab's workers), with
    /// Prometheus metrics and health probes on `--metrics-addr`.
    Worker(worker::WorkerArgs),
    /// Publish the demo's orders as a process of its own (used by the lab).
    #[command(hide = true)]
    Publish(publish::PublishArgs),
    /// Place the demo's orders through a producer outbox as a process of its own (used by
    /// the lab's `relay` class).
    #[command(hide = true)]
    Produce(produce::ProduceArgs),
}

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Err(e) = secrets::read_url_files(&args) {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let matches = <Cli as clap::CommandFactory>::command().get_matches_from(&args);
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = cli.check_url_files(&matches) {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    secrets::warn_about_command_line(&args);
    // The demo's faults are on purpose: its warnings would drown the table.
    // lapin logs a broker restart as errors; the lab reports it as a fault it made.
    logging::init(
        if matches!(
            cli.command,
            Command::Demo(_) | Command::Lab(_) | Command::Bench(_) | Command::BenchRun(_)
        ) {
            "error,lapin=off"
        } else if matches!(
            cli.command,
            Command::Doctor(_) | Command::Dlq(_) | Command::Outbox(_)
        ) {
            // A tool's passive checks of what may not exist: lapin logs each 404 as an
            // error, which the tool reports in its own words.
            "error,justonce=warn,lapin=off"
        } else {
            "error,justonce=warn"
        },
    );
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::Lab(args) => lab::run(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Publish(args) => publish::run(args).await,
            Command::Produce(args) => produce::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::BenchRun(args) => bench::run_child(args).await,
            Command::Dlq(args) => dlq::run(args).await,
            Command::Dedup(args) => dedup::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            Command::Outbox(args) => outbox::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once: a wrapper that repeats its source is left out.
            eprintln!("error: {}", justonce::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
