//! The options of a [`KafkaSource`](crate::KafkaSource) and a
//! [`KafkaPublisher`](crate::KafkaPublisher).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use justonce_core::Positions;

/// Where a source's first read of a partition starts when no position is stored for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Start {
    /// The oldest record the topic keeps (the default): nothing published before the
    /// consumer's first start is skipped.
    Earliest,
    /// The next record published.
    Latest,
}

/// Options of a [`KafkaSource`](crate::KafkaSource) and a
/// [`KafkaPublisher`](crate::KafkaPublisher).
#[derive(Clone)]
#[non_exhaustive]
pub struct KafkaOptions {
    /// The brokers to bootstrap from (`host:port`, comma-separated).
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The consumer group, which is also the consumer's name in positions and dead
    /// letters (default `justonce`). Every worker of one consumer uses the same group:
    /// the group protocol shares the topic's partitions among them.
    pub group: String,
    /// Partitions of the topic when it is created (default 4): at most this many workers
    /// of a group read at once.
    pub partitions: i32,
    /// The dead-letter topic (default `{topic}-{group}-dead`), created with one partition.
    pub dead_topic: String,
    /// Where the positions live. `None` (the default): Kafka's committed offsets of the
    /// group, committed after each ack. With a store's positions
    /// ([`KafkaOptions::positions_in`]) the source seeks to them on assignment, and the
    /// runtime moves them in the batch's transaction
    /// ([`KafkaSource::acks_in`](crate::KafkaSource::acks_in)).
    pub positions: Option<Arc<dyn Positions>>,
    /// Where a partition with no position starts (default [`Start::Earliest`]).
    pub start: Start,
    /// The partitions this worker reads, assigned by hand (default `None`: the group
    /// protocol shares them among the group's members). With a list the worker joins no
    /// group: nothing rebalances, and a worker that stops leaves its partitions unread
    /// until it (or one started with the same list) comes back, at the stored positions.
    /// For one worker per partition set (a StatefulSet's ordinal), and for brokers whose
    /// group protocol cannot be trusted with dead members (tansu 0.6, docs/guide/kafka.md).
    pub assignment: Option<Vec<i32>>,
    /// The group's session timeout: how long a worker that stopped answering (killed,
    /// paused, cut off) keeps its partitions before the group gives them to another
    /// (default 10 s). This is the source's lease.
    pub session_timeout: Duration,
    /// The largest record published, payload and headers (default 1 MiB, as Kafka's
    /// `message.max.bytes`); a larger one is refused before it is sent.
    pub max_message_bytes: usize,
    /// Records fetched and not yet received that a source holds (default 1,000).
    pub prefetch: usize,
    /// Publish the message id as the record's key too (default `false`: no key, and
    /// librdkafka's sticky partitioner). With a key, every record of one id lands in one
    /// partition, in order.
    pub key_by_id: bool,
    /// Create the topic and the dead-letter topic if missing (default `true`). With
    /// `false` (topics owned by infrastructure, and the tools) both must exist.
    pub create: bool,
    /// How long a request to the brokers may take, a publish's delivery report included
    /// (default 30 s).
    pub request_timeout: Duration,
    /// librdkafka settings passed as they are (`security.protocol`, `client.id`, …),
    /// after justonce's own; the settings justonce's guarantees rest on are refused.
    /// librdkafka prints its own log lines on stderr; justonce lets through only critical
    /// ones (what the others say comes back as errors) unless `log_level` (0 to 7) is set
    /// here, with `debug` for its debug contexts.
    pub client: Vec<(String, String)>,
}

impl fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("partitions", &self.partitions)
            .field("dead_topic", &self.dead_topic)
            .field("positions", &self.positions.as_ref().map(|_| "store"))
            .field("start", &self.start)
            .field("assignment", &self.assignment)
            .field("session_timeout", &self.session_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("create", &self.create)
            .finish_non_exhaustive()
    }
}

/// librdkafka settings a user may not override: what justonce's guarantees rest on.
/// Partitions of a topic justonce makes, unless [`KafkaOptions::partitions`] says otherwise.
pub const DEFAULT_PARTITIONS: i32 = 4;

pub(crate) const GUARDED: &[&str] = &[
    "enable.idempotence",
    "acks",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "group.id",
    "isolation.level",
];

impl KafkaOptions {
    /// Options for `topic` on the brokers `brokers` (`host:port`, comma-separated; a
    /// `kafka://` prefix is taken off).
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        let topic = topic.into();
        let group = "justonce".to_owned();
        KafkaOptions {
            brokers: crate::brokers_of(&brokers.into()),
            dead_topic: format!("{topic}-{group}-dead"),
            topic,
            group,
            partitions: DEFAULT_PARTITIONS,
            positions: None,
            start: Start::Earliest,
            assignment: None,
            session_timeout: Duration::from_secs(10),
            max_message_bytes: 1 << 20,
            prefetch: 1000,
            key_by_id: false,
            create: true,
            request_timeout: Duration::from_secs(30),
            client: Vec::new(),
        }
    }

    /// Sets [`KafkaOptions::group`], and the dead-letter topic's name with it unless it
    /// was set.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        let group = group.into();
        if self.dead_topic == format!("{}-{}-dead", self.topic, self.group) {
            self.dead_topic = format!("{}-{group}-dead", self.topic);
        }
        self.group = group;
        self
    }

    /// Sets [`KafkaOptions::dead_topic`].
    pub fn dead_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_topic = topic.into();
        self
    }

    /// Keeps the positions in a store ([`KafkaOptions::positions`]): a SQL store's
    /// `positions()` table.
    pub fn positions_in(mut self, positions: impl Positions + 'static) -> Self {
        self.positions = Some(Arc::new(positions));
        self
    }

    /// Sets [`KafkaOptions::partitions`].
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Sets [`KafkaOptions::start`].
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Sets [`KafkaOptions::assignment`].
    pub fn assign(mut self, partitions: impl IntoIterator<Item = i32>) -> Self {
        self.assignment = Some(partitions.into_iter().collect());
        self
    }

    /// Sets [`KafkaOptions::session_timeout`].
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets [`KafkaOptions::max_message_bytes`].
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Sets [`KafkaOptions::prefetch`].
    pub fn prefetch(mut self, records: usize) -> Self {
        self.prefetch = records.max(1);
        self
    }

    /// Sets [`KafkaOptions::key_by_id`].
    pub fn key_by_id(mut self, yes: bool) -> Self {
        self.key_by_id = yes;
        self
    }

    /// Sets [`KafkaOptions::create`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`KafkaOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Adds a librdkafka setting ([`KafkaOptions::client`]).
    pub fn client(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.client.push((key.into(), value.into()));
        self
    }
}
