//! Seeded in-process faults and an effect checker: test your handler the way justonce tests
//! its own.
//!
//! [`Faults`] is a [`FaultHook`] that, by a seeded draw per message, crashes the consumer
//! before the commit (the effect rolls back), after it (the effect stays, the ack never
//! goes), or loses an ack, each on the message's first delivery only, so that every message
//! is eventually applied; and it picks which messages a careless publisher sends twice.
//! [`Effects`] counts what your business data says happened, per id, against what was sent.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
//! use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result};
//! use justonce_test::faults::{Effects, Faults};
//!
//! /// The handler under test: one effect per order.
//! struct Ship;
//!
//! impl Handler<MemoryTx> for Ship {
//!     async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
//!         tx.record(cx.message().id().unwrap().as_str()); // stands for `INSERT INTO shipments`
//!         Ok(Disposition::Ok)
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> Result<()> {
//! let queue = Arc::new(MemoryQueue::new("orders", Duration::from_millis(50)));
//! let store = MemoryStore::new();
//! let faults = Faults::new(7).crash_before_commit(0.2).crash_after_commit(0.2).lose_ack(0.1);
//! let orders: Vec<Message> = (0..100)
//!     .map(|i| Message::new("{}").with_id(format!("ORD-{i}")))
//!     .collect::<Result<_>>()?;
//! queue.publish_batch(&orders).await?;
//! queue.publish_batch(&faults.published_twice(&orders)).await?; // a publisher's retries
//!
//! let options = ConsumerOptions::new("shipping").batch_size(10);
//! let consumer = Consumer::new(options, queue.clone(), store.clone(), Ship)?
//!     .with_fault_hook(Arc::new(faults.clone()));
//! let drained = { let q = queue.clone(); async move { while !q.is_empty() { tokio::time::sleep(Duration::from_millis(5)).await } } };
//! consumer.run_until(drained).await?;
//!
//! let seen = Effects::count(store.effects());
//! let verdict = seen.check(orders.iter().filter_map(|m| m.id()).map(|id| id.as_str()));
//! assert!(faults.fired() > 0, "the faults happened");
//! assert_eq!((verdict.lost, verdict.duplicate_effects), (0, 0), "{verdict:?}");
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use justonce::{Delivery, FaultHook, FaultPoint, Message, Source};

/// Seeded faults, drawn per message id: the same seed makes the same run.
#[derive(Clone)]
pub struct Faults {
    seed: u64,
    before_commit: f64,
    after_commit: f64,
    lost_ack: f64,
    published_twice: f64,
    source: Option<Arc<dyn Source>>,
    fired: Arc<AtomicU64>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults")
            .field("seed", &self.seed)
            .field("before_commit", &self.before_commit)
            .field("after_commit", &self.after_commit)
            .field("lost_ack", &self.lost_ack)
            .field("published_twice", &self.published_twice)
            .finish()
    }
}

impl Faults {
    /// No faults yet, under `seed`; a tenth of the messages published twice.
    pub fn new(seed: u64) -> Self {
        Faults {
            seed,
            before_commit: 0.0,
            after_commit: 0.0,
            lost_ack: 0.0,
            published_twice: 0.1,
            source: None,
            fired: Arc::default(),
        }
    }

    /// Crash before the commit in batches holding a first delivery of this share of the
    /// messages: the effects roll back, the batch comes again.
    pub fn crash_before_commit(mut self, share: f64) -> Self {
        self.before_commit = share;
        self
    }

    /// Crash after the commit, before the acks: the effects stay and the batch comes again,
    /// which only a working idempotency method survives.
    pub fn crash_after_commit(mut self, share: f64) -> Self {
        self.after_commit = share;
        self
    }

    /// Lose the ack of this share of the messages' first deliveries.
    pub fn lose_ack(mut self, share: f64) -> Self {
        self.lost_ack = share;
        self
    }

    /// The share of messages [`Faults::published_twice`] picks.
    pub fn publish_twice(mut self, share: f64) -> Self {
        self.published_twice = share;
        self
    }

    /// On a crash, also let the source go of its deliveries ([`Source::abandon`]): needed on
    /// a broker, where a delivery comes back only when its channel closes.
    pub fn abandoning(mut self, source: Arc<dyn Source>) -> Self {
        self.source = Some(source);
        self
    }

    /// The messages of `sent` a publisher that lost their confirms sends again, same ids.
    pub fn published_twice(&self, sent: &[Message]) -> Vec<Message> {
        sent.iter()
            .filter(|m| self.draw(m, "twice") < self.published_twice)
            .cloned()
            .collect()
    }

    /// How many crashes and lost acks happened so far.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    /// A number in [0, 1) from the seed, the message's id (or payload) and `what`.
    fn draw(&self, m: &Message, what: &str) -> f64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.seed.hash(&mut h);
        what.hash(&mut h);
        match m.id() {
            Some(id) => id.as_str().hash(&mut h),
            None => m.payload().hash(&mut h),
        }
        (h.finish() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn hits(&self, batch: &[&Delivery], what: &str, share: f64) -> bool {
        batch
            .iter()
            .any(|d| d.attempt == 1 && self.draw(&d.message, what) < share)
    }
}

#[async_trait]
impl FaultHook for Faults {
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool {
        let crash = match point {
            FaultPoint::BeforeCommit => self.hits(batch, "before-commit", self.before_commit),
            FaultPoint::AfterCommit => self.hits(batch, "after-commit", self.after_commit),
            FaultPoint::AfterAck => false,
        };
        if crash {
            self.fired.fetch_add(1, Ordering::SeqCst);
            if let Some(source) = &self.source {
                source.abandon().await;
            }
        }
        crash
    }

    fn lose_ack(&self, delivery: &Delivery) -> bool {
        let lost = delivery.attempt == 1 && self.draw(&delivery.message, "ack") < self.lost_ack;
        if lost {
            self.fired.fetch_add(1, Ordering::SeqCst);
        }
        lost
    }
}

/// Effects per id, as your business data records them (a ledger's rows, the shipments
/// table, a payment API's charges).
#[derive(Debug, Clone, Default)]
pub struct Effects {
    per_id: HashMap<String, u64>,
}

/// What [`Effects::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Expected ids with no effect.
    pub lost: u64,
    /// The sum over ids of (effects - 1) where above 1.
    pub duplicate_effects: u64,
    /// Up to ten lost ids, for the message.
    pub lost_ids: Vec<String>,
    /// Up to ten ids applied more than once, with their counts.
    pub duplicated_ids: Vec<(String, u64)>,
}

impl Effects {
    /// One effect per item of `ids` (the ids your data recorded, repeats included).
    pub fn count<I, S>(ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut per_id = HashMap::new();
        for id in ids {
            *per_id.entry(id.into()).or_insert(0) += 1;
        }
        Effects { per_id }
    }

    /// Lost and duplicated effects over the `expected` ids.
    pub fn check<'a>(&self, expected: impl IntoIterator<Item = &'a str>) -> Verdict {
        let mut v = Verdict::default();
        for id in expected {
            match self.per_id.get(id).copied().unwrap_or(0) {
                0 => {
                    v.lost += 1;
                    if v.lost_ids.len() < 10 {
                        v.lost_ids.push(id.to_owned());
                    }
                }
                1 => {}
                n => {
                    v.duplicate_effects += n - 1;
                    if v.duplicated_ids.len() < 10 {
                        v.duplicated_ids.push((id.to_owned(), n));
                    }
                }
            }
        }
        v
    }
}
