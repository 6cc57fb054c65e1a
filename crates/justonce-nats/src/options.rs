//! The options of a [`NatsStream`](crate::NatsStream).

use std::time::Duration;

/// What the stream keeps once a message is acked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Retention {
    /// A work queue (the default): a message is removed once its consumer acks it, and a
    /// subject has one consumer.
    WorkQueue,
    /// A message is removed once every consumer on the stream has acked it: several
    /// consumers (each a durable of its own) read one stream.
    Interest,
    /// Messages stay until the stream's limits remove them (a log); each consumer keeps
    /// its own place.
    Limits,
}

impl Retention {
    pub(crate) fn to_nats(self) -> async_nats::jetstream::stream::RetentionPolicy {
        use async_nats::jetstream::stream::RetentionPolicy as R;
        match self {
            Retention::WorkQueue => R::WorkQueue,
            Retention::Interest => R::Interest,
            Retention::Limits => R::Limits,
        }
    }

    pub(crate) fn from_nats(r: async_nats::jetstream::stream::RetentionPolicy) -> Self {
        use async_nats::jetstream::stream::RetentionPolicy as R;
        match r {
            R::WorkQueue => Retention::WorkQueue,
            R::Interest => Retention::Interest,
            R::Limits => Retention::Limits,
        }
    }

    /// The name NATS gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Retention::WorkQueue => "workqueue",
            Retention::Interest => "interest",
            Retention::Limits => "limits",
        }
    }
}

/// Options of a [`NatsStream`](crate::NatsStream).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NatsOptions {
    /// The JetStream stream's name (letters, digits, `-` and `_`).
    pub stream: String,
    /// The subject messages are published to, and the consumer's filter (default: the
    /// stream's name).
    pub subject: String,
    /// The durable pull consumer's name (default `justonce`). Every worker of one
    /// consumer uses the same name: they share its deliveries.
    pub consumer: String,
    /// The consumer's `ack_wait`: how long a delivery is held before the server delivers
    /// it again (default 30 s). A batch that runs past half of it is kept with `+WPI`.
    pub lease: Duration,
    /// The consumer's `max_deliver` (default 20; `None`: no limit). A message whose last
    /// allowed delivery fails is dead-lettered by the source; one whose worker died on
    /// it is dead-lettered from the server's advisory.
    pub max_deliver: Option<u32>,
    /// The consumer's `max_ack_pending`: deliveries out at once across its workers
    /// (default 1,000). Set it to at least batch size x concurrency x workers.
    pub max_ack_pending: u32,
    /// The stream's `duplicate_window`: how long the server remembers a `Nats-Msg-Id`
    /// (default 2 min).
    pub duplicate_window: Duration,
    /// How long a publisher may go on publishing one message again after a failure (an
    /// outbox relay's retries, your own): the stream must remember ids at least that long,
    /// or a late retry is a second message (default 1 min). Checked at connect.
    pub retry_horizon: Duration,
    /// The stream's retention (default [`Retention::WorkQueue`]); an existing stream must
    /// have this one.
    pub retention: Retention,
    /// Create the stream, the consumer and the dead-letter stream if missing, and bring
    /// the consumer's limits up to these options (default `true`). With `false` (streams
    /// owned by infrastructure, and the tools) everything must exist already and is only
    /// checked, and the consumer's own `ack_wait`, `max_deliver` and `max_ack_pending`
    /// are used as they are.
    pub create: bool,
    /// How long a request to the server may wait for its answer (default 5 s).
    pub request_timeout: Duration,
    /// How to log in and the TLS to insist on, beyond the URL's user, password or token
    /// and its `tls://` (default: nothing more). The URL's query can set each field too
    /// (`?creds_file=…&tls_ca=…`).
    pub connect: crate::NatsConnect,
}

impl NatsOptions {
    /// Options for the stream `stream`.
    pub fn new(stream: impl Into<String>) -> Self {
        let stream = stream.into();
        NatsOptions {
            subject: stream.clone(),
            stream,
            consumer: "justonce".into(),
            lease: Duration::from_secs(30),
            max_deliver: Some(20),
            max_ack_pending: 1000,
            duplicate_window: Duration::from_secs(120),
            retry_horizon: Duration::from_secs(60),
            retention: Retention::WorkQueue,
            create: true,
            request_timeout: Duration::from_secs(5),
            connect: crate::NatsConnect::default(),
        }
    }

    /// Sets [`NatsOptions::subject`].
    pub fn subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = subject.into();
        self
    }

    /// Sets [`NatsOptions::consumer`].
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = consumer.into();
        self
    }

    /// Sets [`NatsOptions::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`NatsOptions::max_deliver`].
    pub fn max_deliver(mut self, max_deliver: Option<u32>) -> Self {
        self.max_deliver = max_deliver;
        self
    }

    /// Sets [`NatsOptions::max_ack_pending`].
    pub fn max_ack_pending(mut self, max_ack_pending: u32) -> Self {
        self.max_ack_pending = max_ack_pending;
        self
    }

    /// Sets [`NatsOptions::duplicate_window`].
    pub fn duplicate_window(mut self, window: Duration) -> Self {
        self.duplicate_window = window;
        self
    }

    /// Sets [`NatsOptions::retry_horizon`].
    pub fn retry_horizon(mut self, horizon: Duration) -> Self {
        self.retry_horizon = horizon;
        self
    }

    /// Sets [`NatsOptions::retention`].
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Sets [`NatsOptions::create`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// Sets [`NatsOptions::request_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The dead-letter stream of this consumer: `{stream}-{consumer}-dead`.
    pub fn dead_stream(&self) -> String {
        format!("{}-{}-dead", self.stream, self.consumer)
    }

    /// The dead-letter stream's subject: `justonce.dead.{stream}.{consumer}`.
    pub fn dead_subject(&self) -> String {
        format!("justonce.dead.{}.{}", self.stream, self.consumer)
    }

    /// The subject of the server's advisory for a message that reached `max_deliver`.
    pub(crate) fn max_deliveries_advisory(&self) -> String {
        format!(
            "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{}",
            self.stream, self.consumer
        )
    }

    /// Checks names and numbers before anything is sent.
    pub(crate) fn validate(&self) -> justonce_core::Result<()> {
        use justonce_core::Error;
        for (what, name) in [("stream", &self.stream), ("consumer", &self.consumer)] {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(Error::config(format!(
                    "`{name}` is not a NATS {what} name: use letters, digits, `-` and `_`"
                )));
            }
        }
        if self.subject.is_empty()
            || self.subject.contains(['*', '>', ' '])
            || self.subject.split('.').any(str::is_empty)
        {
            return Err(Error::config(format!(
                "`{}` is not a subject to publish to (no wildcards, no empty tokens)",
                self.subject
            )));
        }
        if self.lease < Duration::from_millis(100) {
            return Err(Error::config(
                "a NATS consumer's lease (ack_wait) must be at least 100 ms",
            ));
        }
        if self.max_deliver == Some(0) || self.max_ack_pending == 0 {
            return Err(Error::config(
                "max_deliver and max_ack_pending must each be at least 1",
            ));
        }
        if self.duplicate_window < self.retry_horizon {
            return Err(window_too_short(
                &self.stream,
                self.duplicate_window,
                self.retry_horizon,
                "these options",
            ));
        }
        Ok(())
    }
}

/// The error of a duplicate window shorter than the retry horizon.
pub(crate) fn window_too_short(
    stream: &str,
    window: Duration,
    horizon: Duration,
    whose: &str,
) -> justonce_core::Error {
    justonce_core::Error::config(format!(
        "stream `{stream}`: {whose} remember a message id for {window:?} (duplicate_window), \
         but a publisher may retry it for {horizon:?} (retry_horizon): a retry after the window \
         is stored as a second message. Raise the stream's duplicate_window to at least \
         {horizon:?}, or lower the retry horizon"
    ))
}
