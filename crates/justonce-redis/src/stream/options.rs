//! The options of a [`RedisStream`](super::RedisStream).

use std::time::Duration;

/// Where a new consumer group starts reading a stream that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StartAt {
    /// At the stream's first entry (`0`): nothing published before the group existed is
    /// skipped. The default, as a queue's users expect.
    Beginning,
    /// After the stream's last entry (`$`): a group added to a stream with a long history
    /// reads only what comes after it.
    End,
}

/// Options of a [`RedisStream`](super::RedisStream).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisStreamOptions {
    /// The stream's key (an existing stream, or one to create).
    pub stream: String,
    /// The consumer group (default `justonce`), created if missing.
    pub group: String,
    /// This consumer's name in the group. Keep it stable across restarts of one worker
    /// (a pod's name, `worker-3`): a worker restarted under its name takes back its own
    /// pending entries at once instead of waiting a lease for them to be taken over. Two
    /// live workers must never share a name. Default: the host name and the process id.
    pub consumer: String,
    /// How long a delivery is held before another consumer may take it over (default
    /// 30 s); a heartbeat keeps a live consumer's entries from going stale meanwhile.
    pub lease: Duration,
    /// Where a new group starts on an existing stream (default [`StartAt::Beginning`]).
    pub start_at: StartAt,
    /// Create the stream and the group if missing (default `true`); tools open with
    /// `false` and only read what exists.
    pub create: bool,
    /// How long a command may wait for its reply (default 5 s). Blocking reads run on
    /// connections of their own, with a timeout of their wait.
    pub response_timeout: Duration,
}

impl RedisStreamOptions {
    /// Options for the stream `stream`.
    pub fn new(stream: impl Into<String>) -> Self {
        RedisStreamOptions {
            stream: stream.into(),
            group: "justonce".into(),
            consumer: default_consumer(),
            lease: Duration::from_secs(30),
            start_at: StartAt::Beginning,
            create: true,
            response_timeout: Duration::from_secs(5),
        }
    }

    /// Sets [`RedisStreamOptions::group`].
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// Sets [`RedisStreamOptions::consumer`].
    pub fn consumer(mut self, consumer: impl Into<String>) -> Self {
        self.consumer = consumer.into();
        self
    }

    /// Sets [`RedisStreamOptions::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`RedisStreamOptions::start_at`].
    pub fn start_at(mut self, start_at: StartAt) -> Self {
        self.start_at = start_at;
        self
    }

    /// Sets [`RedisStreamOptions::create`].
    pub fn create(mut self, create: bool) -> Self {
        self.create = create;
        self
    }

    /// The group's retry stream: copies of nacked and released deliveries, read by this
    /// group only.
    pub fn retry_key(&self) -> String {
        format!("{}:{}:retry", self.stream, self.group)
    }

    /// The group's delayed retries: a sorted set by due time.
    pub fn delayed_key(&self) -> String {
        format!("{}:{}:delayed", self.stream, self.group)
    }

    /// The group's dead-letter stream.
    pub fn dead_key(&self) -> String {
        format!("{}:{}:dead", self.stream, self.group)
    }
}

fn default_consumer() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
}
