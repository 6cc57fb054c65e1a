//! What tools ask of a topology without consuming from it: the depths the broker counts,
//! the dead letters (read in place, or drained), deleting it all; and the
//! [`Inspect`](justonce_core::Inspect) capability of the publisher and the source.

use async_trait::async_trait;
use lapin::options::{BasicAckOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use justonce_core::{DeadLetter, Error, Inspect, Message, Result};

use crate::error::amqp;
use crate::{codec, AmqpPublisher, AmqpSource};

impl AmqpPublisher {
    /// Messages ready in `queue` (one of
    /// [`AmqpOptions::queues`](crate::AmqpOptions::queues)), as the broker counts them.
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
        for queue in self.options().waiting_queues() {
            n += u64::from(self.ready(&queue).await?);
        }
        Ok(n)
    }

    /// The messages in the dead-letter queue, taken off it (acked): for tests and tools.
    pub async fn drain_dead_letters(&self) -> Result<Vec<Message>> {
        let channel = self.channel().await?;
        let got = fetch_dead_letters(self, &channel, true).await?;
        Ok(got.into_iter().map(|d| d.message).collect())
    }

    /// The messages in the dead-letter queue, left there: each is fetched unacked on a
    /// channel of its own, which is then closed, so the broker puts them all back.
    pub async fn read_dead_letters(&self) -> Result<Vec<DeadLetter>> {
        let channel = self.fresh_channel().await?;
        let got = fetch_dead_letters(self, &channel, false).await;
        let _ = channel
            .close(200, "justonce: dead letters read".into())
            .await;
        got
    }

    /// Deletes every queue and exchange of the topology: for tests and the demo.
    pub async fn delete_topology(&self) -> Result<()> {
        let channel = self.channel().await?;
        for q in self.options().queues() {
            channel
                .queue_delete(
                    q.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await
                .map_err(|e| amqp(format!("deleting queue {q}"), e))?;
        }
        let mut exchanges: Vec<&str> = self.options().own_exchange().into_iter().collect();
        if let crate::DeadLetters::Declare { exchange, .. } = &self.options().dead_letters {
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
}

impl AmqpSource {
    /// Messages ready in `queue` (one of [`AmqpOptions::queues`](crate::AmqpOptions::queues)),
    /// as the broker counts them.
    pub async fn ready(&self, queue: &str) -> Result<u32> {
        self.publisher().ready(queue).await
    }

    /// Messages the broker still owes a consumer: those in flight on this source plus those
    /// ready in the work queue and the retry tiers (dead letters excluded). Counted by the
    /// broker, except in-flight ones; a closed channel's deliveries reappear as ready a moment
    /// after the close, so treat a single zero as provisional.
    pub async fn pending(&self) -> Result<u64> {
        Ok(self.in_flight() as u64 + self.publisher().backlog().await?)
    }

    /// The messages in the dead-letter queue, taken off it (acked): for tests and tools.
    pub async fn drain_dead_letters(&self) -> Result<Vec<Message>> {
        self.publisher().drain_dead_letters().await
    }

    /// Deletes every queue and exchange of the topology: for tests and the demo.
    pub async fn delete_topology(&self) -> Result<()> {
        self.publisher().delete_topology().await?;
        self.abandon().await;
        Ok(())
    }
}

#[async_trait]
impl Inspect for AmqpPublisher {
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

#[async_trait]
impl Inspect for AmqpSource {
    /// In flight on this source, plus ready in the work queue and the retry tiers.
    async fn pending(&self) -> Result<u64> {
        AmqpSource::pending(self).await
    }

    /// The deliveries this source received, counted from the broker's frames as they arrive.
    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(self.delivery_counts().0))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        self.publisher().read_dead_letters().await
    }

    async fn cleanup(&self) -> Result<()> {
        self.delete_topology().await
    }
}

/// Every message of the dead-letter queue, fetched on `channel` and acked when `take`. A
/// topology whose dead letters go to an exchange of the user's has no queue to read.
async fn fetch_dead_letters(
    p: &AmqpPublisher,
    channel: &lapin::Channel,
    take: bool,
) -> Result<Vec<DeadLetter>> {
    let Some(q) = p.options().dead_letter_queue() else {
        let (exchange, key) = p.options().dead_letter_target();
        return Err(Error::config(format!(
            "dead letters go to the existing exchange {exchange} (routing key {key}), not to \
             a queue of justonce's: read them where that exchange routes them"
        )));
    };
    let mut out = Vec::new();
    loop {
        let got = channel
            .basic_get(q.into(), lapin::options::BasicGetOptions::default())
            .await
            .map_err(|e| amqp("reading the dead-letter queue", e))?;
        let Some(got) = got else { break };
        let d = &got.delivery;
        out.push(codec::dead_letter(codec::message(&d.properties, &d.data)));
        if take {
            channel
                .basic_ack(d.delivery_tag, BasicAckOptions::default())
                .await
                .map_err(|e| amqp("acking a dead letter", e))?;
        }
    }
    Ok(out)
}
