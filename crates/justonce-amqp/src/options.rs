use std::time::Duration;

use justonce_core::{validate_consumer_name, Error, Result};

/// The kind of the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// A replicated quorum queue (the default): counts deliveries in `x-delivery-count`
    /// and can dead-letter at-least-once.
    #[default]
    Quorum,
    /// A classic durable queue.
    Classic,
}

impl QueueType {
    /// The `x-queue-type` argument's value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Quorum => "quorum",
            QueueType::Classic => "classic",
        }
    }
}

impl std::str::FromStr for QueueType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "quorum" => Ok(QueueType::Quorum),
            "classic" => Ok(QueueType::Classic),
            _ => Err(Error::config(format!(
                "unknown queue type `{s}`: use quorum or classic"
            ))),
        }
    }
}

/// An exchange type, for an exchange the work queue is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeType {
    /// Routes by exact routing key.
    Direct,
    /// Routes by routing-key pattern (`order.*`, `order.#`).
    Topic,
    /// Routes to every bound queue.
    Fanout,
    /// Routes by headers.
    Headers,
}

impl ExchangeType {
    /// The AMQP name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeType::Direct => "direct",
            ExchangeType::Topic => "topic",
            ExchangeType::Fanout => "fanout",
            ExchangeType::Headers => "headers",
        }
    }
}

impl std::str::FromStr for ExchangeType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "direct" => ExchangeType::Direct,
            "topic" => ExchangeType::Topic,
            "fanout" => ExchangeType::Fanout,
            "headers" => ExchangeType::Headers,
            _ => {
                return Err(Error::config(format!(
                    "unknown exchange type `{s}`: use direct, topic, fanout or headers"
                )))
            }
        })
    }
}

/// A binding of the work queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The exchange.
    pub exchange: String,
    /// Its type, to declare it when it does not exist; `None`: it must exist.
    pub kind: Option<ExchangeType>,
    /// The routing key or pattern.
    pub routing_key: String,
}

/// Where dead letters go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetters {
    /// A direct exchange and a queue bound to it by the work queue's name, declared with
    /// the topology (the default: `<queue>.dlx` and `<queue>.dead`).
    Declare {
        /// The dead-letter exchange.
        exchange: String,
        /// The dead-letter queue.
        queue: String,
    },
    /// An exchange that exists already, published to with `routing_key`: where the letters
    /// go from there is the owner's (infrastructure code, another team). Nothing is
    /// declared for it.
    Existing {
        /// The exchange.
        exchange: String,
        /// The routing key dead letters are published with.
        routing_key: String,
    },
}

/// How much of the topology justonce declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Declare {
    /// Declare every part, including those that exist, so that arguments that differ
    /// (a classic queue where a quorum queue is wanted) fail loudly, with what exists,
    /// what was wanted and the option that aligns them (the default).
    #[default]
    All,
    /// Declare only the parts that do not exist yet; leave existing ones as they are,
    /// whatever their arguments.
    Missing,
    /// Declare and bind nothing: check that every part exists, and fail naming the ones
    /// that do not. For topologies owned by infrastructure code.
    None,
}

impl Declare {
    /// `all`, `missing` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            Declare::All => "all",
            Declare::Missing => "missing",
            Declare::None => "none",
        }
    }
}

impl std::str::FromStr for Declare {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "all" => Declare::All,
            "missing" => Declare::Missing,
            "none" => Declare::None,
            _ => {
                return Err(Error::config(format!(
                    "unknown declare mode `{s}`: use all, missing or none"
                )))
            }
        })
    }
}

/// Everything about one work queue and its satellites.
///
/// By default every name comes from the queue's. For a queue `orders`:
///
/// | name | what |
/// |---|---|
/// | exchange `orders` (direct) | where publishers send, routing key `orders`; only when the queue has no other binding |
/// | queue `orders` | the work queue |
/// | exchange `orders.dlx` (direct) | where dead letters go |
/// | queue `orders.dead` | the dead-letter queue |
/// | queues `orders.retry.<ms>ms` | one per delay tier, of the work queue's type: a TTL, then dead-lettered back to `orders` through the default exchange |
///
/// To consume what an existing exchange carries, bind the queue to it: one line.
///
/// ```
/// use std::time::Duration;
/// use justonce_amqp::{AmqpOptions, Declare, ExchangeType, QueueType};
///
/// // Orders published to the existing topic exchange `shop` as `order.created`.
/// let o = AmqpOptions::new("billing").bind("shop", ExchangeType::Topic, "order.created");
/// assert_eq!(o.publish_target(), ("shop", "order.created"));
///
/// // Names of your own, and a classic queue whose topology infrastructure code owns.
/// let o = AmqpOptions::new("billing")
///     .queue_type(QueueType::Classic)
///     .bind_existing("shop", "order.*")
///     .dead_letters("billing.errors.x", "billing.errors")
///     .retry_tiers("billing.wait", [Duration::from_secs(5), Duration::from_secs(60)])
///     .declare(Declare::None);
/// assert_eq!(o.retry_queue(Duration::from_secs(2)), "billing.wait.5000ms");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AmqpOptions {
    /// The work queue's name; also names the satellites unless they are named otherwise.
    pub queue: String,
    /// Quorum (default) or classic; the retry tiers follow it.
    pub queue_type: QueueType,
    /// Unacked deliveries the broker hands this consumer at most.
    pub prefetch: u16,
    /// The delay tiers for retries, ascending. A nack waits in the smallest tier at least
    /// as long as its delay (the largest one if none is). On RabbitMQ 3.10 a per-message
    /// TTL only expires at the head of a queue, so each tier holds one delay only. Empty:
    /// no tiers, and a retry is requeued at once (a quorum queue counts it against its
    /// delivery limit).
    pub retry_delays: Vec<Duration>,
    /// The retry tiers are named `<retry_prefix>.<ms>ms`; `<queue>.retry` by default.
    pub retry_prefix: String,
    /// Quorum queues: dead-letter a message the broker delivered this many times without an
    /// ack (a consumer crash-looping on it), at-least-once. `None` leaves it to the consumer.
    pub delivery_limit: Option<u32>,
    /// The exchanges the work queue is bound to. Empty: an exchange of its own, named
    /// after it, with the queue's name as routing key.
    pub bindings: Vec<Binding>,
    /// Where dead letters go.
    pub dead_letters: DeadLetters,
    /// How much of the topology is declared.
    pub declare: Declare,
    /// Where [`AmqpPublisher`](crate::AmqpPublisher) publishes: `(exchange, routing key)`.
    /// `None`: the first binding, or the queue's own exchange.
    pub publish_to: Option<(String, String)>,
    /// How long a publish waits for its confirm before it is sent again with the same id.
    pub confirm_timeout: Duration,
    /// Publishes in flight before the publisher waits for confirms.
    pub confirm_window: usize,
    /// Re-sends after a nack, a timeout or a lost connection before a publish fails.
    pub publish_retries: u32,
    /// The TLS of an `amqps://` URL beyond the system's roots: the broker's authority and
    /// a client certificate. The URL's `cacertfile`, `certfile` and `keyfile` override
    /// these ([`crate::connect`]).
    pub tls: AmqpTls,
}

/// The files of an `amqps://` connection, as RabbitMQ's URI query names them: paths, never
/// secrets themselves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AmqpTls {
    /// The authority (PEM) of the broker's certificate, trusted beside the system's roots.
    pub cacertfile: Option<std::path::PathBuf>,
    /// A client certificate (PEM), for a broker that verifies its clients or logs them in
    /// by it (`auth_mechanism=external`); with [`AmqpTls::keyfile`].
    pub certfile: Option<std::path::PathBuf>,
    /// The client certificate's key (PEM, PKCS#8).
    pub keyfile: Option<std::path::PathBuf>,
}

impl AmqpOptions {
    /// Defaults: quorum, prefetch 200, retry tiers 1 s / 10 s / 60 s, delivery limit 20,
    /// every name from the queue's, everything declared, confirm timeout 10 s, window 500,
    /// 5 re-sends.
    pub fn new(queue: impl Into<String>) -> Self {
        let queue = queue.into();
        AmqpOptions {
            queue_type: QueueType::Quorum,
            prefetch: 200,
            retry_delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(10),
                Duration::from_secs(60),
            ],
            retry_prefix: format!("{queue}.retry"),
            delivery_limit: Some(20),
            bindings: Vec::new(),
            dead_letters: DeadLetters::Declare {
                exchange: format!("{queue}.dlx"),
                queue: format!("{queue}.dead"),
            },
            declare: Declare::All,
            publish_to: None,
            confirm_timeout: Duration::from_secs(10),
            confirm_window: 500,
            publish_retries: 5,
            tls: AmqpTls::default(),
            queue,
        }
    }

    /// Binds the work queue to `exchange` with `routing_key` (a pattern for a topic
    /// exchange), declaring the exchange as `kind` if it does not exist. Call again for
    /// more keys or exchanges. A queue with bindings has no exchange of its own.
    pub fn bind(
        mut self,
        exchange: impl Into<String>,
        kind: ExchangeType,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(Binding {
            exchange: exchange.into(),
            kind: Some(kind),
            routing_key: routing_key.into(),
        });
        self
    }

    /// As [`AmqpOptions::bind`], to an exchange that must exist (it is never declared).
    pub fn bind_existing(
        mut self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.bindings.push(Binding {
            exchange: exchange.into(),
            kind: None,
            routing_key: routing_key.into(),
        });
        self
    }

    /// Sets [`AmqpOptions::queue_type`].
    pub fn queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
        self
    }

    /// Sets [`AmqpOptions::prefetch`].
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Names the dead-letter exchange and queue, declared with the topology.
    pub fn dead_letters(mut self, exchange: impl Into<String>, queue: impl Into<String>) -> Self {
        self.dead_letters = DeadLetters::Declare {
            exchange: exchange.into(),
            queue: queue.into(),
        };
        self
    }

    /// Sends dead letters to an existing exchange with `routing_key`, declaring nothing
    /// for them.
    pub fn dead_letters_to(
        mut self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.dead_letters = DeadLetters::Existing {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        };
        self
    }

    /// Names the retry tiers `<prefix>.<ms>ms` and sets their delays; no delays: no tiers.
    pub fn retry_tiers(
        mut self,
        prefix: impl Into<String>,
        delays: impl IntoIterator<Item = Duration>,
    ) -> Self {
        self.retry_prefix = prefix.into();
        self.retry_delays = delays.into_iter().collect();
        self
    }

    /// Sets [`AmqpOptions::delivery_limit`].
    pub fn delivery_limit(mut self, limit: Option<u32>) -> Self {
        self.delivery_limit = limit;
        self
    }

    /// Sets [`AmqpOptions::declare`].
    pub fn declare(mut self, declare: Declare) -> Self {
        self.declare = declare;
        self
    }

    /// Publishes to `exchange` with `routing_key`.
    pub fn publish_to(
        mut self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.publish_to = Some((exchange.into(), routing_key.into()));
        self
    }

    /// Sets the retry tiers' delays ([`AmqpOptions::retry_delays`]), keeping their prefix.
    pub fn retry_delays(mut self, delays: impl IntoIterator<Item = Duration>) -> Self {
        self.retry_delays = delays.into_iter().collect();
        self
    }

    /// Sets [`AmqpOptions::confirm_timeout`].
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// Sets [`AmqpOptions::confirm_window`].
    pub fn confirm_window(mut self, window: usize) -> Self {
        self.confirm_window = window;
        self
    }

    /// Sets [`AmqpOptions::publish_retries`].
    pub fn publish_retries(mut self, retries: u32) -> Self {
        self.publish_retries = retries;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let name_ok = |name: &str| validate_consumer_name(name).is_ok();
        let mut names = vec![self.queue.as_str(), self.retry_prefix.as_str()];
        if let DeadLetters::Declare { exchange, queue } = &self.dead_letters {
            names.extend([exchange.as_str(), queue.as_str()]);
        }
        for name in names {
            if !name_ok(name) {
                return Err(Error::config(format!(
                    "queue or exchange name `{name}` is invalid: use 1-100 characters of \
                     A-Z a-z 0-9 . _ : -"
                )));
            }
        }
        if self.retry_delays.iter().any(|d| d.is_zero()) {
            return Err(Error::config(
                "retry_delays must be non-zero (leave them empty for no retry tiers)",
            ));
        }
        if self.prefetch == 0 || self.confirm_window == 0 {
            return Err(Error::config(
                "prefetch and confirm_window must be at least 1",
            ));
        }
        if let Some(b) = self.bindings.iter().find(|b| b.exchange.is_empty()) {
            return Err(Error::config(format!(
                "binding with routing key `{}` names no exchange: the default exchange \
                 already routes to every queue by name",
                b.routing_key
            )));
        }
        Ok(())
    }

    /// Whether the queue has an exchange of its own (it has no bindings).
    pub fn has_own_exchange(&self) -> bool {
        self.bindings.is_empty()
    }

    /// The queue's own exchange (named after it), when it has one.
    pub fn own_exchange(&self) -> Option<&str> {
        self.has_own_exchange().then_some(self.queue.as_str())
    }

    /// Where publishers send: `(exchange, routing key)`. [`AmqpOptions::publish_to`] if
    /// set, else the first binding, else the queue's own exchange with its name.
    pub fn publish_target(&self) -> (&str, &str) {
        if let Some((x, k)) = &self.publish_to {
            return (x, k);
        }
        match self.bindings.first() {
            Some(b) => (&b.exchange, &b.routing_key),
            None => (&self.queue, &self.queue),
        }
    }

    /// The exchange dead letters are published to, and their routing key.
    pub fn dead_letter_target(&self) -> (&str, &str) {
        match &self.dead_letters {
            DeadLetters::Declare { exchange, .. } => (exchange, &self.queue),
            DeadLetters::Existing {
                exchange,
                routing_key,
            } => (exchange, routing_key),
        }
    }

    /// The dead-letter queue justonce declares, if it declares one.
    pub fn dead_letter_queue(&self) -> Option<&str> {
        match &self.dead_letters {
            DeadLetters::Declare { queue, .. } => Some(queue),
            DeadLetters::Existing { .. } => None,
        }
    }

    /// The retry tier `delay` names.
    fn tier(&self, delay: Duration) -> String {
        format!("{}.{}ms", self.retry_prefix, delay.as_millis())
    }

    /// The retry tier a nack with `delay` waits in (with no tiers, a nack is requeued at
    /// once instead).
    pub fn retry_queue(&self, delay: Duration) -> String {
        let mut tiers = self.retry_delays.clone();
        tiers.sort();
        let tier = tiers
            .iter()
            .find(|t| **t >= delay)
            .or(tiers.last())
            .copied()
            .unwrap_or(delay);
        self.tier(tier)
    }

    /// The longest a message waits in a retry tier: the broker's own hold-back, for the
    /// redelivery horizon (zero without tiers).
    pub fn redelivery_delay(&self) -> Duration {
        self.retry_delays.iter().max().copied().unwrap_or_default()
    }

    /// The retry tiers' queues.
    pub fn retry_queues(&self) -> Vec<String> {
        self.retry_delays.iter().map(|d| self.tier(*d)).collect()
    }

    /// Every queue of this topology: the work queue, the dead-letter queue (when declared)
    /// and the retry tiers.
    pub fn queues(&self) -> Vec<String> {
        let mut q = vec![self.queue.clone()];
        q.extend(self.dead_letter_queue().map(str::to_owned));
        q.extend(self.retry_queues());
        q
    }

    /// The queues a message waits in until it is delivered: the work queue and the retry
    /// tiers.
    pub fn waiting_queues(&self) -> Vec<String> {
        let mut q = vec![self.queue.clone()];
        q.extend(self.retry_queues());
        q
    }
}
