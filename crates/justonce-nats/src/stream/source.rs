//! Receiving from the pull consumer, and settling what was received.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::{StatusCode, Subject};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::join_all;
use futures_util::StreamExt;
use justonce_core::{DeadLetterReason, Delivery, Error, ErrorKind, Receipt, Result, Source};
use tracing::{debug, warn};

use super::{lock, Held, NatsStream, Token};
use crate::codec;
use crate::error::request as request_error;
use crate::options::Retention;

/// How long a no-wait pull request may take to answer, or to send its next message.
const NO_WAIT_ANSWER: Duration = Duration::from_millis(500);

/// How long a settlement of a delivery pulled on an earlier connection waits for its reply
/// ([`NatsStream::settle_stale`]).
const STALE_REPLY: Duration = Duration::from_millis(750);

impl NatsStream {
    /// One pull request: `batch` messages at most; with `expires`, waits that long for
    /// them, else answers at once with what is there.
    async fn pull(
        &self,
        batch: usize,
        expires: Option<Duration>,
    ) -> Result<Vec<async_nats::Message>> {
        let i = &self.inner;
        let inbox = i.client.new_inbox();
        let mut sub = i.client.subscribe(inbox.clone()).await.map_err(|e| {
            Error::with_source(ErrorKind::Io, "subscribing to a pull request's inbox", e)
        })?;
        let request = match expires {
            Some(e) => format!(r#"{{"batch":{batch},"expires":{}}}"#, e.as_nanos()),
            None => format!(r#"{{"batch":{batch},"no_wait":true}}"#),
        };
        i.client
            .publish_with_reply(i.next_subject.clone(), inbox, request.into())
            .await
            .map_err(|e| Error::with_source(ErrorKind::Io, "sending a pull request", e))?;
        let mut deadline = tokio::time::Instant::now()
            + match expires {
                Some(e) => e + i.opts.request_timeout,
                None => NO_WAIT_ANSWER,
            };
        let mut out = Vec::with_capacity(batch.min(1024));
        while out.len() < batch {
            if expires.is_none() && !out.is_empty() {
                // A batch of large messages takes a while to arrive: wait from the last one.
                deadline = tokio::time::Instant::now() + NO_WAIT_ANSWER;
            }
            let m = match tokio::time::timeout_at(deadline, sub.next()).await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) if out.is_empty() && expires.is_none() => {
                    // 2.9 leaves a no-wait request unanswered while the consumer counts a
                    // message it will not deliver (one past max_deliver): nothing now.
                    debug!(consumer = %i.opts.consumer, "a no-wait pull request got no answer");
                    break;
                }
                Err(_) => break,
            };
            match m.status {
                None | Some(StatusCode::OK) => out.push(m),
                Some(StatusCode::IDLE_HEARTBEAT) => {}
                Some(StatusCode::NOT_FOUND) | Some(StatusCode::TIMEOUT) => break,
                Some(StatusCode::REQUEST_TERMINATED) => {
                    // 409: the consumer is at max_ack_pending, or the request was cut.
                    debug!(description = ?m.description, "pull request ended by the server");
                    break;
                }
                Some(StatusCode::NO_RESPONDERS) => {
                    return Err(Error::new(
                        ErrorKind::Connect,
                        format!(
                            "no consumer `{}` on stream `{}` answered (deleted, or JetStream \
                             is down)",
                            i.opts.consumer, i.opts.stream
                        ),
                    ))
                }
                Some(other) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "a pull request on consumer `{}` failed: {other} {}",
                            i.opts.consumer,
                            m.description.unwrap_or_default()
                        ),
                    ))
                }
            }
        }
        let _ = sub.unsubscribe().await;
        Ok(out)
    }

    /// Deliveries of pulled messages, each held by this source.
    fn deliveries(&self, pulled: Vec<async_nats::Message>) -> Vec<Delivery> {
        let now = Instant::now();
        let connects = self.connects();
        let mut held = lock(&self.inner.held);
        let mut out = Vec::with_capacity(pulled.len());
        for m in pulled {
            let Some(reply) = m.reply.clone() else {
                warn!(subject = %m.subject, "a pulled message without an ack subject; skipped");
                continue;
            };
            let Some(info) = codec::ack_info(reply.as_str()) else {
                warn!(reply = %reply, "a pulled message with an ack subject justonce cannot read; skipped");
                continue;
            };
            let d = codec::decode(m.headers.as_ref(), &m.payload);
            let attempt = u32::try_from(info.delivered)
                .unwrap_or(u32::MAX)
                .saturating_add(d.before);
            held.insert(
                info.stream_seq,
                Held {
                    delivered: info.delivered,
                    reply: reply.clone(),
                    touched: now,
                },
            );
            out.push(Delivery {
                message: d.message,
                attempt,
                redelivered: info.delivered > 1 || d.copy,
                receipt: Receipt::new(Token {
                    stream_seq: info.stream_seq,
                    delivered: info.delivered,
                    attempt,
                    reply,
                    connects,
                }),
            });
        }
        out
    }

    fn token(r: &Receipt) -> Result<&Token> {
        r.downcast_ref::<Token>().ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "a receipt from another transport was settled on a NATS stream",
            )
        })
    }

    /// [`unhold`] under the lock.
    fn unhold(&self, t: &Token) -> bool {
        unhold(&mut lock(&self.inner.held), t)
    }

    /// The client's connect count so far.
    fn connects(&self) -> u64 {
        self.inner
            .client
            .statistics()
            .connects
            .load(Ordering::SeqCst)
    }

    /// Sends `body` to each ack subject (with the connect count of its pull) and knows the
    /// server took every one: all but the last go as plain messages and the last as a
    /// request, whose reply says the ones before it were taken too. The server queues one
    /// consumer's acks in the order one connection sent them and answers each after taking
    /// it, and the client writes its messages in order. That holds on one connection only:
    /// when the client connected again meanwhile (a plain ack may have died with the old
    /// socket), or the last reply did not come, each is sent again as a request of its own.
    ///
    /// A delivery pulled before the client last connected again is settled without
    /// depending on a reply ([`NatsStream::settle_stale`]).
    pub(super) async fn settle_all(
        &self,
        body: &'static str,
        replies: Vec<(Subject, u64)>,
    ) -> Result<()> {
        let client = &self.inner.client;
        let payload = Bytes::from_static(body.as_bytes());
        let connects = self.connects();
        let (stale, replies): (Vec<_>, Vec<_>) =
            replies.into_iter().partition(|(_, c)| *c < connects);
        join_all(
            stale
                .into_iter()
                .map(|(reply, _)| self.settle_stale(body, reply, payload.clone())),
        )
        .await;
        let replies: Vec<Subject> = replies.into_iter().map(|(r, _)| r).collect();
        let Some((last, before)) = replies.split_last() else {
            return Ok(());
        };
        let mut sent = true;
        for reply in before {
            if client
                .publish(reply.clone(), payload.clone())
                .await
                .is_err()
            {
                sent = false;
                break;
            }
        }
        if sent {
            let answered = client.request(last.clone(), payload.clone()).await.is_ok();
            if answered && self.connects() == connects {
                return Ok(());
            }
        }
        join_all(
            replies
                .iter()
                .map(|reply| self.request_settle(body, reply.clone(), payload.clone())),
        )
        .await
        .into_iter()
        .collect()
    }

    /// Sends `payload` (`body`, for the error) to the ack subject of `t` and waits for the
    /// server's reply; on a delivery pulled before the client last connected again, without
    /// depending on it ([`NatsStream::settle_stale`]).
    async fn settle_one(&self, body: &str, t: &Token, payload: Bytes) -> Result<()> {
        if t.connects < self.connects() {
            self.settle_stale(body, t.reply.clone(), payload).await;
            return Ok(());
        }
        self.request_settle(body, t.reply.clone(), payload).await
    }

    /// A settlement of a delivery pulled on an earlier connection, as a request whose reply
    /// is waited for [`STALE_REPLY`] at most, and its absence is no failure. The server may
    /// have restarted since, and nats-server 2.10 answers nothing for a delivery its
    /// recovered consumer does not know (2.9 answers): waiting the request timeout for that
    /// reply cost 5 s a batch, and the batch's failure handed it back, whose `-NAK`s waited
    /// too (a worker stalled about 110 s after a restart in the lab). A plain message
    /// instead of the request left 2.9 with a sequence pending for ever now and then (its
    /// bug of messages gone from a work queue: docs/dev/style.md). Whether or not it took,
    /// nothing is lost: a delivery whose ack did not take comes back after `ack_wait`, and
    /// the consumer's dedup record absorbs it.
    async fn settle_stale(&self, body: &str, reply: Subject, payload: Bytes) {
        let asked = self.inner.client.request(reply, payload);
        match tokio::time::timeout(STALE_REPLY, asked).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                debug!(error = %e, "`{body}` of a delivery pulled before the client connected again got no reply; if it did not take, the delivery comes back after ack_wait")
            }
            Err(_) => {
                debug!("`{body}` of a delivery pulled before the client connected again got no reply within {STALE_REPLY:?} (a restarted server that forgot it); if it did not take, the delivery comes back after ack_wait")
            }
        }
    }

    /// Sends `payload` (`body`, for the error) to one ack subject and waits for the
    /// server's reply.
    async fn request_settle(&self, body: &str, reply: Subject, payload: Bytes) -> Result<()> {
        self.inner
            .client
            .request(reply, payload)
            .await
            .map_err(|e| {
                request_error(
                    format!("`{body}` of a delivery (its reply did not come)"),
                    e,
                )
            })?;
        Ok(())
    }

    /// Whether `t` was the last delivery the consumer allows.
    fn last_allowed(&self, t: &Token) -> bool {
        self.inner
            .opts
            .max_deliver
            .is_some_and(|max| t.delivered >= u64::from(max))
    }
}

#[async_trait]
impl Source for NatsStream {
    fn queue(&self) -> &str {
        &self.inner.opts.stream
    }

    fn system(&self) -> &'static str {
        "nats"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let got = self.pull(max, None).await?;
        if !got.is_empty() {
            return Ok(self.deliveries(got));
        }
        if wait.is_zero() {
            return Ok(Vec::new());
        }
        // Wait for one, then take what else is there: a request for the whole batch
        // would go on delivering after this receive returned.
        let first = self
            .pull(1, Some(wait.max(Duration::from_millis(10))))
            .await?;
        if first.is_empty() {
            return Ok(Vec::new());
        }
        let mut all = self.deliveries(first);
        if max > 1 {
            match self.pull(max - 1, None).await {
                Ok(more) => all.extend(self.deliveries(more)),
                Err(e) => debug!(error = %e, "taking the rest of a batch failed"),
            }
        }
        Ok(all)
    }

    /// Double acks: plain `+ACK`s but the last, whose reply says the server took the
    /// batch (on one connection; after a reconnect each is asked again). A receipt of a
    /// delivery that came back to this source since is ignored; one that went to another
    /// worker is acked (the server takes it: the commit it follows is what counts).
    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        let replies = {
            let mut held = lock(&self.inner.held);
            let mut replies = Vec::with_capacity(receipts.len());
            for r in receipts {
                let t = Self::token(r)?;
                if unhold(&mut held, t) {
                    replies.push((t.reply.clone(), t.connects));
                }
            }
            replies
        };
        self.settle_all("+ACK", replies).await
    }

    /// `-NAK` with the delay. The last delivery `max_deliver` allows is dead-lettered
    /// instead: a nack would leave it in the stream, never delivered again.
    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        let t = Self::token(receipt)?;
        if !self.unhold(t) {
            return Ok(());
        }
        if self.last_allowed(t) {
            let max = self.inner.opts.max_deliver.unwrap_or(0);
            return self
                .dead_letter_seq(
                    t,
                    format!(
                        "its last allowed delivery ({} of max_deliver {max}) failed and was to \
                         be retried",
                        t.delivered
                    ),
                )
                .await;
        }
        let body = if delay.is_zero() {
            "-NAK".to_owned()
        } else {
            format!("-NAK {{\"delay\":{}}}", delay.as_nanos())
        };
        self.settle_one("-NAK", t, body.into()).await
    }

    /// On a work-queue stream: a copy with the attempts so far, then an ack, so no
    /// attempt is counted and `max_deliver` comes no closer. On other retentions a copy
    /// would reach every consumer of the subject, so a release is a `-NAK` there, which
    /// counts an attempt.
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        let tokens: Vec<&Token> = receipts
            .iter()
            .map(|r| Self::token(r))
            .collect::<Result<_>>()?;
        let live: Vec<&Token> = tokens.into_iter().filter(|t| self.unhold(t)).collect();
        if self.inner.retention != Retention::WorkQueue {
            return self
                .settle_all(
                    "-NAK",
                    live.iter().map(|t| (t.reply.clone(), t.connects)).collect(),
                )
                .await;
        }
        let mut first_error = None;
        for t in live {
            if let Err(e) = self.release_one(t).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Writes the message and its reason to the dead-letter stream, waits for the
    /// PubAck, then terminates the delivery.
    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        let t = Self::token(&delivery.receipt)?;
        if !self.unhold(t) {
            return Ok(());
        }
        self.inner
            .write_dead(t.stream_seq, &delivery.message, reason)
            .await?;
        self.terminate(t, &reason.error).await
    }

    /// Stops keeping what this source holds: its deliveries come back after `ack_wait`,
    /// as a dead process's would.
    async fn abandon(&self) {
        lock(&self.inner.held).clear();
    }

    fn redelivery_delay(&self) -> Duration {
        self.inner.opts.lease
    }
}

impl NatsStream {
    async fn release_one(&self, t: &Token) -> Result<()> {
        let i = &self.inner;
        let Some(m) = i.stored(&i.opts.stream, t.stream_seq).await? else {
            // Gone from the stream since it was delivered: nothing to copy, but the
            // delivery is settled, so that the consumer does not keep it pending for a
            // message it can no longer deliver (nats-server before 2.10.25 keeps such a
            // sequence for redelivery, counts it to max_deliver and holds its ack floor).
            return self
                .settle_one("+ACK", t, Bytes::from_static(b"+ACK"))
                .await;
        };
        let d = codec::decode(Some(&m.headers), &m.payload);
        let dedup = format!(
            "{}.{}.{}.{}",
            i.opts.stream, i.opts.consumer, t.stream_seq, t.delivered
        );
        let (headers, payload) =
            codec::encode_copy(&d.message, &dedup, Some(t.attempt.saturating_sub(1)));
        i.publish_raw(&i.opts.subject, headers, payload).await?;
        self.settle_one("+ACK", t, Bytes::from_static(b"+ACK"))
            .await
    }

    /// `+TERM`, with the reason where the server takes one (2.10.4 and later; earlier
    /// servers ignore a `+TERM <reason>` and deliver the message again).
    pub(super) async fn terminate(&self, t: &Token, reason: &str) -> Result<()> {
        let body = if self.inner.version.term_takes_a_reason() {
            format!("+TERM {}", reason.replace(['\r', '\n'], " "))
        } else {
            "+TERM".to_owned()
        };
        self.settle_one("+TERM", t, body.into()).await
    }

    /// Dead-letters the message at `t` with `why`, reading it from the stream.
    async fn dead_letter_seq(&self, t: &Token, why: String) -> Result<()> {
        let i = &self.inner;
        if let Some(m) = i.stored(&i.opts.stream, t.stream_seq).await? {
            let d = codec::decode(Some(&m.headers), &m.payload);
            let reason = i.reason(why.clone(), t.attempt);
            i.write_dead(t.stream_seq, &d.message, &reason).await?;
        }
        self.terminate(t, &why).await
    }
}

/// Removes `t` from `held` if it holds that very delivery; answers whether it is still to
/// be settled (`false` for a receipt of a delivery that came back since).
fn unhold(held: &mut std::collections::HashMap<u64, Held>, t: &Token) -> bool {
    match held.get(&t.stream_seq) {
        Some(h) if h.delivered != t.delivered => false,
        Some(_) => {
            held.remove(&t.stream_seq);
            true
        }
        None => true,
    }
}
