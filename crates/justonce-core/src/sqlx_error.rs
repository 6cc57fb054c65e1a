//! Classification of sqlx errors, in one place for every database.

use crate::{Error, ErrorKind};

/// SQLite primary result codes that mean "try again".
const SQLITE_BUSY: &str = "5";
const SQLITE_LOCKED: &str = "6";

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let kind = classify(&e);
        Error::with_source(kind, format!("{kind} error"), e)
    }
}

fn classify(e: &sqlx::Error) -> ErrorKind {
    match e {
        sqlx::Error::Database(db) => {
            if db.is_unique_violation() {
                return ErrorKind::UniqueViolation;
            }
            let code = db.code().unwrap_or_default();
            // SQLite extended codes keep the primary code in the low byte.
            let primary = code
                .parse::<i64>()
                .map(|c| (c & 0xff).to_string())
                .unwrap_or_default();
            match (code.as_ref(), primary.as_str()) {
                (_, SQLITE_BUSY) | (_, SQLITE_LOCKED) => ErrorKind::Busy,
                // PostgreSQL: serialization failure, deadlock, lock timeout, admin shutdown, cannot connect now.
                ("40001" | "40P01" | "55P03" | "57P01" | "57P03", _) => ErrorKind::Busy,
                // MariaDB/MySQL: deadlock, lock wait timeout (reported as SQLSTATE 40001 / HY000).
                ("1213" | "1205", _) => ErrorKind::Busy,
                _ => ErrorKind::Database,
            }
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => ErrorKind::Io,
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => ErrorKind::Closed,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => ErrorKind::Database,
        _ => ErrorKind::Database,
    }
}
