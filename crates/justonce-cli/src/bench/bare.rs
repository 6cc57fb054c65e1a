//! The bare baselines: the same business write per message with no justonce runtime, on a
//! SQL queue through its own calls, and on RabbitMQ through lapin directly.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures_lite::StreamExt;
use justonce::amqp::AmqpOptions;
use justonce::Source;
use tokio::sync::watch;

use super::clock::Clock;
use super::run::{BenchRunArgs, Running};
use crate::orders::{Bank, Payment, Tables};

/// The bare baseline on a SQL queue: receive (with the runtime's 5 ms linger), one
/// transaction of plain sqlx per batch, commit, ack. No dedup, no savepoints, no
/// classification of failures.
pub(crate) async fn bare_source<B: Bank>(
    source: Arc<dyn Source>,
    bank: B,
    tables: Tables,
    batch: usize,
    clock: Arc<Clock>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    while !*stop.borrow() {
        let mut ds = source.receive(batch, Duration::from_millis(100)).await?;
        if ds.is_empty() {
            continue;
        }
        if ds.len() < batch {
            tokio::time::sleep(Duration::from_millis(5)).await;
            ds.extend(source.receive(batch - ds.len(), Duration::ZERO).await?);
        }
        let mut tx = bank.begin_direct().await?;
        for d in &ds {
            let p: Payment = serde_json::from_slice(d.message.payload())?;
            B::pay(&mut tx, &tables, &p).await?;
        }
        B::commit_direct(tx).await?;
        clock.committed(ds.iter().filter_map(|d| d.message.id()).map(|i| i.as_str()));
        let receipts: Vec<_> = ds.iter().map(|d| &d.receipt).collect();
        source.ack(&receipts).await?;
    }
    Ok(())
}

/// The bare baseline on RabbitMQ: lapin and sqlx directly. One channel per batch loop,
/// prefetch of two batches, one transaction per batch, then one `basic.ack` with
/// `multiple` for the batch.
pub(crate) async fn bare_amqp<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    clock: Arc<Clock>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    use lapin::types::FieldTable;

    let queue = AmqpOptions::new(args.name.as_str()).queue;
    let conn = lapin::Connection::connect(&args.transport, lapin::ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")?;
    let conn = Arc::new(conn);
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let channel = conn.create_channel().await?;
        let prefetch = u16::try_from(args.batch * 2).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await?;
        let mut consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let (bank, tables, clock, mut stop) =
            (bank.clone(), tables.clone(), clock.clone(), stop.clone());
        let batch = args.batch;
        tasks.push(tokio::spawn(async move {
            loop {
                let first = tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    d = consumer.next() => d,
                };
                let Some(first) = first else { break };
                let mut ds = vec![first?];
                let linger = tokio::time::sleep(Duration::from_millis(5));
                tokio::pin!(linger);
                while ds.len() < batch {
                    tokio::select! {
                        _ = &mut linger => break,
                        d = consumer.next() => match d {
                            Some(d) => ds.push(d?),
                            None => break,
                        },
                    }
                }
                let mut tx = bank.begin_direct().await?;
                let mut ids = Vec::with_capacity(ds.len());
                for d in &ds {
                    let p: Payment = serde_json::from_slice(&d.data)?;
                    ids.push(p.order_id.clone());
                    B::pay(&mut tx, &tables, &p).await?;
                }
                B::commit_direct(tx).await?;
                clock.committed(ids.iter().map(String::as_str));
                if let Some(last) = ds.last() {
                    channel
                        .basic_ack(last.delivery_tag, BasicAckOptions { multiple: true })
                        .await?;
                }
            }
            let _ = channel.close(200, "bench done".into()).await;
            anyhow::Ok(())
        }));
    }
    Ok(tokio::spawn(async move {
        for t in tasks {
            t.await??;
        }
        let _ = conn.close(200, "bench done".into()).await;
        Ok(())
    }))
}
