//! Dead letters and the tools' counts.
//!
//! Kafka cannot delete one record, so the dead-letter topic is a log of changes: a dead
//! letter is a record keyed by where it came from (`{partition}-{offset}`), and a replay
//! or a purge writes a tombstone (the same key, no value). Reading folds the log by key:
//! a key's first record is the dead letter, a tombstone removes it, and a dead letter
//! written twice (a worker that died after writing it and before its position moved)
//! is listed once.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use justonce_core::{
    chosen_dead_letters, DeadLetter, DeadLetterEntry, DeadLetterReason, Error, ErrorKind, Inspect,
    Message, Replay, Result,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Message as _, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use crate::client::{base, Client};
use crate::codec;
use crate::error::{blocking, kafka};
use crate::options::Start;
use crate::{KafkaPublisher, KafkaSource};

impl Client {
    /// Writes a dead letter for the record at `partition`/`offset`, and waits for its
    /// delivery report.
    pub(crate) async fn write_dead(
        &self,
        partition: i32,
        offset: i64,
        letter: &Message,
    ) -> Result<()> {
        let key = format!("{partition}-{offset}");
        self.send(
            &self.opts.dead_topic,
            letter,
            codec::headers(letter),
            Some(&key),
        )
        .await
        .map(|_| ())
    }

    /// A tombstone for the dead letter `key`.
    async fn tombstone(&self, key: &str) -> Result<()> {
        let topic = &self.opts.dead_topic;
        let record = FutureRecord::<str, [u8]>::to(topic)
            .key(key)
            .headers(OwnedHeaders::new());
        self.producer
            .send(record, Timeout::After(self.opts.request_timeout))
            .await
            .map(|_| ())
            .map_err(|(e, _)| kafka(format!("removing dead letter {key} from `{topic}`"), e))
    }

    /// A consumer in no group, for reading a topic from an offset.
    fn reader(&self) -> Result<BaseConsumer> {
        let mut c = base(&self.opts)?;
        c.set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            // A reader reads to a known end: no fetch of its waits long at the broker.
            .set("fetch.wait.max.ms", "50")
            .set("group.id", format!("{}-tools", self.opts.group));
        c.create().map_err(|e| kafka("creating a Kafka reader", e))
    }

    /// The group's positions per partition, with the partition's first and next offsets:
    /// the store's positions when the options keep them there, else the group's
    /// committed offsets.
    async fn lag(&self) -> Result<Vec<(i32, i64, i64, Option<i64>)>> {
        let o = &self.opts;
        let parts = self.partitions_of(&o.topic).await?.unwrap_or_default();
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let stored: HashMap<i32, i64> = match &o.positions {
            Some(p) => p
                .load(&o.group, &o.topic, &parts)
                .await?
                .into_iter()
                .map(|p| (p.partition, p.offset))
                .collect(),
            None => {
                if self.group_reader.get().is_none() {
                    let mut c = base(o)?;
                    c.set("group.id", &o.group)
                        .set("enable.auto.commit", "false");
                    let consumer: BaseConsumer = c
                        .create()
                        .map_err(|e| kafka("creating a Kafka reader", e))?;
                    let _ = self.group_reader.set(consumer);
                }
                let reader = self.group_reader.clone();
                let (topic, timeout, ps) = (o.topic.clone(), o.request_timeout, parts.clone());
                blocking("reading committed offsets", move || {
                    let Some(consumer) = reader.get() else {
                        return Ok(HashMap::new());
                    };
                    let mut tpl = TopicPartitionList::new();
                    for p in &ps {
                        let _ = tpl.add_partition(&topic, *p);
                    }
                    consumer.committed_offsets(tpl, timeout).map(|c| {
                        c.elements()
                            .iter()
                            .filter_map(|e| match e.offset() {
                                Offset::Offset(o) => Some((e.partition(), o)),
                                _ => None,
                            })
                            .collect::<HashMap<i32, i64>>()
                    })
                })
                .await?
                .map_err(|e| kafka("reading the group's committed offsets", e))?
            }
        };
        let mut out = Vec::new();
        for p in parts {
            let (low, high) = self.watermarks(&o.topic, p).await?;
            out.push((p, low, high, stored.get(&p).copied()));
        }
        Ok(out)
    }

    async fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        let producer = self.producer.clone();
        let (t, timeout) = (topic.to_owned(), self.opts.request_timeout);
        blocking("reading watermarks", move || {
            use rdkafka::producer::Producer as _;
            producer.client().fetch_watermarks(&t, partition, timeout)
        })
        .await?
        .map_err(|e| {
            kafka(
                format!("reading the offsets of `{topic}` partition {partition}"),
                e,
            )
        })
    }

    pub(crate) async fn pending(&self) -> Result<u64> {
        Ok(self.behind(&self.lag().await?))
    }

    /// Records not yet past the positions in `lag`, summed; a partition with no position
    /// counts from where [`KafkaOptions::start`](crate::KafkaOptions::start) starts.
    fn behind(&self, lag: &[(i32, i64, i64, Option<i64>)]) -> u64 {
        lag.iter()
            .map(|(_, low, high, pos)| {
                let pos = pos.unwrap_or(match self.opts.start {
                    Start::Earliest => *low,
                    Start::Latest => *high,
                });
                (high - pos.max(*low)).max(0) as u64
            })
            .sum()
    }

    /// The dead letters, folded by key, oldest first.
    pub(crate) async fn dead_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        let topic = self.opts.dead_topic.clone();
        if self.partitions_of(&topic).await?.is_none() {
            return Ok(Vec::new());
        }
        let (low, high) = self.watermarks(&topic, 0).await?;
        if high <= low {
            return Ok(Vec::new());
        }
        let reader = self.reader()?;
        let timeout = self.opts.request_timeout;
        let group = self.opts.group.clone();
        blocking(
            "reading dead letters",
            move || -> Result<Vec<DeadLetterEntry>> {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&topic, 0, Offset::Offset(low))
                    .map_err(|e| kafka("a dead-letter offset", e))?;
                reader
                    .assign(&tpl)
                    .map_err(|e| kafka("reading dead letters", e))?;
                let deadline = std::time::Instant::now() + timeout;
                let mut order: Vec<String> = Vec::new();
                let mut by_key: HashMap<String, Option<DeadLetterEntry>> = HashMap::new();
                let mut next = low;
                while next < high {
                    if std::time::Instant::now() > deadline {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!("reading the dead letters of `{topic}` took over {timeout:?}"),
                        ));
                    }
                    let Some(m) = reader.poll(Duration::from_millis(200)) else {
                        continue;
                    };
                    let m = m.map_err(|e| kafka("reading dead letters", e))?;
                    next = m.offset() + 1;
                    let Some(key) = m.key().map(|k| String::from_utf8_lossy(k).into_owned()) else {
                        continue;
                    };
                    match m.payload() {
                        None => {
                            by_key.insert(key, None);
                        }
                        Some(value) => {
                            if by_key.get(&key).is_some_and(Option::is_some) {
                                continue; // written twice
                            }
                            let message = codec::decode(m.headers(), Some(value));
                            let reason = DeadLetterReason::from_headers(message.headers())
                                .unwrap_or_else(|| DeadLetterReason {
                                    error: "(no reason recorded)".into(),
                                    attempts: 0,
                                    source_queue: String::new(),
                                    consumer: group.clone(),
                                });
                            let at = m
                                .timestamp()
                                .to_millis()
                                .and_then(|ms| u64::try_from(ms).ok())
                                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
                            if !by_key.contains_key(&key) {
                                order.push(key.clone());
                            }
                            by_key.insert(
                                key.clone(),
                                Some(DeadLetterEntry::new(
                                    key,
                                    DeadLetter { message, reason },
                                    at,
                                )),
                            );
                        }
                    }
                }
                let _ = reader.unassign();
                Ok(order
                    .into_iter()
                    .filter_map(|k| by_key.remove(&k).flatten())
                    .collect())
            },
        )
        .await?
    }

    async fn chosen(&self, keys: &[String]) -> Result<Vec<DeadLetterEntry>> {
        chosen_dead_letters(&self.dead_entries().await?, keys)
    }

    pub(crate) async fn replay(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let target = replay.to.clone().unwrap_or_else(|| self.opts.topic.clone());
        if self
            .partitions_of(&target)
            .await?
            .is_none_or(|p| p.is_empty())
        {
            return Err(Error::config(format!("no topic {target} to replay into")));
        }
        let chosen = self.chosen(keys).await?;
        let mut moved = 0;
        for e in chosen {
            let m = e.letter.replay_message(replay);
            self.check_size(&m)?;
            self.send(&target, &m, codec::headers(&m), None).await?;
            self.tombstone(&e.key).await?;
            moved += 1;
        }
        Ok(moved)
    }

    pub(crate) async fn purge(&self, keys: &[String]) -> Result<u64> {
        let chosen = self.chosen(keys).await?;
        for e in &chosen {
            self.tombstone(&e.key).await?;
        }
        Ok(chosen.len() as u64)
    }

    /// Deletes the topic and the dead-letter topic, and the group's committed offsets.
    pub(crate) async fn delete(&self) -> Result<()> {
        // A broker answers a fetch after waiting up to `fetch.wait.max.ms` (500 ms), and
        // tansu 0.6 goes on with a fetch whose client is gone, in several storage calls:
        // the topic deleted between two of them kills its storage. Let the last fetches
        // of this process end first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let o = &self.opts;
        let opts = rdkafka::admin::AdminOptions::new().operation_timeout(Some(o.request_timeout));
        let topics = [o.topic.as_str(), o.dead_topic.as_str()];
        let results = self
            .admin
            .delete_topics(&topics, &opts)
            .await
            .map_err(|e| kafka("deleting Kafka topics", e))?;
        for r in results {
            if let Err((t, code)) = r {
                if code != rdkafka::error::RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Err(Error::new(
                        crate::error::kind_of(code),
                        format!("deleting topic `{t}` failed: {code}"),
                    ));
                }
            }
        }
        let _ = self.admin.delete_groups(&[o.group.as_str()], &opts).await;
        Ok(())
    }
}

/// The same [`Inspect`] for a source and a publisher, over their [`Client`].
macro_rules! inspect_via_client {
    ($t:ty) => {
        #[async_trait]
        impl Inspect for $t {
            /// Records not yet past the group's position, summed over the partitions: the
            /// ready, the handed out and not finished, and the retries waiting (a retry
            /// holds its partition's position back, so the records behind it count too).
            async fn pending(&self) -> Result<u64> {
                self.client().pending().await
            }

            /// Kafka does not count deliveries.
            async fn deliveries(&self) -> Result<Option<u64>> {
                Ok(None)
            }

            async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
                Ok(self
                    .client()
                    .dead_entries()
                    .await?
                    .into_iter()
                    .map(|e| e.letter)
                    .collect())
            }

            /// Deletes the topic, the dead-letter topic and the group (a source leaves
            /// the group first).
            async fn cleanup(&self) -> Result<()> {
                self.leave().await;
                self.client().delete().await
            }

            async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
                self.client().dead_entries().await
            }

            /// Each dead letter is published (its delivery report awaited), then a
            /// tombstone removes it. A replay interrupted between the two and run again
            /// publishes it again: the consumer's dedup absorbs it unless the replay gives
            /// new ids.
            async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
                self.client().replay(keys, replay).await
            }

            async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
                self.client().purge(keys).await
            }
        }
    };
}

inspect_via_client!(KafkaSource);
inspect_via_client!(KafkaPublisher);

impl KafkaSource {
    async fn leave(&self) {
        self.close().await;
    }
}

impl KafkaPublisher {
    async fn leave(&self) {}
}

impl KafkaPublisher {
    /// The doctor's links: the topic (partitions, the group's lag and where its positions
    /// live), the producer's guarantees, and the dead-letter topic. Connect with
    /// `create(false)`: a missing topic is then a connect error naming it.
    pub async fn check(&self) -> Result<Vec<justonce_core::Check>> {
        use justonce_core::Check;
        let c = &self.client;
        let o = &c.opts;
        let lag = c.lag().await?;
        let pending = c.behind(&lag);
        let where_ = if o.positions.is_some() {
            "in the store's positions table"
        } else {
            "in the group's committed offsets"
        };
        let mut out = vec![Check::pass(
            "queue",
            format!(
                "topic {} has {} partitions; group {} has {pending} records to read (positions {where_})",
                o.topic,
                lag.len(),
                o.group
            ),
        )];
        out.push(Check::pass(
            "publisher",
            "the idempotent producer (enable.idempotence, acks=all), each delivery report awaited",
        ));
        out.push(match c.partitions_of(&o.dead_topic).await? {
            Some(_) => {
                let n = c.dead_entries().await?.len();
                if n == 0 {
                    Check::pass(
                        "dead letters",
                        format!("dead-letter topic {} is empty", o.dead_topic),
                    )
                } else {
                    Check::warn(
                        "dead letters",
                        format!("{n} dead letters in {}", o.dead_topic),
                        "read them with `justonce dlq list`, then replay or purge",
                    )
                }
            }
            None => Check::warn(
                "dead letters",
                format!("no dead-letter topic {} yet", o.dead_topic),
                "start a worker of this consumer once: it creates the dead-letter topic",
            ),
        });
        Ok(out)
    }
}
