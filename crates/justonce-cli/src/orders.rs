//! The order/payment pipeline shared by `demo` and `worker`: its business tables, its
//! handler per idempotency strategy, and the checker that counts effects from the business
//! data.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use justonce::sql::{
    MySqlClaimStore, MySqlStateGuard, MySqlStore, MySqlStoreOptions, MySqlTx, MySqlVersionGuard,
    PgClaimStore, PgStateGuard, PgStore, PgStoreOptions, PgTx, PgVersionGuard, SqliteClaimStore,
    SqliteStateGuard, SqliteStore, SqliteStoreOptions, SqliteTx, SqliteVersionGuard,
};
use justonce::{
    async_trait, Cas, ClaimStore, Context, DedupStore, Disposition, Handler, Idempotency, Message,
    Result, StateMachine, Transition,
};

use justonce::backend::StoreKind;
use serde::{Deserialize, Serialize};
use sqlx::{Row, SqlitePool};

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
        })
    }

    /// Without lock keys: batches run in the order they arrived (the bench's `--unordered`,
    /// to show what the ordering buys).
    pub(crate) fn unordered(mut self) -> Self {
        self.lock_order = false;
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
        };
        for name in t.all() {
            justonce::validate_identifier(name)?;
        }
        Ok(t)
    }

    fn all(&self) -> [&String; 7] {
        [
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

/// The demo's business database: a dedup store whose transactions the payments are written
/// in, with the SQL of its dialect. Implemented by [`bank!`] for SQLite, PostgreSQL and
/// MariaDB.
#[async_trait]
pub(crate) trait Bank: DedupStore + Clone {
    /// Which store this is.
    const KIND: StoreKind;
    /// The state-machine guard of this database.
    type StateGuard: Send + Sync + 'static;
    /// The version guard of this database.
    type VersionGuard: Send + Sync + 'static;

    /// Connects, creating the dedup table `t.dedup`.
    async fn open(url: &str, t: &Tables) -> Result<Self>;
    /// Creates the business tables if missing; `orders` are created PENDING at version 0,
    /// for the state-machine and version strategies.
    async fn setup(&self, t: &Tables, orders: &[&str]) -> Result<()>;
    /// Drops every table of `t`.
    async fn drop_tables(&self, t: &Tables) -> Result<()>;
    /// Ledger rows per order id, and whether the balances add up to the ledger.
    async fn effects(&self, t: &Tables) -> Result<Effects>;
    /// A claim store for the claim strategy: the table `t.claims` at `url` (a file of its own
    /// on SQLite).
    async fn claims(&self, url: &str, t: &Tables) -> Result<Arc<dyn ClaimStore>>;
    /// The state guard on `orders`.
    fn state_guard(orders: &str, machine: StateMachine) -> Result<Self::StateGuard>;
    /// The version guard on `orders`.
    fn version_guard(orders: &str) -> Result<Self::VersionGuard>;
    /// Records the order id under its primary key: a second time is a unique violation.
    async fn record_order(tx: &mut Self::Tx, t: &Tables, order_id: &str) -> Result<()>;
    /// Moves the order's state.
    async fn transition(
        g: &Self::StateGuard,
        tx: &mut Self::Tx,
        order_id: &str,
        to: &str,
    ) -> Result<Transition>;
    /// Bumps the order's version from `expected`.
    async fn bump(
        g: &Self::VersionGuard,
        tx: &mut Self::Tx,
        order_id: &str,
        expected: i64,
    ) -> Result<Cas>;
    /// The payment: balance and ledger row. False when the account does not exist.
    async fn pay(tx: &mut Self::Tx, t: &Tables, p: &Payment) -> Result<bool>;
    /// Appends one row per delivery received (its message id, whether the transport marked
    /// it redelivered) to `t.deliveries`, outside any consumer transaction.
    async fn record_deliveries(&self, t: &Tables, rows: &[(Option<String>, bool)]) -> Result<()>;
    /// Rows in the ledger (cheap: for progress, not for checking).
    async fn ledger_rows(&self, t: &Tables) -> Result<u64>;
    /// The highest ledger row number committed so far: one index lookup, however long the
    /// ledger. Never below [`Bank::ledger_rows`] (rolled-back inserts leave gaps).
    async fn ledger_high(&self, t: &Tables) -> Result<u64>;
    /// Deliveries recorded, and how many of them were redeliveries.
    async fn delivery_counts(&self, t: &Tables) -> Result<(u64, u64)>;

    /// A transaction straight from the sqlx pool, as code without justonce would open it
    /// (the bench's bare baseline).
    async fn begin_direct(&self) -> Result<Self::Tx>;

    /// Commits a transaction of [`Bank::begin_direct`] with sqlx.
    async fn commit_direct(tx: Self::Tx) -> Result<()>;

    /// Closes the pool's connections.
    async fn close(&self);
}

/// Implements [`Bank`] for one database. `ph` makes the n-th placeholder; `serial` is an
/// auto-numbered primary key column; `ignore` is `(prefix, suffix)` of an insert that skips
/// rows whose key exists.
macro_rules! bank {
    (
        $store:ty, $opts:ty, $tx:ty, state: $state:ty, version: $version:ty, ph: $ph:expr,
        serial: $serial:literal, ignore: ($ins:literal, $conflict:literal),
        kind: $kind:expr,
        claims: |$self_:ident, $url:ident, $table:ident| $claims:expr,
        begin: |$pool:ident| $begin:expr $(,)?
    ) => {
        #[async_trait]
        impl Bank for $store {
            const KIND: StoreKind = $kind;

            type StateGuard = $state;
            type VersionGuard = $version;

            async fn open(url: &str, t: &Tables) -> Result<Self> {
                let mut o = <$opts>::default();
                o.dedup_table = t.dedup.clone();
                <$store>::open_with(url, o).await
            }

            async fn setup(&self, t: &Tables, orders: &[&str]) -> Result<()> {
                let ph: fn(usize) -> String = $ph;
                let pool = self.pool();
                for ddl in [
                    format!("CREATE TABLE IF NOT EXISTS {} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)", t.accounts),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (seq {}, order_id VARCHAR(64) NOT NULL,
                             account BIGINT NOT NULL, amount BIGINT NOT NULL)",
                        t.ledger, $serial
                    ),
                    format!("CREATE TABLE IF NOT EXISTS {} (order_id VARCHAR(64) PRIMARY KEY)", t.order_ids),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (seq {}, message_id VARCHAR(255),
                             redelivered BIGINT NOT NULL)",
                        t.deliveries, $serial
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (order_id VARCHAR(64) PRIMARY KEY,
                             status VARCHAR(16) NOT NULL, version BIGINT NOT NULL)",
                        t.orders
                    ),
                ] {
                    sqlx::query(&ddl).execute(pool).await?;
                }
                let ids: Vec<i64> = (1..=ACCOUNTS).collect();
                for chunk in ids.chunks(1000) {
                    let rows: Vec<String> = chunk.iter().map(|i| format!("({i}, 0)")).collect();
                    let sql = format!(
                        "{} {} (id, balance) VALUES {} {}",
                        $ins, t.accounts, rows.join(", "), $conflict
                    );
                    sqlx::query(&sql).execute(pool).await?;
                }
                for chunk in orders.chunks(500) {
                    let rows: Vec<String> =
                        (1..=chunk.len()).map(|i| format!("({}, 'PENDING', 0)", ph(i))).collect();
                    let sql = format!(
                        "{} {} (order_id, status, version) VALUES {} {}",
                        $ins, t.orders, rows.join(", "), $conflict
                    );
                    let mut q = sqlx::query(&sql);
                    for id in chunk {
                        q = q.bind(*id);
                    }
                    q.execute(pool).await?;
                }
                Ok(())
            }

            async fn drop_tables(&self, t: &Tables) -> Result<()> {
                for table in t.all() {
                    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                        .execute(self.pool())
                        .await?;
                }
                Ok(())
            }

            async fn effects(&self, t: &Tables) -> Result<Effects> {
                let pool = self.pool();
                let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                    "SELECT order_id, COUNT(*) FROM {} GROUP BY order_id",
                    t.ledger
                ))
                .fetch_all(pool)
                .await?;
                let per_order: HashMap<String, u64> =
                    rows.into_iter().map(|(id, n)| (id, n as u64)).collect();
                let total = per_order.values().sum();
                // 1 when the balances add up to the ledger; COUNT keeps the type BIGINT everywhere.
                let consistent: i64 = sqlx::query_scalar(&format!(
                    "SELECT COUNT(*) FROM (SELECT 1 AS one) x
                     WHERE (SELECT COALESCE(SUM(balance), 0) FROM {})
                         = (SELECT COALESCE(SUM(amount), 0) FROM {})",
                    t.accounts, t.ledger
                ))
                .fetch_one(pool)
                .await?;
                Ok(Effects { per_order, total, consistent: consistent == 1 })
            }

            async fn claims(&self, url: &str, t: &Tables) -> Result<Arc<dyn ClaimStore>> {
                let ($self_, $url, $table) = (self, url, t.claims.as_str());
                Ok(Arc::new($claims))
            }

            fn state_guard(orders: &str, machine: StateMachine) -> Result<$state> {
                <$state>::new(orders, "order_id", "status", machine)
            }

            fn version_guard(orders: &str) -> Result<$version> {
                <$version>::new(orders, "order_id", "version")
            }

            async fn record_order(tx: &mut $tx, t: &Tables, order_id: &str) -> Result<()> {
                let ph: fn(usize) -> String = $ph;
                sqlx::query(&format!("INSERT INTO {} (order_id) VALUES ({})", t.order_ids, ph(1)))
                    .bind(order_id)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }

            async fn transition(g: &$state, tx: &mut $tx, order_id: &str, to: &str) -> Result<Transition> {
                g.transition(tx, order_id, to).await
            }

            async fn bump(g: &$version, tx: &mut $tx, order_id: &str, expected: i64) -> Result<Cas> {
                g.bump(tx, order_id, expected).await
            }

            async fn record_deliveries(&self, t: &Tables, rows: &[(Option<String>, bool)]) -> Result<()> {
                let ph: fn(usize) -> String = $ph;
                for chunk in rows.chunks(500) {
                    let marks: Vec<String> = (0..chunk.len())
                        .map(|i| format!("({}, {})", ph(2 * i + 1), ph(2 * i + 2)))
                        .collect();
                    let sql = format!(
                        "INSERT INTO {} (message_id, redelivered) VALUES {}",
                        t.deliveries,
                        marks.join(", ")
                    );
                    let mut q = sqlx::query(&sql);
                    for (id, redelivered) in chunk {
                        q = q.bind(id.as_deref()).bind(i64::from(*redelivered));
                    }
                    q.execute(self.pool()).await?;
                }
                Ok(())
            }

            async fn ledger_rows(&self, t: &Tables) -> Result<u64> {
                let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", t.ledger))
                    .fetch_one(self.pool())
                    .await?;
                Ok(n as u64)
            }

            async fn ledger_high(&self, t: &Tables) -> Result<u64> {
                let n: i64 = sqlx::query_scalar(&format!("SELECT COALESCE(MAX(seq), 0) FROM {}", t.ledger))
                    .fetch_one(self.pool())
                    .await?;
                Ok(n as u64)
            }

            async fn delivery_counts(&self, t: &Tables) -> Result<(u64, u64)> {
                let (all, again): (i64, i64) = sqlx::query_as(&format!(
                    "SELECT COUNT(*), COUNT(*) - COUNT(NULLIF(redelivered, 1)) FROM {}",
                    t.deliveries
                ))
                .fetch_one(self.pool())
                .await?;
                Ok((all as u64, again as u64))
            }

            async fn begin_direct(&self) -> Result<$tx> {
                let $pool = self.pool();
                Ok($begin.await?)
            }

            async fn commit_direct(tx: $tx) -> Result<()> {
                Ok(tx.commit().await?)
            }

            async fn close(&self) {
                self.pool().close().await;
            }

            async fn pay(tx: &mut $tx, t: &Tables, p: &Payment) -> Result<bool> {
                let ph: fn(usize) -> String = $ph;
                let updated = sqlx::query(&format!(
                    "UPDATE {} SET balance = balance + {} WHERE id = {}",
                    t.accounts, ph(1), ph(2)
                ))
                .bind(p.amount)
                .bind(p.account)
                .execute(&mut **tx)
                .await?
                .rows_affected();
                if updated == 0 {
                    return Ok(false);
                }
                sqlx::query(&format!(
                    "INSERT INTO {} (order_id, account, amount) VALUES ({}, {}, {})",
                    t.ledger, ph(1), ph(2), ph(3)
                ))
                .bind(&p.order_id)
                .bind(p.account)
                .bind(p.amount)
                .execute(&mut **tx)
                .await?;
                Ok(true)
            }
        }
    };
}

fn question(_: usize) -> String {
    "?".into()
}

fn dollar(n: usize) -> String {
    format!("${n}")
}

bank!(
    SqliteStore, SqliteStoreOptions, SqliteTx, state: SqliteStateGuard, version: SqliteVersionGuard, ph: question,
    serial: "INTEGER PRIMARY KEY AUTOINCREMENT", ignore: ("INSERT INTO", "ON CONFLICT DO NOTHING"),
    kind: StoreKind::Sqlite,
    claims: |_s, url, _t| SqliteClaimStore::open(url).await?,
    begin: |pool| pool.begin_with("BEGIN IMMEDIATE"),
);
bank!(
    PgStore, PgStoreOptions, PgTx, state: PgStateGuard, version: PgVersionGuard, ph: dollar,
    serial: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    ignore: ("INSERT INTO", "ON CONFLICT DO NOTHING"),
    kind: StoreKind::Postgres,
    claims: |_s, url, table| PgClaimStore::open(url, table).await?,
    begin: |pool| pool.begin(),
);
bank!(
    MySqlStore, MySqlStoreOptions, MySqlTx, state: MySqlStateGuard, version: MySqlVersionGuard, ph: question,
    serial: "BIGINT AUTO_INCREMENT PRIMARY KEY", ignore: ("INSERT IGNORE INTO", ""),
    kind: StoreKind::MySql,
    claims: |_s, url, table| MySqlClaimStore::open(url, table).await?,
    begin: |pool| pool.begin(),
);

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
