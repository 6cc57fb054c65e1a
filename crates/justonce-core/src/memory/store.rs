use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Claim, DedupKey, DedupStore, Error, ErrorKind, Fingerprint, MessageId, Result, Store};

type Key = (String, MessageId);

#[derive(Debug, Default)]
pub(super) struct State {
    dedup: HashMap<Key, (Fingerprint, Instant)>,
    pending: HashSet<Key>,
    effects: Vec<String>,
    commits: u64,
    /// The outbox's committed rows, by seq.
    pub(super) outbox: std::collections::BTreeMap<u64, super::outbox::Row>,
    pub(super) next_seq: u64,
}

/// An in-memory [`DedupStore`] whose transactions stage effects as strings.
///
/// A claim holds the key like a row lock until commit or rollback: a second
/// transaction claiming it meanwhile gets a transient [`ErrorKind::Busy`].
///
/// ```
/// use justonce_core::{memory::MemoryStore, Claim, DedupKey, DedupStore, MessageId, Fingerprint, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> justonce_core::Result<()> {
/// let store = MemoryStore::new();
/// let id = MessageId::new("m-1")?;
/// let key = DedupKey { consumer: "billing", message_id: &id };
/// let mut tx = store.begin().await?;
/// assert_eq!(store.claim(&mut tx, key, Fingerprint::of(b"x")).await?, Claim::Fresh);
/// tx.record("charged m-1");
/// store.commit(tx).await?;
/// let mut tx = store.begin().await?;
/// assert_eq!(store.claim(&mut tx, key, Fingerprint::of(b"x")).await?, Claim::Duplicate);
/// assert_eq!(store.effects(), vec!["charged m-1".to_string()]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    pub(super) state: Arc<Mutex<State>>,
    /// Woken when a commit adds outbox rows.
    pub(super) outbox_ready: Arc<tokio::sync::Notify>,
}

/// A transaction of a [`MemoryStore`]: effects are staged until commit.
#[derive(Debug)]
pub struct MemoryTx {
    state: Arc<Mutex<State>>,
    claims: Vec<(Key, Fingerprint)>,
    effects: Vec<String>,
    /// Outgoing messages, staged until commit.
    pub(super) outbox: Vec<(Option<String>, crate::Message)>,
    marks: Vec<(usize, usize, usize)>,
}

impl MemoryTx {
    /// Stages an effect; it becomes visible in [`MemoryStore::effects`] on commit.
    pub fn record(&mut self, effect: impl Into<String>) {
        self.effects.push(effect.into());
    }

    fn release_pending(&mut self, from: usize) {
        let mut st = lock(&self.state);
        for (k, _) in self.claims.drain(from..) {
            st.pending.remove(&k);
        }
    }
}

impl Drop for MemoryTx {
    fn drop(&mut self) {
        self.release_pending(0);
    }
}

pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// The committed effects, in commit order.
    pub fn effects(&self) -> Vec<String> {
        lock(&self.state).effects.clone()
    }

    /// How many transactions committed.
    pub fn commits(&self) -> u64 {
        lock(&self.state).commits
    }
}

#[async_trait]
impl Store for MemoryStore {
    type Tx = MemoryTx;

    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn begin(&self) -> Result<MemoryTx> {
        Ok(MemoryTx {
            state: self.state.clone(),
            claims: Vec::new(),
            effects: Vec::new(),
            outbox: Vec::new(),
            marks: Vec::new(),
        })
    }

    async fn commit(&self, mut tx: MemoryTx) -> Result<()> {
        let now = Instant::now();
        let mut st = lock(&self.state);
        for (k, fp) in tx.claims.drain(..) {
            st.pending.remove(&k);
            st.dedup.insert(k, (fp, now));
        }
        st.effects.append(&mut tx.effects);
        let outgoing = !tx.outbox.is_empty();
        for (key, message) in tx.outbox.drain(..) {
            st.next_seq += 1;
            let seq = st.next_seq;
            st.outbox.insert(seq, super::outbox::Row::new(key, message));
        }
        st.commits += 1;
        drop(st);
        if outgoing {
            self.outbox_ready.notify_one();
        }
        Ok(())
    }

    async fn rollback(&self, tx: MemoryTx) -> Result<()> {
        drop(tx);
        Ok(())
    }

    async fn savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        tx.marks
            .push((tx.claims.len(), tx.effects.len(), tx.outbox.len()));
        Ok(())
    }

    async fn release_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        tx.marks.pop();
        Ok(())
    }

    async fn rollback_to_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        let (claims, effects, outbox) = tx.marks.pop().unwrap_or((0, 0, 0));
        tx.release_pending(claims);
        tx.effects.truncate(effects);
        tx.outbox.truncate(outbox);
        Ok(())
    }
}

#[async_trait]
impl DedupStore for MemoryStore {
    async fn claim(&self, tx: &mut MemoryTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        let k: Key = (key.consumer.to_owned(), key.message_id.clone());
        let mut st = lock(&self.state);
        if let Some((stored, _)) = st.dedup.get(&k) {
            return Ok(if *stored == fp {
                Claim::Duplicate
            } else {
                Claim::Conflict { stored: *stored }
            });
        }
        if let Some((_, stored)) = tx.claims.iter().find(|(c, _)| *c == k) {
            return Ok(if *stored == fp {
                Claim::Duplicate
            } else {
                Claim::Conflict { stored: *stored }
            });
        }
        if !st.pending.insert(k.clone()) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "message {} is being claimed by another transaction",
                    key.message_id
                ),
            ));
        }
        drop(st);
        tx.claims.push((k, fp));
        Ok(Claim::Fresh)
    }

    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        let now = Instant::now();
        let mut st = lock(&self.state);
        let old: Vec<Key> = st
            .dedup
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) > retention)
            .map(|(k, _)| k.clone())
            .take(batch as usize)
            .collect();
        for k in &old {
            st.dedup.remove(k);
        }
        Ok(old.len() as u64)
    }
}
