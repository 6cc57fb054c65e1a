//! The transport seams: where deliveries come from and where messages go.

use std::time::Duration;

use async_trait::async_trait;

use crate::{DeadLetterReason, Delivery, Message, Receipt, Result};

/// Where deliveries come from, and where they are settled.
///
/// Object-safe: the runtime holds an `Arc<dyn Source>`.
#[async_trait]
pub trait Source: Send + Sync {
    /// The queue's name, recorded with dead letters.
    fn queue(&self) -> &str;

    /// The messaging system, as OpenTelemetry's `messaging.system` names it where it has a
    /// name (`rabbitmq`), else the transport's (`sqlite`, `postgresql`): for the runtime's
    /// spans and metrics.
    fn system(&self) -> &'static str {
        "unknown"
    }

    /// Up to `max` deliveries. Waits at most `wait` for the first one; returns an empty
    /// vector when none arrived in that time. Each delivery is leased to this caller until
    /// it is settled or its lease runs out, when the transport delivers it again.
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>>;

    /// Acknowledges deliveries: the transport forgets them. A receipt whose lease has
    /// already run out is ignored (the message was handed to someone else).
    async fn ack(&self, receipts: &[&Receipt]) -> Result<()>;

    /// Gives a delivery back, to be delivered again no sooner than `delay`.
    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()>;

    /// Hands deliveries back without counting an attempt against them: the consumer could
    /// not process them for a reason that is not theirs (an outage, a schema or privilege
    /// mistake, a deadlock), so their next delivery carries the same attempt number and no
    /// attempt limit (the runtime's `max_attempts`, a broker's delivery limit) moves closer.
    ///
    /// The default nacks each with no delay, which counts an attempt on transports that
    /// count deliveries; the built-in transports do better (the SQL queues give the attempt
    /// back, RabbitMQ keeps the deliveries unacked and hands them out again from the source
    /// itself). A receipt that is stale or already settled is ignored.
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        for r in receipts {
            self.nack(r, Duration::ZERO).await?;
        }
        Ok(())
    }

    /// Moves a delivery to the dead-letter queue with its reason, and acks it.
    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()>;

    /// Lets go of every delivery this source holds, without settling any, as a process that
    /// died would: for fault injection (the demo, tests). RabbitMQ closes its channel, which
    /// requeues them at once; the default does nothing, and leases run out.
    async fn abandon(&self) {}

    /// The longest time a delivery can be held back by the transport itself (leases,
    /// broker-side delays), for the retention check of contract 6 in ARCHITECTURE.md.
    fn redelivery_delay(&self) -> Duration;
}

/// Where messages are published.
///
/// A publish returns `Ok` only once the transport has made the message durable (a
/// committed row, a publisher confirm). An error means "unknown": publish again with the
/// same id, and the consumer's dedup absorbs the duplicate that may result.
#[async_trait]
pub trait Publisher: Send + Sync {
    /// Publishes one message durably.
    async fn publish(&self, message: &Message) -> Result<()>;

    /// Publishes several messages; on success all of them are durable.
    async fn publish_batch(&self, messages: &[Message]) -> Result<()>;
}

/// A [`Source`] whose acks can be written in a store's transaction: the queue lives in the
/// same database as the business data (the PostgreSQL queue with the PostgreSQL store).
///
/// The consumer then acks a batch *inside* the transaction that holds its effects: the
/// deliveries are gone if and only if the effects committed. A crash between commit and ack,
/// or a lost ack, cannot happen any more, so nothing is delivered again: exactly-once within
/// that one database, as Kafka's transactions give inside Kafka. Duplicates published twice
/// are still two rows; the dedup record absorbs them.
#[async_trait]
pub trait TransactionalAck<Tx>: Send + Sync {
    /// Acks `receipts` inside `tx`. Fails with [`crate::ErrorKind::Busy`] when a receipt no
    /// longer holds its delivery (its lease ran out and it was delivered again): the caller
    /// must roll `tx` back, or the effect would be applied by two consumers.
    async fn ack_in(&self, tx: &mut Tx, receipts: &[&Receipt]) -> Result<()>;

    /// Says that the transaction `receipts` were acked in has committed: the runtime calls
    /// it after the commit, before settling the rest of the batch. A transport that keeps
    /// deliveries in memory until then (a Kafka partition's position cannot pass them
    /// before) lets them go; the default does nothing. Never called when the commit
    /// failed or the process died first: the transaction decides, not this call.
    async fn committed(&self, receipts: &[&Receipt]) {
        let _ = receipts;
    }
}

/// A shared source is a source: `Consumer::new(opts, Arc::clone(&queue), …)`.
#[async_trait]
impl<T: Source + ?Sized> Source for std::sync::Arc<T> {
    fn queue(&self) -> &str {
        (**self).queue()
    }

    fn system(&self) -> &'static str {
        (**self).system()
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        (**self).receive(max, wait).await
    }
    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        (**self).ack(receipts).await
    }
    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        (**self).nack(receipt, delay).await
    }
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        (**self).release(receipts).await
    }
    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        (**self).dead_letter(delivery, reason).await
    }
    async fn abandon(&self) {
        (**self).abandon().await
    }
    fn redelivery_delay(&self) -> Duration {
        (**self).redelivery_delay()
    }
}

/// A shared publisher is a publisher.
#[async_trait]
impl<T: Publisher + ?Sized> Publisher for std::sync::Arc<T> {
    async fn publish(&self, message: &Message) -> Result<()> {
        (**self).publish(message).await
    }
    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        (**self).publish_batch(messages).await
    }
}
