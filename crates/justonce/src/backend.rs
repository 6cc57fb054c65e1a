//! Backends chosen by URL, in one place.
//!
//! A URL names a transport (`sqlite:`, `postgres://`, `amqp://`, `redis://`) or a store
//! (`sqlite:`, `postgres://`, `mysql://`, `redis://`). [`TransportKind::from_url`] and [`StoreKind::from_url`] parse
//! it into a kind, with one error that names every supported scheme and the cargo feature
//! each needs; [`Transport::open_consumer`] and [`Transport::open_publisher`] open the transport as
//! trait objects. The demo, the worker, the lab and the bench open theirs here, so a new
//! backend is added once, here, and gets their rows.
//!
//! ```no_run
//! use justonce::backend::{Transport, TransportOptions};
//!
//! # async fn run() -> justonce::Result<()> {
//! let transport = Transport::open_consumer("sqlite:queue.db", "orders", &TransportOptions::default()).await?;
//! let pending = transport.inspect().pending().await?; // the same call on every transport
//! # let _ = pending;
//! # Ok(()) }
//! ```

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use justonce_core::{
    redact_url, Error, Inspect, InspectClaims, InspectOutbox, InspectStore, Publisher, Result,
    Source, TransactionalAck,
};

/// Every transport scheme, with its feature: for the error that lists them.
const TRANSPORTS: &str = "sqlite:PATH (the embedded default, feature `sqlite`), \
    postgres://USER@HOST:PORT/DB (a PostgreSQL queue, feature `postgres`), \
    amqp://USER:PASS@HOST:PORT/VHOST or amqps://… (RabbitMQ, feature `amqp`), \
    redis://[:PASS@]HOST:PORT[/DB] or rediss://… (a Redis stream, feature `redis`), \
    nats://HOST:PORT or tls://HOST:PORT (a NATS JetStream stream, feature `nats`) or \
    kafka://HOST:PORT[,HOST:PORT] (a Kafka topic, feature `kafka`)";

/// Every store scheme, with its feature.
const STORES: &str = "sqlite:PATH (the embedded default, feature `sqlite`), \
    postgres://USER@HOST:PORT/DB (feature `postgres`), \
    mysql://USER@HOST:PORT/DB (MariaDB or MySQL, feature `mysql`) or \
    redis://[:PASS@]HOST:PORT[/DB] (effects kept in Redis, feature `redis`)";

/// A transport, as its URL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// `sqlite:PATH`: the embedded SQLite queue.
    Sqlite,
    /// `postgres://` or `postgresql://`: a queue in PostgreSQL.
    Postgres,
    /// `amqp://` or `amqps://`: RabbitMQ.
    Amqp,
    /// `redis://` or `rediss://`: a Redis stream with a consumer group.
    Redis,
    /// `nats://`: a NATS JetStream stream with a durable pull consumer.
    Nats,
    /// `kafka://`: a Kafka topic read by a consumer group.
    Kafka,
}

/// A store (business data and dedup records), as its URL names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreKind {
    /// `sqlite:PATH`.
    Sqlite,
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://`: MariaDB or MySQL.
    MySql,
    /// `redis://` or `rediss://`: effects and dedup records kept in Redis.
    Redis,
}

fn scheme_of(url: &str) -> &str {
    url.split(':').next().unwrap_or_default()
}

impl TransportKind {
    /// The transport `url` names, built into this binary; an error naming every supported
    /// scheme otherwise.
    ///
    /// ```
    /// use justonce::backend::TransportKind;
    ///
    /// assert_eq!(TransportKind::from_url("sqlite:queue.db").unwrap(), TransportKind::Sqlite);
    /// let e = TransportKind::from_url("sqs://eu-west-1/orders").unwrap_err();
    /// assert!(e.to_string().contains("amqp://"), "{e}");
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let kind = match scheme_of(url) {
            "sqlite" => TransportKind::Sqlite,
            "postgres" | "postgresql" => TransportKind::Postgres,
            "amqp" | "amqps" => TransportKind::Amqp,
            "redis" | "rediss" => TransportKind::Redis,
            "nats" | "tls" => TransportKind::Nats,
            "kafka" => TransportKind::Kafka,
            "mysql" | "mariadb" => {
                return Err(Error::config(format!(
                    "`{}` names a store, not a transport: MariaDB holds business data and dedup \
                     records (--store); use {TRANSPORTS}",
                    redact_url(url)
                )))
            }
            other => {
                return Err(Error::config(format!(
                    "there is no {other} transport: use {TRANSPORTS}"
                )))
            }
        };
        if !kind.built() {
            return Err(Error::config(format!(
                "the {} transport needs justonce's `{}` feature",
                kind.as_str(),
                kind.feature()
            )));
        }
        Ok(kind)
    }

    /// The kind's name in reports: `sqlite`, `postgres`, `amqp`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Sqlite => "sqlite",
            TransportKind::Postgres => "postgres",
            TransportKind::Amqp => "amqp",
            TransportKind::Redis => "redis",
            TransportKind::Nats => "nats",
            TransportKind::Kafka => "kafka",
        }
    }

    /// Whether the transport drops a second publish of a message id it stored recently
    /// (NATS: the same `Nats-Msg-Id` inside the stream's duplicate window), so a
    /// publisher's retry never reaches a consumer.
    pub fn drops_republished_ids(self) -> bool {
        matches!(self, TransportKind::Nats)
    }

    /// The cargo feature of `justonce` that builds it.
    pub fn feature(self) -> &'static str {
        match self {
            TransportKind::Sqlite => "sqlite",
            TransportKind::Postgres => "postgres",
            TransportKind::Amqp => "amqp",
            TransportKind::Redis => "redis",
            TransportKind::Nats => "nats",
            TransportKind::Kafka => "kafka",
        }
    }

    fn built(self) -> bool {
        match self {
            TransportKind::Sqlite => cfg!(feature = "sqlite"),
            TransportKind::Postgres => cfg!(feature = "postgres"),
            TransportKind::Amqp => cfg!(feature = "amqp"),
            TransportKind::Redis => cfg!(feature = "redis"),
            TransportKind::Nats => cfg!(feature = "nats"),
            TransportKind::Kafka => cfg!(feature = "kafka"),
        }
    }
}

impl StoreKind {
    /// The store `url` names, built into this binary; an error naming every supported
    /// scheme otherwise.
    ///
    /// ```
    /// use justonce::backend::StoreKind;
    ///
    /// assert_eq!(StoreKind::from_url("sqlite:app.db").unwrap(), StoreKind::Sqlite);
    /// assert!(StoreKind::from_url("amqp://localhost").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let kind = match scheme_of(url) {
            "sqlite" => StoreKind::Sqlite,
            "postgres" | "postgresql" => StoreKind::Postgres,
            "mysql" | "mariadb" => StoreKind::MySql,
            "redis" | "rediss" => StoreKind::Redis,
            other => {
                return Err(Error::config(format!(
                    "the {other} store is not supported: use {STORES}"
                )))
            }
        };
        if !kind.built() {
            return Err(Error::config(format!(
                "the {} store needs justonce's `{}` feature",
                kind.as_str(),
                kind.feature()
            )));
        }
        Ok(kind)
    }

    /// The kind's name in reports: `sqlite`, `postgres`, `mysql`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
            StoreKind::MySql => "mysql",
            StoreKind::Redis => "redis",
        }
    }

    /// The cargo feature of `justonce` that builds it.
    pub fn feature(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
            StoreKind::MySql => "mysql",
            StoreKind::Redis => "redis",
        }
    }

    fn built(self) -> bool {
        match self {
            StoreKind::Sqlite => cfg!(feature = "sqlite"),
            StoreKind::Postgres => cfg!(feature = "postgres"),
            StoreKind::MySql => cfg!(feature = "mysql"),
            StoreKind::Redis => cfg!(feature = "redis"),
        }
    }
}

/// How a transport is opened. Plain data with chained setters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TransportOptions {
    /// The lease: how long a delivery waits for its settlement before it is delivered
    /// again (the SQL queues' lease, a Redis stream's idle time before a claim, NATS's
    /// `ack_wait`, and on Kafka the group's session timeout, at least 6 s: how long a
    /// member that is gone holds its partitions).
    pub lease: Duration,
    /// RabbitMQ's prefetch, unless `amqp` says otherwise.
    pub prefetch: u16,
    /// Make the queue if the transport does not hold it (the default). `false` fails,
    /// naming the queues there are, and on RabbitMQ declares nothing (unless `amqp` says
    /// otherwise): for tools that must not make a queue by mistake.
    pub create: bool,
    /// RabbitMQ's topology; `None`: `AmqpOptions::new(queue)`.
    #[cfg(feature = "amqp")]
    pub amqp: Option<justonce_amqp::AmqpOptions>,
    /// This consumer's name in a Redis stream's group; `None`: the host name and the
    /// process id. Give a worker a name that survives its restarts (it then takes its own
    /// pending entries back at once), and never two live workers the same one.
    pub consumer_name: Option<String>,
    /// The store (a SQL store's URL) whose positions table keeps a Kafka consumer's
    /// positions, moved in that store's transactions ([`Transport::transactional_ack`]);
    /// `None`: Kafka's committed offsets. Ignored by the other transports.
    pub positions: Option<String>,
    /// The Kafka partitions this consumer reads, assigned by hand instead of by the group
    /// protocol (`KafkaOptions::assignment`); `None`: the group shares them. Ignored by
    /// the other transports.
    pub kafka_partitions: Option<Vec<i32>>,
    /// Publish to Kafka with the message id as the record's key (`KafkaOptions::key_by_id`):
    /// the records spread over the partitions by their ids, and every copy of one id lands
    /// in one partition, in order. `false` (the default): no key, and librdkafka's sticky
    /// partitioner, which sends a burst of records to one partition. Ignored by the other
    /// transports.
    pub kafka_key_by_id: bool,
}

impl Default for TransportOptions {
    /// A lease of 30 s, a prefetch of 200.
    fn default() -> Self {
        TransportOptions {
            lease: Duration::from_secs(30),
            prefetch: 200,
            create: true,
            #[cfg(feature = "amqp")]
            amqp: None,
            consumer_name: None,
            positions: None,
            kafka_partitions: None,
            kafka_key_by_id: false,
        }
    }
}

impl TransportOptions {
    /// Sets [`TransportOptions::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`TransportOptions::prefetch`].
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Sets [`TransportOptions::create`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`TransportOptions::kafka_key_by_id`].
    pub fn kafka_key_by_id(mut self, on: bool) -> Self {
        self.kafka_key_by_id = on;
        self
    }

    /// Sets [`TransportOptions::consumer_name`].
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer_name = Some(name.into());
        self
    }

    /// Sets RabbitMQ's topology ([`TransportOptions::amqp`]); its queue must be the one
    /// opened.
    #[cfg(feature = "amqp")]
    pub fn amqp(mut self, amqp: justonce_amqp::AmqpOptions) -> Self {
        self.amqp = Some(amqp);
        self
    }
}

/// The dedup records of the store at `url`, in its table `dedup_table`, for tools
/// (`justonce dedup`). A SQLite file that does not exist is an error, not a new file.
#[allow(unused_variables)]
pub async fn inspect_store(url: &str, dedup_table: &str) -> Result<Arc<dyn InspectStore>> {
    match StoreKind::from_url(url)? {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => {
            sqlite_file_exists(url)?;
            let o = justonce_sql::SqliteStoreOptions::default()
                .dedup_table(dedup_table)
                .create(false);
            Ok(Arc::new(
                justonce_sql::SqliteStore::open_with(url, o).await?,
            ))
        }
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => {
            let o = justonce_sql::PgStoreOptions::default()
                .dedup_table(dedup_table)
                .create(false);
            Ok(Arc::new(justonce_sql::PgStore::open_with(url, o).await?))
        }
        #[cfg(feature = "mysql")]
        StoreKind::MySql => {
            let o = justonce_sql::MySqlStoreOptions::default()
                .dedup_table(dedup_table)
                .create(false);
            Ok(Arc::new(justonce_sql::MySqlStore::open_with(url, o).await?))
        }
        // A Redis store has no table: `dedup_table` names its key prefix, `NAME:` (the
        // default prefix `jo:` is `jo`).
        #[cfg(feature = "redis")]
        StoreKind::Redis => {
            let o = justonce_redis::RedisStoreOptions::default().prefix(format!("{dedup_table}:"));
            Ok(Arc::new(
                justonce_redis::RedisStore::connect_with(url, o).await?,
            ))
        }
        #[allow(unreachable_patterns)]
        kind => Err(Error::config(format!(
            "the {} store needs justonce's `{}` feature",
            kind.as_str(),
            kind.feature()
        ))),
    }
}

/// The outbox of the store at `url`, in its table `table`, for tools (`justonce outbox`):
/// nothing is created, and a SQLite file that does not exist is an error.
#[allow(unused_variables)]
pub async fn inspect_outbox(url: &str, table: &str) -> Result<Arc<dyn InspectOutbox>> {
    #[cfg(feature = "sqlite")]
    let o = justonce_sql::OutboxOptions::default()
        .table(table)
        .create(false);
    match StoreKind::from_url(url)? {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => {
            sqlite_file_exists(url)?;
            let s = justonce_sql::SqliteStoreOptions::default().create(false);
            let store = justonce_sql::SqliteStore::open_with(url, s).await?;
            Ok(Arc::new(store.outbox_with(o).await?))
        }
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => {
            let s = justonce_sql::PgStoreOptions::default().create(false);
            let store = justonce_sql::PgStore::open_with(url, s).await?;
            Ok(Arc::new(store.outbox_with(o).await?))
        }
        #[cfg(feature = "mysql")]
        StoreKind::MySql => {
            let s = justonce_sql::MySqlStoreOptions::default().create(false);
            let store = justonce_sql::MySqlStore::open_with(url, s).await?;
            Ok(Arc::new(store.outbox_with(o).await?))
        }
        StoreKind::Redis if cfg!(feature = "redis") => Err(Error::config(
            "a Redis store has no outbox: an outbox is written in the business database's \
             transaction (SQLite, PostgreSQL, MariaDB); its relay can publish to a Redis stream",
        )),
        #[allow(unreachable_patterns)]
        kind => Err(Error::config(format!(
            "the {} store needs justonce's `{}` feature",
            kind.as_str(),
            kind.feature()
        ))),
    }
}

/// The claims of the claim store at `url` (its table `table`; on SQLite a file of its own,
/// table `jo_claims`), for tools.
#[allow(unused_variables)]
pub async fn inspect_claims(url: &str, table: &str) -> Result<Arc<dyn InspectClaims>> {
    match StoreKind::from_url(url)? {
        #[cfg(feature = "sqlite")]
        StoreKind::Sqlite => {
            sqlite_file_exists(url)?;
            Ok(Arc::new(justonce_sql::SqliteClaimStore::open(url).await?))
        }
        #[cfg(feature = "postgres")]
        StoreKind::Postgres => Ok(Arc::new(
            justonce_sql::PgClaimStore::open(url, table).await?,
        )),
        #[cfg(feature = "mysql")]
        StoreKind::MySql => Ok(Arc::new(
            justonce_sql::MySqlClaimStore::open(url, table).await?,
        )),
        StoreKind::Redis if cfg!(feature = "redis") => Err(Error::config(
            "tools read SQL claim stores; a Redis claim is a hash at \
             RedisClaimStore::key_of (`redis-cli HGETALL` shows it), and it frees itself when \
             its lease runs out",
        )),
        #[allow(unreachable_patterns)]
        kind => Err(Error::config(format!(
            "the {} store needs justonce's `{}` feature",
            kind.as_str(),
            kind.feature()
        ))),
    }
}

/// A tool's SQLite URL must name a file that exists: opening would create it.
#[cfg(feature = "sqlite")]
fn sqlite_file_exists(url: &str) -> Result<()> {
    let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
    let path = path.split('?').next().unwrap_or_default();
    if path.is_empty() || path == ":memory:" || std::path::Path::new(path).exists() {
        return Ok(());
    }
    Err(Error::config(format!(
        "{} does not exist: give the file the consumer writes to",
        redact_url(url)
    )))
}

/// An open transport, as trait objects: where deliveries come from (when opened to
/// consume), where messages go, and what tools count.
#[derive(Clone)]
pub struct Transport {
    kind: TransportKind,
    source: Option<Arc<dyn Source>>,
    publisher: Arc<dyn Publisher>,
    inspect: Arc<dyn Inspect>,
    /// An `Arc<dyn TransactionalAck<Tx>>` for the one `Tx` the queue can ack in.
    tx_ack: Option<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("kind", &self.kind)
            .field("consumes", &self.source.is_some())
            .finish()
    }
}

impl Transport {
    /// Opens the queue `queue` of the transport at `url` to consume it (and publish to it).
    pub async fn open_consumer(url: &str, queue: &str, opts: &TransportOptions) -> Result<Self> {
        Self::open(url, queue, opts, true).await
    }

    /// Opens the queue `queue` of the transport at `url` to publish to it and count it,
    /// never consuming (on RabbitMQ: no consumer on the queue).
    pub async fn open_publisher(url: &str, queue: &str, opts: &TransportOptions) -> Result<Self> {
        Self::open(url, queue, opts, false).await
    }

    #[allow(unused_variables)]
    async fn open(url: &str, queue: &str, opts: &TransportOptions, consume: bool) -> Result<Self> {
        let kind = TransportKind::from_url(url)?;
        match kind {
            #[cfg(feature = "sqlite")]
            TransportKind::Sqlite => {
                let o = justonce_sql::SqliteQueueOptions::default()
                    .lease(opts.lease)
                    .create(opts.create);
                let q = Arc::new(justonce_sql::SqliteQueue::open_with(url, queue, o).await?);
                Ok(Self::one(kind, q, true, None))
            }
            #[cfg(feature = "postgres")]
            TransportKind::Postgres => {
                let o = justonce_sql::PgQueueOptions::default()
                    .lease(opts.lease)
                    .create(opts.create);
                let q = Arc::new(justonce_sql::PgQueue::open_with(url, queue, o).await?);
                let ack: Arc<dyn TransactionalAck<justonce_sql::PgTx>> = q.clone();
                Ok(Self::one(kind, q, true, Some(Arc::new(ack))))
            }
            #[cfg(feature = "amqp")]
            TransportKind::Amqp => {
                let o = match &opts.amqp {
                    Some(o) if o.queue == queue => o.clone(),
                    Some(o) => {
                        return Err(Error::config(format!(
                            "the RabbitMQ options are for queue {}, not {queue}",
                            o.queue
                        )))
                    }
                    None if opts.create => {
                        justonce_amqp::AmqpOptions::new(queue).prefetch(opts.prefetch)
                    }
                    None => justonce_amqp::AmqpOptions::new(queue)
                        .prefetch(opts.prefetch)
                        .declare(justonce_amqp::Declare::None),
                };
                if consume {
                    let s = Arc::new(justonce_amqp::AmqpSource::connect(url, o).await?);
                    Ok(Transport {
                        kind,
                        source: Some(s.clone()),
                        publisher: s.clone(),
                        inspect: s,
                        tx_ack: None,
                    })
                } else {
                    let p = Arc::new(justonce_amqp::AmqpPublisher::connect(url, o).await?);
                    Ok(Transport {
                        kind,
                        source: None,
                        publisher: p.clone(),
                        inspect: p,
                        tx_ack: None,
                    })
                }
            }
            #[cfg(feature = "redis")]
            TransportKind::Redis => {
                let mut o = justonce_redis::RedisStreamOptions::new(queue)
                    .lease(opts.lease)
                    .create(opts.create);
                if let Some(name) = &opts.consumer_name {
                    o = o.consumer(name.clone());
                }
                let q = Arc::new(justonce_redis::RedisStream::connect(url, o).await?);
                Ok(Self::one(kind, q, consume, None))
            }
            #[cfg(feature = "nats")]
            TransportKind::Nats => {
                // Every worker of a consumer shares one durable pull consumer.
                let o = justonce_nats::NatsOptions::new(queue)
                    .lease(opts.lease)
                    .create(opts.create);
                let q = Arc::new(justonce_nats::NatsStream::connect(url, o).await?);
                Ok(Self::one(kind, q, consume, None))
            }
            #[cfg(feature = "kafka")]
            TransportKind::Kafka => kafka::open(kind, url, queue, opts, consume).await,
            #[allow(unreachable_patterns)]
            _ => Err(Error::config(format!(
                "the {} transport needs justonce's `{}` feature",
                kind.as_str(),
                kind.feature()
            ))),
        }
    }

    /// One object publishes and is counted, and consumes when `consume` (a SQL queue, a
    /// Redis or NATS stream).
    #[allow(dead_code)]
    fn one<Q>(
        kind: TransportKind,
        q: Arc<Q>,
        consume: bool,
        tx_ack: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Self
    where
        Q: Source + Publisher + Inspect + 'static,
    {
        Transport {
            kind,
            source: consume.then(|| q.clone() as Arc<dyn Source>),
            publisher: q.clone(),
            inspect: q,
            tx_ack,
        }
    }

    /// What it is.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// Where deliveries come from; an error for a transport opened with
    /// [`Transport::open_publisher`].
    pub fn source(&self) -> Result<Arc<dyn Source>> {
        self.source.clone().ok_or_else(|| {
            Error::config(
                "this transport was opened to publish (Transport::open_publisher), not to consume",
            )
        })
    }

    /// Where messages go.
    pub fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    /// What tools count.
    pub fn inspect(&self) -> Arc<dyn Inspect> {
        self.inspect.clone()
    }

    /// The ack inside a store's transaction of type `Tx`, when the queue lives in that
    /// store's database (a PostgreSQL queue, with `Tx = PgTx`): see
    /// `Consumer::with_transactional_ack`. `None` for every other pairing.
    pub fn transactional_ack<Tx: 'static>(&self) -> Option<Arc<dyn TransactionalAck<Tx>>> {
        self.tx_ack
            .as_ref()?
            .downcast_ref::<Arc<dyn TransactionalAck<Tx>>>()
            .cloned()
    }
}

/// A service the tests and `justonce lab --matrix` expect on this machine: its URL from an
/// environment variable, or the loopback default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalService {
    /// RabbitMQ: `JUSTONCE_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`.
    RabbitMq,
    /// PostgreSQL: `JUSTONCE_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`.
    Postgres,
    /// MariaDB: `JUSTONCE_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`.
    MariaDb,
    /// Redis: `JUSTONCE_REDIS_URL`, default `redis://127.0.0.1:6379`.
    Redis,
    /// NATS with JetStream: `JUSTONCE_NATS_URL`, default `nats://127.0.0.1:4222`.
    Nats,
    /// Kafka (tansu here): `JUSTONCE_KAFKA_URL`, default `kafka://127.0.0.1:9092`.
    Kafka,
}

impl LocalService {
    /// The service's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            LocalService::RabbitMq => "RabbitMQ",
            LocalService::Postgres => "PostgreSQL",
            LocalService::MariaDb => "MariaDB",
            LocalService::Redis => "Redis",
            LocalService::Nats => "NATS",
            LocalService::Kafka => "Kafka",
        }
    }

    /// The environment variable that overrides the URL.
    pub fn env_var(self) -> &'static str {
        match self {
            LocalService::RabbitMq => "JUSTONCE_AMQP_URL",
            LocalService::Postgres => "JUSTONCE_POSTGRES_URL",
            LocalService::MariaDb => "JUSTONCE_MYSQL_URL",
            LocalService::Redis => "JUSTONCE_REDIS_URL",
            LocalService::Nats => "JUSTONCE_NATS_URL",
            LocalService::Kafka => "JUSTONCE_KAFKA_URL",
        }
    }

    /// The loopback address the default URL points at.
    pub fn addr(self) -> &'static str {
        match self {
            LocalService::RabbitMq => "127.0.0.1:5672",
            LocalService::Postgres => "127.0.0.1:5432",
            LocalService::MariaDb => "127.0.0.1:3306",
            LocalService::Redis => "127.0.0.1:6379",
            LocalService::Nats => "127.0.0.1:4222",
            LocalService::Kafka => "127.0.0.1:9092",
        }
    }

    /// The URL: the environment variable, or the loopback default.
    pub fn url(self) -> String {
        std::env::var(self.env_var()).unwrap_or_else(|_| {
            match self {
                LocalService::RabbitMq => "amqp://guest:guest@127.0.0.1:5672/%2f",
                LocalService::Postgres => "postgres://postgres@127.0.0.1:5432/test",
                LocalService::MariaDb => "mysql://root@127.0.0.1:3306/test",
                LocalService::Redis => "redis://127.0.0.1:6379",
                LocalService::Nats => "nats://127.0.0.1:4222",
                LocalService::Kafka => "kafka://127.0.0.1:9092",
            }
            .to_owned()
        })
    }
}

/// Kafka: a group member to consume (its positions in Kafka, or in a SQL store's table
/// and moved in that store's transactions), a publisher in no group otherwise.
#[cfg(feature = "kafka")]
mod kafka {
    use super::*;
    use justonce_kafka::{KafkaOptions, KafkaPublisher, KafkaSource};

    pub(super) async fn open(
        kind: TransportKind,
        url: &str,
        queue: &str,
        opts: &TransportOptions,
        consume: bool,
    ) -> Result<Transport> {
        // A member that is gone holds its partitions for the session timeout: Kafka's
        // lease, no shorter than the 6 s brokers accept by default
        // (`group.min.session.timeout.ms`).
        let mut o = KafkaOptions::from_url(url, queue)?
            .create(opts.create)
            .session_timeout(opts.lease.max(Duration::from_secs(6)))
            .key_by_id(opts.kafka_key_by_id);
        if let Some(parts) = &opts.kafka_partitions {
            o = o.assign(parts.iter().copied());
        }
        let Some(store) = opts.positions.as_deref() else {
            return plain(kind, o, consume).await;
        };
        match StoreKind::from_url(store)? {
            #[cfg(feature = "sqlite")]
            StoreKind::Sqlite => {
                let p = justonce_sql::SqliteStore::open(store)
                    .await?
                    .positions()
                    .await?;
                with_positions::<justonce_sql::SqliteTx, _>(kind, o, p, consume).await
            }
            #[cfg(feature = "postgres")]
            StoreKind::Postgres => {
                let p = justonce_sql::PgStore::open(store)
                    .await?
                    .positions()
                    .await?;
                with_positions::<justonce_sql::PgTx, _>(kind, o, p, consume).await
            }
            #[cfg(feature = "mysql")]
            StoreKind::MySql => {
                let p = justonce_sql::MySqlStore::open(store)
                    .await?
                    .positions()
                    .await?;
                with_positions::<justonce_sql::MySqlTx, _>(kind, o, p, consume).await
            }
            #[allow(unreachable_patterns)]
            other => Err(Error::config(format!(
                "a Kafka consumer keeps its positions in a SQL store (sqlite:, postgres://, \
                 mysql://), not in a {} store",
                other.as_str()
            ))),
        }
    }

    async fn plain(kind: TransportKind, o: KafkaOptions, consume: bool) -> Result<Transport> {
        if consume {
            let s = Arc::new(KafkaSource::connect(o).await?);
            Ok(Transport::one(kind, s, true, None))
        } else {
            let p = Arc::new(KafkaPublisher::connect(o).await?);
            Ok(Transport {
                kind,
                source: None,
                publisher: p.clone(),
                inspect: p,
                tx_ack: None,
            })
        }
    }

    #[allow(dead_code)]
    async fn with_positions<Tx, P>(
        kind: TransportKind,
        o: KafkaOptions,
        positions: P,
        consume: bool,
    ) -> Result<Transport>
    where
        Tx: Send + 'static,
        P: justonce_core::PositionsIn<Tx> + Clone + 'static,
    {
        let o = o.positions_in(positions.clone());
        if !consume {
            return plain(kind, o, false).await;
        }
        let s = KafkaSource::connect(o).await?;
        let ack: Arc<dyn TransactionalAck<Tx>> = Arc::new(s.acks_in(positions)?);
        Ok(Transport::one(kind, Arc::new(s), true, Some(Arc::new(ack))))
    }
}
