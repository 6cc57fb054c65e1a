//! The order/payment pipeline shared by `demo` and `worker`: its business tables, its
//! handler per idempotency strategy, and the checker that counts effects from the business
//! data.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use justonce::sql::{SqliteStateGuard, SqliteStore, SqliteTx, SqliteVersionGuard};
use justonce::{async_trait, Context, Disposition, Handler, Idempotency, Result, StateMachine};
use serde::{Deserialize, Serialize};
use sqlx::{Row, SqlitePool};

/// Accounts the demo's payments are spread over.
pub(crate) const ACCOUNTS: i64 = 100;

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

/// Creates the business tables if missing; `fresh` drops them first. `orders` are created
/// PENDING at version 0, for the state-machine and version strategies.
pub(crate) async fn setup(store: &SqliteStore, fresh: bool, orders: &[&str]) -> Result<()> {
    let pool = store.pool();
    if fresh {
        for table in [
            "jo_demo_ledger",
            "jo_demo_accounts",
            "jo_demo_orders",
            "jo_demo_order_ids",
        ] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                .execute(pool)
                .await?;
        }
    }
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS jo_demo_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS jo_demo_ledger (
             seq INTEGER PRIMARY KEY AUTOINCREMENT, order_id TEXT NOT NULL,
             account INTEGER NOT NULL, amount INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS jo_demo_order_ids (order_id TEXT PRIMARY KEY);
         CREATE TABLE IF NOT EXISTS jo_demo_orders (
             order_id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL);",
    )
    .execute(pool)
    .await?;
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO jo_demo_accounts (id, balance)
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
         SELECT i, 0 FROM n WHERE true ON CONFLICT (id) DO NOTHING",
    )
    .bind(ACCOUNTS)
    .execute(&mut *tx)
    .await?;
    for id in orders {
        sqlx::query("INSERT INTO jo_demo_orders VALUES (?, 'PENDING', 0) ON CONFLICT DO NOTHING")
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// A simulated third-party payment API in a database of its own: it records every call,
/// and charges once per idempotency key, as payment APIs do.
#[derive(Debug, Clone)]
pub(crate) struct PaymentApi {
    pool: SqlitePool,
}

impl PaymentApi {
    /// Opens the API's own database. It stands in for a remote service whose disk is not
    /// what the demo tests, so it does not fsync (`synchronous=OFF`): its writes survive our
    /// process dying, which is the fault the demo injects, but not an OS crash.
    pub(crate) async fn open(url: &str) -> Result<Self> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let opts = url
            .parse::<SqliteConnectOptions>()
            .map_err(|e| justonce::Error::config(format!("bad payment API URL: {e}")))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Off)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = SqlitePool::connect_with(opts).await?;
        sqlx::raw_sql(
            "CREATE TABLE IF NOT EXISTS api_calls (
                 seq INTEGER PRIMARY KEY AUTOINCREMENT, idempotency_key TEXT NOT NULL,
                 order_id TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS api_charges (
                 idempotency_key TEXT PRIMARY KEY, order_id TEXT NOT NULL,
                 account INTEGER NOT NULL, amount INTEGER NOT NULL);",
        )
        .execute(&pool)
        .await?;
        Ok(PaymentApi { pool })
    }

    /// One call: recorded, and charged unless the key was charged before.
    async fn charge(&self, key: &str, p: &Payment) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query("INSERT INTO api_calls (idempotency_key, order_id) VALUES (?, ?)")
            .bind(key)
            .bind(&p.order_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO api_charges (idempotency_key, order_id, account, amount) VALUES (?, ?, ?, ?)
             ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(key)
        .bind(&p.order_id)
        .bind(p.account)
        .bind(p.amount)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Charges per order, and the calls the API received.
    pub(crate) async fn effects(&self) -> Result<(Effects, u64)> {
        let (per_order, total) = per_order(&self.pool, "api_charges").await?;
        let calls: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM api_calls")
            .fetch_one(&self.pool)
            .await?;
        Ok((
            Effects {
                per_order,
                total,
                consistent: true,
            },
            calls as u64,
        ))
    }
}

/// The guard the effectively-once handler applies before the payment.
#[derive(Debug, Clone)]
enum Guard {
    None,
    UniqueKey,
    StateMachine(SqliteStateGuard),
    Version(SqliteVersionGuard),
}

/// Applies a payment: `balance = balance + amount` and a ledger row in the consumer's
/// transaction or, for the claim strategy, a charge through the external API.
#[derive(Debug, Clone)]
pub(crate) struct PaymentHandler {
    runs: Arc<AtomicU64>,
    guard: Guard,
    api: Option<PaymentApi>,
    stable_keys: bool,
}

impl Default for PaymentHandler {
    fn default() -> Self {
        PaymentHandler {
            runs: Arc::default(),
            guard: Guard::None,
            api: None,
            stable_keys: false,
        }
    }
}

impl PaymentHandler {
    /// The handler for `strategy`. `guarded` is false for the at-most-once and
    /// at-least-once runs, which apply payments with no idempotency at all.
    pub(crate) fn new(strategy: Strategy, guarded: bool, api: Option<PaymentApi>) -> Result<Self> {
        let guard = match (guarded, strategy) {
            (false, _) | (_, Strategy::DedupTable | Strategy::Claim) => Guard::None,
            (true, Strategy::UniqueKey) => Guard::UniqueKey,
            (true, Strategy::StateMachine) => {
                let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
                Guard::StateMachine(SqliteStateGuard::new(
                    "jo_demo_orders",
                    "order_id",
                    "status",
                    machine,
                )?)
            }
            (true, Strategy::Version) => Guard::Version(SqliteVersionGuard::new(
                "jo_demo_orders",
                "order_id",
                "version",
            )?),
        };
        Ok(PaymentHandler {
            runs: Arc::default(),
            guard,
            api,
            stable_keys: guarded,
        })
    }

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
                sqlx::query("INSERT INTO jo_demo_order_ids (order_id) VALUES (?)")
                    .bind(&p.order_id)
                    .execute(&mut **tx)
                    .await?;
                None
            }
            Guard::StateMachine(g) => g
                .transition(tx, &p.order_id, "PAID")
                .await?
                .to_disposition(),
            Guard::Version(g) => g
                .bump(tx, &p.order_id, p.version)
                .await?
                .to_disposition(p.version),
        };
        if let Some(done) = done {
            return Ok(done);
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

/// Rows per order id in `table` (the ledger, or the API's charges), and their total.
async fn per_order(pool: &SqlitePool, table: &str) -> Result<(HashMap<String, u64>, u64)> {
    let rows = sqlx::query(&format!(
        "SELECT order_id, COUNT(*) FROM {table} GROUP BY order_id"
    ))
    .fetch_all(pool)
    .await?;
    let per_order: HashMap<String, u64> = rows
        .iter()
        .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1) as u64))
        .collect();
    let total = per_order.values().sum();
    Ok((per_order, total))
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
        let (per_order, total) = per_order(pool, "jo_demo_ledger").await?;
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
