//! The demo's transport: the embedded SQLite queue, RabbitMQ or a PostgreSQL queue, with what the demo needs to
//! count from each: pending messages, deliveries, dead letters, and how a crash looks.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use justonce::amqp::{AmqpOptions, AmqpPublisher, AmqpSource, Declare, ExchangeType, QueueType};
use justonce::sql::{PgQueue, PgQueueOptions, SqliteQueue, SqliteQueueOptions};
use justonce::{Message, Publisher, Result, Source};

/// Where the RabbitMQ work queue gets its messages and what is declared: the flags the
/// demo, the worker, the publisher and the lab share (ignored on the SQL queues).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Topology {
    /// RabbitMQ: bind the work queue to this existing exchange (declared as TYPE, one of
    /// direct, topic, fanout, headers, if it does not exist); repeatable. Without it the
    /// queue has a direct exchange of its own.
    #[arg(long = "exchange", value_name = "NAME[:TYPE]")]
    exchanges: Vec<String>,
    /// RabbitMQ: the routing key or pattern of each --exchange binding; repeatable. The
    /// first is also the key the demo and the lab publish with.
    #[arg(long = "routing-key", value_name = "KEY")]
    routing_keys: Vec<String>,
    /// RabbitMQ: declare every part of the topology (all), only the missing ones (missing),
    /// or none, only checking that each exists (none: the topology is owned elsewhere).
    #[arg(long, value_name = "MODE", default_value = "all")]
    declare: Declare,
    /// RabbitMQ: the work queue's type, quorum or classic.
    #[arg(long, value_name = "TYPE", default_value = "quorum")]
    queue_type: QueueType,
}

impl Default for Topology {
    /// The queue's own exchange, everything declared, a quorum queue.
    fn default() -> Self {
        Topology {
            exchanges: Vec::new(),
            routing_keys: Vec::new(),
            declare: Declare::All,
            queue_type: QueueType::Quorum,
        }
    }
}

impl Topology {
    /// The RabbitMQ options of `queue` with these flags.
    pub(crate) fn options(&self, queue: &str) -> Result<AmqpOptions> {
        let mut o = AmqpOptions::new(queue)
            .declare(self.declare)
            .queue_type(self.queue_type);
        if self.exchanges.is_empty() && !self.routing_keys.is_empty() {
            return Err(justonce::Error::config(
                "--routing-key binds to an --exchange: give the exchange too",
            ));
        }
        let keys: Vec<&str> = if self.routing_keys.is_empty() {
            vec![""]
        } else {
            self.routing_keys.iter().map(String::as_str).collect()
        };
        for x in &self.exchanges {
            let (name, kind) = match x.split_once(':') {
                Some((name, kind)) => (name, Some(kind.parse::<ExchangeType>()?)),
                None => (x.as_str(), None),
            };
            for key in &keys {
                o = match kind {
                    Some(kind) => o.bind(name, kind, *key),
                    None => o.bind_existing(name, *key),
                };
            }
        }
        Ok(o)
    }

    /// The same flags for a child process (a worker, the publisher).
    pub(crate) fn to_args(&self) -> Vec<String> {
        let mut out = Vec::new();
        for x in &self.exchanges {
            out.extend(["--exchange".to_owned(), x.clone()]);
        }
        for k in &self.routing_keys {
            out.extend(["--routing-key".to_owned(), k.clone()]);
        }
        out.extend(["--declare".to_owned(), self.declare.as_str().to_owned()]);
        out.extend([
            "--queue-type".to_owned(),
            self.queue_type.as_str().to_owned(),
        ]);
        out
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Bus {
    Sqlite(SqliteQueue),
    Amqp(AmqpSource),
    Pg(PgQueue),
}

impl Bus {
    /// The backend name of a transport URL, or an error naming what is supported.
    pub(crate) fn scheme(url: &str) -> anyhow::Result<&'static str> {
        if url.starts_with("sqlite:") {
            Ok("sqlite")
        } else if url.starts_with("amqp://") || url.starts_with("amqps://") {
            Ok("amqp")
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok("postgres")
        } else {
            let scheme = url.split(':').next().unwrap_or_default();
            anyhow::bail!(
                "the {scheme} transport is not built yet: use sqlite:PATH (the embedded default), \
                 amqp://USER:PASS@HOST:PORT/VHOST (RabbitMQ) or postgres://USER@HOST:PORT/DB \
                 (a PostgreSQL queue); NATS and Redis transports are on the roadmap in README.md"
            )
        }
    }

    pub(crate) async fn open(
        url: &str,
        queue: &str,
        lease: Duration,
        prefetch: u16,
        topology: &Topology,
    ) -> Result<Self> {
        if url.starts_with("sqlite:") {
            let mut o = SqliteQueueOptions::default();
            o.lease = lease;
            Ok(Bus::Sqlite(SqliteQueue::open_with(url, queue, o).await?))
        } else if url.starts_with("postgres") {
            let mut o = PgQueueOptions::default();
            o.lease = lease;
            Ok(Bus::Pg(PgQueue::open_with(url, queue, o).await?))
        } else {
            let o = topology.options(queue)?.prefetch(prefetch);
            Ok(Bus::Amqp(AmqpSource::connect(url, o).await?))
        }
    }

    pub(crate) fn source(&self) -> Arc<dyn Source> {
        match self {
            Bus::Sqlite(q) => Arc::new(q.clone()),
            Bus::Amqp(q) => Arc::new(q.clone()),
            Bus::Pg(q) => Arc::new(q.clone()),
        }
    }

    /// Publishes `first`, and `again`: the same orders published a second time, as a
    /// publisher does when it never saw the confirm of the first. On RabbitMQ the first
    /// copy of each goes out with its confirm withheld, then the batch is published again
    /// with confirms: a real duplicate on the broker.
    pub(crate) async fn publish(&self, first: &[Message], again: &[Message]) -> Result<()> {
        match self {
            Bus::Sqlite(q) => publish_twice(q, first, again).await?,
            Bus::Pg(q) => publish_twice(q, first, again).await?,
            Bus::Amqp(q) => {
                for m in again {
                    q.publish_without_confirm(m).await?;
                }
                q.publish_batch(first).await?;
            }
        }
        Ok(())
    }

    /// Messages not yet acked or dead-lettered, from the transport itself.
    pub(crate) async fn pending(&self) -> Result<u64> {
        match self {
            Bus::Sqlite(q) => Ok(q.stats().await?.pending),
            Bus::Amqp(q) => q.pending().await,
            Bus::Pg(q) => Ok(q.stats().await?.pending),
        }
    }

    /// Deliveries the transport made: the SQL queue's own counter table, or the frames
    /// RabbitMQ sent (counted where they arrive).
    pub(crate) async fn deliveries(&self) -> Result<u64> {
        match self {
            Bus::Sqlite(q) => Ok(q.stats().await?.deliveries),
            Bus::Amqp(q) => Ok(q.delivery_counts().0),
            Bus::Pg(q) => Ok(q.stats().await?.deliveries),
        }
    }

    /// Distinct messages in the dead-letter queue.
    pub(crate) async fn dead_lettered(&self) -> Result<u64> {
        let letters: Vec<Message> = match self {
            Bus::Sqlite(q) => q
                .dead_letters()
                .await?
                .into_iter()
                .map(|d| d.message)
                .collect(),
            Bus::Amqp(q) => q.drain_dead_letters().await?,
            Bus::Pg(q) => q
                .dead_letters()
                .await?
                .into_iter()
                .map(|d| d.message)
                .collect(),
        };
        Ok(distinct(letters))
    }

    /// A consumer crash as the transport sees it: on RabbitMQ the channel closes with its
    /// deliveries unacked; the SQL queues need nothing (the leases run out).
    pub(crate) async fn crash(&self) {
        if let Bus::Amqp(q) = self {
            q.abandon().await;
        }
    }

    /// A lost ack as the transport sees it: on RabbitMQ the broker requeues the delivery when
    /// the channel goes, shortly after.
    pub(crate) fn lose_ack(&self) {
        if let Bus::Amqp(q) = self {
            let q = q.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                q.abandon().await;
            });
        }
    }

    /// Removes what the run declared on a shared broker.
    pub(crate) async fn cleanup(&self) -> Result<()> {
        match self {
            Bus::Sqlite(_) => Ok(()),
            Bus::Amqp(q) => q.delete_topology().await,
            Bus::Pg(q) => q.delete().await,
        }
    }
}

/// The publishing and counting side of a transport, which never consumes: the lab's
/// publisher process and its checker.
#[derive(Debug, Clone)]
pub(crate) enum Sink {
    Sqlite(SqliteQueue),
    Amqp(Arc<AmqpPublisher>),
    Pg(PgQueue),
}

impl Sink {
    pub(crate) async fn open(url: &str, queue: &str, topology: &Topology) -> Result<Self> {
        Bus::scheme(url).map_err(|e| justonce::Error::config(e.to_string()))?;
        if url.starts_with("sqlite:") {
            Ok(Sink::Sqlite(SqliteQueue::open(url, queue).await?))
        } else if url.starts_with("postgres") {
            Ok(Sink::Pg(PgQueue::open(url, queue).await?))
        } else {
            Ok(Sink::Amqp(Arc::new(
                AmqpPublisher::connect(url, topology.options(queue)?).await?,
            )))
        }
    }

    /// As [`Bus::publish`].
    pub(crate) async fn publish(&self, first: &[Message], again: &[Message]) -> Result<()> {
        match self {
            Sink::Sqlite(q) => publish_twice(q, first, again).await,
            Sink::Pg(q) => publish_twice(q, first, again).await,
            Sink::Amqp(p) => {
                for m in again {
                    p.publish_without_confirm(m).await?;
                }
                p.publish_batch(first).await
            }
        }
    }

    /// Messages waiting on the transport: on RabbitMQ those ready in the work and retry
    /// queues (not the ones unacked at consumers).
    pub(crate) async fn backlog(&self) -> Result<u64> {
        match self {
            Sink::Sqlite(q) => Ok(q.stats().await?.pending),
            Sink::Pg(q) => Ok(q.stats().await?.pending),
            Sink::Amqp(p) => p.backlog().await,
        }
    }

    /// The messages in the dead-letter queue (taken off it on RabbitMQ), with their reasons
    /// in their headers.
    pub(crate) async fn dead_letters(&self) -> Result<Vec<Message>> {
        Ok(match self {
            Sink::Sqlite(q) => q
                .dead_letters()
                .await?
                .into_iter()
                .map(|d| d.message)
                .collect(),
            Sink::Pg(q) => q
                .dead_letters()
                .await?
                .into_iter()
                .map(|d| d.message)
                .collect(),
            Sink::Amqp(p) => p.drain_dead_letters().await?,
        })
    }

    /// Distinct messages among `letters`.
    pub(crate) fn distinct(letters: &[Message]) -> u64 {
        distinct(letters.to_vec())
    }

    /// Removes what the run declared on a shared broker or database.
    pub(crate) async fn cleanup(&self) -> Result<()> {
        match self {
            Sink::Sqlite(_) => Ok(()),
            Sink::Pg(q) => q.delete().await,
            Sink::Amqp(p) => p.delete_topology().await,
        }
    }

    /// Closes the database connections (a server counts a session's statistics when it
    /// ends).
    pub(crate) async fn close(&self) {
        match self {
            Sink::Sqlite(q) => q.pool().close().await,
            Sink::Pg(q) => q.pool().close().await,
            Sink::Amqp(_) => {}
        }
    }
}

/// Publishes `first`, then `again` (the same ids once more) in a second transaction.
async fn publish_twice(q: &impl Publisher, first: &[Message], again: &[Message]) -> Result<()> {
    q.publish_batch(first).await?;
    if !again.is_empty() {
        q.publish_batch(again).await?;
    }
    Ok(())
}

/// Distinct ids among `letters`; letters without an id count one each.
fn distinct(letters: Vec<Message>) -> u64 {
    let mut ids = HashSet::new();
    let mut anonymous = 0;
    for m in letters {
        match m.id() {
            Some(id) => {
                ids.insert(id.clone());
            }
            None => anonymous += 1,
        }
    }
    ids.len() as u64 + anonymous
}
