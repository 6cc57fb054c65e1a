//! Publishing: the idempotent producer, each publish's delivery report awaited.

use async_trait::async_trait;
use futures_util::future::try_join_all;
use justonce_core::{Error, ErrorKind, Message, MessageId, Publisher, Result};
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;

use crate::client::Client;
use crate::codec;
use crate::error::kafka;

impl Client {
    /// Publishes `m` to `topic` with `key`, and waits for its delivery report: `Ok` once
    /// every in-sync replica has it. An error means "unknown" (publish it again; the
    /// consumer's dedup absorbs a duplicate).
    pub(crate) async fn send(
        &self,
        topic: &str,
        m: &Message,
        headers: OwnedHeaders,
        key: Option<&str>,
    ) -> Result<(i32, i64)> {
        let mut record = FutureRecord::<str, [u8]>::to(topic)
            .payload(m.payload())
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.producer
            .send(record, Timeout::After(self.opts.request_timeout))
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| {
                kafka(
                    format!("publishing to `{topic}` (unknown whether it was stored: publish it again with the same id)"),
                    e,
                )
            })
    }

    /// Refuses a message the brokers would refuse, before it is sent.
    pub(crate) fn check_size(&self, m: &Message) -> Result<()> {
        let size = codec::size(m);
        if size > self.opts.max_message_bytes {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "a record of about {size} bytes (id {}) exceeds the limit of {} bytes \
                     (KafkaOptions::max_message_bytes, which must stay within the topic's \
                     max.message.bytes)",
                    m.id().map_or("(none)", MessageId::as_str),
                    self.opts.max_message_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Publishes `messages` to the topic, all sent before any report is awaited.
    pub(crate) async fn publish_all(&self, messages: &[Message]) -> Result<()> {
        for m in messages {
            self.check_size(m)?;
        }
        let topic = self.opts.topic.as_str();
        let sends = messages.iter().map(|m| {
            let key = if self.opts.key_by_id {
                m.id().map(MessageId::as_str)
            } else {
                None
            };
            self.send(topic, m, codec::headers(m), key)
        });
        try_join_all(sends).await?;
        Ok(())
    }
}

/// A publisher to a Kafka topic, and the tools' view of it ([`justonce_core::Inspect`]):
/// it joins no consumer group, so a producer or an outbox relay never takes partitions
/// from the consumers.
///
/// Every publish goes through librdkafka's idempotent producer (`enable.idempotence`,
/// `acks=all`): the broker drops the producer's own retries of a record, and a publish
/// returns once every in-sync replica has the record. A publish that fails may still have
/// been stored; publishing again under the same id makes a second record, which the
/// consumer's dedup record absorbs.
#[derive(Clone)]
pub struct KafkaPublisher {
    pub(crate) client: Client,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher")
            .field("opts", &self.client.opts)
            .finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Connects, checks that the brokers answer, and makes the topic and the dead-letter
    /// topic unless they exist ([`KafkaOptions::create`](crate::KafkaOptions::create)).
    pub async fn connect(opts: crate::KafkaOptions) -> Result<Self> {
        Ok(KafkaPublisher {
            client: Client::connect(opts).await?,
        })
    }

    /// The options it was connected with.
    pub fn options(&self) -> &crate::KafkaOptions {
        &self.client.opts
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }
}

#[async_trait]
impl Publisher for KafkaPublisher {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.client.publish_all(std::slice::from_ref(message)).await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        self.client.publish_all(messages).await
    }
}
