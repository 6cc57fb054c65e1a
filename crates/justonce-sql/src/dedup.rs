//! The dedup store on SQL, written once: [`DedupBackend`] is what a backend gives (its
//! pool, its SQL text, and the hooks where it does better than the common way), and the
//! functions here are the algorithm over it. `impl_dedup_store!` only delegates
//! `justonce_core::Store` and `DedupStore` to them: the orphan rule forbids a blanket impl of
//! those foreign traits over a local one.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use justonce_core::store::defaults;
use justonce_core::{
    Claim, DedupKey, DedupStore, Error, ErrorKind, Fingerprint, Message, MessageId, Result,
};

use crate::conn::{Arg, Conn};
use crate::inspect::InspectSql;
pub(crate) use crate::many::{ManyOrder, ManySql, MANY_CHUNK};

/// The dedup store's statements. Parameters, in order:
/// - `lock` (optional, run before `claim` in the same transaction): consumer, message id;
/// - `claim`: consumer, message id, fingerprint (the time comes from the database clock);
/// - `fingerprint`: consumer, message id;
/// - `purge`: retention in milliseconds, batch size (empty for a store whose
///   [`DedupBackend::purge_own`] always purges its own way: SQLite's sweep, PostgreSQL's
///   partitions).
#[derive(Debug)]
pub(crate) struct DedupSql {
    pub(crate) lock: Option<String>,
    pub(crate) claim: String,
    pub(crate) fingerprint: String,
    pub(crate) purge: String,
    /// A batch's claims in two statements; `None` claims key by key.
    pub(crate) many: Option<ManySql>,
    /// What tools read (`crate::inspect`).
    pub(crate) inspect: InspectSql,
}

/// The answer of a `BEGIN` that carried a single key's claim: the transaction with the key
/// fresh, or `None` when the key was stored (the begin failed on it, leaving no
/// transaction; the claim then goes the usual way, which tells a duplicate from a conflict).
pub(crate) fn claimed_on_begin<T>(
    begun: std::result::Result<T, sqlx::Error>,
) -> Result<Option<(T, Vec<Claim>)>> {
    match begun {
        Ok(tx) => Ok(Some((tx, vec![Claim::Fresh]))),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Each key once (its first occurrence), sorted by id: every claim of a batch takes its row
/// locks in this order, so two batches holding the same keys cannot deadlock on them.
pub(crate) fn lock_order<'a>(
    keys: &[(&'a MessageId, Fingerprint)],
) -> Vec<(&'a MessageId, Fingerprint)> {
    let mut distinct = keys.to_vec();
    // Stable: of two equal ids, the first stays first, and `dedup` keeps it.
    distinct.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    distinct.dedup_by(|b, a| a.0 == b.0);
    distinct
}

/// The answers of `claim_many` in the order of `keys`, from the ids the insert recorded
/// and the fingerprints stored before for the others.
fn many_answers(
    keys: &[(&MessageId, Fingerprint)],
    inserted: &HashSet<&str>,
    stored: &HashMap<String, String>,
) -> Result<Vec<Claim>> {
    let mut record: HashMap<&str, Fingerprint> = HashMap::new();
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
                Error::new(
                    ErrorKind::Busy,
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

/// What a claim that inserted nothing found: the fingerprint stored with the key.
fn existing(stored: &str, fp: Fingerprint) -> Claim {
    match Fingerprint::from_hex(stored) {
        Some(s) if s == fp => Claim::Duplicate,
        Some(s) => Claim::Conflict { stored: s },
        None => Claim::Conflict {
            stored: Fingerprint::of(stored.as_bytes()),
        },
    }
}

/// A transaction of backend `B`.
pub(crate) type Tx<B> = sqlx::Transaction<'static, <B as DedupBackend>::Db>;

/// What a SQL dedup store gives the common algorithm. The provided methods are the hooks:
/// each default is the common way.
#[async_trait]
pub(crate) trait DedupBackend: Send + Sync {
    type Db: sqlx::Database<Connection: Conn>;

    /// `Store::backend`.
    const NAME: &'static str;

    /// The statement that opens a transaction; `None` for the database's `BEGIN`.
    const BEGIN: Option<&'static str> = None;

    /// `Store::take_turn`'s statements (first parameter: the consumer), a lock held to the
    /// end of the transaction: beside, which answers 1 when it took it and 0 when it would
    /// have waited; beside with patience (second parameter: milliseconds, as text), which
    /// also sets the transaction's lock timeout when it took it; and alone. `None` for none.
    const TURN: Option<[&'static str; 3]> = None;

    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    fn sql(&self) -> &DedupSql;

    /// Whether [`DedupBackend::begin_claimed`] is worth trying for a batch of `n` messages:
    /// it needs their fingerprints before the `BEGIN`, which the common way computes while
    /// it waits on it.
    fn claims_with_begin(&self, _n: usize) -> bool {
        false
    }

    /// Begins and claims `keys` its own, cheaper way; `None` leaves it to `begin` and
    /// [`claim_many`].
    async fn begin_claimed(
        &self,
        _consumer: &str,
        _keys: &[(&MessageId, Fingerprint)],
    ) -> Result<Option<(Tx<Self>, Vec<Claim>)>> {
        Ok(None)
    }

    /// The [`ManyOrder::Arrays`] insert of a chunk: the ids it skipped because they were
    /// stored. A backend whose [`ManySql`] is `Arrays` must give it.
    async fn claim_arrays(
        &self,
        _tx: &mut Tx<Self>,
        _consumer: &str,
        _keys: &[(&MessageId, Fingerprint)],
    ) -> Result<HashSet<String>> {
        Err(Error::new(
            ErrorKind::Internal,
            format!("{} has no array claims", Self::NAME),
        ))
    }

    /// Purges its own way; `None` leaves it to the batched delete of [`DedupSql::purge`].
    async fn purge_own(&self, _retention: Duration, _batch: u32) -> Result<Option<u64>> {
        Ok(None)
    }
}

/// A store opened with `create(false)`: its dedup table must be there already.
pub(crate) async fn table_must_exist<DB>(
    pool: &sqlx::Pool<DB>,
    table: &str,
    url: &str,
) -> Result<()>
where
    DB: sqlx::Database<Connection: Conn>,
{
    let mut conn = pool.acquire().await?;
    let probe = format!("SELECT 1 FROM {table} WHERE 1 = 0");
    match (*conn).execute(&probe, &[]).await.map_err(Error::from) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::Schema => Err(Error::with_source(
            ErrorKind::Schema,
            format!(
                "no dedup table {table} in {}: give the table the consumer uses, or open the \
                 store once with justonce, which creates it",
                justonce_core::redact_url(url)
            ),
            e,
        )),
        Err(e) => Err(e),
    }
}

pub(crate) async fn begin<B: DedupBackend>(b: &B) -> Result<Tx<B>> {
    Ok(crate::conn::begin_maybe_with(b.pool(), B::BEGIN).await?)
}

/// Runs one of the savepoint statements.
pub(crate) async fn savepoint<B: DedupBackend>(tx: &mut Tx<B>, sql: &str) -> Result<()> {
    (**tx).execute(sql, &[]).await?;
    Ok(())
}

/// Takes `consumer`'s turn with [`DedupBackend::TURN`], if the backend has one.
pub(crate) async fn take_turn<B: DedupBackend>(
    tx: &mut Tx<B>,
    consumer: &str,
    turn: justonce_core::Turn,
) -> Result<bool> {
    let Some([beside, patient, alone]) = B::TURN else {
        return Ok(true);
    };
    let conn = &mut **tx;
    match turn {
        justonce_core::Turn::Beside { patience: None } => {
            Ok(conn.int(beside, &[Arg::Text(consumer)]).await? == Some(1))
        }
        justonce_core::Turn::Beside {
            patience: Some(patience),
        } => {
            let ms = patience.as_millis().max(1).to_string();
            let args = [Arg::Text(consumer), Arg::Text(&ms)];
            Ok(conn.int(patient, &args).await? == Some(1))
        }
        justonce_core::Turn::Alone => {
            conn.execute(alone, &[Arg::Text(consumer)]).await?;
            Ok(true)
        }
    }
}

/// `ROLLBACK TO` keeps the savepoint open: release it, or they pile up per batch.
pub(crate) async fn rollback_to_savepoint<B: DedupBackend>(tx: &mut Tx<B>) -> Result<()> {
    savepoint::<B>(tx, "ROLLBACK TO SAVEPOINT jo_message").await?;
    savepoint::<B>(tx, "RELEASE SAVEPOINT jo_message").await
}

/// One key's claim: the optional lock, the insert, and on a stored key its fingerprint.
pub(crate) async fn claim<B: DedupBackend>(
    b: &B,
    tx: &mut Tx<B>,
    key: DedupKey<'_>,
    fp: Fingerprint,
) -> Result<Claim> {
    let sql = b.sql();
    let conn = &mut **tx;
    let k = [Arg::Text(key.consumer), Arg::Text(key.message_id.as_str())];
    if let Some(lock) = &sql.lock {
        conn.execute(lock, &k).await?;
    }
    let hex = fp.to_hex();
    let inserted = conn
        .execute(&sql.claim, &[k[0], k[1], Arg::Text(&hex)])
        .await?;
    if inserted == 1 {
        return Ok(Claim::Fresh);
    }
    let stored = conn.text(&sql.fingerprint, &k).await?.ok_or_else(|| {
        Error::new(
            ErrorKind::Busy,
            format!(
                "dedup record of {} neither inserted nor found; retry the batch",
                key.message_id
            ),
        )
    })?;
    Ok(existing(&stored, fp))
}

/// The fingerprints stored for `ids` of `consumer`, by message id.
async fn stored_many<C: Conn + ?Sized>(
    many: &ManySql,
    conn: &mut C,
    consumer: &str,
    ids: &[&str],
) -> Result<HashMap<String, String>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let sql = many.select(ids.len());
    let mut args = Vec::with_capacity(ids.len() + 1);
    args.push(Arg::Text(consumer));
    args.extend(ids.iter().map(|id| Arg::Text(id)));
    Ok(conn.text_pairs(&sql, &args).await?.into_iter().collect())
}

/// A batch's claims: in one statement per [`MANY_CHUNK`] keys where the backend has a
/// [`ManySql`], key by key otherwise.
pub(crate) async fn claim_many<B>(
    b: &B,
    tx: &mut Tx<B>,
    consumer: &str,
    keys: &[(&MessageId, Fingerprint)],
) -> Result<Vec<Claim>>
where
    B: DedupBackend + DedupStore<Tx = Tx<B>>,
{
    let Some(many) = &b.sql().many else {
        return defaults::claim_each(b, tx, consumer, keys).await;
    };
    let distinct = lock_order(keys);
    let mut inserted = HashSet::new();
    let mut stored = HashMap::new();
    if let [(id, fp)] = distinct[..] {
        // One key (every unbatched consumer): the single claim, one statement that returns
        // no row while the key is new.
        let key = DedupKey {
            consumer,
            message_id: id,
        };
        match claim(b, tx, key, fp).await? {
            Claim::Fresh => {
                inserted.insert(id.as_str());
            }
            Claim::Duplicate => {
                stored.insert(id.as_str().to_owned(), fp.to_hex());
            }
            Claim::Conflict { stored: s } => {
                stored.insert(id.as_str().to_owned(), s.to_hex());
            }
        }
        return many_answers(keys, &inserted, &stored);
    }
    for chunk in distinct.chunks(MANY_CHUNK) {
        let ids: Vec<&str> = chunk.iter().map(|k| k.0.as_str()).collect();
        if many.order == ManyOrder::Arrays {
            let skipped = b.claim_arrays(tx, consumer, chunk).await?;
            inserted.extend(ids.iter().filter(|id| !skipped.contains(**id)).copied());
            let others: Vec<&str> = skipped.iter().map(String::as_str).collect();
            stored.extend(stored_many(many, &mut **tx, consumer, &others).await?);
            continue;
        }
        let mut fresh = chunk.to_vec();
        let mut read = false;
        loop {
            let sql = many.insert(fresh.len());
            let hexes: Vec<String> = fresh.iter().map(|k| k.1.to_hex()).collect();
            let mut args = Vec::with_capacity(3 * fresh.len());
            for ((id, _), hex) in fresh.iter().zip(&hexes) {
                args.extend([Arg::Text(consumer), Arg::Text(id.as_str()), Arg::Text(hex)]);
            }
            match (**tx).execute(&sql, &args).await {
                Ok(_) => {
                    inserted.extend(fresh.iter().map(|k| k.0.as_str()));
                    break;
                }
                // The failed statement was undone alone; once the stored keys are known,
                // the next insert holds only new ones.
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() && !read => {
                    read = true;
                    let found = stored_many(many, &mut **tx, consumer, &ids).await?;
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
        return Ok(vec![Claim::Fresh; keys.len()]);
    }
    many_answers(keys, &inserted, &stored)
}

/// `DedupStore::begin_with_claims`: the backend's own way where it has one for this batch,
/// else the common one.
pub(crate) async fn begin_with_claims<B>(
    b: &B,
    consumer: &str,
    messages: &[(&MessageId, &Message)],
) -> Result<(Tx<B>, Vec<Claim>)>
where
    B: DedupBackend + DedupStore<Tx = Tx<B>>,
{
    if !b.claims_with_begin(messages.len()) {
        return defaults::begin_while_hashing(b, consumer, messages).await;
    }
    let keys = defaults::fingerprints(messages);
    match b.begin_claimed(consumer, &keys).await? {
        Some(done) => Ok(done),
        None => defaults::begin_then_claim(b, consumer, &keys).await,
    }
}

pub(crate) async fn purge<B: DedupBackend>(b: &B, retention: Duration, batch: u32) -> Result<u64> {
    if let Some(n) = b.purge_own(retention, batch).await? {
        return Ok(n);
    }
    let mut conn = b.pool().acquire().await?;
    let args = [
        Arg::Int(retention.as_millis() as i64),
        Arg::Int(i64::from(batch)),
    ];
    Ok((*conn).execute(&b.sql().purge, &args).await?)
}

/// `Store` and `DedupStore` for a [`DedupBackend`] whose transactions are `$tx`, by delegation to this module's
/// functions.
macro_rules! impl_dedup_store {
    ($store:ty, $tx:ty) => {
        #[async_trait::async_trait]
        impl justonce_core::Store for $store {
            // Named, not `Tx<$store>`: a public impl cannot name the private trait.
            type Tx = $tx;

            fn backend(&self) -> &'static str {
                <$store as $crate::dedup::DedupBackend>::NAME
            }

            async fn begin(&self) -> justonce_core::Result<Self::Tx> {
                $crate::dedup::begin(self).await
            }

            async fn commit(&self, tx: Self::Tx) -> justonce_core::Result<()> {
                Ok(tx.commit().await?)
            }

            async fn rollback(&self, tx: Self::Tx) -> justonce_core::Result<()> {
                Ok(tx.rollback().await?)
            }

            async fn savepoint(&self, tx: &mut Self::Tx) -> justonce_core::Result<()> {
                $crate::dedup::savepoint::<$store>(tx, "SAVEPOINT jo_message").await
            }

            async fn release_savepoint(&self, tx: &mut Self::Tx) -> justonce_core::Result<()> {
                $crate::dedup::savepoint::<$store>(tx, "RELEASE SAVEPOINT jo_message").await
            }

            async fn rollback_to_savepoint(&self, tx: &mut Self::Tx) -> justonce_core::Result<()> {
                $crate::dedup::rollback_to_savepoint::<$store>(tx).await
            }

            fn takes_turns(&self) -> bool {
                <$store as $crate::dedup::DedupBackend>::TURN.is_some()
            }

            async fn take_turn(
                &self,
                tx: &mut Self::Tx,
                consumer: &str,
                turn: justonce_core::Turn,
            ) -> justonce_core::Result<bool> {
                $crate::dedup::take_turn::<$store>(tx, consumer, turn).await
            }
        }

        #[async_trait::async_trait]
        impl justonce_core::DedupStore for $store {
            async fn claim(
                &self,
                tx: &mut Self::Tx,
                key: justonce_core::DedupKey<'_>,
                fp: justonce_core::Fingerprint,
            ) -> justonce_core::Result<justonce_core::Claim> {
                $crate::dedup::claim(self, tx, key, fp).await
            }

            async fn claim_many(
                &self,
                tx: &mut Self::Tx,
                consumer: &str,
                keys: &[(&justonce_core::MessageId, justonce_core::Fingerprint)],
            ) -> justonce_core::Result<Vec<justonce_core::Claim>> {
                $crate::dedup::claim_many(self, tx, consumer, keys).await
            }

            async fn begin_with_claims(
                &self,
                consumer: &str,
                messages: &[(&justonce_core::MessageId, &justonce_core::Message)],
            ) -> justonce_core::Result<(Self::Tx, Vec<justonce_core::Claim>)> {
                $crate::dedup::begin_with_claims(self, consumer, messages).await
            }

            async fn purge(
                &self,
                retention: std::time::Duration,
                batch: u32,
            ) -> justonce_core::Result<u64> {
                $crate::dedup::purge(self, retention, batch).await
            }
        }

        $crate::inspect::impl_inspect_store!($store);
    };
}

pub(crate) use impl_dedup_store;

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> MessageId {
        MessageId::new(s).unwrap()
    }

    #[test]
    fn a_batch_takes_its_locks_in_id_order_once_per_key() {
        let (a, b) = (id("a"), id("b"));
        let (f1, f2) = (Fingerprint::of(b"1"), Fingerprint::of(b"2"));
        let order = lock_order(&[(&b, f1), (&a, f1), (&b, f2)]);
        let got: Vec<(&str, Fingerprint)> = order.iter().map(|(i, f)| (i.as_str(), *f)).collect();
        assert_eq!(
            got,
            [("a", f1), ("b", f1)],
            "the first occurrence of b stays"
        );
    }

    #[test]
    fn answers_follow_the_keys_and_their_repeats() {
        let (a, b, c) = (id("a"), id("b"), id("c"));
        let (f1, f2) = (Fingerprint::of(b"1"), Fingerprint::of(b"2"));
        let inserted: HashSet<&str> = ["a"].into();
        let stored: HashMap<String, String> =
            [("b".into(), f1.to_hex()), ("c".into(), f2.to_hex())].into();
        let keys = [(&a, f1), (&a, f1), (&a, f2), (&b, f1), (&c, f1), (&c, f2)];
        assert_eq!(
            many_answers(&keys, &inserted, &stored).unwrap(),
            [
                Claim::Fresh,
                Claim::Duplicate,
                Claim::Conflict { stored: f1 },
                Claim::Duplicate,
                Claim::Conflict { stored: f2 },
                // The repeat is judged against what is stored, not against its first place.
                Claim::Duplicate,
            ]
        );
        let lost = many_answers(&[(&id("d"), f1)], &inserted, &stored).unwrap_err();
        assert_eq!(
            lost.kind(),
            ErrorKind::Busy,
            "neither inserted nor found is retried"
        );
    }

    #[test]
    fn a_stored_fingerprint_that_is_not_hex_is_a_conflict() {
        let fp = Fingerprint::of(b"x");
        assert_eq!(existing(&fp.to_hex(), fp), Claim::Duplicate);
        assert_eq!(
            existing("not hex", fp),
            Claim::Conflict {
                stored: Fingerprint::of(b"not hex")
            }
        );
    }
}
