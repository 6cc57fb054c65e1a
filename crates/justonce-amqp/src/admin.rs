//! What tools ask of a topology without consuming from it: the depths the broker counts,
//! the dead letters (read in place, or drained), deleting it all; and the
//! [`Inspect`](justonce_core::Inspect) capability of the publisher and the source.

use async_trait::async_trait;
use lapin::options::{BasicAckOptions, QueueDeclareOptions};
use lapin::types::FieldTable;

use justonce_core::{
    no_such_dead_letter, DeadLetter, DeadLetterEntry, Error, Inspect, Message, Replay, Result,
};

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
        Ok(got.into_iter().map(|e| e.letter.message).collect())
    }

    /// The messages in the dead-letter queue, left there: each is fetched unacked on a
    /// channel of its own, which is then closed, so the broker puts them all back.
    pub async fn read_dead_letters(&self) -> Result<Vec<DeadLetter>> {
        let entries = self.read_dead_letter_entries().await?;
        Ok(entries.into_iter().map(|e| e.letter).collect())
    }

    /// As [`AmqpPublisher::read_dead_letters`], keyed by position (1 for the oldest), with
    /// the time each died where the source recorded it.
    pub async fn read_dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        let channel = self.fresh_channel().await?;
        let got = fetch_dead_letters(self, &channel, false).await;
        let _ = channel
            .close(200, "justonce: dead letters read".into())
            .await;
        got
    }

    /// Replays (`Some`) or purges (`None`) the dead letters at positions `keys` (1 for the
    /// oldest, as [`Inspect::dead_letter_entries`] numbers them). The dead-letter queue is
    /// fetched unacked on a channel of its own; a replay publishes the chosen messages to
    /// the work queue (or `replay.to`) through the default exchange and waits for their
    /// confirms; only then are they acked off the dead letters, and the channel's close
    /// puts the others back. A key past the end, or a target queue that does not exist,
    /// moves nothing. An interrupted replay leaves a message in both places, and replaying it
    /// again publishes the same id.
    pub async fn move_dead_letters(&self, keys: &[String], replay: Option<&Replay>) -> Result<u64> {
        let Some(dlq) = self.options().dead_letter_queue().map(str::to_owned) else {
            return Err(no_dead_letter_queue(self));
        };
        let target = replay.map(|r| r.to.clone().unwrap_or_else(|| self.options().queue.clone()));
        if let Some(t) = &target {
            // On a channel of its own: a refused passive declare closes its channel.
            let ch = self.fresh_channel().await?;
            let found = ch
                .queue_declare(
                    t.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            let _ = ch.close(200, "justonce: queue checked".into()).await;
            if let Err(e) = found {
                return Err(Error::with_source(
                    justonce_core::ErrorKind::Config,
                    format!("no queue {t} on the broker to replay into"),
                    amqp(format!("checking queue {t}"), e),
                ));
            }
        }
        let channel = self.fresh_channel().await?;
        let moved = async {
            let mut got = Vec::new();
            loop {
                let next = channel
                    .basic_get(
                        dlq.as_str().into(),
                        lapin::options::BasicGetOptions::default(),
                    )
                    .await
                    .map_err(|e| amqp("reading the dead-letter queue", e))?;
                let Some(next) = next else { break };
                let d = &next.delivery;
                got.push((
                    d.delivery_tag,
                    codec::dead_letter(codec::message(&d.properties, &d.data)),
                ));
            }
            let mut chosen = Vec::with_capacity(keys.len());
            for key in keys {
                let i = key
                    .parse::<usize>()
                    .ok()
                    .filter(|i| (1..=got.len()).contains(i))
                    .ok_or_else(|| no_such_dead_letter(key))?;
                chosen.push(i - 1);
            }
            chosen.sort_unstable();
            chosen.dedup();
            if let (Some(t), Some(r)) = (&target, replay) {
                let messages: Vec<Message> = chosen
                    .iter()
                    .map(|i| codec::for_replay(got[*i].1.replay_message(r)))
                    .collect();
                let items: Vec<(&[u8], lapin::BasicProperties)> = messages
                    .iter()
                    .map(|m| (m.payload(), codec::properties(m, &[])))
                    .collect();
                self.send("", t, &items).await?;
            }
            for i in &chosen {
                channel
                    .basic_ack(got[*i].0, BasicAckOptions::default())
                    .await
                    .map_err(|e| amqp("acking a dead letter", e))?;
            }
            Ok(chosen.len() as u64)
        }
        .await;
        let _ = channel
            .close(200, "justonce: dead letters moved".into())
            .await;
        moved
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

    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        self.read_dead_letter_entries().await
    }

    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        self.move_dead_letters(keys, Some(replay)).await
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        self.move_dead_letters(keys, None).await
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

    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        self.publisher().read_dead_letter_entries().await
    }

    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        self.publisher().move_dead_letters(keys, Some(replay)).await
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        self.publisher().move_dead_letters(keys, None).await
    }
}

/// The error of a topology whose dead letters go to an exchange of the user's.
fn no_dead_letter_queue(p: &AmqpPublisher) -> Error {
    let (exchange, key) = p.options().dead_letter_target();
    Error::config(format!(
        "dead letters go to the existing exchange {exchange} (routing key {key}), not to a \
         queue of justonce's: read them where that exchange routes them"
    ))
}

/// Every message of the dead-letter queue, fetched on `channel` and acked when `take`,
/// keyed by position. A topology whose dead letters go to an exchange of the user's has no
/// queue to read.
async fn fetch_dead_letters(
    p: &AmqpPublisher,
    channel: &lapin::Channel,
    take: bool,
) -> Result<Vec<DeadLetterEntry>> {
    let Some(q) = p.options().dead_letter_queue() else {
        return Err(no_dead_letter_queue(p));
    };
    let mut out = Vec::new();
    loop {
        let got = channel
            .basic_get(q.into(), lapin::options::BasicGetOptions::default())
            .await
            .map_err(|e| amqp("reading the dead-letter queue", e))?;
        let Some(got) = got else { break };
        let d = &got.delivery;
        let letter = codec::dead_letter(codec::message(&d.properties, &d.data));
        let at = codec::timestamp(&d.properties);
        out.push(DeadLetterEntry::new(
            (out.len() + 1).to_string(),
            letter,
            at,
        ));
        if take {
            channel
                .basic_ack(d.delivery_tag, BasicAckOptions::default())
                .await
                .map_err(|e| amqp("acking a dead letter", e))?;
        }
    }
    Ok(out)
}
