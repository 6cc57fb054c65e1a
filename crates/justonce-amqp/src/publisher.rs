use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{
    BasicAckOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;
use tracing::warn;

use justonce_core::{DeadLetter, DeadLetterReason, Error, ErrorKind, Message, Publisher, Result};

use crate::error::{amqp, connect};
use crate::{topology, AmqpOptions};

/// Opens a connection and a channel, and declares the topology on it.
pub(crate) async fn open(url: &str, opts: &AmqpOptions) -> Result<(Connection, Channel)> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| connect(url, e))?;
    if let Err(e) = topology::declare(&conn, opts).await {
        close_quietly(&conn, 200, "justonce: topology refused").await;
        return Err(e);
    }
    let channel = conn
        .create_channel()
        .await
        .map_err(|e| amqp("opening a channel", e))?;
    Ok((conn, channel))
}

/// Closes a connection, giving up after two seconds: a connection whose socket already
/// broke may never answer the close.
pub(crate) async fn close_quietly(conn: &Connection, code: u16, text: &str) {
    let _ = tokio::time::timeout(Duration::from_secs(2), conn.close(code, text.into())).await;
}

/// A message as AMQP properties: persistent (delivery mode 2), `message_id` set from the
/// message's id, its headers, plus `extra` headers.
pub(crate) fn properties(m: &Message, extra: &[(String, String)]) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (k, v) in m
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    {
        headers.insert(k.into(), AMQPValue::LongString(LongString::from(v)));
    }
    let mut p = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = m.id() {
        p = p.with_message_id(id.as_str().into());
    }
    if let Some(ct) = m.content_type() {
        p = p.with_content_type(ct.into());
    }
    p
}

/// A publisher with confirms: a publish returns `Ok` only once the broker has confirmed
/// it, which for a persistent message routed to a durable queue means "written".
///
/// Messages are persistent and `mandatory`: an unroutable message is an error to the caller,
/// not a silent ack. Up to `confirm_window` publishes are in flight at once. A nack, a
/// confirm timeout or a lost connection re-sends with the same message id, so the duplicate
/// it may create is caught by the consumer's dedup.
///
/// ```no_run
/// use justonce_amqp::{AmqpOptions, AmqpPublisher};
/// use justonce_core::{Message, Publisher};
///
/// # async fn run() -> justonce_core::Result<()> {
/// let publisher = AmqpPublisher::connect("amqp://guest:guest@127.0.0.1:5672/%2f", AmqpOptions::new("orders")).await?;
/// publisher.publish(&Message::new(r#"{"order_id":"ORD-1"}"#).with_id("ORD-1")?).await?;
/// # Ok(()) }
/// ```
pub struct AmqpPublisher {
    url: String,
    opts: AmqpOptions,
    live: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("url", &justonce_core::redact_url(&self.url))
            .field("queue", &self.opts.queue)
            .finish()
    }
}

impl AmqpPublisher {
    /// Connects, declares the topology and enables confirms. Fails with a clear error when
    /// the broker cannot be reached.
    pub async fn connect(url: &str, opts: AmqpOptions) -> Result<Self> {
        opts.validate()?;
        let p = AmqpPublisher {
            url: url.to_owned(),
            opts,
            live: Mutex::new(None),
        };
        p.channel().await?;
        Ok(p)
    }

    /// The options.
    pub fn options(&self) -> &AmqpOptions {
        &self.opts
    }

    /// Messages ready in `queue` (one of [`AmqpOptions::queues`]), as the broker counts them.
    pub async fn ready(&self, queue: &str) -> Result<u32> {
        let channel = self.channel().await?;
        let q = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| amqp(format!("reading the depth of {queue}"), e))?;
        Ok(q.message_count())
    }

    /// Messages ready in the work queue and the retry tiers (dead letters excluded), as the
    /// broker counts them; deliveries unacked at consumers are not counted. For monitors
    /// that must not consume (the lab).
    pub async fn backlog(&self) -> Result<u64> {
        let mut n = 0;
        for queue in self.opts.waiting_queues() {
            n += u64::from(self.ready(&queue).await?);
        }
        Ok(n)
    }

    /// The messages in the dead-letter queue, taken off it (acked): for tests and tools.
    pub async fn drain_dead_letters(&self) -> Result<Vec<Message>> {
        let Some(q) = self.opts.dead_letter_queue() else {
            let (exchange, key) = self.opts.dead_letter_target();
            return Err(Error::config(format!(
                "dead letters go to the existing exchange {exchange} (routing key {key}), not to \
                 a queue of justonce's: read them where that exchange routes them"
            )));
        };
        let channel = self.channel().await?;
        let mut out = Vec::new();
        loop {
            let got = channel
                .basic_get(q.into(), lapin::options::BasicGetOptions::default())
                .await
                .map_err(|e| amqp("reading the dead-letter queue", e))?;
            let Some(got) = got else { break };
            out.push(crate::source::to_message(&got.delivery));
            channel
                .basic_ack(got.delivery.delivery_tag, BasicAckOptions::default())
                .await
                .map_err(|e| amqp("acking a dead letter", e))?;
        }
        Ok(out)
    }

    /// The messages in the dead-letter queue, left there: each is fetched unacked on a
    /// channel of its own, which is then closed, so the broker puts them all back.
    pub async fn read_dead_letters(&self) -> Result<Vec<DeadLetter>> {
        let Some(q) = self.opts.dead_letter_queue() else {
            let (exchange, key) = self.opts.dead_letter_target();
            return Err(Error::config(format!(
                "dead letters go to the existing exchange {exchange} (routing key {key}), not to \
                 a queue of justonce's: read them where that exchange routes them"
            )));
        };
        let channel = self.fresh_channel().await?;
        let mut out = Vec::new();
        loop {
            let got = channel
                .basic_get(q.into(), lapin::options::BasicGetOptions::default())
                .await
                .map_err(|e| amqp("reading the dead-letter queue", e))?;
            let Some(got) = got else { break };
            out.push(dead_letter_of(&got.delivery));
        }
        let _ = channel
            .close(200, "justonce: dead letters read".into())
            .await;
        Ok(out)
    }

    /// Deletes every queue and exchange of the topology: for tests and the demo.
    pub async fn delete_topology(&self) -> Result<()> {
        let channel = self.channel().await?;
        for q in self.opts.queues() {
            channel
                .queue_delete(
                    q.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await
                .map_err(|e| amqp(format!("deleting queue {q}"), e))?;
        }
        let mut exchanges: Vec<&str> = self.opts.own_exchange().into_iter().collect();
        if let crate::DeadLetters::Declare { exchange, .. } = &self.opts.dead_letters {
            exchanges.push(exchange);
        }
        for x in exchanges {
            channel
                .exchange_delete(x.into(), lapin::options::ExchangeDeleteOptions::default())
                .await
                .map_err(|e| amqp(format!("deleting exchange {x}"), e))?;
        }
        Ok(())
    }

    async fn channel(&self) -> Result<Channel> {
        let mut live = self.live.lock().await;
        if let Some((conn, ch)) = live.as_ref() {
            if conn.status().connected() && ch.status().connected() {
                return Ok(ch.clone());
            }
        }
        let (conn, ch) = open(&self.url, &self.opts).await?;
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| amqp("enabling publisher confirms", e))?;
        *live = Some((conn, ch.clone()));
        Ok(ch)
    }

    /// A new channel on the publisher's connection (opened if needed), for work that may
    /// close its channel or leave it in a state the publishing channel must not be in.
    async fn fresh_channel(&self) -> Result<Channel> {
        self.channel().await?;
        let live = self.live.lock().await;
        let (conn, _) = live
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Closed, "the publisher's connection closed"))?;
        conn.create_channel()
            .await
            .map_err(|e| amqp("opening a channel", e))
    }

    async fn reset(&self) {
        if let Some((conn, _)) = self.live.lock().await.take() {
            close_quietly(&conn, 200, "justonce publisher reset").await;
        }
    }

    /// Publishes `message` and does not wait for its confirm: a publisher that timed out on
    /// it. The demo and lab use it to make a real duplicate: the same id published again.
    pub async fn publish_without_confirm(&self, message: &Message) -> Result<()> {
        let ch = self.channel().await?;
        let (exchange, key) = self.opts.publish_target();
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            message.payload(),
            properties(message, &[]),
        )
        .await
        .map_err(|e| amqp("publishing", e))?;
        Ok(())
    }

    /// Publishes `items` (payload, properties) to `exchange` with `routing_key`, confirmed,
    /// in windows, re-sending what was not confirmed.
    pub(crate) async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        items: &[(&[u8], BasicProperties)],
    ) -> Result<()> {
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let mut last_error = None;
        for round in 0..=self.opts.publish_retries {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(100 * 2u64.pow(round.min(6)))).await;
            }
            let ch = match self.channel().await {
                Ok(ch) => ch,
                Err(e) if e.is_transient() => {
                    warn!(error = %e, "publisher cannot reach the broker; will retry");
                    last_error = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut failed = Vec::new();
            for window in pending.chunks(self.opts.confirm_window) {
                let mut confirms = Vec::with_capacity(window.len());
                for &i in window {
                    let (payload, props) = &items[i];
                    let sent = ch
                        .basic_publish(
                            exchange.into(),
                            routing_key.into(),
                            BasicPublishOptions {
                                mandatory: true,
                                ..BasicPublishOptions::default()
                            },
                            payload,
                            props.clone(),
                        )
                        .await;
                    match sent {
                        Ok(confirm) => confirms.push((i, confirm)),
                        Err(e) => {
                            last_error = Some(amqp("publishing", e));
                            failed.push(i);
                        }
                    }
                }
                for (i, confirm) in confirms {
                    match tokio::time::timeout(self.opts.confirm_timeout, confirm).await {
                        Ok(Ok(Confirmation::Ack(None))) => {}
                        Ok(Ok(
                            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)),
                        )) => {
                            return Err(Error::new(
                                ErrorKind::InvalidInput,
                                format!(
                                    "message {} is unroutable: exchange `{exchange}` has no queue bound for \
                                     routing key `{routing_key}` ({} {}); declare the topology first",
                                    items[i].1.message_id().as_ref().map_or("(no id)", |s| s.as_str()),
                                    returned.reply_code,
                                    returned.reply_text
                                ),
                            ));
                        }
                        Ok(Ok(Confirmation::Nack(None))) => {
                            last_error =
                                Some(Error::new(ErrorKind::Busy, "the broker nacked a publish"));
                            failed.push(i);
                        }
                        Ok(Ok(Confirmation::NotRequested)) => {
                            last_error = Some(Error::new(
                                ErrorKind::Closed,
                                "confirms are not enabled on the channel",
                            ));
                            failed.push(i);
                        }
                        Ok(Err(e)) => {
                            last_error = Some(amqp("waiting for a publisher confirm", e));
                            failed.push(i);
                        }
                        Err(_) => {
                            last_error = Some(Error::new(
                                ErrorKind::Timeout,
                                format!(
                                    "no publisher confirm within {:?}",
                                    self.opts.confirm_timeout
                                ),
                            ));
                            failed.push(i);
                        }
                    }
                }
            }
            if failed.is_empty() {
                return Ok(());
            }
            warn!(
                unconfirmed = failed.len(),
                round, "re-sending unconfirmed publishes with the same ids"
            );
            self.reset().await;
            pending = failed;
        }
        Err(last_error.unwrap_or_else(|| Error::new(ErrorKind::Timeout, "publish not confirmed")))
    }
}

#[async_trait]
impl Publisher for AmqpPublisher {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        let items: Vec<(&[u8], BasicProperties)> = messages
            .iter()
            .map(|m| (m.payload(), properties(m, &[])))
            .collect();
        let (exchange, key) = self.opts.publish_target();
        self.send(exchange, key, &items).await
    }
}

/// A dead letter read back: its reason from our headers or, for one the broker dead-lettered
/// itself (a quorum queue's delivery limit), from the broker's `x-first-death-*` headers.
fn dead_letter_of(d: &lapin::message::Delivery) -> DeadLetter {
    let message = crate::source::to_message(d);
    let h = message.headers();
    let reason = DeadLetterReason::from_headers(h).unwrap_or_else(|| DeadLetterReason {
        error: format!(
            "dead-lettered by the broker: {}",
            h.get("x-first-death-reason")
                .map_or("no reason given", |r| r.as_str())
        ),
        attempts: h
            .get("x-delivery-count")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
        source_queue: h.get("x-first-death-queue").cloned().unwrap_or_default(),
        consumer: String::new(),
    });
    DeadLetter { message, reason }
}

#[async_trait]
impl justonce_core::Inspect for AmqpPublisher {
    /// Messages ready in the work queue and the retry tiers, as the broker counts them (a
    /// publisher sees none in flight at consumers).
    async fn pending(&self) -> Result<u64> {
        self.backlog().await
    }

    /// `None`: a publisher sees no deliveries.
    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        self.read_dead_letters().await
    }

    async fn cleanup(&self) -> Result<()> {
        self.delete_topology().await
    }
}
