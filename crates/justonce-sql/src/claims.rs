//! The claim store on SQL, written once: [`ClaimBackend`] is what a backend gives (its
//! pool and its SQL text), and the functions here are the algorithm over it: the insert, the
//! row read under the database's lock, the decision ([`decide`], pure), the takeover, and
//! completions fenced by their token. `impl_claim_store!` only delegates
//! `justonce_core::ClaimStore` to them (the orphan rule forbids a blanket impl).

use std::time::Duration;

use justonce_core::{ClaimState, DedupKey, Error, ErrorKind, Fingerprint, Finish, Result};

use crate::conn::{Arg, ClaimRow, Conn};

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
    /// `crate::inspect`: consumer, message id; columns fingerprint, state, token, ms left on
    /// the lease, completed at (ms), result as hex, each as text.
    pub(crate) record: String,
    /// Releases a claim in progress and raises its token: consumer, message id.
    pub(crate) force_release: String,
}

/// What a SQL claim store gives the common algorithm.
pub(crate) trait ClaimBackend: Send + Sync {
    type Db: sqlx::Database<Connection: Conn>;

    /// The statement that opens a batch's transaction; `None` for the database's `BEGIN`.
    const BEGIN: Option<&'static str> = None;

    fn pool(&self) -> &sqlx::Pool<Self::Db>;

    fn sql(&self) -> &ClaimSql;
}

async fn begin<B: ClaimBackend>(b: &B) -> Result<sqlx::Transaction<'static, B::Db>> {
    Ok(crate::conn::begin_maybe_with(b.pool(), B::BEGIN).await?)
}

/// One acquire, in the caller's transaction.
async fn acquire_in<C: Conn + ?Sized>(
    sql: &ClaimSql,
    conn: &mut C,
    key: DedupKey<'_>,
    fp: Fingerprint,
    lease: Duration,
) -> Result<ClaimState> {
    let lease_ms = Arg::Int(lease.as_millis() as i64);
    let (consumer, id) = (Arg::Text(key.consumer), Arg::Text(key.message_id.as_str()));
    let hex = fp.to_hex();
    let fingerprint = Arg::Text(&hex);
    let inserted = conn
        .execute(&sql.insert, &[consumer, id, fingerprint, lease_ms])
        .await?;
    if inserted == 1 {
        return Ok(ClaimState::Acquired { token: 1 });
    }
    let row = conn.claim_row(&sql.select, &[consumer, id]).await?;
    match decide(row, fp) {
        Decision::Answer(state) => Ok(state),
        Decision::TakeOver { token } => {
            let t = Arg::Int(token as i64);
            conn.execute(&sql.takeover, &[t, fingerprint, lease_ms, consumer, id])
                .await?;
            Ok(ClaimState::Acquired { token })
        }
    }
}

/// One completion or release, in the caller's transaction. The outer `Result` is the
/// database's; the inner one says whether the token still held the claim.
async fn finish_in<C: Conn + ?Sized>(
    sql: &ClaimSql,
    conn: &mut C,
    key: DedupKey<'_>,
    token: u64,
    finish: Finish<'_>,
) -> Result<Result<()>> {
    let (consumer, id) = (Arg::Text(key.consumer), Arg::Text(key.message_id.as_str()));
    let t = Arg::Int(token as i64);
    match finish {
        Finish::Complete(result) => {
            let args = [Arg::Blob(result), consumer, id, t];
            if conn.execute(&sql.complete, &args).await? == 1 {
                return Ok(Ok(()));
            }
            let current = conn.int(&sql.token, &[consumer, id]).await?;
            Ok(Err(fenced(key, token, current)))
        }
        Finish::Release => {
            conn.execute(&sql.release, &[consumer, id, t]).await?;
            Ok(Ok(()))
        }
    }
}

/// `ClaimStore::acquire_batch`: one transaction for the whole batch.
pub(crate) async fn acquire_batch<B: ClaimBackend>(
    b: &B,
    keys: &[(DedupKey<'_>, Fingerprint)],
    lease: Duration,
) -> Result<Vec<ClaimState>> {
    let mut tx = begin(b).await?;
    let mut out = Vec::with_capacity(keys.len());
    for (key, fp) in keys {
        out.push(acquire_in(b.sql(), &mut *tx, *key, *fp, lease).await?);
    }
    tx.commit().await?;
    Ok(out)
}

/// `ClaimStore::acquire`: a batch of one.
pub(crate) async fn acquire<B: ClaimBackend>(
    b: &B,
    key: DedupKey<'_>,
    fp: Fingerprint,
    lease: Duration,
) -> Result<ClaimState> {
    let mut states = acquire_batch(b, &[(key, fp)], lease).await?;
    states
        .pop()
        .ok_or_else(|| Error::new(ErrorKind::Database, "acquire returned nothing"))
}

/// `ClaimStore::finish_batch`: one transaction for the whole batch.
pub(crate) async fn finish_batch<B: ClaimBackend>(
    b: &B,
    items: &[(DedupKey<'_>, u64, Finish<'_>)],
) -> Result<Vec<Result<()>>> {
    let mut tx = begin(b).await?;
    let mut out = Vec::with_capacity(items.len());
    for (key, token, finish) in items {
        out.push(finish_in(b.sql(), &mut *tx, *key, *token, *finish).await?);
    }
    tx.commit().await?;
    Ok(out)
}

/// `ClaimStore::complete` and `release`: one statement (two when fenced) on a pooled
/// connection, no transaction.
pub(crate) async fn finish<B: ClaimBackend>(
    b: &B,
    key: DedupKey<'_>,
    token: u64,
    finish: Finish<'_>,
) -> Result<()> {
    let mut conn = b.pool().acquire().await?;
    finish_in(b.sql(), &mut *conn, key, token, finish).await?
}

pub(crate) async fn purge<B: ClaimBackend>(b: &B, retention: Duration, batch: u32) -> Result<u64> {
    let mut conn = b.pool().acquire().await?;
    let args = [
        Arg::Int(retention.as_millis() as i64),
        Arg::Int(i64::from(batch)),
    ];
    Ok((*conn).execute(&b.sql().purge, &args).await?)
}

/// What an acquire does with the row it found.
enum Decision {
    /// Answer without changing the row.
    Answer(ClaimState),
    /// Take the claim with this new token (the lease ran out, or the claim was released).
    TakeOver { token: u64 },
}

fn decide(row: ClaimRow, fp: Fingerprint) -> Decision {
    let stored = Fingerprint::from_hex(&row.fingerprint)
        .unwrap_or_else(|| Fingerprint::of(row.fingerprint.as_bytes()));
    match row.state.as_str() {
        "completed" if stored == fp => {
            Decision::Answer(ClaimState::Completed { result: row.result })
        }
        "completed" => Decision::Answer(ClaimState::Conflict { stored }),
        "in_progress" if row.remaining_ms.unwrap_or(0) > 0 => {
            Decision::Answer(ClaimState::InProgress {
                retry_after: Duration::from_millis(row.remaining_ms.unwrap_or(0) as u64),
            })
        }
        _ => Decision::TakeOver {
            token: row.token as u64 + 1,
        },
    }
}

/// The error of a completion refused by its fencing token.
fn fenced(key: DedupKey<'_>, token: u64, current: Option<i64>) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "claim on {} for consumer {} is fenced: token {token} no longer holds it (current token {})",
            key.message_id,
            key.consumer,
            current.map_or_else(|| "none".to_owned(), |t| t.to_string())
        ),
    )
}

/// `ClaimStore` for a [`ClaimBackend`], by delegation to this module's functions.
macro_rules! impl_claim_store {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl justonce_core::ClaimStore for $store {
            async fn acquire(
                &self,
                key: justonce_core::DedupKey<'_>,
                fp: justonce_core::Fingerprint,
                lease: std::time::Duration,
            ) -> justonce_core::Result<justonce_core::ClaimState> {
                $crate::claims::acquire(self, key, fp, lease).await
            }

            async fn complete(
                &self,
                key: justonce_core::DedupKey<'_>,
                token: u64,
                result: Option<&[u8]>,
            ) -> justonce_core::Result<()> {
                $crate::claims::finish(self, key, token, justonce_core::Finish::Complete(result))
                    .await
            }

            async fn release(
                &self,
                key: justonce_core::DedupKey<'_>,
                token: u64,
            ) -> justonce_core::Result<()> {
                $crate::claims::finish(self, key, token, justonce_core::Finish::Release).await
            }

            async fn purge(
                &self,
                retention: std::time::Duration,
                batch: u32,
            ) -> justonce_core::Result<u64> {
                $crate::claims::purge(self, retention, batch).await
            }

            async fn acquire_batch(
                &self,
                keys: &[(justonce_core::DedupKey<'_>, justonce_core::Fingerprint)],
                lease: std::time::Duration,
            ) -> justonce_core::Result<Vec<justonce_core::ClaimState>> {
                $crate::claims::acquire_batch(self, keys, lease).await
            }

            async fn finish_batch(
                &self,
                items: &[(justonce_core::DedupKey<'_>, u64, justonce_core::Finish<'_>)],
            ) -> justonce_core::Result<Vec<justonce_core::Result<()>>> {
                $crate::claims::finish_batch(self, items).await
            }
        }

        $crate::inspect::impl_inspect_claims!($store);
    };
}

pub(crate) use impl_claim_store;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, fp: Fingerprint, remaining_ms: Option<i64>) -> ClaimRow {
        ClaimRow {
            fingerprint: fp.to_hex(),
            state: state.into(),
            token: 4,
            remaining_ms,
            result: Some(b"r".to_vec()),
        }
    }

    #[test]
    fn a_row_decides_the_acquire() {
        let fp = Fingerprint::of(b"a");
        let other = Fingerprint::of(b"b");
        let answer = |r| match decide(r, fp) {
            Decision::Answer(s) => Some(s),
            Decision::TakeOver { token } => {
                assert_eq!(token, 5, "a takeover moves the fence by one");
                None
            }
        };
        assert_eq!(
            answer(row("completed", fp, None)),
            Some(ClaimState::Completed {
                result: Some(b"r".to_vec())
            })
        );
        assert_eq!(
            answer(row("completed", other, None)),
            Some(ClaimState::Conflict { stored: other })
        );
        assert_eq!(
            answer(row("in_progress", fp, Some(1500))),
            Some(ClaimState::InProgress {
                retry_after: Duration::from_millis(1500)
            })
        );
        // A lease that ran out, or none, and a released claim are taken over.
        assert_eq!(answer(row("in_progress", fp, Some(0))), None);
        assert_eq!(answer(row("in_progress", fp, None)), None);
        assert_eq!(answer(row("released", other, None)), None);
    }

    #[test]
    fn a_fenced_completion_names_both_tokens() {
        let id = justonce_core::MessageId::new("m-1").unwrap();
        let key = DedupKey {
            consumer: "c",
            message_id: &id,
        };
        let e = fenced(key, 3, Some(4));
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(
            e.to_string().contains("token 3") && e.to_string().contains("current token 4"),
            "{e}"
        );
        assert!(fenced(key, 3, None)
            .to_string()
            .contains("current token none"));
    }
}
