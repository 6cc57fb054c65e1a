//! The order/payment pipeline shared by `demo`, `worker`, `lab` and `bench`: the payment
//! and its strategies here, the handler (`handler.rs`), the business database of each SQL
//! dialect (`bank.rs`), the simulated external payment API (`api.rs`), and the checker that
//! counts effects from the business data (`Effects`, below).

mod api;
mod bank;
mod handler;
mod redis_bank;

use std::collections::HashMap;

use justonce::{Idempotency, Result};
use serde::{Deserialize, Serialize};

pub(crate) use api::PaymentApi;
pub(crate) use bank::Bank;

/// One delivery received, as the lab's audit records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    /// The message id, if it had one.
    pub(crate) id: Option<String>,
    /// Whether the transport marked it redelivered.
    pub(crate) redelivered: bool,
    /// Where it sits in a log, where the transport says (Kafka: `partition:offset`): two
    /// deliveries at one position are one record read twice, whatever the mark says.
    pub(crate) at: Option<String>,
}
pub(crate) use handler::{PaymentHandler, ReceiptHandler};

/// Accounts the demo's payments are spread over.
/// Enough that concurrent batches rarely pay into the same two accounts in opposite orders:
/// with 100, three workers spent most of their time in deadlocks.
pub(crate) const ACCOUNTS: i64 = 10_000;

/// One payment: `balance = balance + amount` on an account, plus one ledger row. Not
/// idempotent by itself: applying it twice pays twice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Payment {
    pub(crate) order_id: String,
    pub(crate) account: i64,
    pub(crate) amount: i64,
    /// The order version this payment expects (the version strategy's compare-and-set).
    #[serde(default)]
    pub(crate) version: i64,
}

/// The receipt the two-hop pipeline's payments consumer sends for each payment it applies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Receipt {
    pub(crate) order_id: String,
    pub(crate) account: i64,
}

/// How the effectively-once consumer recognises a payment it already applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Strategy {
    /// A dedup record in the business transaction (the runtime's claim).
    DedupTable,
    /// The order id as a primary key: its unique violation is the duplicate signal.
    UniqueKey,
    /// The order's state: PENDING -> PAID; a second PAID is a duplicate.
    StateMachine,
    /// The order's version: compare-and-set from the version the payment expects.
    Version,
    /// A claim with a lease around a call to an external payment API.
    Claim,
}

impl Strategy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Strategy::DedupTable => "dedup-table",
            Strategy::UniqueKey => "unique-key",
            Strategy::StateMachine => "state-machine",
            Strategy::Version => "version",
            Strategy::Claim => "claim",
        }
    }

    pub(crate) fn idempotency(self) -> Idempotency {
        match self {
            Strategy::DedupTable => Idempotency::DedupTable,
            Strategy::UniqueKey => Idempotency::UniqueKey,
            Strategy::StateMachine | Strategy::Version => Idempotency::Guard,
            Strategy::Claim => Idempotency::Claim,
        }
    }
}

/// The names of one run's business tables: the accounts, the payment ledger, the order ids
/// (unique-key strategy) and the orders with state and version (guard strategies). On a
/// shared server each run has its own prefix.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub(crate) dedup: String,
    pub(crate) claims: String,
    pub(crate) deliveries: String,
    pub(crate) accounts: String,
    pub(crate) ledger: String,
    pub(crate) order_ids: String,
    pub(crate) orders: String,
    /// The two-hop pipeline's receipts (one row per receipt applied, no key: a duplicate
    /// is a second row), its outbox, and the MariaDB outbox's lock table.
    pub(crate) receipts: String,
    pub(crate) outbox: String,
    pub(crate) outbox_locks: String,
    /// The lab's producer's orders placed (its business table beside the outbox).
    pub(crate) placed: String,
}

impl Tables {
    /// The tables `{prefix}_accounts`, `_ledger`, `_order_ids`, `_orders`, the dedup and
    /// claim tables `{prefix}_dedup`, `_claims`, and the lab's audit of deliveries
    /// `{prefix}_deliveries`.
    pub(crate) fn new(prefix: &str) -> Result<Self> {
        let t = Tables {
            dedup: format!("{prefix}_dedup"),
            claims: format!("{prefix}_claims"),
            deliveries: format!("{prefix}_deliveries"),
            accounts: format!("{prefix}_accounts"),
            ledger: format!("{prefix}_ledger"),
            order_ids: format!("{prefix}_order_ids"),
            orders: format!("{prefix}_orders"),
            receipts: format!("{prefix}_receipts"),
            outbox: format!("{prefix}_outbox"),
            outbox_locks: format!("{prefix}_outbox_locks"),
            placed: format!("{prefix}_placed"),
        };
        for name in t.all() {
            justonce::validate_identifier(name)?;
        }
        Ok(t)
    }

    pub(crate) fn all(&self) -> [&String; 11] {
        [
            &self.placed,
            &self.receipts,
            &self.outbox,
            &self.outbox_locks,
            &self.deliveries,
            &self.ledger,
            &self.accounts,
            &self.orders,
            &self.order_ids,
            &self.dedup,
            &self.claims,
        ]
    }
}

/// What the business data says happened.
#[derive(Debug, Clone, Default)]
pub(crate) struct Effects {
    /// Ledger rows per order id.
    pub(crate) per_order: HashMap<String, u64>,
    /// Ledger rows in all.
    pub(crate) total: u64,
    /// Whether the account balances add up to the ledger (every commit was atomic).
    pub(crate) consistent: bool,
}

impl Effects {
    /// `(lost, duplicate_effects)` over the expected order ids.
    pub(crate) fn check<'a>(&self, expected: impl IntoIterator<Item = &'a String>) -> (u64, u64) {
        let mut lost = 0;
        let mut dups = 0;
        for id in expected {
            match self.per_order.get(id).copied().unwrap_or(0) {
                0 => lost += 1,
                n => dups += n - 1,
            }
        }
        (lost, dups)
    }
}
