//! The bare baselines: the same business write per message with no justonce runtime, on a
//! SQL queue through its own calls, on RabbitMQ through lapin, on a Redis stream through
//! redis-rs, on a NATS stream through async-nats and on Kafka through rdkafka directly.

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

/// Every baseline's business work: one plain transaction of the store for a batch of
/// payment payloads; answers their order ids.
async fn pay_batch<'a, B: Bank>(
    bank: &B,
    tables: &Tables,
    payloads: impl Iterator<Item = &'a [u8]>,
) -> anyhow::Result<Vec<String>> {
    let mut tx = bank.begin_direct().await?;
    let mut ids = Vec::new();
    for payload in payloads {
        let p: Payment = serde_json::from_slice(payload)?;
        B::pay(&mut tx, tables, &p).await?;
        ids.push(p.order_id);
    }
    B::commit_direct(tx).await?;
    Ok(ids)
}

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
        let ids = pay_batch(&bank, &tables, ds.iter().map(|d| d.message.payload())).await?;
        clock.committed(ids.iter().map(String::as_str));
        let receipts: Vec<_> = ds.iter().map(|d| &d.receipt).collect();
        source.ack(&receipts).await?;
    }
    Ok(())
}

/// A bare loop's next batch from `stream`: the first item awaited, then more until `batch`
/// came or 5 ms passed. `None` at `stop` or at the stream's end with nothing in hand.
async fn next_batch<T, E>(
    stream: &mut (impl futures_lite::Stream<Item = Result<T, E>> + Unpin),
    batch: usize,
    stop: &mut watch::Receiver<bool>,
) -> Result<Option<Vec<T>>, E> {
    let first = tokio::select! {
        _ = stop.wait_for(|s| *s) => return Ok(None),
        d = stream.next() => d,
    };
    let Some(first) = first else { return Ok(None) };
    let mut items = vec![first?];
    let linger = tokio::time::sleep(Duration::from_millis(5));
    tokio::pin!(linger);
    while items.len() < batch {
        tokio::select! {
            _ = &mut linger => break,
            d = stream.next() => match d {
                Some(d) => items.push(d?),
                None => break,
            },
        }
    }
    Ok(Some(items))
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
    let conn = justonce::amqp::connect(&args.transport, &Default::default()).await?;
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
            while let Some(ds) = next_batch(&mut consumer, batch, &mut stop).await? {
                let ids = pay_batch(&bank, &tables, ds.iter().map(|d| d.data.as_slice())).await?;
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

/// The bare baseline on a Redis stream: redis-rs directly. Per batch loop a connection of
/// its own, `XREADGROUP … COUNT batch BLOCK 100 … >` (then a 5 ms linger and one more
/// non-blocking read, as the runtime does), one transaction of the store per batch, then
/// one `XACK` of the batch's entries. No heartbeat, no takeover, no retries, no dead
/// letters: a failure ends the run.
pub(crate) async fn bare_redis<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    clock: Arc<Clock>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    use redis::Value;

    let opts = justonce::redis::RedisStreamOptions::new(args.name.as_str());
    let client = justonce::redis::client(&args.transport)?;
    let mut tasks = Vec::new();
    for slot in 0..args.concurrency {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .context("connecting to Redis")?;
        let (stream, group) = (opts.stream.clone(), opts.group.clone());
        let consumer = format!("bare-{slot}");
        let (bank, tables, clock, stop) =
            (bank.clone(), tables.clone(), clock.clone(), stop.clone());
        let batch = args.batch;
        tasks.push(tokio::spawn(async move {
            // (entry id, payload) of each entry a read answered.
            let read = |conn: &mut redis::aio::MultiplexedConnection, count: usize, block: u64| {
                let mut cmd = redis::cmd("XREADGROUP");
                cmd.arg("GROUP")
                    .arg(&group)
                    .arg(&consumer)
                    .arg("COUNT")
                    .arg(count);
                if block > 0 {
                    cmd.arg("BLOCK").arg(block);
                }
                cmd.arg("STREAMS").arg(&stream).arg(">");
                let mut conn = conn.clone();
                async move {
                    let reply: Value = cmd.query_async(&mut conn).await?;
                    anyhow::Ok(entries(reply))
                }
            };
            while !*stop.borrow() {
                let mut ds = read(&mut conn, batch, 100).await?;
                if ds.is_empty() {
                    continue;
                }
                if ds.len() < batch {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ds.extend(read(&mut conn, batch - ds.len(), 0).await?);
                }
                let ids = pay_batch(&bank, &tables, ds.iter().map(|(_, p)| p.as_slice())).await?;
                clock.committed(ids.iter().map(String::as_str));
                let mut ack = redis::cmd("XACK");
                ack.arg(&stream).arg(&group);
                for (entry, _) in &ds {
                    ack.arg(entry);
                }
                let _: u64 = ack.query_async(&mut conn).await?;
            }
            anyhow::Ok(())
        }));
    }
    Ok(joined(tasks))
}

/// The bare baseline on NATS JetStream: async-nats directly, on the durable pull consumer
/// the bus made. Per batch loop: a `fetch` of the batch (no wait); when it answers nothing,
/// a `batch` of up to the batch that waits 100 ms; one transaction of the store per batch,
/// then a plain `+ACK` of each message (no reply awaited). No `+WPI`, no retries, no dead
/// letters: a failure ends the run.
pub(crate) async fn bare_nats<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    clock: Arc<Clock>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    let opts = justonce::nats::NatsOptions::new(args.name.as_str());
    let client = async_nats::connect(args.transport.as_str())
        .await
        .context("connecting to NATS")?;
    let js = async_nats::jetstream::new(client);
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream(&opts.stream)
        .await
        .context("the bench's stream")?
        .get_consumer(&opts.consumer)
        .await
        .map_err(|e| anyhow::anyhow!("the bench's consumer: {e}"))?;
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let consumer = consumer.clone();
        let (bank, tables, clock, stop) =
            (bank.clone(), tables.clone(), clock.clone(), stop.clone());
        let batch = args.batch;
        tasks.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let fetched = consumer.fetch().max_messages(batch).messages();
                let mut got: Vec<_> = fetched
                    .await
                    .map_err(|e| anyhow::anyhow!("fetch: {e}"))?
                    .try_collect()
                    .await
                    .map_err(|e| anyhow::anyhow!("fetch: {e}"))?;
                if got.is_empty() {
                    let waited = consumer
                        .batch()
                        .max_messages(batch)
                        .expires(Duration::from_millis(100))
                        .messages();
                    got = waited
                        .await
                        .map_err(|e| anyhow::anyhow!("batch: {e}"))?
                        .try_collect()
                        .await
                        .map_err(|e| anyhow::anyhow!("batch: {e}"))?;
                }
                if got.is_empty() {
                    continue;
                }
                let ids = pay_batch(&bank, &tables, got.iter().map(|m| m.payload.as_ref())).await?;
                clock.committed(ids.iter().map(String::as_str));
                for m in &got {
                    m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                }
            }
            anyhow::Ok(())
        }));
    }
    Ok(joined(tasks))
}

/// The bare baseline on Kafka: rdkafka directly. Per batch loop a `StreamConsumer` in a
/// group of the baseline's own on the bench's topic (from the earliest offset, no automatic
/// commits); per batch: the first record awaited, more until the batch is full or 5 ms have
/// passed, one transaction of the store, then one synchronous commit of the offsets past
/// the batch (at-least-once: the offsets move after the effect, as justonce moves Kafka's
/// committed offsets after each ack). No retries, no dead letters: a failure ends the run.
pub(crate) async fn bare_kafka<B: Bank>(
    args: &BenchRunArgs,
    bank: &B,
    tables: &Tables,
    clock: Arc<Clock>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    use rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
    use rdkafka::{Message as _, Offset, TopicPartitionList};

    let opts =
        justonce::kafka::KafkaOptions::from_url(args.transport.as_str(), args.name.as_str())?;
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let consumer: StreamConsumer = opts
            .client_config()?
            .set("group.id", format!("{}-bare", opts.group))
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .context("creating the Kafka consumer")?;
        consumer
            .subscribe(&[&opts.topic])
            .context("subscribing to the bench's topic")?;
        let consumer = Arc::new(consumer);
        let (bank, tables, clock, mut stop) =
            (bank.clone(), tables.clone(), clock.clone(), stop.clone());
        let (batch, topic) = (args.batch, opts.topic.clone());
        tasks.push(tokio::spawn(async move {
            let mut records = consumer.stream().map(|m| m.map(|m| m.detach()));
            while let Some(ms) = next_batch(&mut records, batch, &mut stop).await? {
                let ids = pay_batch(
                    &bank,
                    &tables,
                    ms.iter().map(|m| m.payload().unwrap_or_default()),
                )
                .await?;
                clock.committed(ids.iter().map(String::as_str));
                let mut next = std::collections::BTreeMap::new();
                for m in &ms {
                    let o = next.entry(m.partition()).or_insert(0);
                    *o = (*o).max(m.offset() + 1);
                }
                let mut tpl = TopicPartitionList::new();
                for (partition, offset) in next {
                    tpl.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
                }
                let c = consumer.clone();
                tokio::task::spawn_blocking(move || c.commit(&tpl, CommitMode::Sync)).await??;
            }
            anyhow::Ok(())
        }));
    }
    Ok(joined(tasks))
}

/// One task that awaits `tasks` in turn, failing with the first error it meets.
pub(crate) fn joined(tasks: Vec<Running>) -> Running {
    tokio::spawn(async move {
        for t in tasks {
            t.await??;
        }
        Ok(())
    })
}

/// The entries of an `XREADGROUP` reply (RESP2: `[[stream, [[id, [field, value, …]], …]]]`,
/// nil when nothing came), as (entry id, the `payload` field).
fn entries(reply: redis::Value) -> Vec<(String, Vec<u8>)> {
    use redis::Value;
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let mut out = Vec::new();
    let Value::Array(streams) = reply else {
        return out;
    };
    for s in streams {
        let Value::Array(s) = s else { continue };
        let Some(Value::Array(list)) = s.get(1) else {
            continue;
        };
        for e in list {
            let Value::Array(e) = e else { continue };
            let (Some(id), Some(Value::Array(fields))) = (e.first().and_then(text), e.get(1))
            else {
                continue;
            };
            let payload = fields
                .chunks(2)
                .find(|kv| kv.first().and_then(text).as_deref() == Some(b"payload"))
                .and_then(|kv| kv.get(1).and_then(text));
            if let Some(payload) = payload {
                out.push((String::from_utf8_lossy(&id).into_owned(), payload));
            }
        }
    }
    out
}
