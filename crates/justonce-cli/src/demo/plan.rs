//! The seeded fault plan: which messages are poison, published twice, or crash the
//! consumer on their first delivery.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use justonce::{async_trait, Delivery, FaultHook, FaultPoint, Message};
use serde::Serialize;

use crate::bus::Bus;
use crate::orders::{Payment, ACCOUNTS};

/// Per-message fault rates.
const DUPLICATE_PUBLISH: f64 = 0.01;
const POISON: f64 = 0.001;
const CRASH_BEFORE_COMMIT: f64 = 0.002;
const CRASH_AFTER_COMMIT: f64 = 0.002;
const ACK_LOST: f64 = 0.003;
const CRASH_AFTER_ACK: f64 = 0.002;

/// The kinds of poison the publisher sends.
const POISON_KINDS: usize = 4;

/// Where message ids come from, on the publisher's side and the consumer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum IdStrategy {
    /// The publisher sets the order id as the message id; the consumer reads it (the
    /// source article's advice).
    MessageId,
    /// The publisher makes a new UUID for every publish attempt; the consumer reads it.
    FreshUuid,
    /// The publisher makes a new UUID per attempt; the consumer takes the id from the
    /// payload's `/order_id` field instead.
    Field,
    /// The publisher makes a new UUID per attempt; the consumer takes a hash of the
    /// payload's canonical JSON instead.
    ContentHash,
}

impl IdStrategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            IdStrategy::MessageId => "message-id",
            IdStrategy::FreshUuid => "fresh-uuid",
            IdStrategy::Field => "field",
            IdStrategy::ContentHash => "content-hash",
        }
    }

    /// How the consumer derives the id.
    pub(crate) fn consumer(self) -> justonce::IdStrategy {
        match self {
            IdStrategy::MessageId | IdStrategy::FreshUuid => justonce::IdStrategy::Header,
            IdStrategy::Field => justonce::IdStrategy::field("/order_id"),
            IdStrategy::ContentHash => justonce::IdStrategy::content_hash("payments"),
        }
    }
}

/// Fault counts: planned in the top-level JSON, fired per row.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub(crate) struct FaultCounts {
    pub(crate) duplicate_publishes: u64,
    pub(crate) crash_before_commit: u64,
    pub(crate) crash_after_commit: u64,
    pub(crate) ack_lost: u64,
    pub(crate) crash_after_ack: u64,
    pub(crate) poison: u64,
}

/// One order of the plan.
#[derive(Debug, Clone)]
pub(crate) struct Planned {
    pub(crate) order_id: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) poison: bool,
    pub(crate) publish_twice: bool,
}

/// Everything the seed decides.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) orders: Vec<Planned>,
    pub(crate) crash_before_commit: HashSet<String>,
    pub(crate) crash_after_commit: HashSet<String>,
    pub(crate) ack_lost: HashSet<String>,
    pub(crate) crash_after_ack: HashSet<String>,
}

impl Plan {
    pub(crate) fn new(messages: u64, seed: u64, max_payload_bytes: usize) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut plan = Plan {
            orders: Vec::with_capacity(messages as usize),
            crash_before_commit: HashSet::new(),
            crash_after_commit: HashSet::new(),
            ack_lost: HashSet::new(),
            crash_after_ack: HashSet::new(),
        };
        let mut poison_kind = 0usize;
        for i in 0..messages {
            let order_id = format!("ord-{i:07}");
            let payment = Payment {
                order_id: order_id.clone(),
                account: rng.i64(1..=ACCOUNTS),
                amount: rng.i64(1..=10_000),
                version: 0,
            };
            let poison = rng.f64() < POISON;
            let payload = if poison {
                poison_kind += 1;
                poison_payload(&payment, poison_kind % POISON_KINDS, max_payload_bytes)
            } else {
                serde_json::to_vec(&payment).unwrap_or_default()
            };
            let publish_twice = rng.f64() < DUPLICATE_PUBLISH;
            for (set, p) in [
                (&mut plan.crash_before_commit, CRASH_BEFORE_COMMIT),
                (&mut plan.crash_after_commit, CRASH_AFTER_COMMIT),
                (&mut plan.ack_lost, ACK_LOST),
                (&mut plan.crash_after_ack, CRASH_AFTER_ACK),
            ] {
                if rng.f64() < p {
                    set.insert(order_id.clone());
                }
            }
            plan.orders.push(Planned {
                order_id,
                payload,
                poison,
                publish_twice,
            });
        }
        plan
    }

    pub(crate) fn planned(&self) -> FaultCounts {
        FaultCounts {
            duplicate_publishes: self.orders.iter().filter(|o| o.publish_twice).count() as u64,
            crash_before_commit: self.crash_before_commit.len() as u64,
            crash_after_commit: self.crash_after_commit.len() as u64,
            ack_lost: self.ack_lost.len() as u64,
            crash_after_ack: self.crash_after_ack.len() as u64,
            poison: self.orders.iter().filter(|o| o.poison).count() as u64,
        }
    }

    /// The order ids whose payment is well-formed: each must take effect exactly once.
    pub(crate) fn well_formed(&self) -> impl Iterator<Item = &String> {
        self.orders
            .iter()
            .filter(|o| !o.poison)
            .map(|o| &o.order_id)
    }

    /// The message for one publish attempt of an order.
    pub(crate) fn message(&self, o: &Planned, ids: IdStrategy) -> Message {
        let id = match ids {
            IdStrategy::MessageId => o.order_id.clone(),
            IdStrategy::FreshUuid | IdStrategy::Field | IdStrategy::ContentHash => {
                uuid::Uuid::new_v4().to_string()
            }
        };
        Message::new(o.payload.clone())
            .with_content_type("application/json")
            .with_header("order-id", &o.order_id)
            .with_message_id(justonce::MessageId::new(id).ok())
    }
}

fn poison_payload(p: &Payment, kind: usize, max_payload_bytes: usize) -> Vec<u8> {
    match kind {
        // Malformed JSON: cut off mid-object.
        0 => format!(
            r#"{{"order_id":"{}","account":{},"amount":"#,
            p.order_id, p.account
        )
        .into_bytes(),
        // Wrong shape: the amount is a word.
        1 => format!(
            r#"{{"order_id":"{}","account":{},"amount":"ten"}}"#,
            p.order_id, p.account
        )
        .into_bytes(),
        // A business rule: a negative amount.
        2 => format!(
            r#"{{"order_id":"{}","account":{},"amount":-{}}}"#,
            p.order_id, p.account, p.amount
        )
        .into_bytes(),
        // Oversized.
        _ => {
            let note = "x".repeat(max_payload_bytes + 1);
            format!(
                r#"{{"order_id":"{}","account":{},"amount":{},"note":"{note}"}}"#,
                p.order_id, p.account, p.amount
            )
            .into_bytes()
        }
    }
}

/// The consumer-side faults of a plan, fired on a message's first delivery.
#[derive(Debug)]
pub(crate) struct PlanFaults {
    plan: Arc<Plan>,
    bus: Bus,
    pub(crate) fired: Arc<FiredCounts>,
}

/// Crashes and lost acks that actually happened in one run.
#[derive(Debug, Default)]
pub(crate) struct FiredCounts {
    crash_before_commit: AtomicU64,
    crash_after_commit: AtomicU64,
    ack_lost: AtomicU64,
    crash_after_ack: AtomicU64,
}

impl FiredCounts {
    pub(crate) fn snapshot(&self, plan: &FaultCounts) -> FaultCounts {
        FaultCounts {
            duplicate_publishes: plan.duplicate_publishes,
            poison: plan.poison,
            crash_before_commit: self.crash_before_commit.load(Ordering::Relaxed),
            crash_after_commit: self.crash_after_commit.load(Ordering::Relaxed),
            ack_lost: self.ack_lost.load(Ordering::Relaxed),
            crash_after_ack: self.crash_after_ack.load(Ordering::Relaxed),
        }
    }
}

impl PlanFaults {
    pub(crate) fn new(plan: Arc<Plan>, bus: Bus) -> Self {
        PlanFaults {
            plan,
            bus,
            fired: Arc::default(),
        }
    }
}

fn order_id(d: &Delivery) -> Option<&str> {
    d.message.header("order-id")
}

fn first_and_marked(d: &Delivery, set: &HashSet<String>) -> bool {
    d.attempt == 1 && order_id(d).is_some_and(|id| set.contains(id))
}

#[async_trait]
impl FaultHook for PlanFaults {
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool {
        let (set, counter) = match point {
            FaultPoint::AfterAck => (&self.plan.crash_after_ack, &self.fired.crash_after_ack),
            FaultPoint::BeforeCommit => (
                &self.plan.crash_before_commit,
                &self.fired.crash_before_commit,
            ),
            FaultPoint::AfterCommit => (
                &self.plan.crash_after_commit,
                &self.fired.crash_after_commit,
            ),
        };
        let crash = batch.iter().any(|d| first_and_marked(d, set));
        if crash {
            counter.fetch_add(1, Ordering::Relaxed);
            self.bus.crash().await;
        }
        crash
    }

    fn lose_ack(&self, d: &Delivery) -> bool {
        let lost = first_and_marked(d, &self.plan.ack_lost);
        if lost {
            self.fired.ack_lost.fetch_add(1, Ordering::Relaxed);
            self.bus.lose_ack();
        }
        lost
    }
}
