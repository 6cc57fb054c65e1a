//! The options of a [`KafkaSource`](crate::KafkaSource) and a
//! [`KafkaPublisher`](crate::KafkaPublisher).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use justonce_core::{Error, Positions, Result};

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
    /// TLS to the brokers (`None`, the default: plaintext). Needs the feature `tls`
    /// (librdkafka built with OpenSSL); without it a connect that asks for TLS fails.
    pub tls: Option<KafkaTls>,
    /// SASL authentication (`None`, the default: none).
    pub sasl: Option<KafkaSasl>,
    /// librdkafka settings passed as they are (`client.id`, `ssl.cipher.suites`, …),
    /// after justonce's own; the settings justonce's guarantees rest on are refused, and
    /// so are the ones [`KafkaOptions::tls`] and [`KafkaOptions::sasl`] set
    /// (`security.protocol`, `sasl.*` credentials, `ssl.*.location`) and any that turns
    /// certificate verification off.
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
            .field("tls", &self.tls)
            .field("sasl", &self.sasl)
            .finish_non_exhaustive()
    }
}

/// Partitions of a topic justonce makes, unless [`KafkaOptions::partitions`] says otherwise.
pub const DEFAULT_PARTITIONS: i32 = 4;

/// librdkafka settings a user may not override: what justonce's guarantees rest on.
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
            tls: None,
            sasl: None,
            client: Vec::new(),
        }
    }

    /// Options for `topic` from a URL:
    /// `kafka://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][?SETTINGS]`, the settings named as
    /// librdkafka names them:
    ///
    /// - `security.protocol`: `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`. When it
    ///   is not given, a user name in the URL means `sasl_ssl` (a password is never sent in
    ///   plaintext unless `sasl_plaintext` says so), an `ssl.*` setting means `ssl`, and
    ///   nothing means `plaintext`;
    /// - `sasl.mechanism`: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` (the default);
    /// - `ssl.ca.location` (the authority that signed the brokers' certificates; default:
    ///   the system's roots), `ssl.certificate.location` and `ssl.key.location` (a client
    ///   certificate), `ssl.key.password`;
    /// - any other librdkafka setting, passed as [`KafkaOptions::client`] is.
    ///
    /// The user name and password are percent-decoded. A URL that contradicts itself
    /// (`security.protocol=plaintext` with a CA file, a password with `ssl`) is refused,
    /// as is one that turns certificate verification off.
    ///
    /// ```
    /// use justonce_kafka::{KafkaOptions, SaslMechanism};
    /// let o = KafkaOptions::from_url(
    ///     "kafka://app:s3cret@broker-1:9093,broker-2:9093?sasl.mechanism=SCRAM-SHA-256&ssl.ca.location=/etc/kafka/ca.pem",
    ///     "orders",
    /// )?;
    /// assert_eq!(o.brokers, "broker-1:9093,broker-2:9093");
    /// assert_eq!(o.security_protocol(), "sasl_ssl");
    /// assert_eq!(o.sasl.as_ref().map(|s| s.mechanism), Some(SaslMechanism::ScramSha256));
    /// assert!(!format!("{o:?}").contains("s3cret"));
    /// # Ok::<(), justonce_core::Error>(())
    /// ```
    pub fn from_url(url: &str, topic: impl Into<String>) -> Result<Self> {
        let parsed = crate::url::parse(url)?;
        let mut o = KafkaOptions::new(parsed.brokers, topic);
        o.tls = parsed.tls;
        o.sasl = parsed.sasl;
        o.client = parsed.client;
        Ok(o)
    }

    /// librdkafka's `security.protocol` these options connect with.
    pub fn security_protocol(&self) -> &'static str {
        match (&self.tls, &self.sasl) {
            (None, None) => "plaintext",
            (Some(_), None) => "ssl",
            (None, Some(_)) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        }
    }

    /// Sets [`KafkaOptions::tls`].
    pub fn tls(mut self, tls: KafkaTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets [`KafkaOptions::sasl`].
    pub fn sasl(mut self, sasl: KafkaSasl) -> Self {
        self.sasl = Some(sasl);
        self
    }

    /// The librdkafka configuration every client of these options starts from: the
    /// brokers, TLS and SASL, then [`KafkaOptions::client`]. For a client of one's own
    /// beside justonce's (a benchmark's bare consumer, say). Its `Debug` prints the
    /// password: never log it.
    pub fn client_config(&self) -> Result<rdkafka::ClientConfig> {
        crate::client::base(self)
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

/// TLS to the brokers ([`KafkaOptions::tls`]): the brokers' certificates verified, chain
/// and host name, against the system's roots or the authority named here. librdkafka does
/// the TLS, with OpenSSL (the feature `tls`). Turning verification off is not offered.
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct KafkaTls {
    /// The authority (PEM) that signed the brokers' certificates (`ssl.ca.location`);
    /// `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (PEM, `ssl.certificate.location`), for brokers that ask for one.
    pub cert: Option<PathBuf>,
    /// The client certificate's key (PEM, `ssl.key.location`).
    pub key: Option<PathBuf>,
    key_password: Option<String>,
}

impl KafkaTls {
    /// TLS verified against the system's roots.
    pub fn new() -> Self {
        Self::default()
    }

    /// Verifies the brokers against the authority in the PEM file `ca`.
    pub fn ca(mut self, ca: impl Into<PathBuf>) -> Self {
        self.ca = Some(ca.into());
        self
    }

    /// Presents the client certificate `cert` with its key `key` (PEM files).
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.cert = Some(cert.into());
        self.key = Some(key.into());
        self
    }

    /// The password of an encrypted key (`ssl.key.password`). Never printed.
    pub fn key_password(mut self, password: impl Into<String>) -> Self {
        self.key_password = Some(password.into());
        self
    }

    pub(crate) fn settings(&self) -> Vec<(&'static str, String)> {
        let mut s = vec![
            ("enable.ssl.certificate.verification", "true".to_owned()),
            ("ssl.endpoint.identification.algorithm", "https".to_owned()),
        ];
        let path = |p: &PathBuf| p.display().to_string();
        if let Some(ca) = &self.ca {
            s.push(("ssl.ca.location", path(ca)));
        }
        if let Some(cert) = &self.cert {
            s.push(("ssl.certificate.location", path(cert)));
        }
        if let Some(key) = &self.key {
            s.push(("ssl.key.location", path(key)));
        }
        if let Some(pw) = &self.key_password {
            s.push(("ssl.key.password", pw.clone()));
        }
        s
    }
}

impl fmt::Debug for KafkaTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaTls")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("key_password", &self.key_password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A SASL mechanism librdkafka speaks without Kerberos.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaslMechanism {
    /// `PLAIN`: the password itself crosses the link; use it over TLS only.
    Plain,
    /// `SCRAM-SHA-256`: a challenge and response, the password never sent.
    ScramSha256,
    /// `SCRAM-SHA-512` (the default of a URL).
    ScramSha512,
}

impl SaslMechanism {
    /// The mechanism's name, as librdkafka and the brokers spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    /// The mechanism named `name` (any case).
    pub fn parse(name: &str) -> Result<Self> {
        match name.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            _ => Err(Error::config(format!(
                "`{name}` is not a SASL mechanism justonce speaks to Kafka: PLAIN, \
                 SCRAM-SHA-256 or SCRAM-SHA-512"
            ))),
        }
    }
}

/// SASL authentication ([`KafkaOptions::sasl`]). Its `Debug` never prints the password.
#[derive(Clone)]
pub struct KafkaSasl {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user name.
    pub username: String,
    password: String,
}

impl KafkaSasl {
    /// `username` with `password`, by `mechanism`.
    pub fn new(
        mechanism: SaslMechanism,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        KafkaSasl {
            mechanism,
            username: username.into(),
            password: password.into(),
        }
    }

    pub(crate) fn settings(&self) -> Vec<(&'static str, String)> {
        vec![
            ("sasl.mechanisms", self.mechanism.as_str().to_owned()),
            ("sasl.username", self.username.clone()),
            ("sasl.password", self.password.clone()),
        ]
    }
}

impl fmt::Debug for KafkaSasl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"***")
            .finish()
    }
}
