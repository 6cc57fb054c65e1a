//! The demo's transport, opened by the library (`justonce::backend`), with what the demo,
//! the worker and the lab do with it: publish (duplicates included), count through
//! `Inspect`, crash as a dead process would. Nothing here knows which transport it is.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use justonce::amqp::{AmqpOptions, Declare, ExchangeType, QueueType};
use justonce::backend::{Transport, TransportKind, TransportOptions};
use justonce::{DeadLetter, Message, Result, Source, TransactionalAck};

/// Where the RabbitMQ work queue gets its messages and what is declared: the flags the
/// demo, the worker, the publisher and the lab share (ignored on the SQL queues).
#[derive(Clone, clap::Args)]
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

/// An open transport.
#[derive(Debug, Clone)]
pub(crate) struct Bus {
    transport: Transport,
}

impl Bus {
    /// The transport a URL names, or an error naming what is supported.
    pub(crate) fn kind_of(url: &str) -> anyhow::Result<TransportKind> {
        Ok(TransportKind::from_url(url)?)
    }

    /// Opens `queue` to consume it (and publish to it).
    pub(crate) async fn open(
        url: &str,
        queue: &str,
        lease: Duration,
        prefetch: u16,
        topology: &Topology,
    ) -> Result<Self> {
        Self::open_with(
            url,
            queue,
            &Self::options(queue, lease, prefetch, topology)?,
        )
        .await
    }

    /// Opens `queue` to consume it with options of the caller's ([`Bus::options`] and more).
    pub(crate) async fn open_with(url: &str, queue: &str, opts: &TransportOptions) -> Result<Self> {
        Ok(Bus {
            transport: Transport::open_consumer(url, queue, opts).await?,
        })
    }

    /// [`Bus::open`] on Kafka with the consumer's positions in the store at `store`,
    /// moved in its transactions ([`Bus::transactional_ack`]).
    pub(crate) async fn open_with_positions(
        url: &str,
        queue: &str,
        lease: Duration,
        prefetch: u16,
        topology: &Topology,
        store: &str,
    ) -> Result<Self> {
        let mut opts = Self::options(queue, lease, prefetch, topology)?;
        opts.positions = Some(store.to_owned());
        Self::open_with(url, queue, &opts).await
    }

    /// Opens `queue` to publish to it and count it, never consuming: the lab's publisher
    /// process and its checker.
    pub(crate) async fn open_publisher(
        url: &str,
        queue: &str,
        topology: &Topology,
    ) -> Result<Self> {
        Self::open_publisher_with_positions(url, queue, topology, None).await
    }

    /// [`Bus::open_publisher`] that, given a store, counts a Kafka consumer's pending
    /// records from its positions there (where [`Bus::open_with_positions`] keeps them),
    /// not from the group's committed offsets, which are only a hint then.
    pub(crate) async fn open_publisher_with_positions(
        url: &str,
        queue: &str,
        topology: &Topology,
        store: Option<&str>,
    ) -> Result<Self> {
        let mut opts = Self::options(queue, Duration::from_secs(30), 200, topology)?;
        opts.positions = store.map(str::to_owned);
        Ok(Bus {
            transport: Transport::open_publisher(url, queue, &opts).await?,
        })
    }

    /// The options every open starts from. On Kafka the message id is the record's key:
    /// orders spread over every partition (librdkafka's sticky partitioner, with no key,
    /// sent a burst of orders to one or two partitions, and the lab's workers that read
    /// the others had nothing to be killed in), and a re-published order lands where its
    /// first copy did.
    pub(crate) fn options(
        queue: &str,
        lease: Duration,
        prefetch: u16,
        topology: &Topology,
    ) -> Result<TransportOptions> {
        Ok(TransportOptions::default()
            .lease(lease)
            .prefetch(prefetch)
            .kafka_key_by_id(true)
            .amqp(topology.options(queue)?.prefetch(prefetch)))
    }

    /// Where messages go.
    pub(crate) fn publisher(&self) -> Arc<dyn justonce::Publisher> {
        self.transport.publisher()
    }

    /// Where deliveries come from.
    pub(crate) fn source(&self) -> Result<Arc<dyn Source>> {
        self.transport.source()
    }

    /// What tools read of the transport: pending messages, dead letters.
    pub(crate) fn inspect(&self) -> Arc<dyn justonce::Inspect> {
        self.transport.inspect()
    }

    /// The ack in the store's transaction, when the queue is in the store's database.
    pub(crate) fn transactional_ack<Tx: 'static>(&self) -> Option<Arc<dyn TransactionalAck<Tx>>> {
        self.transport.transactional_ack()
    }

    /// Publishes `first`, then `again`: the same orders published a second time with the
    /// same ids, as a publisher does when it never saw the confirm of the first.
    pub(crate) async fn publish(&self, first: &[Message], again: &[Message]) -> Result<()> {
        let publisher = self.transport.publisher();
        publisher.publish_batch(first).await?;
        if !again.is_empty() {
            publisher.publish_batch(again).await?;
        }
        Ok(())
    }

    /// Messages not yet acked or dead-lettered, from the transport itself.
    pub(crate) async fn pending(&self) -> Result<u64> {
        self.transport.inspect().pending().await
    }

    /// Deliveries the transport made, as it counts them; `None` where it does not (Kafka).
    pub(crate) async fn deliveries(&self) -> Result<Option<u64>> {
        self.transport.inspect().deliveries().await
    }

    /// The dead letters, with their reasons, left where they are.
    pub(crate) async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        self.transport.inspect().dead_letters().await
    }

    /// Distinct messages in the dead-letter queue.
    pub(crate) async fn dead_lettered(&self) -> Result<u64> {
        Ok(distinct(&self.dead_letters().await?))
    }

    /// A consumer crash as the transport sees it: the source lets go of its deliveries
    /// (RabbitMQ: the channel closes with them unacked; the SQL queues: their leases run out).
    pub(crate) async fn crash(&self) {
        if let Ok(source) = self.source() {
            source.abandon().await;
        }
    }

    /// A lost ack as the transport sees it: the delivery stays unsettled until the source
    /// lets go of it, shortly after (on the SQL queues, until its lease runs out).
    pub(crate) fn lose_ack(&self) {
        if let Ok(source) = self.source() {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                source.abandon().await;
            });
        }
    }

    /// Removes what the run made on a shared broker or database.
    pub(crate) async fn cleanup(&self) -> Result<()> {
        self.transport.inspect().cleanup().await
    }
}

/// Distinct ids among `letters`; letters without an id count one each.
pub(crate) fn distinct(letters: &[DeadLetter]) -> u64 {
    let mut ids = HashSet::new();
    let mut anonymous = 0;
    for d in letters {
        match d.message.id() {
            Some(id) => {
                ids.insert(id.clone());
            }
            None => anonymous += 1,
        }
    }
    ids.len() as u64 + anonymous
}
