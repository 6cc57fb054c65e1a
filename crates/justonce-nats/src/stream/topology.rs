//! Connecting, the server's version, and the stream, consumer and dead-letter stream:
//! declared idempotently, or checked only.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use justonce_core::{Error, Result};
use tracing::info;

use crate::error;
use crate::link::Link;
use crate::options::{window_too_short, NatsOptions, Retention};

/// A nats-server's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServerVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl ServerVersion {
    /// Reads `2.9.10` (a suffix such as `-beta` is ignored).
    pub fn parse(s: &str) -> Option<Self> {
        let core = s.trim().trim_start_matches('v');
        let core = core.split(['-', '+']).next()?;
        let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
        Some(ServerVersion {
            major: it.next()??,
            minor: it.next()??,
            patch: it.next().flatten().unwrap_or(0),
        })
    }

    /// Whether this server is at least `major.minor.patch`.
    pub fn at_least(self, major: u32, minor: u32, patch: u32) -> bool {
        self >= ServerVersion {
            major,
            minor,
            patch,
        }
    }

    /// Whether `+TERM` takes a reason (2.10.4 and later); earlier servers ignore a
    /// `+TERM <reason>` and deliver the message again.
    pub fn term_takes_a_reason(self) -> bool {
        self.at_least(2, 10, 4)
    }

    /// justonce needs 2.9 (double acks, `-NAK` with a delay, `Nats-Msg-Id` dedup).
    pub(crate) fn supported(self) -> Result<()> {
        if self.at_least(2, 9, 0) {
            Ok(())
        } else {
            Err(Error::config(format!(
                "nats-server {self} is older than 2.9, which justonce needs (double acks, \
                 -NAK with a delay)"
            )))
        }
    }
}

impl std::fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Connects, failing within a few seconds when the server is not there, logged in and
/// with the TLS the URL and [`NatsOptions::connect`] ask for ([`crate::link`]).
pub(super) async fn client(url: &str, opts: &NatsOptions) -> Result<async_nats::Client> {
    let link = Link::parse(url, &opts.connect)?;
    let options = async_nats::ConnectOptions::new()
        .name("justonce")
        .connection_timeout(Duration::from_secs(3))
        .request_timeout(Some(opts.request_timeout));
    link.apply(options, url)
        .await?
        .connect(link.addr())
        .await
        .map_err(|e| error::connect(url, link.wants_tls(), e))
}

/// What connect found: the stream's retention, and the consumer's limits as the server
/// has them.
pub(super) struct Found {
    pub(super) retention: Retention,
    pub(super) ack_wait: Duration,
    pub(super) max_deliver: Option<u32>,
}

/// Declares (or checks) the stream, the consumer and the dead-letter stream.
pub(super) async fn declare(js: &jetstream::Context, opts: &NatsOptions) -> Result<Found> {
    let stream = match js.get_stream(&opts.stream).await {
        Ok(s) => s,
        Err(e) if error::not_found(&e) && opts.create => {
            let c = stream::Config {
                name: opts.stream.clone(),
                subjects: vec![opts.subject.clone()],
                retention: opts.retention.to_nats(),
                storage: stream::StorageType::File,
                duplicate_window: opts.duplicate_window,
                ..Default::default()
            };
            let s = js
                .create_stream(c)
                .await
                .map_err(|e| error::api(format!("creating stream `{}`", opts.stream), e))?;
            info!(stream = %opts.stream, "created the JetStream stream");
            s
        }
        Err(e) if error::not_found(&e) => {
            return Err(Error::config(format!(
                "no JetStream stream `{}` (create it, or let justonce create it)",
                opts.stream
            )))
        }
        Err(e) => {
            return Err(error::api(
                format!("looking up stream `{}`", opts.stream),
                e,
            ))
        }
    };
    let config = &stream.cached_info().config;
    check_stream(config, opts)?;
    let consumer = declare_consumer(&stream, opts).await?;
    declare_dead(js, opts).await?;
    Ok(Found {
        retention: Retention::from_nats(config.retention),
        ack_wait: consumer.ack_wait,
        max_deliver: u32::try_from(consumer.max_deliver).ok().filter(|m| *m > 0),
    })
}

/// What an existing stream must be for these options.
fn check_stream(c: &stream::Config, opts: &NatsOptions) -> Result<()> {
    let name = &opts.stream;
    if c.storage != stream::StorageType::File {
        return Err(Error::config(format!(
            "stream `{name}` keeps its messages in memory: a server restart loses every one \
             of them. justonce needs file storage"
        )));
    }
    let retention = Retention::from_nats(c.retention);
    if retention != opts.retention {
        return Err(Error::config(format!(
            "stream `{name}` has {} retention, and these options ask for {}: set \
             NatsOptions::retention to match the stream",
            retention.as_str(),
            opts.retention.as_str()
        )));
    }
    if !c.subjects.iter().any(|s| covers(s, &opts.subject)) {
        return Err(Error::config(format!(
            "stream `{name}` takes the subjects {:?}, not `{}`: a publish there would be \
             stored nowhere",
            c.subjects, opts.subject
        )));
    }
    if c.duplicate_window < opts.retry_horizon {
        return Err(window_too_short(
            name,
            c.duplicate_window,
            opts.retry_horizon,
            "the server's stream settings",
        ));
    }
    Ok(())
}

/// Whether the subject pattern `pattern` takes `subject`.
fn covers(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

fn wanted_consumer(opts: &NatsOptions) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(opts.consumer.clone()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: opts.lease,
        max_deliver: opts.max_deliver.map_or(-1, i64::from),
        max_ack_pending: i64::from(opts.max_ack_pending),
        filter_subject: opts.subject.clone(),
        deliver_policy: consumer::DeliverPolicy::All,
        ..Default::default()
    }
}

/// A consumer's `ack_wait` and `max_deliver`.
struct Limits {
    ack_wait: Duration,
    max_deliver: i64,
}

/// Declares the consumer (or checks it) and answers its limits as the server has them.
async fn declare_consumer(stream: &stream::Stream, opts: &NatsOptions) -> Result<Limits> {
    let want = wanted_consumer(opts);
    let existing = match stream.consumer_info(&opts.consumer).await {
        Ok(i) => Some(i.config),
        Err(e) if error::not_found(&e) => None,
        Err(e) => {
            return Err(error::api(
                format!("looking up consumer `{}`", opts.consumer),
                e,
            ))
        }
    };
    let Some(have) = existing else {
        if !opts.create {
            return Err(Error::config(format!(
                "no consumer `{}` on stream `{}` (create it, or let justonce create it)",
                opts.consumer, opts.stream
            )));
        }
        stream
            .create_consumer(want.clone())
            .await
            .map_err(|e| error::api(format!("creating consumer `{}`", opts.consumer), e))?;
        info!(stream = %opts.stream, consumer = %opts.consumer, "created the durable pull consumer");
        return Ok(Limits {
            ack_wait: want.ack_wait,
            max_deliver: want.max_deliver,
        });
    };
    let have_limits = Limits {
        ack_wait: have.ack_wait,
        max_deliver: have.max_deliver,
    };
    let name = &opts.consumer;
    if have.deliver_subject.is_some() {
        return Err(Error::config(format!(
            "consumer `{name}` is a push consumer; justonce pulls: give it a pull consumer of \
             its own"
        )));
    }
    if have.ack_policy != consumer::AckPolicy::Explicit {
        return Err(Error::config(format!(
            "consumer `{name}` acks with {:?}; justonce needs explicit acks (each delivery \
             acked after its commit)",
            have.ack_policy
        )));
    }
    if !have.filter_subject.is_empty() && have.filter_subject != opts.subject {
        return Err(Error::config(format!(
            "consumer `{name}` reads `{}`, and these options say `{}`",
            have.filter_subject, opts.subject
        )));
    }
    let differs = have.ack_wait != want.ack_wait
        || have.max_deliver != want.max_deliver
        || have.max_ack_pending < want.max_ack_pending;
    if !differs {
        return Ok(have_limits);
    }
    if !opts.create {
        // Owned by infrastructure: its limits are what they are, and the source goes by
        // them (its lease is the consumer's ack_wait).
        info!(
            consumer = %name,
            ack_wait = ?have.ack_wait,
            max_deliver = have.max_deliver,
            max_ack_pending = have.max_ack_pending,
            "using the consumer's own limits (create is off)"
        );
        return Ok(have_limits);
    }
    // Only the limits justonce sets change: what else the consumer has (a description,
    // metadata, the `_nats.*` keys NATS 2.11 writes) is sent back as it was, and never
    // compared.
    let update = consumer::Config {
        ack_wait: want.ack_wait,
        max_deliver: want.max_deliver,
        max_ack_pending: have.max_ack_pending.max(want.max_ack_pending),
        ..have
    };
    // On 2.9 a create of an existing durable updates what may change.
    stream
        .create_consumer(update.clone())
        .await
        .map_err(|e| error::api(format!("updating consumer `{name}`"), e))?;
    info!(stream = %opts.stream, consumer = %name, "updated the consumer's ack_wait, max_deliver and max_ack_pending");
    Ok(Limits {
        ack_wait: update.ack_wait,
        max_deliver: update.max_deliver,
    })
}

fn dead_config(opts: &NatsOptions) -> stream::Config {
    stream::Config {
        name: opts.dead_stream(),
        subjects: vec![opts.dead_subject()],
        retention: stream::RetentionPolicy::Limits,
        storage: stream::StorageType::File,
        duplicate_window: opts.duplicate_window,
        ..Default::default()
    }
}

async fn declare_dead(js: &jetstream::Context, opts: &NatsOptions) -> Result<()> {
    if !opts.create {
        return Ok(());
    }
    js.get_or_create_stream(dead_config(opts))
        .await
        .map_err(|e| {
            error::api(
                format!("creating the dead-letter stream `{}`", opts.dead_stream()),
                e,
            )
        })?;
    Ok(())
}

/// Deletes the consumer, the dead-letter stream, and the stream once it has no consumer.
pub(super) async fn delete(js: &jetstream::Context, opts: &NatsOptions) -> Result<()> {
    let _ = js
        .delete_consumer_from_stream(&opts.consumer, &opts.stream)
        .await;
    let _ = js.delete_stream(opts.dead_stream()).await;
    if let Ok(s) = js.get_stream(&opts.stream).await {
        if s.cached_info().state.consumer_count == 0 {
            js.delete_stream(&opts.stream)
                .await
                .map_err(|e| error::api(format!("deleting stream `{}`", opts.stream), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_and_old_servers_are_refused() {
        let v = ServerVersion::parse("2.9.10").unwrap();
        assert!(v.at_least(2, 9, 0));
        assert!(!v.term_takes_a_reason());
        assert!(ServerVersion::parse("v2.10.4-beta")
            .unwrap()
            .term_takes_a_reason());
        assert!(ServerVersion::parse("2.8.4").unwrap().supported().is_err());
        assert_eq!(ServerVersion::parse("x"), None);
    }

    #[test]
    fn subject_patterns_cover_what_they_should() {
        assert!(covers("orders", "orders"));
        assert!(covers("orders.>", "orders.eu.paid"));
        assert!(covers("orders.*", "orders.eu"));
        assert!(!covers("orders.*", "orders.eu.paid"));
        assert!(!covers("orders", "orders.eu"));
        assert!(!covers("orders.>", "orders"));
    }
}
