//! The links of the chain on a transport and a store, checked against the real services
//! without creating anything: what `justonce doctor` prints. Each backend checks what only
//! it can see (`justonce_amqp::check`, `SqliteQueue::check`, `PgQueue::check`); a store is
//! checked through [`InspectStore`](crate::InspectStore).
//!
//! ```no_run
//! # async fn run() -> justonce::Result<()> {
//! use justonce::backend::TransportOptions;
//! use justonce::CheckStatus;
//!
//! let url = "amqp://guest:guest@127.0.0.1:5672/%2f";
//! let found = justonce::doctor::check_transport(url, "orders", &TransportOptions::default()).await?;
//! for c in found.iter().filter(|c| c.status != CheckStatus::Pass) {
//!     println!("{} {}: {}", c.status.as_str(), c.link, c.detail);
//! }
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime};

use justonce_core::{Check, Error, ErrorKind, Result};

use crate::backend::{TransportKind, TransportOptions};

/// The transport's links for `queue`: it exists, it is durable, its dead letters have
/// somewhere to go, publishes are confirmed. On RabbitMQ `opts.amqp` is the topology to
/// hold the broker to (default: justonce's for `queue`). An unreachable service is an
/// error; a queue that does not exist is a failed check.
#[allow(unused_variables)]
pub async fn check_transport(
    url: &str,
    queue: &str,
    opts: &TransportOptions,
) -> Result<Vec<Check>> {
    let kind = TransportKind::from_url(url)?;
    let missing = |e: Error| -> Result<Vec<Check>> {
        match e.kind() {
            ErrorKind::Config | ErrorKind::Schema => Ok(vec![Check::fail(
                "queue",
                e.to_chain_string(),
                "start a consumer of it once (it creates its tables), or give the queue it uses",
            )]),
            _ => Err(e),
        }
    };
    match kind {
        #[cfg(feature = "sqlite")]
        TransportKind::Sqlite => {
            let o = justonce_sql::SqliteQueueOptions::default().create(false);
            match justonce_sql::SqliteQueue::open_with(url, queue, o).await {
                Ok(q) => q.check().await,
                Err(e) => missing(e),
            }
        }
        #[cfg(feature = "postgres")]
        TransportKind::Postgres => {
            let o = justonce_sql::PgQueueOptions::default().create(false);
            match justonce_sql::PgQueue::open_with(url, queue, o).await {
                Ok(q) => q.check().await,
                Err(e) => missing(e),
            }
        }
        #[cfg(feature = "amqp")]
        TransportKind::Amqp => {
            let o = match &opts.amqp {
                Some(o) => o.clone(),
                None => justonce_amqp::AmqpOptions::new(queue),
            };
            justonce_amqp::check(url, &o).await
        }
        #[cfg(feature = "redis")]
        TransportKind::Redis => {
            let o = justonce_redis::RedisStreamOptions::new(queue)
                .lease(opts.lease)
                .create(false);
            match justonce_redis::RedisStream::connect(url, o).await {
                Ok(q) => q.check().await,
                Err(e) => missing(e),
            }
        }
        #[cfg(feature = "nats")]
        TransportKind::Nats => {
            let o = justonce_nats::NatsOptions::new(queue)
                .lease(opts.lease)
                .create(false);
            match justonce_nats::NatsStream::connect(url, o).await {
                Ok(q) => q.check().await,
                Err(e) => missing(e),
            }
        }
        #[cfg(feature = "kafka")]
        TransportKind::Kafka => {
            let o = justonce_kafka::KafkaOptions::from_url(url, queue)?.create(false);
            match justonce_kafka::KafkaPublisher::connect(o).await {
                Ok(p) => p.check().await,
                Err(e) => missing(e),
            }
        }
        #[allow(unreachable_patterns)]
        _ => Err(Error::config(format!(
            "the {} transport needs justonce's `{}` feature",
            kind.as_str(),
            kind.feature()
        ))),
    }
}

/// The store's links: its dedup table `dedup_table` exists (with how many records), and
/// its clock agrees with this machine's (leases and retention go by the store's clock;
/// fencing and leases compare it with the consumers'). An unreachable store is an error.
pub async fn check_store(url: &str, dedup_table: &str) -> Result<Vec<Check>> {
    let no_table = |e: Error| {
        Check::fail(
            "dedup table",
            e.to_chain_string(),
            "open the store with justonce once (it creates the table), or give the table the \
             consumer uses (`--dedup-table`)",
        )
    };
    let store = match crate::backend::inspect_store(url, dedup_table).await {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::Schema => return Ok(vec![no_table(e)]),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    match store.dedup_stats().await {
        Ok(stats) => {
            let records: u64 = stats.iter().map(|c| c.records).sum();
            out.push(Check::pass(
                "dedup table",
                format!(
                    "{dedup_table} exists: {records} records of {} consumers",
                    stats.len()
                ),
            ))
        }
        Err(e) if e.kind() == ErrorKind::Schema => out.push(no_table(e)),
        Err(e) => return Err(e),
    }
    let before = SystemTime::now();
    let theirs = store.clock().await?;
    let after = SystemTime::now();
    if let Some(theirs) = theirs {
        let mid = before + after.duration_since(before).unwrap_or_default() / 2;
        let skew = theirs
            .duration_since(mid)
            .or_else(|e| Ok::<_, ()>(e.duration()))
            .unwrap_or_default();
        let ms = skew.as_millis();
        out.push(if skew > Duration::from_secs(30) {
            Check::fail(
                "store clock",
                format!("the store's clock is {ms} ms from this machine's"),
                "synchronise the clocks (NTP): leases, retention and the purge go by the \
                 store's clock",
            )
        } else if skew > Duration::from_secs(1) {
            Check::warn(
                "store clock",
                format!("the store's clock is {ms} ms from this machine's"),
                "synchronise the clocks (NTP)",
            )
        } else {
            Check::pass("store clock", format!("within {ms} ms of this machine's"))
        });
    }
    out.extend(store.server_checks().await?);
    // What a Redis store's server keeps on disk and may evict decides whether a record
    // outlives a restart or memory pressure.
    #[cfg(feature = "redis")]
    if crate::backend::StoreKind::from_url(url)? == crate::backend::StoreKind::Redis {
        let s = justonce_redis::RedisStore::connect(url).await?;
        out.extend(s.server().checks());
    }
    Ok(out)
}
