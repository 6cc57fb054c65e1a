//! [`RedisStream`]: a Redis stream and a consumer group as a justonce transport.

mod admin;
mod codec;
mod options;
mod receive;
mod reply;
mod settle;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use justonce_core::{
    DeadLetterReason, Delivery, Error, ErrorKind, Message, Publisher, Receipt, Result, Source,
};
use redis::aio::{ConnectionManager, MultiplexedConnection};
use redis::Script;
use tracing::{debug, warn};

use crate::connection;
use crate::error::redis;
use crate::server::{require_commands, ServerSettings, STREAM_COMMANDS};
use admin::{create_group, must_exist};
use codec::Fields;
pub use options::{RedisStreamOptions, StartAt};
use settle::reason_args;

/// A stream entry: its id and its fields.
type Entry = (String, Fields);

/// Which stream a delivery came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tag {
    Main,
    Retry,
}

impl Tag {
    fn as_str(self) -> &'static str {
        match self {
            Tag::Main => "m",
            Tag::Retry => "r",
        }
    }
}

/// A delivery's receipt: the entry and the delivery count it was received with, and the
/// delivery's attempt (the copy's attempts before it plus that count).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Token {
    tag: Tag,
    id: String,
    count: u64,
    attempt: u32,
}

struct Scripts {
    ready: Script,
    settle: Script,
    touch: Script,
    trim: Script,
    /// Entries after an id, counted in Redis (`Inspect::pending`).
    count: Script,
}

struct Inner {
    opts: RedisStreamOptions,
    client: redis::Client,
    conn: ConnectionManager,
    /// Connections for blocking reads, one per read under way.
    blocking: Mutex<Vec<MultiplexedConnection>>,
    scripts: Scripts,
    /// Receipts received and not yet settled, for the heartbeat.
    held: Mutex<HashMap<(Tag, String), u64>>,
    /// Whether this consumer has read its own pending entries yet.
    resumed: Mutex<bool>,
    /// The last run of the ready script, which new entries of the main stream do not
    /// need: it runs at most every tenth of the lease (100 ms at most) unless it found
    /// something last time or a delayed retry is due.
    sweep: Mutex<Sweep>,
    /// Deliveries this source handed out (Redis counts none per group).
    delivered: std::sync::atomic::AtomicU64,
    server: ServerSettings,
    url: String,
}

/// When the ready script last ran, whether it found entries, and when the next delayed
/// retry is due.
#[derive(Default)]
struct Sweep {
    at: Option<Instant>,
    found: bool,
    due_at: Option<Instant>,
}

/// A Redis stream with a consumer group as a justonce transport ([`Source`],
/// [`Publisher`], [`Inspect`](justonce_core::Inspect)).
///
/// - **Consumer groups**: each delivery is pending for one consumer until it is acked;
///   other groups on the same stream read it too, and the stream is only ever acked (and
///   trimmed below what every group has settled), never rewritten.
/// - **Leases**: an entry idle past [`RedisStreamOptions::lease`] in a consumer's pending
///   list is taken over (`XAUTOCLAIM`) by the next receive, its delivery counted; a
///   heartbeat (`XCLAIM … JUSTID`, every third of the lease) keeps a live consumer's
///   entries from going stale while a long batch runs. A consumer restarted under its
///   name reads its own pending entries first.
/// - **Retries with a delay**: a nack acks the entry and writes a copy with the attempts
///   so far into the group's retry stream, through a sorted set by due time when it has a
///   delay (Redis has no delayed delivery); a release does the same without counting an
///   attempt. The attempt of a delivery is the copy's attempts plus its delivery count.
/// - **Dead letters**: a copy in the group's dead-letter stream with the reason as fields,
///   written in the script that acks the entry (Redis has no dead-letter stream).
/// - **Receipts**: a settlement names the entry and its delivery count, and is ignored
///   when the entry went to another consumer or came back since.
/// - **The message id in a field** (`id`), never the entry id.
/// - **Blocking reads** on connections of their own, with a timeout of their wait.
///
/// ```no_run
/// use std::time::Duration;
/// use justonce_core::{Message, Publisher, Source};
/// use justonce_redis::{RedisStream, RedisStreamOptions};
///
/// # async fn run() -> justonce_core::Result<()> {
/// let opts = RedisStreamOptions::new("orders").consumer("worker-1");
/// let q = RedisStream::connect("redis://127.0.0.1:6379", opts).await?;
/// q.publish(&Message::new("{}").with_id("ORD-1")?).await?;
/// let batch = q.receive(10, Duration::from_secs(1)).await?;
/// let receipts: Vec<_> = batch.iter().map(|d| &d.receipt).collect();
/// q.ack(&receipts).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStream {
    inner: Arc<Inner>,
    _heartbeat: Arc<AbortOnDrop>,
}

impl std::fmt::Debug for RedisStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStream")
            .field("opts", &self.inner.opts)
            .finish()
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RedisStream {
    /// Connects, creates the stream and the group if missing (unless
    /// [`RedisStreamOptions::create`] is off, when both must exist), and starts the
    /// heartbeat.
    pub async fn connect(url: &str, opts: RedisStreamOptions) -> Result<Self> {
        if opts.stream.is_empty() || opts.group.is_empty() || opts.consumer.is_empty() {
            return Err(Error::config(
                "a Redis stream needs a stream key, a group and a consumer name",
            ));
        }
        if opts.lease < Duration::from_millis(30) {
            return Err(Error::config(
                "a Redis stream's lease must be at least 30 ms",
            ));
        }
        let client = connection::client(url)?;
        let mut conn = connection::open(url, opts.response_timeout).await?;
        require_commands(&mut conn, "a Redis stream", STREAM_COMMANDS).await?;
        let scripts = Scripts {
            ready: Script::new(include_str!("../lua/stream_ready.lua")),
            settle: Script::new(include_str!("../lua/stream_settle.lua")),
            touch: Script::new(include_str!("../lua/stream_touch.lua")),
            trim: Script::new(concat!(
                include_str!("../lua/stream_ids.lua"),
                include_str!("../lua/stream_trim.lua")
            )),
            count: Script::new(include_str!("../lua/stream_count.lua")),
        };
        for s in [
            &scripts.ready,
            &scripts.settle,
            &scripts.touch,
            &scripts.trim,
            &scripts.count,
        ] {
            s.load_async(&mut conn)
                .await
                .map_err(|e| redis("loading the stream scripts", e))?;
        }
        if opts.create {
            let start = match opts.start_at {
                StartAt::Beginning => "0",
                StartAt::End => "$",
            };
            create_group(&mut conn, &opts.stream, &opts.group, start).await?;
            create_group(&mut conn, &opts.retry_key(), &opts.group, "0").await?;
        } else {
            must_exist(&mut conn, &opts, url).await?;
        }
        let server = ServerSettings::read(&mut conn).await?;
        for w in server.warnings() {
            warn!(url = %justonce_core::redact_url(url), stream = %opts.stream, "a Redis stream: {w}");
        }
        let inner = Arc::new(Inner {
            opts,
            client,
            conn,
            blocking: Mutex::new(Vec::new()),
            scripts,
            held: Mutex::new(HashMap::new()),
            resumed: Mutex::new(false),
            sweep: Mutex::new(Sweep::default()),
            delivered: std::sync::atomic::AtomicU64::new(0),
            server,
            url: url.to_owned(),
        });
        let beat = tokio::spawn(heartbeat(Arc::downgrade(&inner)));
        Ok(RedisStream {
            inner,
            _heartbeat: Arc::new(AbortOnDrop(beat)),
        })
    }

    /// The options.
    pub fn options(&self) -> &RedisStreamOptions {
        &self.inner.opts
    }

    /// The server's settings, as read at connect.
    pub fn server(&self) -> &ServerSettings {
        &self.inner.server
    }

    fn keys(&self) -> [String; 4] {
        let o = &self.inner.opts;
        [
            o.stream.clone(),
            o.retry_key(),
            o.delayed_key(),
            o.dead_key(),
        ]
    }

    /// Trims the main stream below what every consumer group on it still needs (each
    /// group's first pending entry, or the entry after its last delivered one): a pending
    /// entry, or one some group has not read, is never removed. The heartbeat does this
    /// every third of the lease; answers how many entries went.
    pub async fn trim(&self) -> Result<u64> {
        trim(&self.inner).await
    }

    /// Deletes the stream's keys for this group, and the stream itself: for tests, demos
    /// and labs on shared servers.
    pub async fn delete(&self) -> Result<()> {
        let keys = self.keys();
        let _: () = redis::cmd("DEL")
            .arg(&keys[..])
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("deleting the stream", e))?;
        Ok(())
    }
}

/// Trims the main stream below what every group on it still needs.
async fn trim(i: &Inner) -> Result<u64> {
    let mut call = i.scripts.trim.prepare_invoke();
    call.key(&i.opts.stream);
    call.invoke_async(&mut i.conn.clone())
        .await
        .map_err(|e| redis("trimming the stream", e))
}

/// The heartbeat: every third of the lease, touches the entries this consumer holds, and
/// trims the main stream below what every group has settled.
async fn heartbeat(inner: std::sync::Weak<Inner>) {
    loop {
        let every = match inner.upgrade() {
            Some(i) => i.opts.lease / 3,
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(i) = inner.upgrade() else { return };
        let held: Vec<(Tag, String, u64)> = lock(&i.held)
            .iter()
            .map(|((t, id), c)| (*t, id.clone(), *c))
            .collect();
        let mut conn = i.conn.clone();
        if !held.is_empty() {
            let mut call = i.scripts.touch.prepare_invoke();
            call.key(&i.opts.stream).key(i.opts.retry_key());
            call.arg(&i.opts.group).arg(&i.opts.consumer);
            for (t, id, c) in &held {
                call.arg(t.as_str()).arg(id).arg(*c);
            }
            if let Err(e) = call.invoke_async::<u64>(&mut conn).await {
                debug!(error = %e, "heartbeat of held stream entries failed");
            }
        }
        if let Err(e) = trim(&i).await {
            debug!(error = %e, "trimming the stream failed");
        }
    }
}

#[async_trait]
impl Source for RedisStream {
    fn queue(&self) -> &str {
        &self.inner.opts.stream
    }

    fn system(&self) -> &'static str {
        "redis"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = Instant::now() + wait;
        loop {
            let (mut got, due) = self.ready(max).await?;
            if got.len() < max {
                // What the ready script took is held: a failed read must not drop it.
                match self.fresh(max - got.len()).await {
                    Ok(more) => got.extend(more),
                    Err(e) if got.is_empty() => return Err(e),
                    Err(e) => debug!(error = %e, "reading new stream entries failed"),
                }
            }
            if !got.is_empty() {
                return Ok(got);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(got);
            }
            // Wake for new entries, for the next delayed retry, and at least every half
            // lease to take over what a dead consumer left.
            let mut step = left.min(self.inner.opts.lease / 2);
            if let Some(due) = due {
                step = step.min(due.max(Duration::from_millis(1)));
            }
            let got = self.block(max, step).await?;
            if !got.is_empty() {
                return Ok(got);
            }
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        let tokens = receipts
            .iter()
            .map(|r| Self::token(r))
            .collect::<Result<Vec<_>>>()?;
        self.settle("ack", Duration::ZERO, 0, &[], &tokens).await?;
        Ok(())
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = Self::token(receipt)?;
        self.settle("nack", delay, t.attempt, &[], &[t]).await?;
        Ok(())
    }

    /// One settle call per attempt number among `receipts` (a released delivery keeps
    /// the attempts it had before). After a failed call the rest are let go unsettled, as
    /// the failed one was: their leases run out and another consumer takes them.
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        let tokens = receipts
            .iter()
            .map(|r| Self::token(r))
            .collect::<Result<Vec<_>>>()?;
        let mut by_attempt: std::collections::BTreeMap<u32, Vec<&Token>> = Default::default();
        for t in tokens {
            by_attempt.entry(t.attempt).or_default().push(t);
        }
        for (attempt, group) in &by_attempt {
            let attempts = attempt.saturating_sub(1);
            if let Err(e) = self
                .settle("release", Duration::ZERO, attempts, &[], group)
                .await
            {
                self.unhold(by_attempt.values().flatten().copied());
                return Err(e);
            }
        }
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = Self::token(&delivery.receipt)?;
        self.settle("dead", Duration::ZERO, 0, &reason_args(reason), &[t])
            .await?;
        Ok(())
    }

    /// Lets go of what this consumer holds as a dead process would: the heartbeat stops
    /// touching it, and the entries are taken over after their lease.
    async fn abandon(&self) {
        lock(&self.inner.held).clear();
    }

    fn redelivery_delay(&self) -> Duration {
        self.inner.opts.lease
    }
}

#[async_trait]
impl Publisher for RedisStream {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    /// One `MULTI`/`EXEC` of `XADD`s: all entries are written, or none.
    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for m in messages {
            let fields = codec::fields(m);
            pipe.cmd("XADD").arg(&self.inner.opts.stream).arg("*");
            for (k, v) in &fields {
                pipe.arg(*k).arg(v.as_slice());
            }
            pipe.ignore();
        }
        let _: () = pipe
            .query_async(&mut self.inner.conn.clone())
            .await
            .map_err(|e| redis("publishing to the stream", e))?;
        Ok(())
    }
}

fn internal(what: String) -> Error {
    Error::new(ErrorKind::Internal, what)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
