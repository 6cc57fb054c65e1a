//! `justonce doctor`: every link of the chain checked against the real services, printed
//! pass/warn/fail with what to change. The transport's and the store's own links come from
//! `justonce::doctor`; the links that depend on how the consumer is configured (the dedup
//! retention against the redelivery horizon, RabbitMQ's `consumer_timeout` against the
//! longest batch) are judged here from the flags.

use std::time::Duration;

use justonce::backend::{TransportKind, TransportOptions};
use justonce::{Check, CheckStatus, ConsumerOptions, RetryOptions};
use serde_json::json;

use crate::local::RabbitNode;

/// Arguments of `justonce doctor`.
#[derive(clap::Args)]
pub(crate) struct DoctorArgs {
    /// Transport URL.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_TRANSPORT_URL",
        hide_env_values = true
    )]
    transport: String,
    /// The work queue.
    #[arg(long, default_value = "orders")]
    queue: String,
    /// Store URL (the dedup table's database).
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: Option<String>,
    /// The dedup table.
    #[arg(long, default_value = "jo_dedup")]
    dedup_table: String,
    /// The consumer's dedup retention, in seconds (none: records are kept for ever).
    #[arg(long, value_name = "SECONDS")]
    retention_secs: Option<u64>,
    /// The consumer's attempts per message.
    #[arg(long, default_value_t = RetryOptions::default().max_attempts)]
    max_attempts: u32,
    /// The consumer's longest backoff between attempts, in milliseconds.
    #[arg(long, default_value_t = RetryOptions::default().backoff_max.as_millis() as u64)]
    backoff_max_ms: u64,
    /// The SQL queues' lease, in milliseconds: how long a crashed consumer's delivery waits
    /// before it is delivered again.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// The longest a batch may hold its deliveries, from receive to ack, in seconds (the
    /// handler's worst case times the batch, plus the commit).
    #[arg(long, default_value_t = 60)]
    max_batch_secs: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    topology: crate::bus::Topology,
}

pub(crate) async fn run(a: DoctorArgs) -> anyhow::Result<()> {
    let kind = TransportKind::from_url(&a.transport)?;
    let mut found: Vec<(&'static str, Check)> = Vec::new();
    let amqp = a.topology.options(&a.queue)?;
    let transport_delay = match kind {
        TransportKind::Amqp => amqp.redelivery_delay(),
        _ => Duration::from_millis(a.lease_ms),
    };
    let opts = TransportOptions::default()
        .lease(Duration::from_millis(a.lease_ms))
        .amqp(amqp);
    found.extend(
        crate::doctor_link::check(&a.transport)
            .await
            .map(|c| ("transport", c)),
    );
    if let Some(store) = &a.store {
        found.extend(crate::doctor_link::check(store).await.map(|c| ("store", c)));
    }
    match justonce::doctor::check_transport(&a.transport, &a.queue, &opts).await {
        Ok(checks) => found.extend(checks.into_iter().map(|c| ("transport", c))),
        Err(e) => found.push((
            "transport",
            Check::fail(
                "reachable",
                e.to_chain_string(),
                "check the URL, the credentials and that the service runs",
            ),
        )),
    }
    if kind == TransportKind::Amqp {
        found.push((
            "transport",
            consumer_timeout(&a.transport, a.max_batch_secs).await,
        ));
    }
    if let Some(store) = &a.store {
        match justonce::doctor::check_store(store, &a.dedup_table).await {
            Ok(checks) => found.extend(checks.into_iter().map(|c| ("store", c))),
            Err(e) => found.push((
                "store",
                Check::fail(
                    "reachable",
                    e.to_chain_string(),
                    "check the URL, the credentials and that the service runs",
                ),
            )),
        }
    }
    found.push(("consumer", retention(&a, transport_delay)));
    let failed = found.iter().any(|(_, c)| c.status == CheckStatus::Fail);
    if a.json {
        let checks: Vec<_> = found
            .iter()
            .map(|(part, c)| json!({"part": part, "link": c.link, "status": c.status, "detail": c.detail, "fix": c.fix}))
            .collect();
        println!(
            "{}",
            json!({"transport": justonce::redact_url(&a.transport), "queue": a.queue, "checks": checks, "ok": !failed})
        );
    } else {
        for (part, c) in &found {
            println!(
                "{:<4}  {:<9}  {:<18}  {}",
                c.status.as_str(),
                part,
                c.link,
                c.detail
            );
            if let Some(fix) = &c.fix {
                println!("{:<35}  -> {fix}", "");
            }
        }
        let n = |s| found.iter().filter(|(_, c)| c.status == s).count();
        println!(
            "\n{} pass, {} warn, {} fail",
            n(CheckStatus::Pass),
            n(CheckStatus::Warn),
            n(CheckStatus::Fail)
        );
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// The dedup retention against the redelivery horizon (contract 6): a record purged before
/// the last redelivery of its message lets that redelivery apply it again.
fn retention(a: &DoctorArgs, transport_delay: Duration) -> Check {
    let mut opts = ConsumerOptions::new("doctor");
    opts.retry.max_attempts = a.max_attempts.max(1);
    opts.retry.backoff_max = Duration::from_millis(a.backoff_max_ms);
    let horizon = opts.redelivery_horizon(transport_delay);
    let h = horizon.as_secs_f64();
    match a.retention_secs {
        None => Check::pass(
            "dedup retention",
            format!(
                "no retention given: records are kept for ever, past the redelivery horizon \
                 of {h:.0} s (pass --retention-secs to check the consumer's)"
            ),
        ),
        Some(r) if Duration::from_secs(r) <= horizon => Check::fail(
            "dedup retention",
            format!(
                "a retention of {r} s is not longer than the redelivery horizon of {h:.0} s \
                 ({} attempts, backoff up to {} ms, {} ms per redelivery): a message \
                 redelivered after its record is purged is applied twice",
                a.max_attempts,
                a.backoff_max_ms,
                transport_delay.as_millis()
            ),
            format!("raise the retention above {h:.0} s, or lower max_attempts / backoff_max"),
        ),
        Some(r) => Check::pass(
            "dedup retention",
            format!("a retention of {r} s outlasts the redelivery horizon of {h:.0} s"),
        ),
    }
}

/// RabbitMQ's `consumer_timeout` against the longest batch: a delivery unacked for longer
/// makes the broker close the channel, and every delivery on it comes again. AMQP cannot
/// read it; the node's own `rabbitmqctl` can, where the node the URL names runs on this
/// machine ([`RabbitNode`]: found by the port it listens on, never the machine's default).
async fn consumer_timeout(url: &str, max_batch_secs: u64) -> Check {
    const LINK: &str = "consumer timeout";
    let read = async {
        let node = RabbitNode::find(url)?;
        let facts = node.facts().await?;
        anyhow::Ok((node.name, facts.consumer_timeout_ms))
    };
    let (node, ms) = match read.await {
        Ok(read) => read,
        Err(e) => {
            return Check::warn(
                LINK,
                format!("cannot read consumer_timeout: {e:#}"),
                format!(
                    "check on the broker that consumer_timeout (default 30 min) is well above the longest batch ({max_batch_secs} s): `rabbitmqctl eval 'application:get_env(rabbit, consumer_timeout).'`"
                ),
            );
        }
    };
    let Some(ms) = ms else {
        return Check::pass(
            LINK,
            format!(
                "consumer_timeout is off on {node}: the broker never reclaims a delivery held long"
            ),
        );
    };
    let batch_ms = max_batch_secs.saturating_mul(1000);
    if ms <= batch_ms {
        Check::fail(
            LINK,
            format!("consumer_timeout is {ms} ms on {node}, not longer than the longest batch ({batch_ms} ms): the broker closes the channel under a slow batch and delivers all of it again"),
            "raise consumer_timeout in rabbitmq.conf, or make batches shorter",
        )
    } else if ms < batch_ms.saturating_mul(2) {
        Check::warn(
            LINK,
            format!(
                "consumer_timeout is {ms} ms on {node}, less than twice the longest batch ({batch_ms} ms)"
            ),
            "raise consumer_timeout in rabbitmq.conf, or make batches shorter",
        )
    } else {
        Check::pass(
            LINK,
            format!(
                "consumer_timeout is {ms} ms on {node}, above the longest batch ({batch_ms} ms)"
            ),
        )
    }
}
