//! The `justonce` command. Thin over the libraries: argument parsing, output, exit codes.

mod bench;
mod bus;
mod dedup;
mod demo;
mod dlq;
mod doctor;
mod doctor_link;
mod lab;
mod local;
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
    init_tracing(
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

/// Logs to stderr, filtered by `JUSTONCE_LOG`; as one JSON object per line when
/// `JUSTONCE_LOG_FORMAT=json`, for log pipelines: each event with the spans it is in, and a
/// line when a span closes, so `JUSTONCE_LOG=justonce=info` gives one line per batch with
/// what it came to (and `debug`, one per delivery with its outcome).
fn init_tracing(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("JUSTONCE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match std::env::var("JUSTONCE_LOG_FORMAT").as_deref() {
        Ok("json") => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
            .try_init(),
        _ => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
    };
}
