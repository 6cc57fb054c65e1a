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
    if a.duplicate {
        i.duplicates.fetch_add(1, Ordering::Relaxed);
        debug!(stream = %a.stream, seq = a.sequence, "the server already had this message id: a duplicate publish, dropped");
    }
    Ok(())
}

#[async_trait]
impl Publisher for NatsStream {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    /// Sends every message, keeping up to 512 PubAcks outstanding, and waits for
    /// every one. On an error some may be stored: publish the batch again, and the
    /// server drops the ids it has.
    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        let i = &self.inner;
        for m in messages {
            fits(i, m)?;
        }
        let subject = &i.opts.subject;
        let mut acks = std::collections::VecDeque::with_capacity(messages.len().min(WINDOW));
        let mut first_error = None;
        for m in messages {
            if acks.len() == WINDOW {
                if let Some(ack) = acks.pop_front() {
                    if let Err(e) = confirmed(i, subject, ack).await {
                        first_error.get_or_insert(e);
                    }
                }
            }
            let (headers, payload) = codec::encode(m);
            acks.push_back(send(i, subject, headers, payload).await?);
        }
        for ack in acks {
            if let Err(e) = confirmed(i, subject, ack).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
