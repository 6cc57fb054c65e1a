use std::time::Duration;

use justonce_core::{Error, Result};

/// How a [`Relay`](super::Relay) runs. [`RelayOptions::default`] suits most outboxes; the
/// chained setters change it.
///
/// ```
/// use std::time::Duration;
/// use justonce::relay::RelayOptions;
///
/// let o = RelayOptions::default()
///     .batch(200)
///     .concurrency(4)
///     .lease(Duration::from_secs(60))
///     .publish_timeout(Duration::from_secs(20))
///     .max_attempts(5);
/// assert_eq!(o.batch, 200);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayOptions {
    /// The relay's name in logs and metrics (`outbox` label; default `outbox`).
    pub name: String,
    /// Who holds the leases, unique per relay process (default: host, pid and a random
    /// suffix).
    pub owner: String,
    /// Rows taken and published at once (default 100).
    pub batch: usize,
    /// Relay loops in this process (default 2). Keys spread over them; one key is never
    /// held by two at once.
    pub concurrency: usize,
    /// How long a taken row is this relay's (default 30 s): one that dies leaves its rows
    /// to the others after that.
    pub lease: Duration,
    /// How long one publish may take before it counts as failed (default 10 s); shorter
    /// than the lease, so that a key's rows are never in flight from two relays.
    pub publish_timeout: Duration,
    /// How often an idle relay looks for rows when nothing woke it (default 1 s).
    pub poll_interval: Duration,
    /// The delay before a refused row is tried again, doubling from this (default 1 s)...
    pub retry_base: Duration,
    /// ...up to this (default 5 min).
    pub retry_max: Duration,
    /// Refused publishes of one row before it is dead (default 10).
    pub max_attempts: u32,
    /// How often the backlog gauges are read (default 10 s).
    pub stats_interval: Duration,
    /// How often the relay tidies the outbox's table ([`OutboxStore::tidy`]: a `VACUUM`
    /// on PostgreSQL; default 10 s).
    ///
    /// [`OutboxStore::tidy`]: justonce_core::OutboxStore::tidy
    pub tidy_interval: Duration,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            name: "outbox".into(),
            owner: default_owner(),
            batch: 100,
            concurrency: 2,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            max_attempts: 10,
            stats_interval: Duration::from_secs(10),
            tidy_interval: Duration::from_secs(10),
        }
    }
}

macro_rules! setters {
    ($($field:ident: $ty:ty),* $(,)?) => {
        $(
            #[doc = concat!("Sets [`RelayOptions::", stringify!($field), "`].")]
            pub fn $field(mut self, value: $ty) -> Self {
                self.$field = value;
                self
            }
        )*
    };
}

impl RelayOptions {
    setters!(
        batch: usize,
        concurrency: usize,
        lease: Duration,
        publish_timeout: Duration,
        poll_interval: Duration,
        max_attempts: u32,
        stats_interval: Duration,
        tidy_interval: Duration,
    );

    /// Sets [`RelayOptions::name`].
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets [`RelayOptions::owner`].
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = owner.into();
        self
    }

    /// Sets [`RelayOptions::retry_base`] and [`RelayOptions::retry_max`].
    pub fn retry(mut self, base: Duration, max: Duration) -> Self {
        self.retry_base = base;
        self.retry_max = max;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.concurrency == 0 || self.max_attempts == 0 {
            return Err(Error::config(
                "a relay's batch, concurrency and max_attempts must each be at least 1",
            ));
        }
        if self.tidy_interval.is_zero() || self.stats_interval.is_zero() {
            return Err(Error::config(
                "a relay's tidy_interval and stats_interval must be longer than zero",
            ));
        }
        if self.owner.trim().is_empty() {
            return Err(Error::config("a relay's owner is empty"));
        }
        if self.publish_timeout >= self.lease {
            return Err(Error::config(format!(
                "the relay's publish timeout ({:?}) must be shorter than its lease ({:?}): \
                 otherwise a slow publish could still be in flight when another relay takes \
                 the same rows, and a key's order would be lost",
                self.publish_timeout, self.lease
            )));
        }
        Ok(())
    }
}

fn default_owner() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".into());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}
