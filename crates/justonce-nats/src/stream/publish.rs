//! Publishing with `Nats-Msg-Id` and the PubAck awaited.

use std::sync::atomic::Ordering;

use async_nats::jetstream::context::PublishAckFuture;
use async_nats::HeaderMap;
use async_trait::async_trait;
use bytes::Bytes;
use justonce_core::{Error, ErrorKind, Message, Publisher, Result};
use tracing::debug;

use super::{Inner, NatsStream};
use crate::codec;
use crate::error;

impl NatsStream {
    /// How many publishes the server answered as duplicates (an id it had stored within
    /// the window) since this stream was opened: each is a success, and no second
    /// message.
    pub fn publish_duplicates(&self) -> u64 {
        self.inner.duplicates.load(Ordering::Relaxed)
    }
}

impl Inner {
    /// Publishes `payload` with `headers` to `subject` and waits for its PubAck.
    pub(super) async fn publish_raw(
        &self,
        subject: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<()> {
        let ack = send(self, subject, headers, payload).await?;
        confirmed(self, subject, ack).await
    }
}

/// PubAcks a batch keeps outstanding (the context allows more, so a send never waits on
/// a PubAck the batch has not awaited yet).
const WINDOW: usize = 512;

/// Checks a message against the server's `max_payload` before it is sent.
fn fits(i: &Inner, m: &Message) -> Result<()> {
    if m.payload().len() > i.max_payload {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "message {} has a payload of {} bytes; the NATS server takes at most {} \
                 (max_payload)",
                m.id().map_or("(no id)", |id| id.as_str()),
                m.payload().len(),
                i.max_payload
            ),
        ));
    }
    Ok(())
}

async fn send(
    i: &Inner,
    subject: &str,
    headers: HeaderMap,
    payload: Bytes,
) -> Result<PublishAckFuture> {
    i.js.publish_with_headers(subject.to_owned(), headers, payload)
        .await
        .map_err(|e| error::publish(subject, e))
}

async fn confirmed(i: &Inner, subject: &str, ack: PublishAckFuture) -> Result<()> {
    let a = ack.await.map_err(|e| error::publish(subject, e))?;
    counted(i, &a);
    Ok(())
}

/// Waits for `ack` until `deadline` (its send, plus the request timeout), not for a full
/// timeout from the moment it is awaited: a batch whose PubAcks were lost to a server
/// restart answers once, within a timeout of its last send, instead of a timeout per
/// message one after another (250 messages: 21 minutes).
async fn confirmed_by(
    i: &Inner,
    subject: &str,
    ack: PublishAckFuture,
    deadline: tokio::time::Instant,
) -> Result<()> {
    use std::future::IntoFuture as _;
    let a = match tokio::time::timeout_at(deadline, ack.into_future()).await {
        Ok(a) => a.map_err(|e| error::publish(subject, e))?,
        Err(_) => {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "no PubAck for a publish to `{subject}` in time: it may or may not be stored"
                ),
            ))
        }
    };
    counted(i, &a);
    Ok(())
}

fn counted(i: &Inner, a: &async_nats::jetstream::publish::PublishAck) {
    if a.duplicate {
        i.duplicates.fetch_add(1, Ordering::Relaxed);
        debug!(stream = %a.stream, seq = a.sequence, "the server already had this message id: a duplicate publish, dropped");
    }
}

#[async_trait]
impl Publisher for NatsStream {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    /// Sends every message, keeping up to 512 PubAcks outstanding, and waits for
    /// every one, each until the request timeout after its own send. The first PubAck
    /// that fails (or does not come) ends the batch: on an error some may be stored:
    /// publish the batch again, and the server drops the ids it has.
    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        let i = &self.inner;
        for m in messages {
            fits(i, m)?;
        }
        let subject = &i.opts.subject;
        let wait = i.opts.request_timeout;
        let mut acks = std::collections::VecDeque::with_capacity(messages.len().min(WINDOW));
        for m in messages {
            if acks.len() == WINDOW {
                if let Some((ack, deadline)) = acks.pop_front() {
                    confirmed_by(i, subject, ack, deadline).await?;
                }
            }
            let (headers, payload) = codec::encode(m);
            let ack = send(i, subject, headers, payload).await?;
            acks.push_back((ack, tokio::time::Instant::now() + wait));
        }
        for (ack, deadline) in acks {
            confirmed_by(i, subject, ack, deadline).await?;
        }
        Ok(())
    }
}
