//! The [`MemoryStore`]'s outbox: messages staged in a [`MemoryTx`] and committed with it.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::store::{lock, MemoryStore, MemoryTx};
use crate::outbox::{check_outgoing, DEFAULT_MAX_PAYLOAD};
use crate::{Message, OutboxFailure, OutboxRow, OutboxStats, OutboxStore, Result};

/// A committed outbox row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    key: Option<String>,
    message: Message,
    attempts: u32,
    leased_until: Option<Instant>,
    due: Instant,
    dead: Option<String>,
    enqueued: SystemTime,
}

impl Row {
    pub(super) fn new(key: Option<String>, message: Message) -> Self {
        Row {
            key,
            message,
            attempts: 0,
            leased_until: None,
            due: Instant::now(),
            dead: None,
            enqueued: SystemTime::now(),
        }
    }

    fn free(&self, now: Instant) -> bool {
        self.dead.is_none() && self.due <= now && self.leased_until.is_none_or(|t| t <= now)
    }
}

#[async_trait]
impl OutboxStore for MemoryStore {
    type Tx = MemoryTx;

    async fn enqueue(&self, tx: &mut MemoryTx, message: &Message, key: Option<&str>) -> Result<()> {
        check_outgoing(message, DEFAULT_MAX_PAYLOAD)?;
        tx.outbox.push((key.map(str::to_owned), message.clone()));
        Ok(())
    }

    async fn take(&self, _owner: &str, max: usize, lease: Duration) -> Result<Vec<OutboxRow>> {
        let now = Instant::now();
        let mut st = lock(&self.state);
        let mut blocked: HashSet<String> = HashSet::new();
        let mut taken = Vec::new();
        for (seq, row) in st.outbox.iter_mut() {
            let free = row.free(now);
            if let Some(k) = &row.key {
                if blocked.contains(k) {
                    continue;
                }
                if !free {
                    blocked.insert(k.clone());
                    continue;
                }
            }
            if !free || taken.len() >= max {
                continue;
            }
            row.leased_until = Some(now + lease);
            taken.push(OutboxRow {
                seq: *seq,
                key: row.key.clone(),
                message: row.message.clone(),
                attempts: row.attempts,
            });
        }
        Ok(taken)
    }

    async fn mark_sent(&self, seqs: &[u64]) -> Result<()> {
        let mut st = lock(&self.state);
        for seq in seqs {
            st.outbox.remove(seq);
        }
        Ok(())
    }

    async fn mark_failed(
        &self,
        seq: u64,
        error: &str,
        retry_after: Duration,
        max_attempts: u32,
    ) -> Result<OutboxFailure> {
        let mut st = lock(&self.state);
        let Some(row) = st.outbox.get_mut(&seq) else {
            return Ok(OutboxFailure::Retrying);
        };
        row.attempts += 1;
        row.leased_until = None;
        row.due = Instant::now() + retry_after;
        if row.attempts >= max_attempts {
            row.dead = Some(error.to_owned());
            return Ok(OutboxFailure::Dead);
        }
        Ok(OutboxFailure::Retrying)
    }

    async fn release(&self, seqs: &[u64]) -> Result<()> {
        let mut st = lock(&self.state);
        for seq in seqs {
            if let Some(row) = st.outbox.get_mut(seq) {
                row.leased_until = None;
            }
        }
        Ok(())
    }

    async fn outbox_stats(&self) -> Result<OutboxStats> {
        let now = Instant::now();
        let st = lock(&self.state);
        let live = st.outbox.values().filter(|r| r.dead.is_none());
        let pending = live.clone().count() as u64;
        let leased = live
            .clone()
            .filter(|r| r.leased_until.is_some_and(|t| t > now))
            .count() as u64;
        let oldest = live.map(|r| r.enqueued).min();
        let dead = st.outbox.values().filter(|r| r.dead.is_some()).count() as u64;
        Ok(OutboxStats::new(pending, leased, dead, oldest))
    }
}
