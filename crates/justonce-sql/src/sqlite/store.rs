use std::sync::Arc;
use std::time::Duration;

use justonce_core::{validate_identifier, Claim, Fingerprint, MessageId, Result};
use sqlx::{Sqlite, SqlitePool};
use tokio::sync::Mutex;

use super::{connect, NOW_MS};
use crate::dedup::{
    claimed_on_begin, impl_dedup_store, DedupBackend, DedupSql, ManyOrder, ManySql,
};
use crate::inspect::InspectSql;

/// The transaction a handler on a [`SqliteStore`] receives: write through `&mut **tx`.
pub type SqliteTx = sqlx::Transaction<'static, Sqlite>;

/// The dedup table: one B-tree in key order, and no index on `processed_at` (it would hold
/// every key a second time and make each batch write about 70% more pages; the purge
/// sweeps the keys instead, see `SqliteStore::sweep`). The index that tables of earlier
/// versions have is dropped: nothing reads it any more.
fn schema(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
             consumer     TEXT    NOT NULL,
             message_id   TEXT    NOT NULL,
             fingerprint  TEXT    NOT NULL,
             processed_at INTEGER NOT NULL,
             PRIMARY KEY (consumer, message_id)
         ) WITHOUT ROWID;
         DROP INDEX IF EXISTS {table}_processed_at;"
    )
}

/// How a [`SqliteStore`] keeps its dedup records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SqliteStoreOptions {
    /// The dedup table's name (default `jo_dedup`), validated as an SQL identifier.
    pub dedup_table: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Create the dedup table if it does not exist (the default). `false` makes `open`
    /// fail when it is missing instead: for tools that must not create one by mistake
    /// (`justonce dedup`, `justonce doctor`).
    pub create: bool,
}

crate::options::setters!(SqliteStoreOptions { max_connections: u32, create: bool } into { dedup_table });

impl Default for SqliteStoreOptions {
    fn default() -> Self {
        SqliteStoreOptions {
            dedup_table: "jo_dedup".into(),
            max_connections: 4,
            create: true,
        }
    }
}

/// The dedup store on SQLite, in the same file as your business tables.
///
/// Transactions start with `BEGIN IMMEDIATE`, so a handler that reads before it writes
/// cannot fail on a stale snapshot under SQLite's single writer.
///
/// ```no_run
/// use justonce_sql::SqliteStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = SqliteStore::open("sqlite:app.db").await?;
/// sqlx::query("CREATE TABLE IF NOT EXISTS ledger (order_id TEXT, cents INTEGER)")
///     .execute(store.pool())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<DedupSql>,
    sweep: Arc<Sweeper>,
    /// `INSERT OR ROLLBACK INTO {table} (…) VALUES`: the claim that rides on `BEGIN
    /// IMMEDIATE` (`SqliteStore::begin_with_claim`).
    fold: Arc<str>,
}

/// The purge's statements, and where its pass over the dedup table's keys is.
#[derive(Debug)]
struct Sweeper {
    /// The store's clock, in ms.
    now: String,
    /// One window: `(after consumer, after id, batch)`.
    read: String,
    /// The expired records of one window: `(after consumer, after id, last consumer, last
    /// id, cutoff, batch)`.
    delete: String,
    state: Mutex<SweepState>,
}

#[derive(Debug, Default)]
struct SweepState {
    /// The pass under way; `None` between passes.
    pass: Option<Pass>,
    /// What the last finished pass left: no record is older than this (ms, store clock).
    horizon: Option<i64>,
}

#[derive(Debug)]
struct Pass {
    /// The last key the pass has looked at (`("", "")` before the first: ids are never
    /// empty).
    after: (String, String),
    /// The oldest `processed_at` the pass has kept, or the store's clock when it began if
    /// older: every key it did not see is younger than that.
    oldest_kept: i64,
}

/// A pass waits until the oldest record it may find is this fraction of the retention
/// past its expiry, so that passes are rare (a record is kept for 1 to 1.125 retentions).
const SLACK_DIVISOR: i64 = 8;

impl SqliteStore {
    /// Opens (creating if needed) the SQLite file at `url` and its dedup table `jo_dedup`.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, SqliteStoreOptions::default()).await
    }

    /// As [`SqliteStore::open`], with options.
    pub async fn open_with(url: &str, opts: SqliteStoreOptions) -> Result<Self> {
        let table = &opts.dedup_table;
        validate_identifier(table)?;
        let pool = connect(url, true, opts.max_connections, false, opts.create).await?;
        if opts.create {
            sqlx::raw_sql(&schema(table)).execute(&pool).await?;
        } else {
            crate::dedup::table_must_exist(&pool, table, url).await?;
        }
        let sql = DedupSql {
            lock: None,
            claim: format!(
                "INSERT INTO {table} (consumer, message_id, fingerprint, processed_at)
                 VALUES (?, ?, ?, {NOW_MS}) ON CONFLICT (consumer, message_id) DO NOTHING"
            ),
            fingerprint: format!(
                "SELECT fingerprint FROM {table} WHERE consumer = ? AND message_id = ?"
            ),
            // `SqliteStore::sweep` purges.
            purge: String::new(),
            many: Some(ManySql::new(
                table,
                (", processed_at", format!(", {NOW_MS}")),
                ManyOrder::StatementRollback,
            )),
            inspect: InspectSql::new(
                table,
                "processed_at",
                "CAST({} AS TEXT)",
                ["?", "?"],
                super::NOW_MS,
            ),
        };
        Ok(SqliteStore {
            pool,
            fold: format!(
                "INSERT OR ROLLBACK INTO {table} (consumer, message_id, fingerprint, processed_at) VALUES"
            )
            .into(),
            sql: Arc::new(sql),
            sweep: Arc::new(Sweeper {
                now: format!("SELECT {NOW_MS}"),
                read: format!(
                    "SELECT consumer, message_id, processed_at FROM {table}
                     WHERE (consumer, message_id) > (?, ?) ORDER BY consumer, message_id LIMIT ?"
                ),
                delete: format!(
                    "DELETE FROM {table} WHERE (consumer, message_id) IN (
                         SELECT consumer, message_id FROM {table}
                         WHERE (consumer, message_id) > (?, ?) AND (consumer, message_id) <= (?, ?)
                           AND processed_at < ? LIMIT ?)"
                ),
                state: Mutex::default(),
            }),
        })
    }

    /// The purge: a pass over the table in key order, `batch` keys at a time. Each window is
    /// read outside any transaction (WAL readers never wait for the writer), then its expired
    /// records are deleted by one short statement over the window's key range, so a purge
    /// never holds the write lock for longer than one window. A call goes on from where the
    /// last one stopped until it has deleted `batch` records or the pass ends. A finished
    /// pass knows the oldest record it kept; the next pass starts only once that record is
    /// an eighth of the retention past its expiry, so a table with nothing to purge is read
    /// once per eighth of the retention, not once per purge interval.
    async fn sweep(&self, retention: Duration, batch: u32) -> Result<Option<u64>> {
        let sweeper = &self.sweep;
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let now: i64 = sqlx::query_scalar(&sweeper.now)
            .fetch_one(&self.pool)
            .await?;
        let cutoff = now.saturating_sub(retention_ms);
        let mut state = sweeper.state.lock().await;
        let SweepState { pass, horizon } = &mut *state;
        let pass = match pass {
            Some(pass) => pass,
            None => {
                let slack = retention_ms / SLACK_DIVISOR;
                if horizon.is_some_and(|h| cutoff <= h.saturating_add(slack)) {
                    return Ok(Some(0));
                }
                pass.insert(Pass {
                    after: (String::new(), String::new()),
                    oldest_kept: now,
                })
            }
        };
        let (mut deleted, mut finished) = (0u64, false);
        while deleted < u64::from(batch) && !finished {
            let want = u64::from(batch) - deleted;
            let (c, m) = &pass.after;
            let rows: Vec<(String, String, i64)> = sqlx::query_as(&sweeper.read)
                .bind(c)
                .bind(m)
                .bind(want as i64)
                .fetch_all(&self.pool)
                .await?;
            let mut expired = false;
            for &(_, _, at) in &rows {
                if at < cutoff {
                    expired = true;
                } else {
                    pass.oldest_kept = pass.oldest_kept.min(at);
                }
            }
            finished = (rows.len() as u64) < want; // the end of the table
            let Some((lc, lm, _)) = rows.into_iter().last() else {
                break;
            };
            if expired {
                deleted += sqlx::query(&sweeper.delete)
                    .bind(c)
                    .bind(m)
                    .bind(&lc)
                    .bind(&lm)
                    .bind(cutoff)
                    .bind(want as i64)
                    .execute(&self.pool)
                    .await?
                    .rows_affected();
            }
            pass.after = (lc, lm);
        }
        if finished {
            *horizon = Some(pass.oldest_kept);
            state.pass = None;
        }
        Ok(Some(deleted))
    }

    /// An unbatched consumer's claim rides on its `BEGIN IMMEDIATE`: one `sqlite3_exec` of
    /// `BEGIN IMMEDIATE; INSERT OR ROLLBACK …`, which saves the claim's round trip to the
    /// connection's thread. A stored key breaks the insert, and `OR ROLLBACK` rolls the
    /// whole transaction back with it, so the connection is out of any transaction when the
    /// begin fails, as sqlx expects; the claim then goes the usual way, which tells a
    /// duplicate from a conflict. The statement is parsed each time, which a prepared one
    /// would not be: cheap for one row, dearer than the round trip for a batch (0.46 ms
    /// against 0.20 for 100 rows), so batches are left to `claim_many`. The values are
    /// literals; an id holding a NUL, which SQL text cannot carry, goes the usual way too.
    async fn begin_with_claim(
        &self,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(SqliteTx, Vec<Claim>)>> {
        let [(id, fp)] = keys else {
            return Ok(None);
        };
        if consumer.contains('\0') || id.as_str().contains('\0') {
            return Ok(None);
        }
        let sql = format!(
            "BEGIN IMMEDIATE; {} ({}, {}, '{}', {NOW_MS})",
            self.fold,
            literal(consumer),
            literal(id.as_str()),
            fp.to_hex()
        );
        let begun = crate::begin_with(&self.pool, sql).await;
        // Not a stored key, nor a begin that waited in vain for the write lock: the insert
        // failed inside the transaction its `BEGIN IMMEDIATE` opened.
        if let Err(e) = &begun {
            let before_begin = match e {
                sqlx::Error::Database(d) => {
                    d.is_unique_violation() || matches!(d.code().as_deref(), Some("5" | "6"))
                }
                _ => true,
            };
            if !before_begin {
                self.unstick().await;
            }
        }
        claimed_on_begin(begun)
    }

    /// After a `BEGIN IMMEDIATE; INSERT …` whose insert failed for another reason than a
    /// stored key (its table renamed away by a deploy mistake): the `BEGIN` ran, yet sqlx
    /// counts no transaction and never rolls it back, so the connection would hold the
    /// write lock until the process ends, every other writer would wait, and the consumer
    /// would not recover when the table is back. Once the connection is back in the pool
    /// (sqlx returns it in a task of its own), roll back every idle connection: on one
    /// outside a transaction `ROLLBACK` fails harmlessly. Gives up after 100 ms.
    async fn unstick(&self) {
        for _ in 0..50 {
            let mut idle = Vec::new();
            let mut found = false;
            while let Some(mut conn) = self.pool.try_acquire() {
                found |= sqlx::Executor::execute(&mut *conn, "ROLLBACK")
                    .await
                    .is_ok();
                idle.push(conn);
            }
            drop(idle);
            if found {
                tracing::debug!("rolled back the transaction a failed begin left open");
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tracing::warn!("a failed begin may have left a transaction open on its connection");
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// `s` as an SQLite string literal: quotes doubled, nothing else escaped (SQLite has no
/// backslash escapes).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[async_trait::async_trait]
impl DedupBackend for SqliteStore {
    type Db = Sqlite;
    const NAME: &'static str = "sqlite";
    const BEGIN: Option<&'static str> = Some("BEGIN IMMEDIATE");

    fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    fn sql(&self) -> &DedupSql {
        &self.sql
    }

    /// `begin_with_claim` takes single keys only: a batch is hashed while its `BEGIN` waits.
    fn claims_with_begin(&self, n: usize) -> bool {
        n == 1
    }

    async fn begin_claimed(
        &self,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(SqliteTx, Vec<Claim>)>> {
        self.begin_with_claim(consumer, keys).await
    }

    async fn purge_own(&self, retention: Duration, batch: u32) -> Result<Option<u64>> {
        self.sweep(retention, batch).await
    }
}

impl_dedup_store!(SqliteStore, SqliteTx);
