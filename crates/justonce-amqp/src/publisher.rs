use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::Mutex;
use tracing::warn;

use justonce_core::{Error, ErrorKind, Message, Publisher, Result};

use crate::codec::properties;
use crate::connection::{close_quietly, open};
use crate::error::amqp;
use crate::AmqpOptions;

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

    /// The publishing channel, with confirms on; reopened (connection, topology) if it
    /// broke.
    pub(crate) async fn channel(&self) -> Result<Channel> {
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
    pub(crate) async fn fresh_channel(&self) -> Result<Channel> {
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
