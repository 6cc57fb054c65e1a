use std::time::Duration;

use justonce_core::{validate_consumer_name, Error, Result};

/// The kind of the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// A replicated quorum queue (the default): counts deliveries in `x-delivery-count`
    /// and can dead-letter at-least-once.
    #[default]
    Quorum,
    /// A classic durable queue.
    Classic,
}

/// Everything about one work queue and its satellites, declared idempotently.
///
/// For a queue `orders`:
///
/// | name | what |
/// |---|---|
/// | exchange `orders` (direct) | where publishers send, routing key `orders` |
/// | queue `orders` | the work queue |
/// | exchange `orders.dlx` (direct) | where dead letters go |
/// | queue `orders.dead` | the dead-letter queue |
/// | queues `orders.retry.<ms>ms` | one per delay tier: TTL, then dead-lettered back to `orders` |
///
/// ```
/// use std::time::Duration;
/// use justonce_amqp::{AmqpOptions, QueueType};
///
/// let mut o = AmqpOptions::new("orders");
/// o.queue_type = QueueType::Quorum;
/// o.retry_delays = vec![Duration::from_secs(1), Duration::from_secs(30)];
/// assert_eq!(o.retry_queue(Duration::from_millis(1500)), "orders.retry.30000ms");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AmqpOptions {
    /// The work queue's name; also names the exchanges and satellite queues.
    pub queue: String,
    /// Quorum (default) or classic.
    pub queue_type: QueueType,
    /// Unacked deliveries the broker hands this consumer at most.
    pub prefetch: u16,
    /// The delay tiers for retries, ascending. A nack waits in the smallest tier at least
    /// as long as its delay (the largest one if none is). On RabbitMQ 3.10 a per-message
    /// TTL only expires at the head of a queue, so each tier holds one delay only.
    pub retry_delays: Vec<Duration>,
    /// Quorum queues: dead-letter a message the broker delivered this many times without an
    /// ack (a consumer crash-looping on it), at-least-once. `None` leaves it to the consumer.
    pub delivery_limit: Option<u32>,
    /// How long a publish waits for its confirm before it is sent again with the same id.
    pub confirm_timeout: Duration,
    /// Publishes in flight before the publisher waits for confirms.
    pub confirm_window: usize,
    /// Re-sends after a nack, a timeout or a lost connection before a publish fails.
    pub publish_retries: u32,
}

impl AmqpOptions {
    /// Defaults: quorum, prefetch 200, retry tiers 1 s / 10 s / 60 s, delivery limit 20,
    /// confirm timeout 10 s, window 500, 5 re-sends.
    pub fn new(queue: impl Into<String>) -> Self {
        AmqpOptions {
            queue: queue.into(),
            queue_type: QueueType::Quorum,
            prefetch: 200,
            retry_delays: vec![
                Duration::from_secs(1),
                Duration::from_secs(10),
                Duration::from_secs(60),
            ],
            delivery_limit: Some(20),
            confirm_timeout: Duration::from_secs(10),
            confirm_window: 500,
            publish_retries: 5,
        }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_consumer_name(&self.queue).map_err(|_| {
            Error::config(format!(
                "queue name `{}` is invalid: use 1-100 characters of A-Z a-z 0-9 . _ : -",
                self.queue
            ))
        })?;
        if self.retry_delays.is_empty() || self.retry_delays.iter().any(|d| d.is_zero()) {
            return Err(Error::config(
                "retry_delays needs at least one non-zero delay",
            ));
        }
        if self.prefetch == 0 || self.confirm_window == 0 {
            return Err(Error::config(
                "prefetch and confirm_window must be at least 1",
            ));
        }
        Ok(())
    }

    /// The exchange publishers send to.
    pub fn exchange(&self) -> String {
        self.queue.clone()
    }

    /// The dead-letter exchange.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.queue)
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead", self.queue)
    }

    /// The retry queue a nack with `delay` waits in.
    pub fn retry_queue(&self, delay: Duration) -> String {
        let mut tiers = self.retry_delays.clone();
        tiers.sort();
        let tier = tiers
            .iter()
            .find(|t| **t >= delay)
            .or(tiers.last())
            .copied()
            .unwrap_or(delay);
        format!("{}.retry.{}ms", self.queue, tier.as_millis())
    }

    /// Every queue this topology declares.
    pub fn queues(&self) -> Vec<String> {
        let mut q = vec![self.queue.clone(), self.dead_letter_queue()];
        q.extend(
            self.retry_delays
                .iter()
                .map(|d| format!("{}.retry.{}ms", self.queue, d.as_millis())),
        );
        q
    }
}
