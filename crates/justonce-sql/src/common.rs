//! What every SQL store shares. Each backend provides its DDL and its SQL text, with
//! parameters always bound in the order documented on [`DedupSql`] and [`ClaimSql`]; the
//! trait implementations are written once, here, by macro.

use justonce_core::{Claim, Fingerprint};

/// The dedup store's statements. Parameters, in order:
/// - `lock` (optional, run before `claim` in the same transaction): consumer, message id;
/// - `claim`: consumer, message id, fingerprint (the time comes from the database clock);
/// - `fingerprint`: consumer, message id;
/// - `purge`: retention in milliseconds, batch size.
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
/// and `INSERT … ON CONFLICT DO NOTHING` (SQLite, PostgreSQL). Parameters: the insert takes
/// `(consumer, message id, fingerprint)` per row; the select takes the consumer, then the
/// message ids.
#[derive(Debug)]
pub(crate) struct ManySql {
    pub(crate) table: String,
    /// Columns and values after `(consumer, message_id, fingerprint`: `""` when the table's
    /// default stamps the row, or `", processed_at"` and its SQL expression.
    pub(crate) stamp: (&'static str, String),
    /// `$n` placeholders (PostgreSQL) instead of `?`.
    pub(crate) dollar: bool,
    /// How the batch learns which keys were there before it:
    /// - `Returning` (PostgreSQL): insert skipping stored keys, `RETURNING` the ids it wrote,
    ///   then read the fingerprints of the others. Safe under concurrent claims: a second
    ///   transaction's insert waits on the first's row and then skips it.
    /// - `StatementRollback` (SQLite): a plain insert of every key; SQLite undoes a statement
    ///   that breaks a constraint alone and the transaction goes on, so on a stored key the
    ///   batch reads the stored fingerprints and inserts the rest. sqlx runs a SQLite
    ///   connection on its own thread and sends every returned row across a channel: while
    ///   no key is stored (nearly always) the claim is one statement that returns nothing.
    pub(crate) order: ManyOrder,
}

/// See [`ManySql::order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManyOrder {
    Returning,
    StatementRollback,
}

/// Keys per statement: three parameters each stays far below every placeholder limit.
pub(crate) const MANY_CHUNK: usize = 500;

impl ManySql {
    fn ph(&self, i: usize) -> String {
        if self.dollar {
            format!("${i}")
        } else {
            "?".to_owned()
        }
    }

    /// The insert of `n` keys, as [`ManySql::order`] says: skipping the stored ones and
    /// returning the new ones' ids, or a plain insert that fails on a stored key.
    pub(crate) fn insert(&self, n: usize) -> String {
        let (col, value) = &self.stamp;
        let rows: Vec<String> = (0..n)
            .map(|k| {
                format!(
                    "({}, {}, {}{value})",
                    self.ph(3 * k + 1),
                    self.ph(3 * k + 2),
                    self.ph(3 * k + 3)
                )
            })
            .collect();
        format!(
            "INSERT INTO {} (consumer, message_id, fingerprint{col}) VALUES {}{}",
            self.table,
            rows.join(", "),
            if self.order == ManyOrder::Returning {
                "\n             ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id"
            } else {
                ""
            }
        )
    }

    pub(crate) fn select(&self, n: usize) -> String {
        let ids: Vec<String> = (0..n).map(|k| self.ph(k + 2)).collect();
        format!(
            "SELECT message_id, fingerprint FROM {} WHERE consumer = {} AND message_id IN ({})",
            self.table,
            self.ph(1),
            ids.join(", ")
        )
    }
}

/// The answers of `claim_many` in the order of `keys`, from the ids the insert recorded
/// and the fingerprints stored before for the others.
pub(crate) fn many_answers(
    keys: &[(&justonce_core::MessageId, Fingerprint)],
    inserted: &std::collections::HashSet<String>,
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
/// `(retention) -> Result<Option<u64>>` that purges in its own way, or answers `None` to
/// leave it to the batched delete of `sql.purge`; `begin_claimed:` names an inherent method
/// `(consumer, keys) -> Result<Option<(Tx, Vec<Claim>)>>` that begins and claims in one round
/// trip, or answers `None` to leave it to `begin` then `claim_many`.
macro_rules! impl_dedup_store {
    (
        $store:ty, $tx:ty, $backend:literal, begin: $begin:ident ( $($arg:expr)? )
        $(, purge: $purge:ident)? $(, begin_claimed: $bc:ident)?
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
                use sqlx::Row as _;
                let Some(many) = &self.sql.many else {
                    return justonce_core::claim_each(self, tx, consumer, keys).await;
                };
                // Each key once, in one order for every batch, so that two batches holding
                // the same keys take their row locks in the same order.
                let mut distinct: Vec<(&justonce_core::MessageId, justonce_core::Fingerprint)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for (id, fp) in keys {
                    if seen.insert(id.as_str()) {
                        distinct.push((*id, *fp));
                    }
                }
                distinct.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
                let mut inserted = std::collections::HashSet::new();
                let mut stored = std::collections::HashMap::new();
                if let [(id, fp)] = distinct[..] {
                    // One key (every unbatched consumer): the single claim, one statement
                    // that returns no row while the key is new.
                    let key = justonce_core::DedupKey { consumer, message_id: id };
                    match self.claim(tx, key, fp).await? {
                        justonce_core::Claim::Fresh => {
                            inserted.insert(id.as_str().to_owned());
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
                    if many.order == $crate::common::ManyOrder::Returning {
                        let sql = many.insert(chunk.len());
                        let mut q = sqlx::query(&sql);
                        for (id, fp) in chunk {
                            q = q.bind(consumer).bind(id.as_str()).bind(fp.to_hex());
                        }
                        for row in q.fetch_all(&mut **tx).await? {
                            inserted.insert(row.try_get::<String, _>(0)?);
                        }
                        let others: Vec<&str> =
                            ids.into_iter().filter(|id| !inserted.contains(*id)).collect();
                        stored.extend(Self::stored_many(many, tx, consumer, &others).await?);
                        continue;
                    }
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
                                inserted.extend(fresh.iter().map(|k| k.0.as_str().to_owned()));
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
                $crate::common::many_answers(keys, &inserted, &stored)
            }

            $(
                async fn begin_claimed(
                    &self,
                    consumer: &str,
                    keys: &[(&justonce_core::MessageId, justonce_core::Fingerprint)],
                ) -> justonce_core::Result<($tx, Vec<justonce_core::Claim>)> {
                    match self.$bc(consumer, keys).await? {
                        Some(done) => Ok(done),
                        None => justonce_core::begin_then_claim(self, consumer, keys).await,
                    }
                }
            )?

            async fn purge(&self, retention: std::time::Duration, batch: u32) -> justonce_core::Result<u64> {
                $(
                    if let Some(n) = self.$purge(retention).await? {
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
