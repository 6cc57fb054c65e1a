use std::sync::Arc;

use std::time::Duration;

use justonce_core::{validate_identifier, Claim, Error, Fingerprint, MessageId, Result};
use sqlx::{PgPool, Postgres};
use tracing::warn;

use super::{connect, connect_with, create, MS};
use crate::dedup::{
    claimed_on_begin, impl_dedup_store, lock_order, DedupBackend, DedupSql, ManyOrder, ManySql,
};
use crate::inspect::InspectSql;

/// The claim every connection of a non-partitioned store prepares (`begin_with_claim`).
const FOLDED_CLAIM: &str = "justonce_claim";

/// The transaction a handler on a [`PgStore`] receives: write through `&mut **tx`.
pub type PgTx = sqlx::Transaction<'static, Postgres>;

/// How a [`PgStore`] keeps its dedup records.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgStoreOptions {
    /// The dedup table's name (default `jo_dedup`), validated as an SQL identifier.
    pub dedup_table: String,
    /// Connections in the pool.
    pub max_connections: u32,
    /// Keep the dedup table in daily partitions (UTC days), and purge by dropping whole
    /// partitions once every record in them is past retention: no row-by-row delete, no
    /// table bloat, no long lock. The consumer's purge loop also creates the partitions of
    /// the coming days ahead of time. Needs PostgreSQL 14 or later.
    ///
    /// The table's primary key must then include the partition key, so uniqueness of
    /// `(consumer, message id)` across days is kept by a transaction-level advisory lock on
    /// the key, taken before the claim: one more statement per message. Default `false`.
    /// Chosen when the table is created; an existing table keeps its layout.
    pub partitioned: bool,
    /// Create the dedup table if it does not exist (the default). `false` makes `open`
    /// fail when it is missing instead: for tools that must not create one by mistake
    /// (`justonce dedup`, `justonce doctor`).
    pub create: bool,
}

crate::options::setters!(PgStoreOptions { max_connections: u32, partitioned: bool, create: bool } into { dedup_table });

impl Default for PgStoreOptions {
    fn default() -> Self {
        PgStoreOptions {
            dedup_table: "jo_dedup".into(),
            max_connections: 8,
            create: true,
            partitioned: false,
        }
    }
}

/// Daily partitions created ahead of today by [`PgStoreOptions::partitioned`] stores.
const DAYS_AHEAD: i32 = 7;

/// The dedup store on PostgreSQL, in the same database as your business tables.
///
/// The claim is `INSERT … ON CONFLICT DO NOTHING` in the handler's transaction; a second
/// transaction claiming the same key waits for the first to commit or roll back, then
/// sees the outcome. Records are stamped with the database's clock.
///
/// ```no_run
/// use justonce_sql::PgStore;
///
/// # async fn run() -> justonce_core::Result<()> {
/// let store = PgStore::open("postgres://app@127.0.0.1:5432/shop").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    sql: Arc<DedupSql>,
    table: String,
    partitioned: bool,
    /// The insert of [`PgStore::begin_with_plain_claims`].
    plain_claims: String,
}

impl PgStore {
    /// Connects and creates the dedup table `jo_dedup` if missing.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, PgStoreOptions::default()).await
    }

    /// As [`PgStore::open`], with options.
    pub async fn open_with(url: &str, opts: PgStoreOptions) -> Result<Self> {
        let t = &opts.dedup_table;
        validate_identifier(t)?;
        if opts.partitioned && t.len() > 63 - "_p20261130".len() {
            return Err(Error::config(format!(
                "dedup table name `{t}` is too long for daily partitions named {t}_pYYYYMMDD"
            )));
        }
        let pool = connect(url, opts.max_connections).await?;
        let (key, layout) = if opts.partitioned {
            (
                "PRIMARY KEY (consumer, message_id, processed_at)",
                " PARTITION BY RANGE (processed_at)",
            )
        } else {
            ("PRIMARY KEY (consumer, message_id)", "")
        };
        // Keys compare byte for byte (`COLLATE "C"`, as `utf8mb4_bin` on MariaDB): a message
        // id is opaque, and the database's default collation would compare it by locale
        // rules on every B-tree step of every claim.
        if !opts.create {
            crate::dedup::table_must_exist(&pool, t, url).await?;
        } else {
            create(
                &pool,
                &[
                    format!(
                        "CREATE TABLE IF NOT EXISTS {t} (
                         consumer     TEXT        COLLATE \"C\" NOT NULL,
                         message_id   TEXT        COLLATE \"C\" NOT NULL,
                         fingerprint  TEXT        NOT NULL,
                         processed_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
                         {key}){layout}"
                    ),
                    // Records arrive in time order: a BRIN index finds the old ones for the purge
                    // at almost no cost per insert, where a B-tree adds a page write to every
                    // claim. Daily partitions are purged whole and keep their B-tree.
                    format!(
                    "CREATE INDEX IF NOT EXISTS {t}_processed_at ON {t} USING {} (processed_at)",
                    if opts.partitioned { "btree" } else { "brin" }
                ),
                ],
            )
            .await?;
        }
        let partitioned: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = $1::regclass)",
        )
        .bind(t)
        .fetch_one(&pool)
        .await?;
        let sql = if partitioned {
            DedupSql {
                // Two claims of one key serialise here; the second's INSERT then sees the
                // first's committed row, whatever partition it is in.
                lock: Some(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))".into(),
                ),
                claim: format!(
                    "INSERT INTO {t} (consumer, message_id, fingerprint)
                     SELECT $1, $2, $3
                     WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE consumer = $1 AND message_id = $2)"
                ),
                fingerprint: format!(
                    "SELECT fingerprint FROM {t} WHERE consumer = $1 AND message_id = $2 LIMIT 1"
                ),
                purge: String::new(),
                // Uniqueness across partitions is the advisory lock's: key by key.
                many: None,
                inspect: pg_inspect(t),
            }
        } else {
            DedupSql {
                lock: None,
                claim: format!(
                    "INSERT INTO {t} (consumer, message_id, fingerprint) VALUES ($1, $2, $3)
                     ON CONFLICT (consumer, message_id) DO NOTHING"
                ),
                fingerprint: format!(
                    "SELECT fingerprint FROM {t} WHERE consumer = $1 AND message_id = $2"
                ),
                purge: format!(
                    "DELETE FROM {t} WHERE ctid IN (
                         SELECT ctid FROM {t} WHERE processed_at < clock_timestamp() - $1 * {MS} LIMIT $2)"
                ),
                many: Some(ManySql::new(t, ("", String::new()), ManyOrder::Arrays)),
                inspect: pg_inspect(t),
            }
        };
        // Every connection of the store's pool prepares the claim that rides on `BEGIN`
        // (`begin_with_claim`): a simple query is parsed and planned each time, a prepared
        // statement once per connection.
        let pool = if partitioned {
            pool
        } else {
            pool.close().await;
            let prepare = format!(
                "PREPARE {FOLDED_CLAIM} (text, text, text) AS
                 INSERT INTO {t} (consumer, message_id, fingerprint) VALUES ($1, $2, $3)"
            );
            connect_with(url, opts.max_connections, Some(prepare)).await?
        };
        let store = PgStore {
            pool,
            sql: Arc::new(sql),
            table: t.clone(),
            partitioned,
            plain_claims: format!(
                "INSERT INTO {t} (consumer, message_id, fingerprint)
                 SELECT $1, * FROM unnest($2::text[], $3::text[])"
            ),
        };
        if partitioned {
            store.create_partitions().await?;
        }
        Ok(store)
    }

    /// The pool: create your business tables and read results through it.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether the dedup table is partitioned by day ([`PgStoreOptions::partitioned`]).
    pub fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    /// Creates the missing daily partitions from yesterday to [`DAYS_AHEAD`] days ahead (UTC,
    /// by the database clock). Each is created alone and attached, which locks the parent
    /// only against other DDL (`SHARE UPDATE EXCLUSIVE`), never against claims.
    async fn create_partitions(&self) -> Result<()> {
        let t = &self.table;
        let days: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT to_char(d, 'YYYYMMDD'), to_char(d, 'YYYY-MM-DD'), to_char(d + 1, 'YYYY-MM-DD')
             FROM (SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date + n AS d
                   FROM generate_series(-1, $1) AS g(n)) days",
        )
        .bind(DAYS_AHEAD)
        .fetch_all(&self.pool)
        .await?;
        let existing = self.partitions().await?;
        for (tag, from, to) in days {
            let p = format!("{t}_p{tag}");
            if existing.iter().any(|(name, _, _)| *name == p) {
                continue;
            }
            let attach = format!(
                "ALTER TABLE {t} ATTACH PARTITION {p}
                 FOR VALUES FROM ('{from} 00:00:00+00') TO ('{to} 00:00:00+00')"
            );
            let made = create(
                &self.pool,
                &[
                    format!("CREATE TABLE IF NOT EXISTS {p} (LIKE {t} INCLUDING DEFAULTS)"),
                    format!(
                        "DO $$ BEGIN
                             IF NOT EXISTS (SELECT 1 FROM pg_inherits
                                            WHERE inhrelid = '{p}'::regclass) THEN
                                 EXECUTE $a${attach}$a$;
                             END IF;
                         END $$"
                    ),
                ],
            )
            .await;
            if let Err(e) = made {
                warn!(partition = %p, error = %e.to_chain_string(), "could not create a dedup partition; will try again");
            }
        }
        Ok(())
    }

    /// The partitions: name, whether a detach is pending, whether every record in it is
    /// older than `retention` (its day ended before now minus retention).
    async fn partitions_past(&self, retention: Duration) -> Result<Vec<(String, bool, bool)>> {
        Ok(sqlx::query_as(&format!(
            "SELECT c.relname::text, i.inhdetachpending,
                    to_date(right(c.relname, 8), 'YYYYMMDD') + 1
                        <= ((clock_timestamp() - $1 * {MS}) AT TIME ZONE 'UTC')::date
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = $2::regclass AND c.relname ~ '_p[0-9]{{8}}$'"
        ))
        .bind(retention.as_millis() as i64)
        .bind(&self.table)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn partitions(&self) -> Result<Vec<(String, bool, bool)>> {
        self.partitions_past(Duration::ZERO).await
    }

    /// The purge of a partitioned table: detaches (concurrently: claims are never blocked)
    /// and drops each partition past retention, then creates the coming days' partitions.
    /// Returns the records dropped.
    async fn drop_partitions(&self, retention: Duration) -> Result<u64> {
        let t = &self.table;
        let mut dropped = 0u64;
        for (p, pending, expired) in self.partitions_past(retention).await? {
            if !expired {
                continue;
            }
            // A detach interrupted midway (a lost connection) is finished, not restarted.
            let detach = if pending {
                format!("ALTER TABLE {t} DETACH PARTITION {p} FINALIZE")
            } else {
                format!("ALTER TABLE {t} DETACH PARTITION {p} CONCURRENTLY")
            };
            sqlx::raw_sql(&detach).execute(&self.pool).await?;
            let rows: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {p}"))
                .fetch_one(&self.pool)
                .await?;
            sqlx::raw_sql(&format!("DROP TABLE {p}"))
                .execute(&self.pool)
                .await?;
            dropped += rows as u64;
        }
        self.create_partitions().await?;
        Ok(dropped)
    }

    /// Begins a transaction with `keys` claimed in it, the cheap way, while no key is
    /// stored; answers `None` to leave it to `begin` and `claim_many`, which tell a
    /// duplicate from a conflict. Not on a partitioned table, whose claims need their
    /// advisory locks first.
    async fn begin_with_claim(
        &self,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(PgTx, Vec<Claim>)>> {
        if self.partitioned {
            return Ok(None);
        }
        match keys {
            [] => Ok(None),
            [(id, fp)] => self.begin_with_folded_claim(consumer, id, *fp).await,
            _ => self.begin_with_plain_claims(consumer, keys).await,
        }
    }

    /// An unbatched consumer's claim rides on its `BEGIN`: one simple query, `EXECUTE` of
    /// the claim every connection prepared, then `BEGIN`. The statements before a `BEGIN`
    /// in one query join the transaction it opens; a stored key fails the insert, the
    /// query stops before its `BEGIN`, the implicit transaction rolls back and the
    /// connection is idle again. Saves one round trip per message, which is most of what
    /// effectively-once costs an unbatched consumer. A simple query takes no parameters:
    /// the values are `E'…'` literals (see [`literal`]).
    async fn begin_with_folded_claim(
        &self,
        consumer: &str,
        id: &MessageId,
        fp: Fingerprint,
    ) -> Result<Option<(PgTx, Vec<Claim>)>> {
        let sql = format!(
            "EXECUTE {FOLDED_CLAIM}({}, {}, '{}'); BEGIN",
            literal(consumer),
            literal(id.as_str()),
            fp.to_hex()
        );
        let begun = crate::begin_with(&self.pool, sql).await;
        // The session lost its prepared statements (`DISCARD ALL`, a pooler's reset): this
        // connection claims the usual way from now on.
        if let Err(sqlx::Error::Database(e)) = &begun {
            if e.code().as_deref() == Some("26000") {
                tracing::debug!(table = %self.table, "no prepared claim on this connection: {e}");
                return Ok(None);
            }
        }
        claimed_on_begin(begun)
    }

    /// A batch's claims as a plain `INSERT` of every key, from two arrays. `ON CONFLICT DO
    /// NOTHING` makes PostgreSQL insert each row speculatively (a probe of the index before
    /// the heap insert, and one more WAL record to confirm it): 0.55 ms against 0.36 ms for
    /// 100 rows, measured with pgbench. A stored key fails the insert and with it the
    /// transaction, which is rolled back; the batch then claims the usual way. A batch that
    /// holds an id twice goes that way at once.
    async fn begin_with_plain_claims(
        &self,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(PgTx, Vec<Claim>)>> {
        let sorted = lock_order(keys);
        if sorted.len() != keys.len() {
            return Ok(None);
        }
        let (ids, fps) = arrays(&sorted);
        let mut tx = crate::begin(&self.pool).await?;
        let inserted = sqlx::query(&self.plain_claims)
            .bind(consumer)
            .bind(ids)
            .bind(fps)
            .execute(&mut *tx)
            .await;
        match inserted {
            Ok(_) => Ok(Some((tx, vec![Claim::Fresh; keys.len()]))),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                tx.rollback().await?;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[async_trait::async_trait]
impl DedupBackend for PgStore {
    type Db = Postgres;
    const NAME: &'static str = "postgres";
    /// An advisory lock of the database, shared (tried, never waited for) or exclusive,
    /// keyed by a hash of the consumer's name (64 bits; the prefix keeps it apart from the
    /// partitioned claim's locks). The patient try sets `lock_timeout` for the rest of the
    /// transaction only when it took the lock: a refused batch goes on to take it alone,
    /// and waits as long as that takes.
    const TURN: Option<[&'static str; 3]> = Some([
        "SELECT pg_try_advisory_xact_lock_shared(hashtextextended('justonce.turn' || chr(31) || $1, 0))::int::bigint",
        "SELECT t::int::bigint, CASE WHEN t THEN set_config('lock_timeout', $2, true) END
         FROM (SELECT pg_try_advisory_xact_lock_shared(hashtextextended('justonce.turn' || chr(31) || $1, 0)) AS t) s",
        "SELECT pg_advisory_xact_lock(hashtextextended('justonce.turn' || chr(31) || $1, 0))",
    ]);

    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn sql(&self) -> &DedupSql {
        &self.sql
    }

    /// `begin_with_claim` takes batches too (a plain insert after `BEGIN`, which needs the
    /// fingerprints first), except on a partitioned table.
    fn claims_with_begin(&self, _n: usize) -> bool {
        !self.partitioned
    }

    async fn begin_claimed(
        &self,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(PgTx, Vec<Claim>)>> {
        self.begin_with_claim(consumer, keys).await
    }

    /// A batch's claims in one statement of three parameters (consumer, ids, fingerprints):
    /// the ids it did not insert, because they were stored before.
    async fn claim_arrays(
        &self,
        tx: &mut PgTx,
        consumer: &str,
        keys: &[(&MessageId, Fingerprint)],
    ) -> Result<std::collections::HashSet<String>> {
        let many = self.sql.many.as_ref().ok_or_else(|| {
            Error::new(
                justonce_core::ErrorKind::Internal,
                "a partitioned table has no array claims",
            )
        })?;
        let (ids, fps) = arrays(keys);
        let skipped: Vec<String> = sqlx::query_scalar(&many.insert(keys.len()))
            .bind(consumer)
            .bind(ids)
            .bind(fps)
            .fetch_all(&mut **tx)
            .await?;
        Ok(skipped.into_iter().collect())
    }

    /// The purge of a partitioned table; `None` (batched delete) otherwise.
    async fn purge_own(&self, retention: Duration, _batch: u32) -> Result<Option<u64>> {
        if !self.partitioned {
            return Ok(None);
        }
        self.drop_partitions(retention).await.map(Some)
    }
}

impl_dedup_store!(PgStore, PgTx);

/// The ids and the hex fingerprints of `keys`, as the two arrays the batch claims bind.
fn arrays<'a>(keys: &[(&'a MessageId, Fingerprint)]) -> (Vec<&'a str>, Vec<String>) {
    keys.iter()
        .map(|(id, fp)| (id.as_str(), fp.to_hex()))
        .unzip()
}

/// `s` as a PostgreSQL escape-string literal: `E'…'` with `\` and `'` doubled, which reads
/// back as `s` whatever `standard_conforming_strings` says. PostgreSQL text holds no NUL
/// (a bound parameter fails on it the same way).
fn literal(s: &str) -> String {
    format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The statements tools read the dedup table `t` with.
fn pg_inspect(t: &str) -> InspectSql {
    let ms = "(EXTRACT(EPOCH FROM processed_at) * 1000)::bigint";
    let now = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint";
    InspectSql::new(t, ms, "({})::text", ["$1", "$2"], now).deadlocks(
        "SELECT deadlocks::text, COALESCE('its statistics were reset at ' || \
         date_trunc('second', stats_reset)::text, 'it keeps statistics') \
         FROM pg_stat_database WHERE datname = current_database()",
    )
}
