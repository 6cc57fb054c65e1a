//! What tools count on a NATS stream: the consumer's own numbers, and the dead-letter
//! stream.

use std::time::SystemTime;

use async_trait::async_trait;
use justonce_core::{
    chosen_dead_letters, no_such_dead_letter, Check, DeadLetter, DeadLetterEntry, DeadLetterReason,
    Error, Inspect, Replay, Result,
};

use super::NatsStream;
use crate::codec;
use crate::error;

impl NatsStream {
    /// What `justonce doctor` prints for this stream: it and its consumer exist (pending,
    /// dead letters), the dead-letter stream, `max_deliver`, and the server's version and
    /// durability. The stream's storage, retention and duplicate window were checked at
    /// connect.
    pub async fn check(&self) -> Result<Vec<Check>> {
        let i = &self.inner;
        let o = &i.opts;
        let c = self.consumer_info().await?;
        // The dead-letter stream's own count: its letters need not be read to be counted.
        let dead_stream = match i.js.get_stream(o.dead_stream()).await {
            Ok(s) => Some(s.cached_info().state.messages),
            Err(e) if error::not_found(&e) => None,
            Err(e) => return Err(error::api("looking up the dead-letter stream", e)),
        };
        let dead = dead_stream.unwrap_or(0);
        let mut out = vec![Check::pass(
            "queue",
            format!(
                "stream {} (file storage, {} retention) with pull consumer {} exists: {} \
                 messages pending, {dead} dead letters",
                o.stream,
                i.retention.as_str(),
                o.consumer,
                c.num_pending + c.num_ack_pending as u64
            ),
        )];
        out.push(Check::pass(
            "publisher dedup",
            format!(
                "publishes carry Nats-Msg-Id; the stream remembers ids at least as long as a \
                 publisher retries ({:?})",
                o.retry_horizon
            ),
        ));
        out.push(match dead_stream {
            Some(_) => Check::pass(
                "dead letters",
                format!("dead-letter stream {} exists", o.dead_stream()),
            ),
            None => Check::warn(
                "dead letters",
                format!("no dead-letter stream {} yet", o.dead_stream()),
                "start a worker of this consumer once: it creates the dead-letter stream",
            ),
        });
        out.push(if c.config.max_deliver > 0 {
            Check::pass(
                "delivery limit",
                format!(
                    "max_deliver {}: a message whose workers all die on it is dead-lettered \
                     from the server's advisory",
                    c.config.max_deliver
                ),
            )
        } else {
            Check::warn(
                "delivery limit",
                "no max_deliver: a message that crashes every worker it reaches is delivered \
                 forever",
                "set NatsOptions::max_deliver (justonce's default is 20)",
            )
        });
        out.push(Check::pass(
            "server",
            format!(
                "nats-server {} (max_payload {} bytes); 2.9 syncs its store to disk every 2 \
                 min, so a power failure can lose acked publishes (a process crash does not)",
                i.version, i.max_payload
            ),
        ));
        Ok(out)
    }

    async fn consumer_info(&self) -> Result<async_nats::jetstream::consumer::Info> {
        let o = &self.inner.opts;
        self.inner
            .stream(&o.stream)
            .await?
            .consumer_info(&o.consumer)
            .await
            .map_err(|e| error::api(format!("reading consumer `{}`", o.consumer), e))
    }

    /// The dead-letter stream's messages, oldest first, with their sequence numbers.
    async fn dead_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        let i = &self.inner;
        let name = i.opts.dead_stream();
        let state = match i.js.get_stream(&name).await {
            Ok(s) => s.cached_info().state.clone(),
            Err(e) if error::not_found(&e) => return Ok(Vec::new()),
            Err(e) => return Err(error::api(format!("opening stream `{name}`"), e)),
        };
        let mut out = Vec::new();
        if state.messages == 0 {
            return Ok(out);
        }
        for seq in state.first_sequence..=state.last_sequence {
            let Some(m) = i.stored(&name, seq).await? else {
                continue;
            };
            let d = codec::decode(Some(&m.headers), &m.payload);
            let reason = DeadLetterReason::from_headers(d.message.headers())
                .unwrap_or_else(|| i.reason("(no reason recorded)".into(), 0));
            let at: SystemTime = m.time.into();
            out.push(DeadLetterEntry::new(
                seq.to_string(),
                DeadLetter {
                    message: d.message,
                    reason,
                },
                Some(at),
            ));
            if out.len() as u64 >= state.messages {
                break;
            }
        }
        Ok(out)
    }

    /// The dead letters `keys` names, each once; an error before anything moves when one
    /// is not there.
    async fn chosen(&self, keys: &[String]) -> Result<Vec<DeadLetterEntry>> {
        chosen_dead_letters(&self.dead_entries().await?, keys)
    }

    async fn delete_dead(&self, key: &str) -> Result<()> {
        let i = &self.inner;
        let name = i.opts.dead_stream();
        let seq: u64 = key.parse().map_err(|_| no_such_dead_letter(key))?;
        match i.stream(&name).await?.delete_message(seq).await {
            Ok(_) => Ok(()),
            Err(e) if error::not_found(&e) => Ok(()),
            Err(e) => Err(error::api(format!("deleting dead letter {seq}"), e)),
        }
    }

    /// The subject to replay into: this stream's, or the one subject of the stream
    /// `target` names.
    async fn replay_subject(&self, target: Option<&str>) -> Result<String> {
        let i = &self.inner;
        let Some(target) = target.filter(|t| *t != i.opts.stream) else {
            return Ok(i.opts.subject.clone());
        };
        let s = i.js.get_stream(target).await.map_err(|e| {
            if error::not_found(&e) {
                Error::config(format!("no stream {target} to replay into"))
            } else {
                error::api(format!("opening stream `{target}`"), e)
            }
        })?;
        let subjects = s.cached_info().config.subjects.clone();
        match subjects.as_slice() {
            [one] if !one.contains(['*', '>']) => Ok(one.clone()),
            _ => Err(Error::config(format!(
                "stream {target} takes the subjects {subjects:?}: a replay needs a stream of \
                 one plain subject"
            ))),
        }
    }
}

#[async_trait]
impl Inspect for NatsStream {
    /// Messages the consumer has not delivered yet (`num_pending`) and deliveries out and
    /// not yet acked, nacked ones waiting out their delay included (`num_ack_pending`).
    async fn pending(&self) -> Result<u64> {
        let c = self.consumer_info().await?;
        Ok(c.num_pending + c.num_ack_pending as u64)
    }

    /// The consumer's delivery sequence: every delivery it made, redeliveries included.
    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(
            self.consumer_info().await?.delivered.consumer_sequence,
        ))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self
            .dead_letter_entries()
            .await?
            .into_iter()
            .map(|e| e.letter)
            .collect())
    }

    async fn cleanup(&self) -> Result<()> {
        self.delete().await
    }

    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        self.dead_entries().await
    }

    /// Each dead letter is published (PubAck awaited), then deleted from the dead-letter
    /// stream. Its `Nats-Msg-Id` is derived from the dead letter and the replay's number,
    /// so a replay interrupted between the two and run again is stored once.
    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let subject = self.replay_subject(replay.to.as_deref()).await?;
        let chosen = self.chosen(keys).await?;
        let mut moved = 0;
        for e in chosen {
            let m = e.letter.replay_message(replay);
            let dedup = format!(
                "{}.replay.{}.{}",
                self.inner.opts.dead_stream(),
                e.key,
                e.letter.replays() + 1
            );
            let (headers, payload) = codec::encode_copy(&m, &dedup, None);
            self.inner.publish_raw(&subject, headers, payload).await?;
            self.delete_dead(&e.key).await?;
            moved += 1;
        }
        Ok(moved)
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        let chosen = self.chosen(keys).await?;
        for e in &chosen {
            self.delete_dead(&e.key).await?;
        }
        Ok(chosen.len() as u64)
    }
}
