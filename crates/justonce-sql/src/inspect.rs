//! What tools read of the SQL stores and fix in their claims ([`InspectStore`],
//! [`InspectClaims`] of the core), written once over [`Conn`]: each backend gives the SQL
//! text, every value cast to text.
//!
//! [`InspectStore`]: justonce_core::InspectStore
//! [`InspectClaims`]: justonce_core::InspectClaims

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use justonce_core::{
    Check, ClaimRecord, ClaimRecordState, ConsumerRecords, DedupKey, DedupRecord, Error, ErrorKind,
    Fingerprint, Result,
};

use crate::claims::ClaimBackend;
use crate::conn::{Arg, Conn};
use crate::dedup::DedupBackend;

/// A dedup table's statements for tools, every column as text:
/// - `stats`: no parameters; consumer, records, the oldest record's time in ms;
/// - `record`: consumer, message id; fingerprint, time in ms;
/// - `now`: no parameters; the database's clock in ms;
/// - `deadlocks`: no parameters; the deadlocks the server counted, and since when (a
///   phrase), where the server counts them.
#[derive(Debug)]
pub(crate) struct InspectSql {
    pub(crate) stats: String,
    pub(crate) record: String,
    pub(crate) now: String,
    pub(crate) deadlocks: Option<String>,
}

impl InspectSql {
    /// The statements for `table`, whose `processed_at` in milliseconds is `ms` (an SQL
    /// expression over the column), with `text` casting a value to text (`CAST(? AS TEXT)`
    /// written as `{}`), the placeholders `p1`, `p2`, and `now_ms` the database's clock in
    /// milliseconds.
    pub(crate) fn new(table: &str, ms: &str, text: &str, p: [&str; 2], now_ms: &str) -> Self {
        let t = |e: &str| text.replace("{}", e);
        InspectSql {
            stats: format!(
                "SELECT {}, {}, {} FROM {table} GROUP BY consumer ORDER BY consumer",
                t("consumer"),
                t("COUNT(*)"),
                t(&ms.replace("processed_at", "MIN(processed_at)")),
            ),
            record: format!(
                "SELECT {}, {} FROM {table} WHERE consumer = {} AND message_id = {}",
                t("fingerprint"),
                t(ms),
                p[0],
                p[1],
            ),
            now: format!("SELECT {}", t(now_ms)),
            deadlocks: None,
        }
    }

    /// With the statement that reads the server's deadlock count.
    #[cfg_attr(not(any(feature = "mysql", feature = "postgres")), allow(dead_code))]
    pub(crate) fn deadlocks(mut self, sql: &str) -> Self {
        self.deadlocks = Some(sql.to_owned());
        self
    }
}

fn number(s: &Option<String>) -> Option<i64> {
    s.as_deref()?.trim().parse::<f64>().ok().map(|f| f as i64)
}

fn time(ms: &Option<String>) -> Option<SystemTime> {
    let ms = number(ms)?;
    Some(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).ok()?))
}

fn fingerprint(s: &Option<String>) -> Fingerprint {
    let s = s.as_deref().unwrap_or_default();
    Fingerprint::from_hex(s).unwrap_or_else(|| Fingerprint::of(s.as_bytes()))
}

fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

pub(crate) async fn dedup_stats<B: DedupBackend>(b: &B) -> Result<Vec<ConsumerRecords>> {
    let mut conn = b.pool().acquire().await?;
    let rows = (*conn).text_rows(&b.sql().inspect.stats, &[]).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let records = number(&r[1]).unwrap_or(0).max(0) as u64;
            ConsumerRecords::new(r[0].clone().unwrap_or_default(), records, time(&r[2]))
        })
        .collect())
}

pub(crate) async fn clock<B: DedupBackend>(b: &B) -> Result<Option<SystemTime>> {
    let mut conn = b.pool().acquire().await?;
    let rows = (*conn).text_rows(&b.sql().inspect.now, &[]).await?;
    Ok(rows.first().and_then(|r| time(&r[0])))
}

/// The server's own count of deadlocks, judged: every client's, so a warning, never a
/// failure. None where the store's server counts none (SQLite).
pub(crate) async fn server_checks<B: DedupBackend>(b: &B) -> Result<Vec<Check>> {
    let Some(sql) = &b.sql().inspect.deadlocks else {
        return Ok(Vec::new());
    };
    let mut conn = b.pool().acquire().await?;
    let rows = match (*conn).text_rows(sql, &[]).await {
        Ok(rows) => rows,
        Err(e) => {
            return Ok(vec![Check::warn(
                "lock conflicts",
                format!("the server's deadlock count could not be read: {e}"),
                "doctor reads pg_stat_database (PostgreSQL) or information_schema.GLOBAL_STATUS \
                 (MariaDB)",
            )])
        }
    };
    let Some(r) = rows.first() else {
        return Ok(Vec::new());
    };
    let n = number(&r[0]).unwrap_or(0).max(0);
    let since = r[1].clone().unwrap_or_default();
    Ok(vec![if n == 0 {
        Check::pass(
            "lock conflicts",
            format!("the database counted no deadlock since {since}"),
        )
    } else {
        Check::warn(
            "lock conflicts",
            format!(
                "the database counted {n} deadlock{} since {since} (every client's, not only \
                 justonce's)",
                if n == 1 { "" } else { "s" }
            ),
            "consumers in several processes (or with concurrency > 1) whose handlers update \
             the same rows deadlock unless every batch takes its locks in one order: \
             implement Handler::lock_key (docs/guide/failures.md#deadlocks-when-you-scale-out); \
             a consumer's own are its justonce_lock_conflicts_total",
        )
    }])
}

pub(crate) async fn dedup_record<B: DedupBackend>(
    b: &B,
    key: DedupKey<'_>,
) -> Result<Option<DedupRecord>> {
    let mut conn = b.pool().acquire().await?;
    let args = [Arg::Text(key.consumer), Arg::Text(key.message_id.as_str())];
    let rows = (*conn).text_rows(&b.sql().inspect.record, &args).await?;
    Ok(rows
        .first()
        .map(|r| DedupRecord::new(fingerprint(&r[0]), time(&r[1]))))
}

pub(crate) async fn claim_record<B: ClaimBackend>(
    b: &B,
    key: DedupKey<'_>,
) -> Result<Option<ClaimRecord>> {
    let mut conn = b.pool().acquire().await?;
    let args = [Arg::Text(key.consumer), Arg::Text(key.message_id.as_str())];
    let rows = (*conn).text_rows(&b.sql().record, &args).await?;
    let Some(r) = rows.first() else {
        return Ok(None);
    };
    let state = match r[1].as_deref() {
        Some("in_progress") => ClaimRecordState::InProgress {
            lease_left: Duration::from_millis(number(&r[3]).unwrap_or(0).max(0) as u64),
        },
        Some("released") => ClaimRecordState::Released,
        Some("completed") => ClaimRecordState::Completed { at: time(&r[4]) },
        other => {
            return Err(Error::new(
                ErrorKind::Database,
                format!("claim of {} in an unknown state {other:?}", key.message_id),
            ))
        }
    };
    let token = number(&r[2]).unwrap_or(0).max(0) as u64;
    let result = r[5].as_deref().and_then(hex_bytes);
    Ok(Some(ClaimRecord::new(
        fingerprint(&r[0]),
        state,
        token,
        result,
    )))
}

pub(crate) async fn force_release<B: ClaimBackend>(
    b: &B,
    key: DedupKey<'_>,
) -> Result<Option<u64>> {
    let mut conn = b.pool().acquire().await?;
    let args = [Arg::Text(key.consumer), Arg::Text(key.message_id.as_str())];
    if (*conn).execute(&b.sql().force_release, &args).await? != 1 {
        return Ok(None);
    }
    let token = (*conn).int(&b.sql().token, &args).await?;
    Ok(token.map(|t| t.max(0) as u64))
}

/// `InspectStore` for a [`DedupBackend`], by delegation (invoked by `impl_dedup_store!`).
macro_rules! impl_inspect_store {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl justonce_core::InspectStore for $store {
            async fn dedup_stats(
                &self,
            ) -> justonce_core::Result<Vec<justonce_core::ConsumerRecords>> {
                $crate::inspect::dedup_stats(self).await
            }

            async fn dedup_record(
                &self,
                key: justonce_core::DedupKey<'_>,
            ) -> justonce_core::Result<Option<justonce_core::DedupRecord>> {
                $crate::inspect::dedup_record(self, key).await
            }

            async fn purge_records(
                &self,
                retention: std::time::Duration,
                batch: u32,
            ) -> justonce_core::Result<u64> {
                $crate::dedup::purge(self, retention, batch).await
            }

            async fn clock(&self) -> justonce_core::Result<Option<std::time::SystemTime>> {
                $crate::inspect::clock(self).await
            }

            async fn server_checks(&self) -> justonce_core::Result<Vec<justonce_core::Check>> {
                $crate::inspect::server_checks(self).await
            }
        }
    };
}

/// `InspectClaims` for a [`ClaimBackend`], by delegation (invoked by `impl_claim_store!`).
macro_rules! impl_inspect_claims {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl justonce_core::InspectClaims for $store {
            async fn claim_record(
                &self,
                key: justonce_core::DedupKey<'_>,
            ) -> justonce_core::Result<Option<justonce_core::ClaimRecord>> {
                $crate::inspect::claim_record(self, key).await
            }

            async fn force_release(
                &self,
                key: justonce_core::DedupKey<'_>,
            ) -> justonce_core::Result<Option<u64>> {
                $crate::inspect::force_release(self, key).await
            }
        }
    };
}

pub(crate) use impl_inspect_claims;
pub(crate) use impl_inspect_store;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_name_the_table_and_cast_to_text() {
        let s = InspectSql::new(
            "jo_dedup",
            "processed_at",
            "CAST({} AS TEXT)",
            ["?", "?"],
            "0",
        );
        assert_eq!(
            s.stats,
            "SELECT CAST(consumer AS TEXT), CAST(COUNT(*) AS TEXT), CAST(MIN(processed_at) AS TEXT) FROM jo_dedup GROUP BY consumer ORDER BY consumer"
        );
        assert!(
            s.record.ends_with("WHERE consumer = ? AND message_id = ?"),
            "{}",
            s.record
        );
    }

    #[test]
    fn text_values_read_back() {
        assert_eq!(number(&Some("42".into())), Some(42));
        assert_eq!(
            number(&Some("1764600000123.0".into())),
            Some(1_764_600_000_123)
        );
        assert_eq!(time(&None), None);
        assert_eq!(hex_bytes("736e74"), Some(b"snt".to_vec()));
        assert_eq!(hex_bytes("7"), None);
    }
}
