//! The payment handler: one per idempotency strategy, the guard it applies before the
//! payment, and the lock key that orders a batch by account.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use justonce::{Context, Disposition, Handler, Message, Result, StateMachine};

use super::{Bank, Payment, PaymentApi, Receipt, Strategy, Tables};

/// The guard the effectively-once handler applies before the payment.
enum Guard<B: Bank> {
    None,
    UniqueKey,
    StateMachine(B::StateGuard),
    Version(B::VersionGuard),
}

/// Applies a payment: `balance = balance + amount` and a ledger row in the consumer's
/// transaction or, for the claim strategy, a charge through the external API.
pub(crate) struct PaymentHandler<B: Bank> {
    runs: Arc<AtomicU64>,
    tables: Tables,
    guard: Guard<B>,
    api: Option<PaymentApi>,
    stable_keys: bool,
    /// Name each payment's account as its lock key (on unless the bench turns it off).
    lock_order: bool,
    /// Send a receipt through the consumer's outbox for each payment applied (two-hop).
    receipts: bool,
}

impl<B: Bank> PaymentHandler<B> {
    /// The handler for `strategy`. `guarded` is false for the at-most-once and
    /// at-least-once runs, which apply payments with no idempotency at all.
    pub(crate) fn new(
        tables: Tables,
        strategy: Strategy,
        guarded: bool,
        api: Option<PaymentApi>,
    ) -> Result<Self> {
        let guard = match (guarded, strategy) {
            (false, _) | (_, Strategy::DedupTable | Strategy::Claim) => Guard::None,
            (true, Strategy::UniqueKey) => Guard::UniqueKey,
            (true, Strategy::StateMachine) => {
                let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
                Guard::StateMachine(B::state_guard(&tables.orders, machine)?)
            }
            (true, Strategy::Version) => Guard::Version(B::version_guard(&tables.orders)?),
        };
        Ok(PaymentHandler {
            runs: Arc::default(),
            tables,
            guard,
            api,
            stable_keys: guarded,
            lock_order: true,
            receipts: false,
        })
    }

    /// Without lock keys: batches run in the order they arrived (the bench's `--unordered`,
    /// to show what the ordering buys).
    pub(crate) fn unordered(mut self) -> Self {
        self.lock_order = false;
        self
    }

    /// Sends a receipt for each payment it applies, through the consumer's outbox, keyed by
    /// the account (the two-hop pipeline).
    pub(crate) fn sending_receipts(mut self) -> Self {
        self.receipts = true;
        self
    }

    /// How many times the handler ran (committed or not), shared by the clones.
    pub(crate) fn runs(&self) -> Arc<AtomicU64> {
        self.runs.clone()
    }
}

impl<B: Bank> Handler<B::Tx> for PaymentHandler<B> {
    /// The account row the payment updates: batches take their account locks in account
    /// order, so that concurrent batches never deadlock over two accounts.
    fn lock_key(&self, message: &Message) -> Option<String> {
        if !self.lock_order {
            return None;
        }
        let p: Payment = message.decode_json().ok()?;
        Some(format!("{:020}", p.account))
    }

    async fn handle(&self, cx: &Context<'_>, tx: &mut B::Tx) -> Result<Disposition> {
        let done = self.pay(cx, tx).await?;
        if self.receipts && matches!(done, Disposition::Ok) {
            let p: Payment = cx.message().decode_json()?;
            let r = Receipt {
                order_id: p.order_id.clone(),
                account: p.account,
            };
            let m = Message::json(&r)?.with_header("order-id", p.order_id);
            cx.send_keyed(format!("account-{}", p.account), m)?;
        }
        Ok(done)
    }
}

impl<B: Bank> PaymentHandler<B> {
    async fn pay(&self, cx: &Context<'_>, tx: &mut B::Tx) -> Result<Disposition> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let p: Payment = cx.message().decode_json()?;
        if p.amount <= 0 {
            return Ok(Disposition::dead_letter(format!(
                "invalid input: amount must be positive, got {}",
                p.amount
            )));
        }
        if let Some(api) = &self.api {
            // Without a claim, a naive client makes a new idempotency key per call.
            let key = match (self.stable_keys, cx.idempotency_key()) {
                (true, Some(key)) => key,
                _ => uuid::Uuid::new_v4().to_string(),
            };
            api.charge(&key, &p).await?;
            cx.set_result(format!("charged {} to account {}", p.amount, p.account));
            return Ok(Disposition::Ok);
        }
        let done = match &self.guard {
            Guard::None => None,
            Guard::UniqueKey => {
                // A duplicate fails here with a unique violation, which the runtime acks.
                B::record_order(tx, &self.tables, &p.order_id).await?;
                None
            }
            Guard::StateMachine(g) => B::transition(g, tx, &p.order_id, "PAID")
                .await?
                .to_disposition(),
            Guard::Version(g) => B::bump(g, tx, &p.order_id, p.version)
                .await?
                .to_disposition(p.version),
        };
        if let Some(done) = done {
            return Ok(done);
        }
        if !B::pay(tx, &self.tables, &p).await? {
            return Ok(Disposition::dead_letter(format!(
                "invalid input: no account {}",
                p.account
            )));
        }
        Ok(Disposition::Ok)
    }
}

/// Applies a receipt: one row per receipt in `receipts`, with no idempotency of its own, so
/// a duplicate that the consumer lets through is a second row.
pub(crate) struct ReceiptHandler<B: Bank> {
    tables: Tables,
    runs: Arc<AtomicU64>,
    _bank: std::marker::PhantomData<fn() -> B>,
}

impl<B: Bank> ReceiptHandler<B> {
    pub(crate) fn new(tables: Tables) -> Self {
        ReceiptHandler {
            tables,
            runs: Arc::default(),
            _bank: std::marker::PhantomData,
        }
    }

    /// How many times the handler ran.
    pub(crate) fn runs(&self) -> Arc<AtomicU64> {
        self.runs.clone()
    }
}

impl<B: Bank> Handler<B::Tx> for ReceiptHandler<B> {
    fn lock_key(&self, message: &Message) -> Option<String> {
        let r: Receipt = message.decode_json().ok()?;
        Some(format!("{:020}", r.account))
    }

    async fn handle(&self, cx: &Context<'_>, tx: &mut B::Tx) -> Result<Disposition> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let r: Receipt = cx.message().decode_json()?;
        B::receipt(tx, &self.tables, &r).await?;
        Ok(Disposition::Ok)
    }
}
