//! What every SQL store shares. Each backend provides its DDL and its SQL text, with
//! parameters always bound in the order documented on [`DedupSql`] and [`ClaimSql`]; the
//! trait implementations are written once, here, by macro.

use justonce_core::{Claim, Fingerprint};

/// The dedup store's statements. Parameters, in order:
/// - `lock` (optional, run before `claim` in the same transaction): consumer, message id;
/// - `claim`: consumer, message id, fingerprint (the time comes from the database clock);
/// - `fingerprint`: consumer, message id;
/// - `purge`: retention in milliseconds, batch size (empty for a store whose `purge:` hook
///   always purges its own way: SQLite's sweep, PostgreSQL's partitions).
#[derive(Debug)]
pub(crate) struct DedupSql {
    pub(crate) lock: Option<String>,
    pub(crate) claim: String,
    pub(crate) fingerprint: String,
    pub(crate) purge: String,
    /// A batch's claims in two statements; `None` claims key by key.
    pub(crate) many: Option<ManySql>,
}

/// The statements of `claim_many` for a dedup table with a unique `(consumer, message_id)`
/// (SQLite, PostgreSQL). The insert takes, row by row, the consumer, the id and the
/// fingerprint, as anonymous `?` (SQLite, the only store of plain multi-row inserts: it
/// looks a numbered parameter's name up in a list on every bind, a cost that grows with the
/// square of the row count); or, as `Arrays`, the consumer `$1`, then the ids and the
/// fingerprints as two arrays. The select takes the consumer `$1`, then the message ids
/// (numbered, which SQLite reads too).
#[derive(Debug)]
pub(crate) struct ManySql {
    pub(crate) table: String,
    /// Columns and values after `(consumer, message_id, fingerprint`: `""` when the table's
    /// default stamps the row, or `", processed_at"` and its SQL expression.
    pub(crate) stamp: (&'static str, String),
    /// How the batch learns which keys were there before it:
    /// - `Arrays` (PostgreSQL): one statement takes the batch as two arrays, inserts skipping
    ///   stored keys and answers the ids it skipped (none, nearly always); then the batch
    ///   reads the fingerprints of those. Safe under concurrent claims: a second
    ///   transaction's insert waits on the first's row and then skips it.
    /// - `StatementRollback` (SQLite): a plain insert of every key; SQLite undoes a statement
    ///   that breaks a constraint alone and the transaction goes on, so on a stored key the
    ///   batch reads the stored fingerprints and inserts the rest. sqlx runs a SQLite
    ///   connection on its own thread and sends every returned row across a channel: while
    ///   no key is stored (nearly always) the claim is one statement that returns nothing.
    pub(crate) order: ManyOrder,
    /// The inserts made so far, by row count: a batch's is built once, not per batch.
    pub(crate) inserts: std::sync::Mutex<std::collections::HashMap<usize, std::sync::Arc<str>>>,
}

/// See [`ManySql::order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManyOrder {
    Arrays,
    StatementRollback,
}

/// Keys per statement: three parameters each stays far below every placeholder limit.
pub(crate) const MANY_CHUNK: usize = 500;

impl ManySql {
    pub(crate) fn new(table: &str, stamp: (&'static str, String), order: ManyOrder) -> Self {
        ManySql {
            table: table.to_owned(),
            stamp,
            order,
            inserts: Default::default(),
        }
    }

    /// [`ManySql::build_insert`], built once per row count (once for `Arrays`).
    pub(crate) fn insert(&self, n: usize) -> std::sync::Arc<str> {
        let n = if self.order == ManyOrder::Arrays {
            0
        } else {
            n
        };
        let mut inserts = self.inserts.lock().unwrap_or_else(|e| e.into_inner());
        if inserts.len() > 64 {
            inserts.clear(); // batch sizes vary without bound only if the caller's do
        }
        inserts
            .entry(n)
            .or_insert_with(|| self.build_insert(n).into())
            .clone()
    }

    /// The insert of `n` keys, as [`ManySql::order`] says: of the arrays `$2` (ids) and `$3`
    /// (fingerprints) for consumer `$1`, skipping the stored ones and answering their ids
    /// (`n` is not used); or a plain insert of `n` rows of `(consumer, id, fingerprint)`
    /// that fails on a stored key.
    fn build_insert(&self, n: usize) -> String {
        let (col, value) = &self.stamp;
        if self.order == ManyOrder::Arrays {
            // The ids compare as the key column does (`COLLATE "C"`), whatever collation
            // an older table was created with.
            return format!(
                "WITH k (message_id, fingerprint) AS (SELECT * FROM unnest($2::text[], $3::text[])),
                      ins AS (INSERT INTO {t} (consumer, message_id, fingerprint{col})
                              SELECT $1, message_id, fingerprint{value} FROM k
                              ON CONFLICT (consumer, message_id) DO NOTHING
                              RETURNING message_id)
                 SELECT message_id FROM k
                 WHERE NOT EXISTS (SELECT 1 FROM ins
                                   WHERE ins.message_id = k.message_id COLLATE \"C\")",
                t = self.table
            );
        }
        let rows: Vec<String> = (0..n).map(|_| format!("(?, ?, ?{value})")).collect();
        format!(
            "INSERT INTO {} (consumer, message_id, fingerprint{col}) VALUES {}",
            self.table,
            rows.join(", "),
        )
    }

    pub(crate) fn select(&self, n: usize) -> String {
        let ids: Vec<String> = (0..n).map(|k| format!("${}", k + 2)).collect();
        format!(
            "SELECT message_id, fingerprint FROM {} WHERE consumer = $1 AND message_id IN ({})",
            self.table,
            ids.join(", ")
        )
    }
}

/// The answer of a `BEGIN` that carried a single key's claim: the transaction with the key
/// fresh, or `None` when the key was stored (the begin failed on it, leaving no
/// transaction; the claim then goes the usual way, which tells a duplicate from a conflict).
pub(crate) fn claimed_on_begin<T>(
    begun: std::result::Result<T, sqlx::Error>,
) -> justonce_core::Result<Option<(T, Vec<Claim>)>> {
    match begun {
        Ok(tx) => Ok(Some((tx, vec![Claim::Fresh]))),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Each key once (its first occurrence), sorted by id: every claim of a batch takes its row
/// locks in this order, so two batches holding the same keys cannot deadlock on them.
pub(crate) fn lock_order<'a>(
    keys: &[(&'a justonce_core::MessageId, Fingerprint)],
) -> Vec<(&'a justonce_core::MessageId, Fingerprint)> {
    let mut distinct = keys.to_vec();
    // Stable: of two equal ids, the first stays first, and `dedup` keeps it.
    distinct.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    distinct.dedup_by(|b, a| a.0 == b.0);
    distinct
}

/// The answers of `claim_many` in the order of `keys`, from the ids the insert recorded
/// and the fingerprints stored before for the others.
pub(crate) fn many_answers(
    keys: &[(&justonce_core::MessageId, Fingerprint)],
    inserted: &std::collections::HashSet<&str>,
    stored: &std::collections::HashMap<String, String>,
) -> justonce_core::Result<Vec<Claim>> {
    let mut record: std::collections::HashMap<&str, Fingerprint> = Default::default();
    let mut out = Vec::with_capacity(keys.len());
    for (id, fp) in keys {
        let id = id.as_str();
        if let Some(first) = record.get(id) {
            out.push(if first == fp {
                Claim::Duplicate
            } else {
                Claim::Conflict { stored: *first }
            });
            continue;
        }
        let claim = if inserted.contains(id) {
            record.insert(id, *fp);
            Claim::Fresh
        } else {
            let s = stored.get(id).ok_or_else(|| {
                justonce_core::Error::new(
                    justonce_core::ErrorKind::Busy,
                    format!("dedup record of {id} neither inserted nor found; retry the batch"),
                )
            })?;
            let c = existing(s, *fp);
            record.insert(
                id,
                match c {
                    Claim::Conflict { stored } => stored,
                    _ => *fp,
                },
            );
            c
        };
        out.push(claim);
    }
    Ok(out)
}

/// The claim store's statements. Parameters, in order:
/// - `insert`: consumer, message id, fingerprint, lease in milliseconds;
/// - `select` (locking the row; columns `fingerprint, state, token, result, remaining`) and
///   `token`: consumer, message id;
/// - `takeover`: token, fingerprint, lease in milliseconds, consumer, message id;
/// - `complete`: result, consumer, message id, token;
/// - `release`: consumer, message id, token;
/// - `purge`: retention in milliseconds, batch size.
#[derive(Debug)]
pub(crate) struct ClaimSql {
    pub(crate) insert: String,
    pub(crate) select: String,
    pub(crate) takeover: String,
    pub(crate) complete: String,
    pub(crate) token: String,
    pub(crate) release: String,
    pub(crate) purge: String,
}

/// What a claim that inserted nothing found: the fingerprint stored with the key.
pub(crate) fn existing(stored: &str, fp: Fingerprint) -> Claim {
    match Fingerprint::from_hex(stored) {
        Some(s) if s == fp => Claim::Duplicate,
        Some(s) => Claim::Conflict { stored: s },
        None => Claim::Conflict {
            stored: Fingerprint::of(stored.as_bytes()),
        },
    }
}

/// `Store` and `DedupStore` for a struct with fields `pool` and `sql: Arc<DedupSql>`.
/// `begin:` is the pool call that opens a transaction; `purge:` names an inherent method
/// `(retention, batch) -> Result<Option<u64>>` that purges in its own way, or answers `None` to
/// leave it to the batched delete of `sql.purge`; `begin_claimed:` names an inherent method
/// `(consumer, keys) -> Result<Option<(Tx, Vec<Claim>)>>` that begins and claims its own,
/// cheaper way, or answers `None` to leave it to `begin` then `claim_many` (with it, an
/// inherent `claims_batches_with_begin(&self) -> bool` says whether that way takes batches
/// too: `begin_with_claims` then hashes a batch before its `BEGIN`, not while it waits on it);
/// `arrays:` names
/// an associated fn `(many, tx, consumer, keys) -> Result<HashSet<String>>` that runs the
/// [`ManyOrder::Arrays`] insert and answers the ids it skipped (a store whose `ManySql` is
/// `Arrays` must name it).
macro_rules! impl_dedup_store {
    (
        $store:ty, $tx:ty, $backend:literal, begin: $begin:ident ( $($arg:expr)? )
        $(, purge: $purge:ident)? $(, begin_claimed: $bc:ident)? $(, arrays: $arrays:ident)?
    ) => {
        #[async_trait::async_trait]
        impl justonce_core::Store for $store {
            type Tx = $tx;

            fn backend(&self) -> &'static str {
                $backend
            }

            async fn begin(&self) -> justonce_core::Result<$tx> {
                Ok(self.pool.$begin($($arg)?).await?)
            }

            async fn commit(&self, tx: $tx) -> justonce_core::Result<()> {
                Ok(tx.commit().await?)
            }

            async fn rollback(&self, tx: $tx) -> justonce_core::Result<()> {
                Ok(tx.rollback().await?)
            }

            async fn savepoint(&self, tx: &mut $tx) -> justonce_core::Result<()> {
                sqlx::query("SAVEPOINT jo_message").execute(&mut **tx).await?;
                Ok(())
            }

            async fn release_savepoint(&self, tx: &mut $tx) -> justonce_core::Result<()> {
                sqlx::query("RELEASE SAVEPOINT jo_message").execute(&mut **tx).await?;
                Ok(())
            }

            /// `ROLLBACK TO` keeps the savepoint open: release it, or they pile up per batch.
            async fn rollback_to_savepoint(&self, tx: &mut $tx) -> justonce_core::Result<()> {
                sqlx::query("ROLLBACK TO SAVEPOINT jo_message").execute(&mut **tx).await?;
                sqlx::query("RELEASE SAVEPOINT jo_message").execute(&mut **tx).await?;
                Ok(())
            }
        }

        impl $store {
            /// The fingerprints stored for `ids` of `consumer`, by message id.
            async fn stored_many(
                many: &$crate::common::ManySql,
                tx: &mut $tx,
                consumer: &str,
                ids: &[&str],
            ) -> justonce_core::Result<std::collections::HashMap<String, String>> {
                use sqlx::Row as _;
                let mut stored = std::collections::HashMap::new();
                if ids.is_empty() {
                    return Ok(stored);
                }
                let sql = many.select(ids.len());
                let mut q = sqlx::query(&sql).bind(consumer);
                for id in ids {
                    q = q.bind(*id);
                }
                for row in q.fetch_all(&mut **tx).await? {
                    stored.insert(row.try_get::<String, _>(0)?, row.try_get::<String, _>(1)?);
                }
                Ok(stored)
            }
        }

        #[async_trait::async_trait]
        impl justonce_core::DedupStore for $store {
            async fn claim(
                &self,
                tx: &mut $tx,
                key: justonce_core::DedupKey<'_>,
                fp: justonce_core::Fingerprint,
            ) -> justonce_core::Result<justonce_core::Claim> {
                if let Some(lock) = &self.sql.lock {
                    sqlx::query(lock)
                        .bind(key.consumer)
                        .bind(key.message_id.as_str())
                        .execute(&mut **tx)
                        .await?;
                }
                let inserted = sqlx::query(&self.sql.claim)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .bind(fp.to_hex())
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
                if inserted == 1 {
                    return Ok(justonce_core::Claim::Fresh);
                }
                let stored: String = sqlx::query_scalar(&self.sql.fingerprint)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .fetch_one(&mut **tx)
                    .await?;
                Ok($crate::common::existing(&stored, fp))
            }

            async fn claim_many(
                &self,
                tx: &mut $tx,
                consumer: &str,
                keys: &[(&justonce_core::MessageId, justonce_core::Fingerprint)],
            ) -> justonce_core::Result<Vec<justonce_core::Claim>> {
                let Some(many) = &self.sql.many else {
                    return justonce_core::store::defaults::claim_each(self, tx, consumer, keys).await;
                };
                let distinct = $crate::common::lock_order(keys);
                let mut inserted = std::collections::HashSet::new();
                let mut stored = std::collections::HashMap::new();
                if let [(id, fp)] = distinct[..] {
                    // One key (every unbatched consumer): the single claim, one statement
                    // that returns no row while the key is new.
                    let key = justonce_core::DedupKey { consumer, message_id: id };
                    match self.claim(tx, key, fp).await? {
                        justonce_core::Claim::Fresh => {
                            inserted.insert(id.as_str());
                        }
                        justonce_core::Claim::Duplicate => {
                            stored.insert(id.as_str().to_owned(), fp.to_hex());
                        }
                        justonce_core::Claim::Conflict { stored: s } => {
                            stored.insert(id.as_str().to_owned(), s.to_hex());
                        }
                    }
                    return $crate::common::many_answers(keys, &inserted, &stored);
                }
                for chunk in distinct.chunks($crate::common::MANY_CHUNK) {
                    let ids: Vec<&str> = chunk.iter().map(|k| k.0.as_str()).collect();
                    $(
                        if many.order == $crate::common::ManyOrder::Arrays {
                            let skipped = Self::$arrays(many, tx, consumer, chunk).await?;
                            inserted.extend(
                                ids.iter().filter(|id| !skipped.contains(**id)).copied(),
                            );
                            let others: Vec<&str> = skipped.iter().map(String::as_str).collect();
                            stored.extend(Self::stored_many(many, tx, consumer, &others).await?);
                            continue;
                        }
                    )?
                    let mut fresh = chunk.to_vec();
                    let mut read = false;
                    loop {
                        let sql = many.insert(fresh.len());
                        let mut q = sqlx::query(&sql);
                        for (id, fp) in &fresh {
                            q = q.bind(consumer).bind(id.as_str()).bind(fp.to_hex());
                        }
                        match q.execute(&mut **tx).await {
                            Ok(_) => {
                                inserted.extend(fresh.iter().map(|k| k.0.as_str()));
                                break;
                            }
                            // The failed statement was undone alone; once the stored keys
                            // are known, the next insert holds only new ones.
                            Err(sqlx::Error::Database(e))
                                if e.is_unique_violation() && !read =>
                            {
                                read = true;
                                let found = Self::stored_many(many, tx, consumer, &ids).await?;
                                fresh.retain(|k| !found.contains_key(k.0.as_str()));
                                stored.extend(found);
                                if fresh.is_empty() {
                                    break;
                                }
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                if stored.is_empty() && inserted.len() == keys.len() {
                    // Every key new and none twice (nearly every batch).
                    return Ok(vec![justonce_core::Claim::Fresh; keys.len()]);
                }
                $crate::common::many_answers(keys, &inserted, &stored)
            }

            $(
                async fn begin_with_claims(
                    &self,
                    consumer: &str,
                    messages: &[(&justonce_core::MessageId, &justonce_core::Message)],
                ) -> justonce_core::Result<($tx, Vec<justonce_core::Claim>)> {
                    use justonce_core::store::defaults;
                    if messages.len() != 1 && !self.claims_batches_with_begin() {
                        return defaults::begin_while_hashing(self, consumer, messages).await;
                    }
                    let keys = defaults::fingerprints(messages);
                    match self.$bc(consumer, &keys).await? {
                        Some(done) => Ok(done),
                        None => defaults::begin_then_claim(self, consumer, &keys).await,
                    }
                }
            )?

            async fn purge(&self, retention: std::time::Duration, batch: u32) -> justonce_core::Result<u64> {
                $(
                    if let Some(n) = self.$purge(retention, batch).await? {
                        return Ok(n);
                    }
                )?
                Ok(sqlx::query(&self.sql.purge)
                    .bind(retention.as_millis() as i64)
                    .bind(i64::from(batch))
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            }
        }
    };
}

/// `ClaimStore` for a struct with fields `pool` and `sql: Arc<ClaimSql>`, whose
/// connections are `$conn`. Batches are one transaction (`begin:` opens it).
macro_rules! impl_claim_store {
    ($store:ty, $conn:ty, begin: $($begin:tt)+) => {
        impl $store {
            async fn acquire_in(
                &self,
                conn: &mut $conn,
                key: justonce_core::DedupKey<'_>,
                fp: justonce_core::Fingerprint,
                lease: std::time::Duration,
            ) -> justonce_core::Result<justonce_core::ClaimState> {
                use sqlx::Row as _;
                use $crate::claim_logic::{decide, ClaimRow, Decision};
                let lease_ms = lease.as_millis() as i64;
                let inserted = sqlx::query(&self.sql.insert)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .bind(fp.to_hex())
                    .bind(lease_ms)
                    .execute(&mut *conn)
                    .await?
                    .rows_affected();
                if inserted == 1 {
                    return Ok(justonce_core::ClaimState::Acquired { token: 1 });
                }
                let r = sqlx::query(&self.sql.select)
                    .bind(key.consumer)
                    .bind(key.message_id.as_str())
                    .fetch_one(&mut *conn)
                    .await?;
                let row = ClaimRow {
                    fingerprint: r.try_get("fingerprint")?,
                    state: r.try_get("state")?,
                    token: r.try_get("token")?,
                    remaining_ms: r.try_get("remaining")?,
                    result: r.try_get("result")?,
                };
                match decide(row, fp) {
                    Decision::Answer(state) => Ok(state),
                    Decision::TakeOver { token } => {
                        sqlx::query(&self.sql.takeover)
                            .bind(token as i64)
                            .bind(fp.to_hex())
                            .bind(lease_ms)
                            .bind(key.consumer)
                            .bind(key.message_id.as_str())
                            .execute(&mut *conn)
                            .await?;
                        Ok(justonce_core::ClaimState::Acquired { token })
                    }
                }
            }

            /// The outer `Result` is the database's; the inner one says whether the token
            /// still held the claim.
            async fn finish_in(
                &self,
                conn: &mut $conn,
                key: justonce_core::DedupKey<'_>,
                token: u64,
                finish: justonce_core::Finish<'_>,
            ) -> justonce_core::Result<justonce_core::Result<()>> {
                match finish {
                    justonce_core::Finish::Complete(result) => {
                        let done = sqlx::query(&self.sql.complete)
                            .bind(result)
                            .bind(key.consumer)
                            .bind(key.message_id.as_str())
                            .bind(token as i64)
                            .execute(&mut *conn)
                            .await?
                            .rows_affected();
                        if done == 1 {
                            return Ok(Ok(()));
                        }
                        let current: Option<i64> = sqlx::query_scalar(&self.sql.token)
                            .bind(key.consumer)
                            .bind(key.message_id.as_str())
                            .fetch_optional(&mut *conn)
                            .await?;
                        Ok(Err($crate::claim_logic::fenced(key, token, current)))
                    }
                    justonce_core::Finish::Release => {
                        sqlx::query(&self.sql.release)
                            .bind(key.consumer)
                            .bind(key.message_id.as_str())
                            .bind(token as i64)
                            .execute(&mut *conn)
                            .await?;
                        Ok(Ok(()))
                    }
                }
            }
        }

        #[async_trait::async_trait]
        impl justonce_core::ClaimStore for $store {
            async fn acquire(
                &self,
                key: justonce_core::DedupKey<'_>,
                fp: justonce_core::Fingerprint,
                lease: std::time::Duration,
            ) -> justonce_core::Result<justonce_core::ClaimState> {
                let mut states = self.acquire_batch(&[(key, fp)], lease).await?;
                states.pop().ok_or_else(|| {
                    justonce_core::Error::new(justonce_core::ErrorKind::Database, "acquire returned nothing")
                })
            }

            async fn complete(
                &self,
                key: justonce_core::DedupKey<'_>,
                token: u64,
                result: Option<&[u8]>,
            ) -> justonce_core::Result<()> {
                let mut conn = self.pool.acquire().await?;
                self.finish_in(&mut conn, key, token, justonce_core::Finish::Complete(result)).await?
            }

            async fn release(&self, key: justonce_core::DedupKey<'_>, token: u64) -> justonce_core::Result<()> {
                let mut conn = self.pool.acquire().await?;
                self.finish_in(&mut conn, key, token, justonce_core::Finish::Release).await?
            }

            async fn purge(&self, retention: std::time::Duration, batch: u32) -> justonce_core::Result<u64> {
                Ok(sqlx::query(&self.sql.purge)
                    .bind(retention.as_millis() as i64)
                    .bind(i64::from(batch))
                    .execute(&self.pool)
                    .await?
                    .rows_affected())
            }

            /// One transaction for the whole batch.
            async fn acquire_batch(
                &self,
                keys: &[(justonce_core::DedupKey<'_>, justonce_core::Fingerprint)],
                lease: std::time::Duration,
            ) -> justonce_core::Result<Vec<justonce_core::ClaimState>> {
                let mut tx = self.pool.$($begin)+.await?;
                let mut out = Vec::with_capacity(keys.len());
                for (key, fp) in keys {
                    out.push(self.acquire_in(&mut tx, *key, *fp, lease).await?);
                }
                tx.commit().await?;
                Ok(out)
            }

            /// One transaction for the whole batch.
            async fn finish_batch(
                &self,
                items: &[(justonce_core::DedupKey<'_>, u64, justonce_core::Finish<'_>)],
            ) -> justonce_core::Result<Vec<justonce_core::Result<()>>> {
                let mut tx = self.pool.$($begin)+.await?;
                let mut out = Vec::with_capacity(items.len());
                for (key, token, finish) in items {
                    out.push(self.finish_in(&mut tx, *key, *token, *finish).await?);
                }
                tx.commit().await?;
                Ok(out)
            }
        }
    };
}

pub(crate) use impl_claim_store;
pub(crate) use impl_dedup_store;

/// Chained setters for an options struct, one per field, named after it (`#[non_exhaustive]`
/// structs cannot be built with `..Default::default()` outside the crate). Fields under
/// `into` take `impl Into<String>`.
macro_rules! setters {
    ($ty:ident { $($field:ident: $t:ty),* $(,)? } $(into { $($sfield:ident),* $(,)? })?) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
                #[must_use]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
            $($(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($sfield), "`].")]
                #[must_use]
                pub fn $sfield(mut self, value: impl Into<String>) -> Self {
                    self.$sfield = value.into();
                    self
                }
            )*)?
        }
    };
}
pub(crate) use setters;
