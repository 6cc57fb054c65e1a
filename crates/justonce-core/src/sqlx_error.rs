//! Classification of sqlx errors, in one place for every database.
//!
//! What matters most is who is to blame. An error about the statement's data (a foreign
//! key, a check, a value out of range) is the message's: it dead-letters that message.
//! Everything else (a missing table, a missing privilege, a full disk, a lost connection,
//! a deadlock) is the environment's: the batch is handed back and the consumer pauses, so
//! that a deploy mistake stalls the queue instead of emptying it into the dead letters.
//! PostgreSQL and MariaDB are classified by SQLSTATE class (and MariaDB's error number,
//! since it reports many errors as the generic `HY000`), SQLite by its result code.

use crate::{Error, ErrorKind};

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        let kind = classify(&e);
        // The database's own sentence, once; the chain adds nothing that repeats it.
        let message = match &e {
            sqlx::Error::Database(db) => db.message().to_owned(),
            other => other.to_string(),
        };
        Error::with_source(kind, message, e)
    }
}

fn classify(e: &sqlx::Error) -> ErrorKind {
    match e {
        sqlx::Error::Database(db) => {
            if db.is_unique_violation() {
                return ErrorKind::UniqueViolation;
            }
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                if let Some(kind) = mysql_number(my.number()) {
                    return kind;
                }
            }
            let code = db.code().unwrap_or_default();
            if is_sqlstate(&code) {
                sqlstate(&code)
            } else {
                sqlite(&code, db.message())
            }
        }
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => ErrorKind::Io,
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => ErrorKind::Closed,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        sqlx::Error::Protocol(_) => ErrorKind::Io,
        // A column the code reads is missing or has another type: the schema and the code
        // disagree, which no message can fix.
        sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => ErrorKind::Schema,
        sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => ErrorKind::Schema,
        _ => ErrorKind::Database,
    }
}

/// A five-character SQLSTATE (PostgreSQL, MariaDB), as opposed to SQLite's decimal codes,
/// which never have five digits.
fn is_sqlstate(code: &str) -> bool {
    code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// By SQLSTATE, the same for PostgreSQL and MariaDB where the standard defines the class.
fn sqlstate(code: &str) -> ErrorKind {
    match code {
        // Serialization failure, deadlock, lock not available, object in use.
        "40001" | "40P01" | "55P03" | "55006" => ErrorKind::Busy,
        // Statement timeout or cancel.
        "57014" => ErrorKind::Timeout,
        // Admin shutdown, crash shutdown, cannot connect now: the server is going away.
        "57P01" | "57P02" | "57P03" => ErrorKind::Closed,
        // Read-only transaction (a replica, or default_transaction_read_only).
        "25006" => ErrorKind::Permission,
        "42501" => ErrorKind::Permission,
        // Feature not supported by this server.
        "0A000" => ErrorKind::Schema,
        // Invalid catalog (database) or schema name.
        "3D000" | "3F000" => ErrorKind::Schema,
        _ => match &code[..2] {
            "08" => ErrorKind::Connect,
            "28" => ErrorKind::Permission,
            // Syntax error or access rule violation: undefined table, column, function,
            // a datatype mismatch in the SQL, a syntax error.
            "42" => ErrorKind::Schema,
            "53" | "F0" | "XX" => ErrorKind::Resource,
            "58" => ErrorKind::Io,
            // 22 data exception, 23 integrity constraint, P0 raised by a trigger, and the rest.
            _ => ErrorKind::Database,
        },
    }
}

/// MariaDB / MySQL error numbers that the SQLSTATE does not tell apart (`HY000`, `42000`).
#[cfg(feature = "mysql")]
fn mysql_number(n: u16) -> Option<ErrorKind> {
    Some(match n {
        // Deadlock, lock wait timeout, and "Record has changed since last read": a write
        // conflict under snapshot isolation (`innodb_snapshot_isolation`, on by default from
        // MariaDB 11.8), which a retry of the transaction passes.
        1213 | 1205 | 1020 => ErrorKind::Busy,
        // Access denied (database, user, command, column, routine), needs a privilege,
        // --read-only, read-only transaction.
        1044 | 1045 | 1142 | 1143 | 1227 | 1290 | 1370 | 1792 => ErrorKind::Permission,
        // No database selected, unknown database, unknown column, syntax error, unknown
        // table, table does not exist, function does not exist, view is invalid.
        1046 | 1049 | 1054 | 1064 | 1109 | 1146 | 1305 | 1356 => ErrorKind::Schema,
        // Disk full, error from the storage engine, out of memory, too many connections,
        // table full, user connections or resource limit exceeded.
        1021 | 1030 | 1037 | 1038 | 1040 | 1041 | 1114 | 1203 | 1226 => ErrorKind::Resource,
        // Server shutdown, connection killed, server gone away, lost connection.
        1053 | 1927 | 2006 | 2013 => ErrorKind::Closed,
        // Query interrupted, max_statement_time exceeded.
        1317 | 1969 | 3024 => ErrorKind::Timeout,
        _ => return None,
    })
}

/// SQLite result codes (extended codes keep the primary code in the low byte). Its generic
/// `SQLITE_ERROR` covers both schema mistakes and a few data errors, so the message decides.
fn sqlite(code: &str, message: &str) -> ErrorKind {
    let Ok(extended) = code.parse::<i64>() else {
        return ErrorKind::Database;
    };
    match extended & 0xff {
        5 | 6 => ErrorKind::Busy,                // SQLITE_BUSY, SQLITE_LOCKED
        3 | 8 | 23 => ErrorKind::Permission,     // SQLITE_PERM, SQLITE_READONLY, SQLITE_AUTH
        7 | 11 | 13 | 26 => ErrorKind::Resource, // NOMEM, CORRUPT, FULL, NOTADB
        10 | 14 | 15 => ErrorKind::Io,           // IOERR, CANTOPEN, PROTOCOL
        1 if sqlite_schema_message(message) => ErrorKind::Schema,
        _ => ErrorKind::Database,
    }
}

/// Whether an `SQLITE_ERROR` message says the statement names something the database does
/// not have, or does not parse (SQLite's wording, stable across versions).
fn sqlite_schema_message(message: &str) -> bool {
    const SCHEMA: [&str; 8] = [
        "no such table",
        "no such column",
        "no such function",
        "no such index",
        "no such view",
        "has no column named",
        "syntax error",
        "unknown database",
    ];
    SCHEMA.iter().any(|p| message.contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_blame_the_environment_except_for_data_and_integrity() {
        for (code, kind) in [
            ("42P01", ErrorKind::Schema),     // undefined table
            ("42703", ErrorKind::Schema),     // undefined column
            ("42883", ErrorKind::Schema),     // undefined function
            ("42601", ErrorKind::Schema),     // syntax error
            ("42S02", ErrorKind::Schema),     // MariaDB: table does not exist
            ("3F000", ErrorKind::Schema),     // invalid schema name
            ("3D000", ErrorKind::Schema),     // invalid catalog name
            ("42501", ErrorKind::Permission), // insufficient privilege
            ("28P01", ErrorKind::Permission), // invalid password
            ("25006", ErrorKind::Permission), // read-only transaction
            ("53100", ErrorKind::Resource),   // disk full
            ("53300", ErrorKind::Resource),   // too many connections
            ("08006", ErrorKind::Connect),    // connection failure
            ("40P01", ErrorKind::Busy),       // deadlock
            ("40001", ErrorKind::Busy),       // serialization failure
            ("57014", ErrorKind::Timeout),    // statement timeout
            ("57P01", ErrorKind::Closed),     // admin shutdown
            ("23503", ErrorKind::Database),   // foreign key
            ("23514", ErrorKind::Database),   // check
            ("23502", ErrorKind::Database),   // not null
            ("22003", ErrorKind::Database),   // numeric value out of range
            ("22P02", ErrorKind::Database),   // invalid text representation
            ("P0001", ErrorKind::Database),   // raised by a trigger
            ("HY000", ErrorKind::Database),   // MariaDB's generic state, number unknown
        ] {
            assert!(is_sqlstate(code), "{code}");
            assert_eq!(sqlstate(code), kind, "{code}");
            assert_eq!(
                kind.is_message_fault(),
                code.starts_with("22")
                    || code.starts_with("23")
                    || code.starts_with('P')
                    || code == "HY000",
                "{code}"
            );
        }
    }

    #[test]
    fn sqlite_codes_and_messages() {
        for (code, message, kind) in [
            ("1", "no such table: payments", ErrorKind::Schema),
            (
                "1",
                "table ledger has no column named amount",
                ErrorKind::Schema,
            ),
            ("1", "near \"SELEC\": syntax error", ErrorKind::Schema),
            ("1", "malformed JSON", ErrorKind::Database),
            ("5", "database is locked", ErrorKind::Busy),
            ("517", "database is locked", ErrorKind::Busy), // SQLITE_BUSY_SNAPSHOT
            (
                "8",
                "attempt to write a readonly database",
                ErrorKind::Permission,
            ),
            ("13", "database or disk is full", ErrorKind::Resource),
            ("787", "FOREIGN KEY constraint failed", ErrorKind::Database),
            ("275", "CHECK constraint failed", ErrorKind::Database),
            ("1299", "NOT NULL constraint failed", ErrorKind::Database),
        ] {
            assert!(!is_sqlstate(code), "{code}");
            assert_eq!(sqlite(code, message), kind, "{code} {message}");
        }
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mariadb_numbers_that_share_a_generic_sqlstate() {
        assert_eq!(mysql_number(1146), Some(ErrorKind::Schema));
        assert_eq!(mysql_number(1142), Some(ErrorKind::Permission));
        assert_eq!(mysql_number(1205), Some(ErrorKind::Busy));
        assert_eq!(mysql_number(1020), Some(ErrorKind::Busy));
        assert_eq!(mysql_number(1021), Some(ErrorKind::Resource));
        assert_eq!(mysql_number(1452), None, "a foreign key is the message's");
        assert_eq!(
            mysql_number(1366),
            None,
            "an incorrect value is the message's"
        );
    }
}
