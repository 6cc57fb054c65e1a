use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, BasicRejectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::{mpsc, Mutex};
use tracing::warn;

use justonce_core::{
    DeadLetterReason, Delivery, Error, Message, Publisher, Receipt, Result, Source,
};

use crate::codec::{self, properties, ATTEMPTS_HEADER};
use crate::connection::{close_quietly, open};
use crate::error::amqp;
use crate::{acks, AmqpOptions, AmqpPublisher};

/// A RabbitMQ consumer with manual acks.
///
/// Deliveries are leased by the channel: an unacked delivery returns to the queue, with
/// `redelivered` set, when the channel closes (a crash, a lost connection, a broker
/// restart). Acks go out only when the runtime settles (after its commit), with
/// `multiple=true` where the tags are contiguous. A nack with a delay waits in a retry tier;
/// a dead letter is published to the dead-letter exchange, confirmed, before the original
/// is acked. A lost connection is survived: the next receive reconnects with the topology
/// re-declared; acks of the old channel's deliveries are dropped (the broker redelivers
/// them, and the consumer's dedup absorbs them).
///
/// ```no_run
/// use justonce_amqp::{AmqpOptions, AmqpSource};
///
/// # async fn run() -> justonce_core::Result<()> {
/// let source = AmqpSource::connect("amqp://guest:guest@127.0.0.1:5672/%2f", AmqpOptions::new("orders")).await?;
/// // Consumer::new(options, source, store, handler)
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AmqpSource {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    opts: AmqpOptions,
    live: Mutex<Option<Live>>,
    rx: Mutex<mpsc::UnboundedReceiver<(u64, lapin::message::Delivery)>>,
    tx: mpsc::UnboundedSender<(u64, lapin::message::Delivery)>,
    generation: AtomicU64,
    outstanding: std::sync::Mutex<BTreeSet<u64>>,
    /// Deliveries the runtime released ([`Source::release`]): still unacked on their
    /// channel, handed out again by the next receive before anything new, so that no
    /// requeue counts an attempt (a quorum queue's `x-delivery-count`, its delivery limit).
    released: std::sync::Mutex<std::collections::VecDeque<Token>>,
    /// Held while acks and nacks are computed and sent: a `multiple` ack sent ahead of an
    /// earlier one would cover its tags, and the earlier one would then name tags the
    /// broker no longer knows, which closes the channel.
    settle_order: Mutex<()>,
    publisher: AmqpPublisher,
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
}

struct Live {
    conn: Connection,
    channel: Channel,
    generation: u64,
    broken: Arc<AtomicBool>,
}

#[derive(Debug, Clone)]
struct Token {
    generation: u64,
    tag: u64,
    attempt: u32,
    redelivered: bool,
    message: Message,
}

impl std::fmt::Debug for AmqpSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSource")
            .field("url", &justonce_core::redact_url(&self.inner.url))
            .field("queue", &self.inner.opts.queue)
            .finish()
    }
}

impl AmqpSource {
    /// Connects, declares the topology and starts consuming. Fails with a clear error when
    /// the broker cannot be reached.
    pub async fn connect(url: &str, opts: AmqpOptions) -> Result<Self> {
        opts.validate()?;
        let publisher = AmqpPublisher::connect(url, opts.clone()).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let source = AmqpSource {
            inner: Arc::new(Inner {
                url: url.to_owned(),
                opts,
                live: Mutex::new(None),
                rx: Mutex::new(rx),
                tx,
                generation: AtomicU64::new(0),
                outstanding: std::sync::Mutex::new(BTreeSet::new()),
                released: std::sync::Mutex::new(std::collections::VecDeque::new()),
                settle_order: Mutex::new(()),
                publisher,
                deliveries: AtomicU64::new(0),
                redeliveries: AtomicU64::new(0),
            }),
        };
        source.live().await?;
        Ok(source)
    }

    /// The options.
    pub fn options(&self) -> &AmqpOptions {
        &self.inner.opts
    }

    /// Deliveries this source received, and how many of them the broker marked redelivered
    /// (counted where they arrive, from the broker's frames).
    pub fn delivery_counts(&self) -> (u64, u64) {
        (
            self.inner.deliveries.load(Ordering::Relaxed),
            self.inner.redeliveries.load(Ordering::Relaxed),
        )
    }

    /// Deliveries received on the current channel and not yet acked.
    pub fn in_flight(&self) -> usize {
        self.inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Publishes without waiting for the confirm; see
    /// [`AmqpPublisher::publish_without_confirm`].
    pub async fn publish_without_confirm(&self, message: &Message) -> Result<()> {
        self.inner.publisher.publish_without_confirm(message).await
    }

    /// Closes the channel and connection without acking, as a crashed process would: the
    /// broker returns every unacked delivery to the queue as a redelivery. The next receive
    /// reconnects.
    pub async fn abandon(&self) {
        let live = self.inner.live.lock().await.take();
        self.inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        if let Some(live) = live {
            live.broken.store(true, Ordering::SeqCst);
            close_quietly(
                &live.conn,
                320,
                "justonce: consumer abandoned its deliveries",
            )
            .await;
        }
    }

    /// The publisher this source sends retries and dead letters with.
    pub(crate) fn publisher(&self) -> &AmqpPublisher {
        &self.inner.publisher
    }

    /// The current channel and its generation, reconnecting if it broke.
    async fn live(&self) -> Result<(Channel, u64)> {
        let inner = &self.inner;
        let mut live = inner.live.lock().await;
        if let Some(l) = live.as_ref() {
            if !l.broken.load(Ordering::SeqCst) && l.channel.status().connected() {
                return Ok((l.channel.clone(), l.generation));
            }
        }
        if let Some(old) = live.take() {
            close_quietly(&old.conn, 200, "justonce: reconnecting").await;
        }
        let (conn, channel) = open(&inner.url, &inner.opts).await?;
        channel
            .basic_qos(inner.opts.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| amqp("setting prefetch", e))?;
        let consumer = channel
            .basic_consume(
                inner.opts.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| amqp(format!("consuming from {}", inner.opts.queue), e))?;
        let generation = inner.generation.fetch_add(1, Ordering::SeqCst) + 1;
        inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let broken = Arc::new(AtomicBool::new(false));
        let (tx, flag) = (inner.tx.clone(), broken.clone());
        tokio::spawn(async move {
            let mut consumer = consumer;
            while let Some(next) = consumer.next().await {
                match next {
                    Ok(d) => {
                        if tx.send((generation, d)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let text = e.to_string();
                        if text.contains("acknowledgement") && text.contains("timed out") {
                            tracing::error!(
                                error = %text,
                                "a batch took longer than the broker's consumer_timeout to be acked: \
                                 RabbitMQ closed the channel and will redeliver its deliveries (dedup \
                                 absorbs them). Make batches smaller or handlers faster, or raise \
                                 consumer_timeout in rabbitmq.conf"
                            );
                        } else {
                            warn!(error = %text, "RabbitMQ consumer stopped; reconnecting on the next receive");
                        }
                        break;
                    }
                }
            }
            flag.store(true, Ordering::SeqCst);
        });
        *live = Some(Live {
            conn,
            channel: channel.clone(),
            generation,
            broken,
        });
        Ok((channel, generation))
    }

    fn take(&self, generation: u64, d: lapin::message::Delivery) -> Delivery {
        let attempt = codec::attempt(&d.properties, d.redelivered);
        let message = codec::message(&d.properties, &d.data);
        self.inner
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(d.delivery_tag);
        self.inner.deliveries.fetch_add(1, Ordering::Relaxed);
        if d.redelivered || attempt > 1 {
            self.inner.redeliveries.fetch_add(1, Ordering::Relaxed);
        }
        redeliver(Token {
            generation,
            tag: d.delivery_tag,
            attempt,
            redelivered: d.redelivered || attempt > 1,
            message,
        })
    }

    /// Up to `max` released deliveries of the current channel, oldest first; those of a
    /// channel that closed are dropped (the broker requeued them).
    fn take_released(&self, generation: u64, max: usize) -> Vec<Delivery> {
        let mut released = self
            .inner
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        released.retain(|t| t.generation == generation);
        let n = released.len().min(max);
        released.drain(..n).map(redeliver).collect()
    }

    /// Acks the `(generation, tag)` pairs of the current channel, `multiple` over the
    /// longest run of the oldest outstanding tags. Tags of a channel that closed, or not
    /// outstanding (already acked), are skipped: acking an unknown tag closes the channel.
    async fn ack_tags(&self, tags: &[(u64, u64)]) -> Result<()> {
        let _order = self.inner.settle_order.lock().await;
        let Some((channel, current)) = self.current().await else {
            return Ok(());
        };
        let (multiple, singles) = {
            let mut out = self
                .inner
                .outstanding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let wanted = tags
                .iter()
                .filter(|(generation, _)| *generation == current)
                .map(|(_, tag)| *tag);
            acks::plan(&mut out, wanted)
        };
        if let Some(t) = multiple {
            channel
                .basic_ack(t, BasicAckOptions { multiple: true })
                .await
                .map_err(|e| amqp("acking", e))?;
        }
        for t in singles {
            channel
                .basic_ack(t, BasicAckOptions::default())
                .await
                .map_err(|e| amqp("acking", e))?;
        }
        Ok(())
    }

    async fn current(&self) -> Option<(Channel, u64)> {
        let live = self.inner.live.lock().await;
        live.as_ref()
            .filter(|l| !l.broken.load(Ordering::SeqCst))
            .map(|l| (l.channel.clone(), l.generation))
    }
}

/// A delivery for `t`, which stays the receipt.
fn redeliver(t: Token) -> Delivery {
    Delivery {
        message: t.message.clone(),
        attempt: t.attempt,
        redelivered: t.redelivered,
        receipt: Receipt::new(t),
    }
}

fn token(receipt: &Receipt) -> Result<&Token> {
    receipt
        .downcast_ref::<Token>()
        .ok_or_else(|| Error::config("receipt does not belong to an AmqpSource"))
}

#[async_trait]
impl Source for AmqpSource {
    fn queue(&self) -> &str {
        &self.inner.opts.queue
    }

    fn system(&self) -> &'static str {
        "rabbitmq"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = self.inner.rx.lock().await;
        loop {
            // Reconnects if the channel broke while we waited: its deliveries are back in
            // the queue, and only a new channel receives them.
            let (_, generation) = self.live().await?;
            let released = self.take_released(generation, max);
            if !released.is_empty() {
                return Ok(released);
            }
            let slice = (tokio::time::Instant::now() + Duration::from_millis(100)).min(deadline);
            let mut out = Vec::new();
            if let Ok(Some(first)) = tokio::time::timeout_at(slice, rx.recv()).await {
                let mut next = Some(first);
                while let Some((gen, d)) = next.take() {
                    // A delivery of a channel that has closed: the broker requeued it already.
                    if gen == generation {
                        out.push(self.take(gen, d));
                    }
                    if out.len() < max {
                        // The broker pushes a burst frame by frame: gather until a short gap.
                        next = tokio::time::timeout(Duration::from_millis(2), rx.recv())
                            .await
                            .unwrap_or_default();
                    }
                }
            }
            if !out.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(out);
            }
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        let tags = receipts
            .iter()
            .map(|r| token(r).map(|t| (t.generation, t.tag)))
            .collect::<Result<Vec<_>>>()?;
        self.ack_tags(&tags).await
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = token(receipt)?;
        // Without retry tiers a retry is requeued at once (documented on `retry_delays`).
        if delay.is_zero() || self.inner.opts.retry_delays.is_empty() {
            let _order = self.inner.settle_order.lock().await;
            if let Some((channel, current)) = self.current().await {
                let owned = self
                    .inner
                    .outstanding
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&t.tag);
                // `basic.reject`, not `basic.nack`: from RabbitMQ 4.3 only a reject counts
                // towards a quorum queue's delivery limit, which dead-letters a message
                // that keeps failing.
                if current == t.generation && owned {
                    channel
                        .basic_reject(t.tag, BasicRejectOptions { requeue: true })
                        .await
                        .map_err(|e| amqp("rejecting", e))?;
                }
            }
            return Ok(());
        }
        // Through a retry tier: the copy is confirmed before the original is acked.
        let tier = self.inner.opts.retry_queue(delay);
        let extra = [(ATTEMPTS_HEADER.to_owned(), t.attempt.to_string())];
        let props = properties(&t.message, &extra);
        self.inner
            .publisher
            .send("", &tier, &[(t.message.payload(), props)])
            .await?;
        self.ack_tags(&[(t.generation, t.tag)]).await
    }

    /// Keeps the deliveries unacked on their channel and hands them out again from the
    /// next receive: the broker never sees them come back, so nothing counts an attempt.
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        let Some((_, current)) = self.current().await else {
            return Ok(());
        };
        let tokens = receipts
            .iter()
            .map(|r| token(r))
            .collect::<Result<Vec<_>>>()?;
        let held: Vec<Token> = {
            let outstanding = self
                .inner
                .outstanding
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            tokens
                .into_iter()
                .filter(|t| t.generation == current && outstanding.contains(&t.tag))
                .cloned()
                .collect()
        };
        self.inner
            .released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(held);
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = token(&delivery.receipt)?;
        let mut extra: Vec<(String, String)> = reason.to_headers().into_iter().collect();
        extra.push((ATTEMPTS_HEADER.to_owned(), t.attempt.to_string()));
        // The time it died, as AMQP's `timestamp` property (seconds): what `justonce dlq`
        // shows as first and last failure.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let props = properties(&delivery.message, &extra).with_timestamp(now);
        let (exchange, key) = self.inner.opts.dead_letter_target();
        self.inner
            .publisher
            .send(exchange, key, &[(delivery.message.payload(), props)])
            .await?;
        self.ack_tags(&[(t.generation, t.tag)]).await
    }

    async fn abandon(&self) {
        AmqpSource::abandon(self).await
    }

    fn redelivery_delay(&self) -> Duration {
        self.inner.opts.redelivery_delay()
    }
}

#[async_trait]
impl Publisher for AmqpSource {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.inner.publisher.publish(message).await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        self.inner.publisher.publish_batch(messages).await
    }
}
