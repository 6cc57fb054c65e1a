//! The business database of each SQL dialect: its tables, the payment, the guards, the
//! counts the checker and the bench read. One trait, [`Bank`], and one macro that writes it
//! for SQLite, PostgreSQL and MariaDB from their differences (serial keys, insert-or-skip;
//! sqlx's `QueryBuilder` writes the placeholders).

use std::collections::HashMap;
use std::sync::Arc;

use justonce::backend::StoreKind;
use justonce::sql::{
    MySqlClaimStore, MySqlStateGuard, MySqlStore, MySqlStoreOptions, MySqlTx, MySqlVersionGuard,
    PgClaimStore, PgStateGuard, PgStore, PgStoreOptions, PgTx, PgVersionGuard, SqliteClaimStore,
    SqliteStateGuard, SqliteStore, SqliteStoreOptions, SqliteTx, SqliteVersionGuard,
};
use justonce::{
    async_trait, Cas, ClaimStore, DedupStore, OutboxStore, Result, StateMachine, Transition,
};

use super::{Effects, Payment, Receipt, Seen, Tables, ACCOUNTS};

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
    /// Appends one row per delivery received to `t.deliveries`, outside any consumer
    /// transaction.
    async fn record_deliveries(&self, t: &Tables, rows: &[Seen]) -> Result<()>;
    /// Rows in the ledger (cheap: for progress, not for checking).
    async fn ledger_rows(&self, t: &Tables) -> Result<u64>;
    /// The highest ledger row number committed so far: one index lookup, however long the
    /// ledger. Never below [`Bank::ledger_rows`] (rolled-back inserts leave gaps).
    async fn ledger_high(&self, t: &Tables) -> Result<u64>;
    /// Deliveries recorded, and how many of them were redeliveries: marked so by the
    /// transport, or (where deliveries carry a position) a position read again.
    async fn delivery_counts(&self, t: &Tables) -> Result<(u64, u64)>;
    /// Duplicates at the broker, from the audit table: first deliveries (not marked
    /// redelivered) of a message id beyond its first, or (where deliveries carry a
    /// position) positions of a message id beyond its first. A lower bound: a worker
    /// killed before it wrote its audit rows leaves some out.
    async fn broker_duplicates(&self, t: &Tables) -> Result<u64>;
    /// The lab's producer: records the order as placed, in the producer's transaction.
    /// False when it was placed already (a producer started again after a crash).
    async fn place(tx: &mut Self::Tx, t: &Tables, order_id: &str) -> Result<bool>;

    /// A transaction straight from the sqlx pool, as code without justonce would open it
    /// (the bench's bare baseline).
    async fn begin_direct(&self) -> Result<Self::Tx>;

    /// Commits a transaction of [`Bank::begin_direct`] with sqlx.
    async fn commit_direct(tx: Self::Tx) -> Result<()>;

    /// Closes the pool's connections.
    async fn close(&self);

    /// The outbox of this database.
    type Outbox: OutboxStore<Tx = Self::Tx> + Clone;
    /// The outbox table `t.outbox`, created if missing.
    async fn outbox(&self, t: &Tables) -> Result<Self::Outbox>;
    /// Applies a receipt: one row in `t.receipts`.
    async fn receipt(tx: &mut Self::Tx, t: &Tables, r: &Receipt) -> Result<()>;
    /// Receipt rows per order id.
    async fn receipts(&self, t: &Tables) -> Result<HashMap<String, u64>>;
    /// The bytes `table` takes on disk (with its indexes), as the database reports it.
    async fn table_bytes(&self, table: &str) -> Result<u64>;
    /// Whether the outbox table `table` holds a row that is not dead: the first one by
    /// seq, read through its primary key (cheap, where a count scans the table).
    async fn outbox_has_rows(&self, table: &str) -> Result<bool>;
}

/// Implements [`Bank`] for one database. `db` is its sqlx database, whose `QueryBuilder`
/// writes the placeholders; `serial` is an
/// auto-numbered primary key column; `ignore` is `(prefix, suffix)` of an insert that skips
/// rows whose key exists.
macro_rules! bank {
    (
        $store:ty, $opts:ty, $tx:ty, state: $state:ty, version: $version:ty, db: $db:ty,
        serial: $serial:literal, ignore: ($ins:literal, $conflict:literal),
        kind: $kind:expr,
        claims: |$self_:ident, $url:ident, $table:ident| $claims:expr,
        begin: |$pool:ident| $begin:expr,
        size: [$($size:literal),+] $(,)?
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
                let pool = self.pool();
                for ddl in [
                    format!("CREATE TABLE IF NOT EXISTS {} (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)", t.accounts),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (seq {}, order_id VARCHAR(64) NOT NULL,
                             account BIGINT NOT NULL, amount BIGINT NOT NULL)",
                        t.ledger, $serial
                    ),
                    format!("CREATE TABLE IF NOT EXISTS {} (order_id VARCHAR(64) PRIMARY KEY)", t.order_ids),
                    format!("CREATE TABLE IF NOT EXISTS {} (order_id VARCHAR(64) PRIMARY KEY)", t.placed),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (seq {}, message_id VARCHAR(255),
                             redelivered BIGINT NOT NULL, record_at VARCHAR(64))",
                        t.deliveries, $serial
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (order_id VARCHAR(64) PRIMARY KEY,
                             status VARCHAR(16) NOT NULL, version BIGINT NOT NULL)",
                        t.orders
                    ),
                    format!(
                        "CREATE TABLE IF NOT EXISTS {} (seq {}, order_id VARCHAR(64) NOT NULL,
                             account BIGINT NOT NULL)",
                        t.receipts, $serial
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
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "{} {} (order_id, status, version) ",
                        $ins, t.orders
                    ));
                    q.push_values(chunk, |mut row, id| {
                        row.push_bind(*id).push("'PENDING'").push("0");
                    });
                    q.push(concat!(" ", $conflict));
                    q.build().execute(pool).await?;
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
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "INSERT INTO {} (order_id) VALUES (",
                    t.order_ids
                ));
                q.push_bind(order_id).push(")");
                q.build().execute(&mut **tx).await?;
                Ok(())
            }

            async fn transition(g: &$state, tx: &mut $tx, order_id: &str, to: &str) -> Result<Transition> {
                g.transition(tx, order_id, to).await
            }

            async fn bump(g: &$version, tx: &mut $tx, order_id: &str, expected: i64) -> Result<Cas> {
                g.bump(tx, order_id, expected).await
            }

            async fn record_deliveries(&self, t: &Tables, rows: &[Seen]) -> Result<()> {
                for chunk in rows.chunks(500) {
                    let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                        "INSERT INTO {} (message_id, redelivered, record_at) ",
                        t.deliveries
                    ));
                    q.push_values(chunk, |mut row, seen| {
                        row.push_bind(seen.id.as_deref())
                            .push_bind(i64::from(seen.redelivered))
                            .push_bind(seen.at.as_deref());
                    });
                    q.build().execute(self.pool()).await?;
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
                // A positioned delivery is again when its position was read before; the
                // transport's mark counts where there is no position.
                let (all, again): (i64, i64) = sqlx::query_as(&format!(
                    "SELECT COUNT(*),
                            COUNT(CASE WHEN record_at IS NULL AND redelivered = 1 THEN 1 END)
                            + COUNT(record_at) - COUNT(DISTINCT record_at)
                     FROM {}",
                    t.deliveries
                ))
                .fetch_one(self.pool())
                .await?;
                Ok((all as u64, again as u64))
            }

            async fn broker_duplicates(&self, t: &Tables) -> Result<u64> {
                let n: i64 = sqlx::query_scalar(&format!(
                    // COUNT is BIGINT on every dialect (MariaDB's SUM is DECIMAL).
                    "SELECT COUNT(CASE WHEN record_at IS NULL AND redelivered = 0 THEN message_id END)
                            - COUNT(DISTINCT CASE WHEN record_at IS NULL AND redelivered = 0 THEN message_id END)
                            + COUNT(DISTINCT CASE WHEN message_id IS NOT NULL THEN record_at END)
                            - COUNT(DISTINCT CASE WHEN record_at IS NOT NULL THEN message_id END)
                     FROM {}",
                    t.deliveries
                ))
                .fetch_one(self.pool())
                .await?;
                Ok(n as u64)
            }

            async fn place(tx: &mut $tx, t: &Tables, order_id: &str) -> Result<bool> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "{} {} (order_id) VALUES (",
                    $ins, t.placed
                ));
                q.push_bind(order_id).push(concat!(") ", $conflict));
                Ok(q.build().execute(&mut **tx).await?.rows_affected() == 1)
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

            type Outbox = justonce::sql::SqlOutbox<$db>;

            async fn outbox(&self, t: &Tables) -> Result<Self::Outbox> {
                let o = justonce::sql::OutboxOptions::default().table(t.outbox.clone());
                self.outbox_with(o).await
            }

            async fn receipt(tx: &mut $tx, t: &Tables, r: &Receipt) -> Result<()> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "INSERT INTO {} (order_id, account) ",
                    t.receipts
                ));
                q.push_values([r], |mut row, r| {
                    row.push_bind(&r.order_id).push_bind(r.account);
                });
                q.build().execute(&mut **tx).await?;
                Ok(())
            }

            async fn receipts(&self, t: &Tables) -> Result<HashMap<String, u64>> {
                let rows: Vec<(String, i64)> = sqlx::query_as(&format!(
                    "SELECT order_id, COUNT(*) FROM {} GROUP BY order_id",
                    t.receipts
                ))
                .fetch_all(self.pool())
                .await?;
                Ok(rows.into_iter().map(|(id, n)| (id, n as u64)).collect())
            }

            async fn table_bytes(&self, table: &str) -> Result<u64> {
                // Statements before the last prepare the count (MariaDB's ANALYZE).
                let sizes = [$($size),+];
                let (count, before) = sizes.split_last().expect("at least one statement");
                for sql in before {
                    sqlx::raw_sql(&sql.replace("{table}", table)).execute(self.pool()).await?;
                }
                let n: i64 = sqlx::query_scalar(count).bind(table).fetch_one(self.pool()).await?;
                Ok(n.max(0) as u64)
            }

            async fn outbox_has_rows(&self, table: &str) -> Result<bool> {
                let sql = format!(
                    "SELECT seq FROM {table} WHERE dead_reason IS NULL ORDER BY seq LIMIT 1"
                );
                Ok(sqlx::query(&sql).fetch_optional(self.pool()).await?.is_some())
            }

            async fn pay(tx: &mut $tx, t: &Tables, p: &Payment) -> Result<bool> {
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "UPDATE {} SET balance = balance + ",
                    t.accounts
                ));
                q.push_bind(p.amount).push(" WHERE id = ").push_bind(p.account);
                if q.build().execute(&mut **tx).await?.rows_affected() == 0 {
                    return Ok(false);
                }
                let mut q = sqlx::QueryBuilder::<$db>::new(format!(
                    "INSERT INTO {} (order_id, account, amount) ",
                    t.ledger
                ));
                q.push_values([p], |mut row, p| {
                    row.push_bind(&p.order_id).push_bind(p.account).push_bind(p.amount);
                });
                q.build().execute(&mut **tx).await?;
                Ok(true)
            }
        }
    };
}

bank!(
    SqliteStore, SqliteStoreOptions, SqliteTx, state: SqliteStateGuard, version: SqliteVersionGuard, db: sqlx::Sqlite,
    serial: "INTEGER PRIMARY KEY AUTOINCREMENT", ignore: ("INSERT INTO", "ON CONFLICT DO NOTHING"),
    kind: StoreKind::Sqlite,
    claims: |_s, url, _t| SqliteClaimStore::open(url).await?,
    begin: |pool| justonce::sql::begin_with(pool, "BEGIN IMMEDIATE"),
    size: ["SELECT CAST(COALESCE(SUM(pgsize), 0) AS INTEGER) FROM dbstat WHERE name = ?"],
);
bank!(
    PgStore, PgStoreOptions, PgTx, state: PgStateGuard, version: PgVersionGuard, db: sqlx::Postgres,
    serial: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    ignore: ("INSERT INTO", "ON CONFLICT DO NOTHING"),
    kind: StoreKind::Postgres,
    claims: |_s, url, table| PgClaimStore::open(url, table).await?,
    begin: |pool| justonce::sql::begin(pool),
    size: ["SELECT pg_total_relation_size($1::regclass)"],
);
bank!(
    MySqlStore, MySqlStoreOptions, MySqlTx, state: MySqlStateGuard, version: MySqlVersionGuard, db: sqlx::MySql,
    serial: "BIGINT AUTO_INCREMENT PRIMARY KEY", ignore: ("INSERT IGNORE INTO", ""),
    kind: StoreKind::MySql,
    claims: |_s, url, table| MySqlClaimStore::open(url, table).await?,
    begin: |pool| justonce::sql::begin(pool),
    size: [
        "ANALYZE TABLE {table}",
        "SELECT CAST(data_length + index_length AS SIGNED) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = ?"
    ],
);
