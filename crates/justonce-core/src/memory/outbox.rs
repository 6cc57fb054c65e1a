//! The [`MemoryStore`]'s outbox: messages staged in a [`MemoryTx`] and committed with it.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::time::Instant;

use super::store::{lock, MemoryStore, MemoryTx};
use crate::outbox::{check_outgoing, DEFAULT_MAX_PAYLOAD};
use crate::{
    DeadOutboxRow, InspectOutbox, Message, OutboxFailure, OutboxOwner, OutboxRow, OutboxStats,
    OutboxStore, Result,
};

/// A committed outbox row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    key: Option<String>,
    message: Message,
    attempts: u32,
    owner: Option<String>,
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
            owner: None,
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

    async fn take(&self, owner: &str, max: usize, lease: Duration) -> Result<Vec<OutboxRow>> {
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
            row.owner = Some(owner.to_owned());
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

    async fn wait_for_rows(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.outbox_ready.notified()).await;
    }
}

#[async_trait]
impl InspectOutbox for MemoryStore {
    async fn stats(&self) -> Result<OutboxStats> {
        self.outbox_stats().await
    }

    async fn owners(&self) -> Result<Vec<OutboxOwner>> {
        let now = Instant::now();
        let st = lock(&self.state);
        let mut owners: std::collections::BTreeMap<String, (u64, Instant)> = Default::default();
        for row in st.outbox.values() {
            if let (Some(o), Some(t)) = (&row.owner, row.leased_until.filter(|t| *t > now)) {
                let e = owners.entry(o.clone()).or_insert((0, t));
                e.0 += 1;
                e.1 = e.1.max(t);
            }
        }
        Ok(owners
            .into_iter()
            .map(|(o, (n, t))| OutboxOwner::new(o, n, Some(SystemTime::now() + (t - now))))
            .collect())
    }

    async fn dead_rows(&self, max: usize) -> Result<Vec<DeadOutboxRow>> {
        let st = lock(&self.state);
        Ok(st
            .outbox
            .iter()
            .filter_map(|(seq, r)| {
                let reason = r.dead.clone()?;
                let id = r.message.id().map(|i| i.to_string()).unwrap_or_default();
                Some(DeadOutboxRow::new(
                    *seq,
                    r.key.clone(),
                    id,
                    r.attempts,
                    reason,
                ))
            })
            .take(max)
            .collect())
    }

    async fn revive(&self, seqs: Option<&[u64]>) -> Result<u64> {
        let mut st = lock(&self.state);
        let mut n = 0;
        for (seq, row) in st.outbox.iter_mut() {
            if row.dead.is_some() && seqs.is_none_or(|s| s.contains(seq)) {
                row.dead = None;
                row.attempts = 0;
                row.due = Instant::now();
                row.owner = None;
                row.leased_until = None;
                n += 1;
            }
        }
        Ok(n)
    }

    async fn discard(&self, seqs: Option<&[u64]>) -> Result<u64> {
        let mut st = lock(&self.state);
        let before = st.outbox.len();
        st.outbox
            .retain(|seq, r| !(r.dead.is_some() && seqs.is_none_or(|s| s.contains(seq))));
        Ok((before - st.outbox.len()) as u64)
    }
}
