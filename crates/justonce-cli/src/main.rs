//! The `justonce` command. Thin over the libraries: argument parsing, output, exit codes.

mod bus;
mod demo;
mod orders;
mod worker;

use clap::{Parser, Subcommand};

/// Exactly-once effects on at-least-once brokers: demo, and (soon) lab, bench, dlq, dedup.
#[derive(Debug, Parser)]
#[command(name = "justonce", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The order/payment pipeline under seeded faults, once per semantic, with a table of
    /// lost and duplicated effects counted from the business data.
    Demo(demo::DemoArgs),
    /// Run the order/payment consumer as its own process (used by tests and the lab).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The demo's faults are on purpose: its warnings would drown the table.
    init_tracing(if matches!(cli.command, Command::Demo(_)) {
        "error"
    } else {
        "error,justonce=warn"
    });
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
            Command::Worker(args) => worker::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("JUSTONCE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
