//! Dead letters, which JetStream does not have: a stream of the consumer's own, written
//! before the delivery is terminated, and from the server's `MAX_DELIVERIES` advisory
//! for a message whose last allowed delivery was never settled.

use std::sync::Weak;

use async_nats::jetstream::message::StreamMessage;
use futures_util::StreamExt;
use justonce_core::{DeadLetter, DeadLetterReason, Message, Result};
use serde::Deserialize;
use tracing::{info, warn};

use super::Inner;
use crate::codec;
use crate::error;
use crate::options::Retention;

impl Inner {
    /// The message at `seq` of the stream `stream`, if it is still there.
    pub(super) async fn stored(&self, stream: &str, seq: u64) -> Result<Option<StreamMessage>> {
        match self.stream(stream).await?.get_raw_message(seq).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if error::not_found(&e) => Ok(None),
            Err(e) => Err(error::api(
                format!("reading message {seq} of stream `{stream}`"),
                e,
            )),
        }
    }

    /// Writes `message` with `reason` to the dead-letter stream and waits for its
    /// PubAck. Its `Nats-Msg-Id` is the stream and sequence it came from, so a dead
    /// letter written twice (a worker and the advisory, a retry) is stored once.
    pub(super) async fn write_dead(
        &self,
        seq: u64,
        message: &Message,
        reason: &DeadLetterReason,
    ) -> Result<()> {
        let letter = DeadLetter::new(message.clone(), reason.clone());
        let dedup = format!("{}.{}.{seq}", self.opts.stream, self.opts.consumer);
        let (headers, payload) = codec::encode_copy(&letter.message, &dedup, None);
        self.publish_raw(&self.opts.dead_subject(), headers, payload)
            .await
    }
}

/// The `MAX_DELIVERIES` advisory.
#[derive(Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u64,
}

/// Dead-letters each message the server reports as delivered `max_deliver` times
/// without a settlement: its last worker died on it, or let it go. Every worker of the
/// consumer hears the advisory; the dead letter's `Nats-Msg-Id` keeps it to one.
pub(super) async fn advisories(inner: Weak<Inner>, mut sub: async_nats::Subscriber) {
    while let Some(m) = sub.next().await {
        let Some(i) = inner.upgrade() else { return };
        let Ok(a) = serde_json::from_slice::<MaxDeliveries>(&m.payload) else {
            warn!("a MAX_DELIVERIES advisory justonce cannot read");
            continue;
        };
        if let Err(e) = reconcile(&i, a.stream_seq, a.deliveries).await {
            warn!(error = %e.to_chain_string(), seq = a.stream_seq, "dead-lettering a message that reached max_deliver failed; the next worker to start or hear of it tries again");
        }
    }
}

async fn reconcile(i: &Inner, seq: u64, deliveries: u64) -> Result<()> {
    let Some(m) = i.stored(&i.opts.stream, seq).await? else {
        return Ok(());
    };
    let d = codec::decode(Some(&m.headers), &m.payload);
    let reason = i.reason(
        format!(
            "delivered {deliveries} times (max_deliver) and never settled: each worker it \
             went to died or let it go"
        ),
        u32::try_from(deliveries)
            .unwrap_or(u32::MAX)
            .saturating_add(d.before),
    );
    i.write_dead(seq, &d.message, &reason).await?;
    if i.retention == Retention::WorkQueue {
        // The consumer will not deliver it again; on a work queue it would stay forever.
        if let Err(e) = i.stream(&i.opts.stream).await?.delete_message(seq).await {
            if !error::not_found(&e) {
                return Err(error::api(format!("removing message {seq}"), e));
            }
        }
    }
    info!(stream = %i.opts.stream, seq, deliveries, "dead-lettered a message that reached max_deliver unsettled");
    Ok(())
}
