//! `justonce publish`: the demo's orders published by a process of its own, for the lab. A
//! publish that fails (a cut connection, a restarting broker) is sent again with the same
//! ids until it is confirmed, as a careful producer does: the consumer's dedup absorbs the
//! duplicates that may result.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::bus::Bus;
use crate::demo::plan::{IdStrategy, Plan};

/// Arguments of `justonce publish`.
#[derive(clap::Args)]
pub(crate) struct PublishArgs {
    /// Transport URL (sqlite:PATH, amqp://… or postgres://…).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: String,
    /// Queue name.
    #[arg(long)]
    queue: String,
    #[command(flatten)]
    plan: PlanArgs,
    /// Orders published together, confirmed as one batch.
    #[arg(long, default_value_t = 250)]
    chunk: usize,
    /// A pause after each chunk, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pace_ms: u64,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

/// The plan a publisher or a producer sends, and how long it keeps trying.
#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    /// Orders to send.
    #[arg(long)]
    messages: u64,
    /// Seed of the plan (which orders are poison or published twice).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The consumer's payload limit, for the oversized poison.
    #[arg(long, default_value_t = 16 * 1024)]
    max_payload_bytes: usize,
    /// Give up when a publish (a transaction) has failed for this long.
    #[arg(long, default_value_t = 120)]
    give_up_after_s: u64,
}

impl PlanArgs {
    /// The plan, and how long to keep trying.
    pub(crate) fn plan(&self) -> (Plan, Duration) {
        (
            Plan::new(self.messages, self.seed, self.max_payload_bytes),
            Duration::from_secs(self.give_up_after_s),
        )
    }
}

pub(crate) async fn run(args: PublishArgs) -> anyhow::Result<()> {
    let (plan, give_up) = args.plan.plan();
    let sink = retry(give_up, "connect", || {
        Bus::open_publisher(&args.transport, &args.queue, &args.topology)
    })
    .await?;
    for chunk in plan.orders.chunks(args.chunk.max(1)) {
        let first: Vec<_> = chunk
            .iter()
            .map(|o| plan.message(o, IdStrategy::MessageId))
            .collect();
        let again: Vec<_> = chunk
            .iter()
            .filter(|o| o.publish_twice)
            .map(|o| plan.message(o, IdStrategy::MessageId))
            .collect();
        retry(give_up, "publish", || sink.publish(&first, &again)).await?;
        tokio::time::sleep(Duration::from_millis(args.pace_ms)).await;
    }
    Ok(())
}

/// Runs `f` until it succeeds, pausing between attempts, for at most `give_up`.
pub(crate) async fn retry<T, F, Fut>(give_up: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = justonce::Result<T>>,
{
    let started = Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if started.elapsed() < give_up => {
                tracing::warn!(error = %e.to_chain_string(), "{what} failed; trying again with the same ids");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("{what} kept failing for {give_up:?}"))
            }
        }
    }
}
