//! The order/payment pipeline shared by `demo` and `worker`: its business tables, its
//! handler, and the checker that counts effects from the business data.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use justonce::sql::{SqliteStore, SqliteTx};
use justonce::{async_trait, Context, Disposition, Handler, Result};
use serde::{Deserialize, Serialize};
use sqlx::Row;

/// Accounts the demo's payments are spread over.
pub(crate) const ACCOUNTS: i64 = 100;

/// One payment: `balance = balance + amount` on an account, plus one ledger row. Not
/// idempotent by itself: applying it twice pays twice.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Payment {
    pub(crate) order_id: String,
    pub(crate) account: i64,
    pub(crate) amount: i64,
}

/// Creates the business tables if missing; `fresh` drops them first.
pub(crate) async fn setup(store: &SqliteStore, fresh: bool) -> Result<()> {
    let pool = store.pool();
    if fresh {
        sqlx::query("DROP TABLE IF EXISTS jo_demo_ledger")
            .execute(pool)
            .await?;
        sqlx::query("DROP TABLE IF EXISTS jo_demo_accounts")
            .execute(pool)
            .await?;
    }
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS jo_demo_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS jo_demo_ledger (
             seq INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL,
             account INTEGER NOT NULL, amount INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO jo_demo_accounts (id, balance)
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
         SELECT i, 0 FROM n WHERE true ON CONFLICT (id) DO NOTHING",
    )
    .bind(ACCOUNTS)
    .execute(pool)
    .await?;
    Ok(())
}

/// Applies a payment inside the consumer's transaction.
#[derive(Debug, Default, Clone)]
pub(crate) struct PaymentHandler {
    runs: Arc<AtomicU64>,
}

impl PaymentHandler {
    /// How many times the handler ran (committed or not).
    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Handler<SqliteTx> for PaymentHandler {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let p: Payment = cx.message().decode_json()?;
        if p.amount <= 0 {
            return Ok(Disposition::dead_letter(format!(
                "invalid input: amount must be positive, got {}",
                p.amount
            )));
        }
        let updated = sqlx::query("UPDATE jo_demo_accounts SET balance = balance + ? WHERE id = ?")
            .bind(p.amount)
            .bind(p.account)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if updated == 0 {
            return Ok(Disposition::dead_letter(format!(
                "invalid input: no account {}",
                p.account
            )));
        }
        sqlx::query("INSERT INTO jo_demo_ledger (order_id, account, amount) VALUES (?, ?, ?)")
            .bind(&p.order_id)
            .bind(p.account)
            .bind(p.amount)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
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
    /// Reads the ledger and balances.
    pub(crate) async fn read(store: &SqliteStore) -> Result<Self> {
        let pool = store.pool();
        let rows = sqlx::query("SELECT order_id, COUNT(*) FROM jo_demo_ledger GROUP BY order_id")
            .fetch_all(pool)
            .await?;
        let per_order: HashMap<String, u64> = rows
            .iter()
            .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
            .collect();
        let total = per_order.values().sum();
        let balances: i64 =
            sqlx::query_scalar("SELECT COALESCE(SUM(balance), 0) FROM jo_demo_accounts")
                .fetch_one(pool)
                .await?;
        let ledger: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(amount), 0) FROM jo_demo_ledger")
            .fetch_one(pool)
            .await?;
        Ok(Effects {
            per_order,
            total,
            consistent: balances == ledger,
        })
    }

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
