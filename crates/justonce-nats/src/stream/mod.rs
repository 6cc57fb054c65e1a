//! [`NatsStream`]: a JetStream stream and a durable pull consumer as a justonce transport.

mod dead;
mod inspect;
mod publish;
mod source;
mod topology;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::Subject;
use justonce_core::{Error, Result};
use tracing::debug;

use crate::options::{NatsOptions, Retention};
pub use topology::ServerVersion;

/// A delivery's receipt: its place in the stream, the delivery count it came with, its
/// attempt, and the subject that settles it.
#[derive(Debug, Clone)]
struct Token {
    stream_seq: u64,
    delivered: u64,
    attempt: u32,
    reply: Subject,
    /// The client's connect count when it was pulled: a settlement on a later connection
    /// may reach a server that restarted and forgot the delivery.
    connects: u64,
}

impl Inner {
    /// A handle on the stream `name` (no request is sent).
    async fn stream(&self, name: &str) -> Result<jetstream::stream::Stream<()>> {
        self.js
            .get_stream_no_info(name)
            .await
            .map_err(|e| crate::error::api(format!("opening stream `{name}`"), e))
    }

    /// A dead letter's reason, from this consumer of this stream.
    fn reason(&self, error: String, attempts: u32) -> justonce_core::DeadLetterReason {
        justonce_core::DeadLetterReason {
            error,
            attempts,
            source_queue: self.opts.stream.clone(),
            consumer: self.opts.consumer.clone(),
        }
    }
}

/// A delivery this source handed out and has not settled.
struct Held {
    delivered: u64,
    reply: Subject,
    /// When it was received, or last kept with `+WPI`.
    touched: Instant,
}

struct Inner {
    opts: NatsOptions,
    client: async_nats::Client,
    js: jetstream::Context,
    /// `$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}`.
    next_subject: String,
    /// Deliveries received and not yet settled, by stream sequence: for `+WPI`, and to
    /// ignore a receipt of a delivery that came back to this source since.
    held: Mutex<HashMap<u64, Held>>,
    version: ServerVersion,
    max_payload: usize,
    /// The stream's retention, as found or made at connect.
    retention: Retention,
    /// Publishes the server answered as duplicates.
    duplicates: std::sync::atomic::AtomicU64,
}

/// A JetStream stream with a durable pull consumer as a justonce transport ([`Source`],
/// [`Publisher`], [`Inspect`](justonce_core::Inspect)).
///
/// - **Publishes** carry `Nats-Msg-Id` = the message id and wait for their PubAck; the
///   server drops a second publish of an id within the stream's `duplicate_window`
///   (an ack with `duplicate: true` is a success). A batch keeps its PubAcks in flight
///   together. At connect the window is checked against [`NatsOptions::retry_horizon`].
/// - **Receives** pull batches from the durable consumer (explicit acks, `ack_wait` =
///   [`NatsOptions::lease`], `max_deliver`, `max_ack_pending`); a delivery held past half
///   of `ack_wait` is kept with `+WPI`.
/// - **Acks are double acks**, sent after the commit: the server's reply says the ack
///   was taken, so a lost ack is an error, not a silent redelivery. A batch's acks are
///   plain but the last, whose reply covers the ones before it on the same connection.
/// - **Nacks** are `-NAK` with the delay; the attempt is the server's delivery count.
///   A **release** on a work-queue stream writes a copy carrying the attempts so far and
///   acks the delivery, so no attempt is counted and `max_deliver` comes no closer.
/// - **Dead letters**: JetStream has none. The source writes the message and its reason
///   to the consumer's dead-letter stream ([`NatsOptions::dead_stream`]), waits for its
///   PubAck, then terminates the delivery (`+TERM`). A message whose last allowed
///   delivery was never settled (its worker died) is dead-lettered from the server's
///   `MAX_DELIVERIES` advisory.
///
/// ```no_run
/// use std::time::Duration;
/// use justonce_core::{Message, Publisher, Source};
/// use justonce_nats::{NatsOptions, NatsStream};
///
/// # async fn run() -> justonce_core::Result<()> {
/// let q = NatsStream::connect("nats://127.0.0.1:4222", NatsOptions::new("orders")).await?;
/// q.publish(&Message::new("{}").with_id("ORD-1")?).await?;
/// let batch = q.receive(10, Duration::from_secs(1)).await?;
/// let receipts: Vec<_> = batch.iter().map(|d| &d.receipt).collect();
/// q.ack(&receipts).await?;
/// # Ok(()) }
/// ```
///
/// [`Source`]: justonce_core::Source
/// [`Publisher`]: justonce_core::Publisher
#[derive(Clone)]
pub struct NatsStream {
    inner: Arc<Inner>,
    _tasks: Arc<AbortOnDrop>,
}

impl std::fmt::Debug for NatsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsStream")
            .field("opts", &self.inner.opts)
            .field("server", &self.inner.version)
            .finish()
    }
}

struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

impl NatsStream {
    /// Connects, reads the server's version, and declares the stream, the durable pull
    /// consumer and the dead-letter stream (or, with [`NatsOptions::create`] off, checks
    /// that they exist as these options need); then starts the `+WPI` heartbeat and the
    /// listener of the `MAX_DELIVERIES` advisory.
    pub async fn connect(url: &str, opts: NatsOptions) -> Result<Self> {
        opts.validate()?;
        let client = topology::client(url, &opts).await?;
        let info = client.server_info();
        let version = ServerVersion::parse(&info.version).ok_or_else(|| {
            Error::config(format!(
                "the NATS server at {} says its version is `{}`, which justonce cannot read",
                justonce_core::redact_url(url),
                info.version
            ))
        })?;
        version.supported()?;
        if !info.jetstream {
            return Err(Error::config(format!(
                "the NATS server at {} runs without JetStream: start it with `-js` \
                 (and a store directory, `-sd`)",
                justonce_core::redact_url(url)
            )));
        }
        let js = jetstream::ContextBuilder::new()
            .timeout(opts.request_timeout)
            .max_ack_inflight(1024)
            .backpressure_on_inflight(true)
            .build(client.clone());
        let found = topology::declare(&js, &opts).await?;
        let retention = found.retention;
        let mut opts = opts;
        opts.lease = found.ack_wait.max(Duration::from_millis(100));
        opts.max_deliver = found.max_deliver;
        let inner = Arc::new(Inner {
            next_subject: format!(
                "$JS.API.CONSUMER.MSG.NEXT.{}.{}",
                opts.stream, opts.consumer
            ),
            opts,
            client,
            js,
            held: Mutex::new(HashMap::new()),
            version,
            max_payload: info.max_payload,
            retention,
            duplicates: std::sync::atomic::AtomicU64::new(0),
        });
        let mut tasks = vec![tokio::spawn(heartbeat(Arc::downgrade(&inner)))];
        if inner.opts.max_deliver.is_some() {
            let sub = inner
                .client
                .subscribe(inner.opts.max_deliveries_advisory())
                .await
                .map_err(|e| {
                    Error::with_source(
                        justonce_core::ErrorKind::Io,
                        "subscribing to the MAX_DELIVERIES advisory",
                        e,
                    )
                })?;
            tasks.push(tokio::spawn(dead::advisories(Arc::downgrade(&inner), sub)));
        }
        Ok(NatsStream {
            inner,
            _tasks: Arc::new(AbortOnDrop(tasks)),
        })
    }

    /// The options, with the consumer's `ack_wait` and `max_deliver` as the server has
    /// them (the same as asked, unless [`NatsOptions::create`] is off).
    pub fn options(&self) -> &NatsOptions {
        &self.inner.opts
    }

    /// The server's version, as read at connect.
    pub fn server_version(&self) -> ServerVersion {
        self.inner.version
    }

    /// The largest message the server takes (`max_payload`), as read at connect.
    pub fn max_payload(&self) -> usize {
        self.inner.max_payload
    }

    /// The connection's client, for what justonce does not wrap.
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    /// Deletes the consumer, the dead-letter stream, and the stream once no consumer is
    /// left on it: for tests, demos and labs on shared servers.
    pub async fn delete(&self) -> Result<()> {
        topology::delete(&self.inner.js, &self.inner.opts).await
    }
}

/// The heartbeat: every quarter of the lease, `+WPI` for each delivery held past half of
/// it, so a long batch keeps what it holds.
async fn heartbeat(inner: std::sync::Weak<Inner>) {
    loop {
        let every = match inner.upgrade() {
            Some(i) => i.opts.lease / 4,
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(i) = inner.upgrade() else { return };
        let half = i.opts.lease / 2;
        let due: Vec<Subject> = {
            let mut held = lock(&i.held);
            let now = Instant::now();
            held.values_mut()
                .filter(|h| now.duration_since(h.touched) >= half)
                .map(|h| {
                    h.touched = now;
                    h.reply.clone()
                })
                .collect()
        };
        for reply in due {
            if let Err(e) = i.client.publish(reply, "+WPI".into()).await {
                debug!(error = %e, "+WPI of a held delivery failed");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
