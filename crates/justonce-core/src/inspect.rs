//! What tools count on a transport: an optional capability beside [`Source`](crate::Source)
//! and [`Publisher`](crate::Publisher), which the runtime does not need.

use async_trait::async_trait;

use crate::{DeadLetterEntry, DeadLetterReason, Error, Message, Replay, Result};

/// A dead-lettered message and why.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// The message, with the reason headers added.
    pub message: Message,
    /// Why it was dead-lettered.
    pub reason: DeadLetterReason,
}

impl DeadLetter {
    /// A dead letter with the reason headers added to its message.
    pub fn new(message: Message, reason: DeadLetterReason) -> Self {
        let mut headers = message.headers().clone();
        headers.extend(reason.to_headers());
        DeadLetter {
            message: message.with_headers(headers),
            reason,
        }
    }
}

/// What the tools (the demo, the lab, the bench, your monitoring) read from a queue, through
/// one trait for every transport. Counts come from the transport itself (a queue's tables,
/// the broker), never from a consumer's memory.
///
/// Object-safe: tools hold an `Arc<dyn Inspect>`.
///
/// ```
/// use std::time::Duration;
/// use justonce_core::{memory::MemoryQueue, Inspect, Message, Publisher};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> justonce_core::Result<()> {
/// let q = MemoryQueue::new("orders", Duration::from_secs(30));
/// q.publish(&Message::new("{}").with_id("ORD-1")?).await?;
/// let counts: &dyn Inspect = &q; // what a tool holds, whatever the transport
/// assert_eq!(counts.pending().await?, 1);
/// assert_eq!(counts.deliveries().await?, Some(0));
/// assert!(counts.dead_letters().await?.is_empty());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Inspect: Send + Sync {
    /// Messages the transport still owes a consumer: ready, waiting out a delay (a nack
    /// delay, a retry tier) or delivered and not yet settled, where the transport can see
    /// them. Dead letters are not pending.
    async fn pending(&self) -> Result<u64>;

    /// Deliveries made so far, redeliveries included, where the transport counts them;
    /// `None` where it does not.
    async fn deliveries(&self) -> Result<Option<u64>>;

    /// The dead letters, with their reasons, oldest first; they stay where they are.
    async fn dead_letters(&self) -> Result<Vec<DeadLetter>>;

    /// Removes what this queue made (its rows, its topology on the broker): for tests,
    /// demos and labs on shared services.
    async fn cleanup(&self) -> Result<()>;

    /// The dead letters with the handles [`Inspect::replay_dead_letters`] and
    /// [`Inspect::purge_dead_letters`] take, oldest first. The default numbers
    /// [`Inspect::dead_letters`] in order, with no time.
    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        Ok(self
            .dead_letters()
            .await?
            .into_iter()
            .enumerate()
            .map(|(i, letter)| DeadLetterEntry::new((i + 1).to_string(), letter, None))
            .collect())
    }

    /// Publishes the dead letters `keys` again as `replay` says
    /// ([`DeadLetter::replay_message`]), each removed from the dead letters only once its
    /// publish is durable; answers how many moved. A key that is not there is an error
    /// before anything moves, and so is a target queue that does not exist. The default
    /// cannot replay.
    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        let _ = (keys, replay);
        Err(Error::config(
            "this transport cannot replay its dead letters",
        ))
    }

    /// Deletes the dead letters `keys`; answers how many. A key that is not there is an
    /// error before anything is deleted. The default cannot.
    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        let _ = keys;
        Err(Error::config(
            "this transport cannot purge its dead letters",
        ))
    }
}

#[async_trait]
impl<T: Inspect + ?Sized> Inspect for std::sync::Arc<T> {
    async fn pending(&self) -> Result<u64> {
        (**self).pending().await
    }
    async fn deliveries(&self) -> Result<Option<u64>> {
        (**self).deliveries().await
    }
    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        (**self).dead_letters().await
    }
    async fn cleanup(&self) -> Result<()> {
        (**self).cleanup().await
    }
    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        (**self).dead_letter_entries().await
    }
    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        (**self).replay_dead_letters(keys, replay).await
    }
    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        (**self).purge_dead_letters(keys).await
    }
}

/// The error of a dead-letter key that is not there, for transports: the same sentence on
/// each.
pub fn no_such_dead_letter(key: &str) -> Error {
    Error::new(
        crate::ErrorKind::InvalidInput,
        format!("no dead letter {key} (list them again: keys change when dead letters move)"),
    )
}

/// The entries of `all` that `keys` name, each once, in the order of `keys`; the error of
/// the first key that is not there, before anything moves. For a transport's replay and
/// purge.
pub fn chosen_dead_letters(
    all: &[DeadLetterEntry],
    keys: &[String],
) -> Result<Vec<DeadLetterEntry>> {
    let mut out: Vec<DeadLetterEntry> = Vec::new();
    for k in keys {
        let found = all
            .iter()
            .find(|e| &e.key == k)
            .ok_or_else(|| no_such_dead_letter(k))?;
        if !out.iter().any(|e| &e.key == k) {
            out.push(found.clone());
        }
    }
    Ok(out)
}
