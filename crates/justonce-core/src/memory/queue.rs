use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{
    no_such_dead_letter, DeadLetter, DeadLetterEntry, DeadLetterReason, Delivery, Error, Inspect,
    Message, Publisher, Receipt, Replay, Result, Source,
};

/// An in-memory queue with leases, attempts and a dead-letter list.
///
/// ```
/// use std::time::Duration;
/// use justonce_core::{memory::MemoryQueue, Message, Publisher, Source};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> justonce_core::Result<()> {
/// let q = MemoryQueue::new("orders", Duration::from_secs(30));
/// q.publish(&Message::new("hello").with_id("m-1")?).await?;
/// let got = q.receive(10, Duration::ZERO).await?;
/// assert_eq!(got[0].attempt, 1);
/// q.ack(&[&got[0].receipt]).await?;
/// assert_eq!(q.len(), 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MemoryQueue {
    name: String,
    lease: Duration,
    inner: Mutex<Inner>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    next_seq: u64,
    entries: BTreeMap<u64, Entry>,
    /// The dead letters, each with its key.
    dead: Vec<(u64, Message, DeadLetterReason)>,
    next_dead: u64,
    deliveries: u64,
}

#[derive(Debug)]
struct Entry {
    message: Message,
    attempts: u32,
    visible_at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    seq: u64,
    attempt: u32,
}

impl MemoryQueue {
    /// A queue whose deliveries come back after `lease` unless settled.
    pub fn new(name: impl Into<String>, lease: Duration) -> Self {
        MemoryQueue {
            name: name.into(),
            lease,
            inner: Mutex::new(Inner::default()),
            notify: Notify::new(),
        }
    }

    /// Removes the dead letters `keys`, all or none.
    fn take_dead(&self, keys: &[String]) -> Result<Vec<(Message, DeadLetterReason)>> {
        let mut inner = self.lock();
        for key in keys {
            if !inner.dead.iter().any(|(k, _, _)| k.to_string() == *key) {
                return Err(no_such_dead_letter(key));
            }
        }
        let (taken, kept) = std::mem::take(&mut inner.dead)
            .into_iter()
            .partition(|(k, _, _)| keys.contains(&k.to_string()));
        inner.dead = kept;
        Ok(taken.into_iter().map(|(_, m, r)| (m, r)).collect())
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Messages not yet acked or dead-lettered (ready or leased).
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether every message was acked or dead-lettered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The dead letters, with their reasons.
    pub fn dead_letters(&self) -> Vec<(Message, DeadLetterReason)> {
        self.lock()
            .dead
            .iter()
            .map(|(_, m, r)| (m.clone(), r.clone()))
            .collect()
    }

    /// How many deliveries the queue has made, redeliveries included.
    pub fn deliveries(&self) -> u64 {
        self.lock().deliveries
    }

    fn take_ready(&self, max: usize) -> (Vec<Delivery>, Option<Instant>) {
        let now = Instant::now();
        let mut inner = self.lock();
        let mut out = Vec::new();
        let mut next_visible: Option<Instant> = None;
        for (&seq, e) in inner.entries.iter_mut() {
            if out.len() >= max {
                break;
            }
            if e.visible_at > now {
                next_visible = Some(next_visible.map_or(e.visible_at, |n| n.min(e.visible_at)));
                continue;
            }
            e.attempts += 1;
            e.visible_at = now + self.lease;
            out.push(Delivery {
                message: e.message.clone(),
                attempt: e.attempts,
                redelivered: e.attempts > 1,
                receipt: Receipt::new(Token {
                    seq,
                    attempt: e.attempts,
                }),
            });
        }
        inner.deliveries += out.len() as u64;
        (out, next_visible)
    }

    fn remove(&self, receipt: &Receipt) -> Option<Entry> {
        let t = *receipt.downcast_ref::<Token>()?;
        let mut inner = self.lock();
        match inner.entries.get(&t.seq) {
            Some(e) if e.attempts == t.attempt => inner.entries.remove(&t.seq),
            _ => None,
        }
    }
}

#[async_trait]
impl Source for MemoryQueue {
    fn queue(&self) -> &str {
        &self.name
    }

    fn system(&self) -> &'static str {
        "memory"
    }

    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            let (got, next_visible) = self.take_ready(max);
            if !got.is_empty() || Instant::now() >= deadline {
                return Ok(got);
            }
            let until = next_visible.map_or(deadline, |n| n.min(deadline));
            let _ = tokio::time::timeout_at(until, notified).await;
        }
    }

    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        for r in receipts {
            self.remove(r);
        }
        Ok(())
    }

    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        if let Some(t) = receipt.downcast_ref::<Token>() {
            let mut inner = self.lock();
            if let Some(e) = inner.entries.get_mut(&t.seq) {
                if e.attempts == t.attempt {
                    e.visible_at = Instant::now() + delay;
                }
            }
        }
        self.notify.notify_waiters();
        Ok(())
    }

    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        {
            let now = Instant::now();
            let mut inner = self.lock();
            for r in receipts {
                let Some(t) = r.downcast_ref::<Token>() else {
                    continue;
                };
                if let Some(e) = inner.entries.get_mut(&t.seq) {
                    if e.attempts == t.attempt {
                        e.attempts -= 1;
                        e.visible_at = now;
                    }
                }
            }
        }
        self.notify.notify_waiters();
        Ok(())
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        self.remove(&delivery.receipt);
        let mut msg = delivery.message.clone();
        for (k, v) in reason.to_headers() {
            msg = msg.with_header(k, v);
        }
        let mut inner = self.lock();
        inner.next_dead += 1;
        let key = inner.next_dead;
        inner.dead.push((key, msg, reason.clone()));
        Ok(())
    }

    fn redelivery_delay(&self) -> Duration {
        self.lease
    }
}

#[async_trait]
impl Publisher for MemoryQueue {
    async fn publish(&self, message: &Message) -> Result<()> {
        self.publish_batch(std::slice::from_ref(message)).await
    }

    async fn publish_batch(&self, messages: &[Message]) -> Result<()> {
        {
            let now = Instant::now();
            let mut inner = self.lock();
            for m in messages {
                let seq = inner.next_seq;
                inner.next_seq += 1;
                inner.entries.insert(
                    seq,
                    Entry {
                        message: m.clone(),
                        attempts: 0,
                        visible_at: now,
                    },
                );
            }
        }
        self.notify.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Inspect for MemoryQueue {
    async fn pending(&self) -> Result<u64> {
        Ok(self.len() as u64)
    }

    async fn deliveries(&self) -> Result<Option<u64>> {
        Ok(Some(MemoryQueue::deliveries(self)))
    }

    async fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self
            .lock()
            .dead
            .iter()
            .map(|(_, m, r)| DeadLetter::new(m.clone(), r.clone()))
            .collect())
    }

    async fn dead_letter_entries(&self) -> Result<Vec<DeadLetterEntry>> {
        Ok(self
            .lock()
            .dead
            .iter()
            .map(|(k, m, r)| {
                DeadLetterEntry::new(k.to_string(), DeadLetter::new(m.clone(), r.clone()), None)
            })
            .collect())
    }

    async fn replay_dead_letters(&self, keys: &[String], replay: &Replay) -> Result<u64> {
        if replay.to.as_ref().is_some_and(|to| *to != self.name) {
            return Err(Error::config(format!(
                "a memory queue replays into itself only, not into {}",
                replay.to.as_deref().unwrap_or_default()
            )));
        }
        let taken = self.take_dead(keys)?;
        let messages: Vec<Message> = taken
            .into_iter()
            .map(|(m, r)| DeadLetter::new(m, r).replay_message(replay))
            .collect();
        self.publish_batch(&messages).await?;
        Ok(messages.len() as u64)
    }

    async fn purge_dead_letters(&self, keys: &[String]) -> Result<u64> {
        Ok(self.take_dead(keys)?.len() as u64)
    }

    async fn cleanup(&self) -> Result<()> {
        Ok(())
    }
}
