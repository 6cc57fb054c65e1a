//! `justonce produce`: the demo's orders placed by a service of its own through a producer
//! outbox, for the lab's `relay` class. Each chunk of orders is one business transaction:
//! the orders recorded as placed and their messages written to the outbox, or neither. A
//! producer started again after a crash skips the orders it placed, so it never writes an
//! order's message twice; what it committed before dying is the relays' to send.

use std::time::Duration;

use anyhow::Context as _;
use justonce::backend::StoreKind;
use justonce::redis::RedisStore;
use justonce::sql::{MySqlStore, PgStore, SqliteStore};
use justonce::OutboxStore;

use crate::demo::plan::IdStrategy;
use crate::lab::protocol::{LabPoint, Pauser};
use crate::orders::{Bank, Tables};
use crate::publish::{retry, PlanArgs};

/// Orders per business transaction.
const CHUNK: usize = 50;
/// Ordering keys the orders are spread over (customers, say).
const KEYS: usize = 16;

/// Arguments of `justonce produce`.
#[derive(clap::Args)]
pub(crate) struct ProduceArgs {
    /// Store URL: the business database, where the outbox table is.
    #[arg(
        long,
        value_name = "URL",
        env = "JUSTONCE_STORE_URL",
        hide_env_values = true
    )]
    store: String,
    /// Prefix of the tables (`{prefix}_placed`, `{prefix}_outbox`, …), made by the lab.
    #[arg(long)]
    tables: String,
    /// Pause between transactions, in milliseconds (a service placing orders as they come).
    #[arg(long, default_value_t = 0)]
    pace_ms: u64,
    #[command(flatten)]
    plan: PlanArgs,
}

pub(crate) async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    match StoreKind::from_url(&args.store)? {
        StoreKind::Sqlite => run_on::<SqliteStore>(args).await,
        StoreKind::Postgres => run_on::<PgStore>(args).await,
        StoreKind::MySql => run_on::<MySqlStore>(args).await,
        StoreKind::Redis => run_on::<RedisStore>(args).await,
    }
}

async fn run_on<B: Bank>(args: ProduceArgs) -> anyhow::Result<()> {
    let (plan, give_up) = args.plan.plan();
    let tables = Tables::new(&args.tables)?;
    let store = retry(give_up, "connect", || B::open(&args.store, &tables)).await?;
    let outbox = retry(give_up, "open the outbox", || store.outbox(&tables)).await?;
    let pause = Pauser::from_env()?;
    let keyed: Vec<_> = plan.orders.iter().enumerate().collect();
    for (n, chunk) in keyed.chunks(CHUNK).enumerate() {
        let placed = retry(give_up, "place orders", || async {
            let mut tx = store.begin().await?;
            let mut placed = 0u64;
            for (i, order) in chunk {
                if B::place(&mut tx, &tables, &order.order_id).await? {
                    let message = plan.message(order, IdStrategy::MessageId);
                    let key = format!("customer-{}", i % KEYS);
                    outbox.enqueue(&mut tx, &message, Some(&key)).await?;
                    placed += 1;
                }
            }
            store.commit(tx).await?;
            Ok(placed)
        })
        .await
        .context("the producer could not place its orders")?;
        tracing::debug!(chunk = n, placed, "orders placed");
        if let Some(p) = &pause {
            p.at(LabPoint::AfterEnqueue, placed).await;
        }
        tokio::time::sleep(Duration::from_millis(args.pace_ms)).await;
    }
    Ok(())
}
