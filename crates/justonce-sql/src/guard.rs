//! The state-machine and version guards, written once for every database: the statements
//! are built here with sqlx's `QueryBuilder` (which writes each database's placeholders),
//! run through [`RunGuard`], and what the answers mean is decided here, with
//! `StateMachine::decide` and `Cas::decide` of the core. Each backend's public guard types
//! (`PgStateGuard`, …) only name their connection and key types.

use std::fmt::Display;

use async_trait::async_trait;
use justonce_core::{validate_identifier, Cas, Error, ErrorKind, Result, StateMachine, Transition};
use sqlx::{Database, Encode, QueryBuilder, Type};

/// Runs a guard's statement. Implemented for each database by `run_guard!`, where the
/// database is a concrete type: sqlx cannot run a `QueryBuilder` over a database left
/// generic (the query would borrow the builder for as long as its arguments live, which
/// its drop forbids; "lack of lazy normalization", sqlx's own source says).
#[async_trait]
pub(crate) trait RunGuard: Database {
    /// The rows the statement changed.
    async fn rows(conn: &mut Self::Connection, q: QueryBuilder<'_, Self>) -> Result<u64>;
    /// The first column of the first row as text.
    async fn text(conn: &mut Self::Connection, q: QueryBuilder<'_, Self>)
        -> Result<Option<String>>;
    /// The first column of the first row as an integer.
    async fn int(conn: &mut Self::Connection, q: QueryBuilder<'_, Self>) -> Result<Option<i64>>;
}

macro_rules! run_guard {
    ($db:ty) => {
        #[async_trait]
        impl RunGuard for $db {
            async fn rows(
                conn: &mut <$db as Database>::Connection,
                mut q: QueryBuilder<'_, $db>,
            ) -> Result<u64> {
                Ok(q.build().execute(conn).await?.rows_affected())
            }

            async fn text(
                conn: &mut <$db as Database>::Connection,
                mut q: QueryBuilder<'_, $db>,
            ) -> Result<Option<String>> {
                Ok(q.build_query_scalar().fetch_optional(conn).await?)
            }

            async fn int(
                conn: &mut <$db as Database>::Connection,
                mut q: QueryBuilder<'_, $db>,
            ) -> Result<Option<i64>> {
                Ok(q.build_query_scalar().fetch_optional(conn).await?)
            }
        }
    };
}

run_guard!(sqlx::Sqlite);
#[cfg(feature = "postgres")]
run_guard!(sqlx::Postgres);
#[cfg(feature = "mysql")]
run_guard!(sqlx::MySql);

/// A state-machine guard on one table.
#[derive(Debug, Clone)]
pub(crate) struct StateGuard {
    machine: StateMachine,
    table: String,
    key: String,
    state: String,
}

/// A version guard on one table.
#[derive(Debug, Clone)]
pub(crate) struct VersionGuard {
    table: String,
    key: String,
    version: String,
}

/// `SELECT {column} FROM {table} WHERE {key_column} = key`.
fn read<'a, DB, K>(column: &str, table: &str, key_column: &str, key: K) -> QueryBuilder<'a, DB>
where
    DB: Database,
    K: 'a + Encode<'a, DB> + Type<DB>,
{
    let mut q = QueryBuilder::new(format!(
        "SELECT {column} FROM {table} WHERE {key_column} = "
    ));
    q.push_bind(key);
    q
}

fn missing(table: &str, key_column: &str, key: &dyn Display) -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        format!("no row in {table} with {key_column} = {key}"),
    )
}

impl StateGuard {
    pub(crate) fn new(
        table: &str,
        key_column: &str,
        state_column: &str,
        machine: StateMachine,
    ) -> Result<Self> {
        for name in [table, key_column, state_column] {
            validate_identifier(name)?;
        }
        Ok(StateGuard {
            machine,
            table: table.into(),
            key: key_column.into(),
            state: state_column.into(),
        })
    }

    /// `UPDATE … SET state = target WHERE key = … AND state IN (the states that lead to
    /// target)`; `None` when no state leads there. One changed row is
    /// [`Transition::Apply`].
    pub(crate) fn update<'a, DB, K>(
        &'a self,
        key: K,
        target: &'a str,
    ) -> Option<QueryBuilder<'a, DB>>
    where
        DB: Database,
        K: 'a + Encode<'a, DB> + Type<DB>,
        &'a str: Encode<'a, DB> + Type<DB>,
    {
        let sources = self.machine.sources_of(target);
        if sources.is_empty() {
            return None;
        }
        let mut q = QueryBuilder::new(format!("UPDATE {} SET {} = ", self.table, self.state));
        q.push_bind(target)
            .push(format!(" WHERE {} = ", self.key))
            .push_bind(key)
            .push(format!(" AND {} IN (", self.state));
        let mut marks = q.separated(", ");
        for s in sources {
            marks.push_bind(s);
        }
        q.push(")");
        Some(q)
    }

    /// The entity's current state, read when the update changed nothing.
    pub(crate) fn read<'a, DB, K>(&self, key: K) -> QueryBuilder<'a, DB>
    where
        DB: Database,
        K: 'a + Encode<'a, DB> + Type<DB>,
    {
        read(&self.state, &self.table, &self.key, key)
    }

    /// Moves the entity `key` to `target`: the conditional update, and only when it
    /// changed nothing, the state read back and decided.
    pub(crate) async fn transition<'a, DB, K>(
        &'a self,
        conn: &mut DB::Connection,
        key: K,
        target: &'a str,
    ) -> Result<Transition>
    where
        DB: RunGuard,
        K: 'a + Encode<'a, DB> + Type<DB> + Clone + Display + Send,
        &'a str: Encode<'a, DB> + Type<DB>,
    {
        if let Some(q) = self.update::<DB, K>(key.clone(), target) {
            if DB::rows(conn, q).await? == 1 {
                return Ok(Transition::Apply);
            }
        }
        let current = DB::text(conn, self.read(key.clone())).await?;
        self.decide(current, &key, target)
    }

    /// What an update that changed nothing means, from the state read after it.
    pub(crate) fn decide(
        &self,
        current: Option<String>,
        key: &dyn Display,
        target: &str,
    ) -> Result<Transition> {
        let Some(current) = current else {
            return Err(missing(&self.table, &self.key, key));
        };
        match self.machine.decide(&current, target) {
            // The conditional update saw another state: someone moved it meanwhile.
            Transition::Apply => Err(Error::new(
                ErrorKind::Busy,
                format!("{key} changed state concurrently"),
            )),
            other => Ok(other),
        }
    }
}

impl VersionGuard {
    pub(crate) fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self> {
        for name in [table, key_column, version_column] {
            validate_identifier(name)?;
        }
        Ok(VersionGuard {
            table: table.into(),
            key: key_column.into(),
            version: version_column.into(),
        })
    }

    /// `UPDATE … SET version = version + 1 WHERE key = … AND version = expected`. One
    /// changed row is [`Cas::Applied`].
    pub(crate) fn update<'a, DB, K>(&self, key: K, expected: i64) -> QueryBuilder<'a, DB>
    where
        DB: Database,
        K: 'a + Encode<'a, DB> + Type<DB>,
        i64: Encode<'a, DB> + Type<DB>,
    {
        let v = &self.version;
        let mut q = QueryBuilder::new(format!(
            "UPDATE {} SET {v} = {v} + 1 WHERE {} = ",
            self.table, self.key
        ));
        q.push_bind(key)
            .push(format!(" AND {v} = "))
            .push_bind(expected);
        q
    }

    /// The entity's current version, read when the update changed nothing.
    pub(crate) fn read<'a, DB, K>(&self, key: K) -> QueryBuilder<'a, DB>
    where
        DB: Database,
        K: 'a + Encode<'a, DB> + Type<DB>,
    {
        read(&self.version, &self.table, &self.key, key)
    }

    /// Bumps the version of `key` if it is `expected`: the conditional update, and only
    /// when it changed nothing, the version read back and decided.
    pub(crate) async fn bump<'a, DB, K>(
        &'a self,
        conn: &mut DB::Connection,
        key: K,
        expected: i64,
    ) -> Result<Cas>
    where
        DB: RunGuard,
        K: 'a + Encode<'a, DB> + Type<DB> + Clone + Display + Send,
        i64: Encode<'a, DB> + Type<DB>,
    {
        if DB::rows(conn, self.update::<DB, K>(key.clone(), expected)).await? == 1 {
            return Ok(Cas::Applied);
        }
        let current = DB::int(conn, self.read(key.clone())).await?;
        self.decide(current, &key, expected)
    }

    /// What an update that changed nothing means, from the version read after it.
    pub(crate) fn decide(
        &self,
        current: Option<i64>,
        key: &dyn Display,
        expected: i64,
    ) -> Result<Cas> {
        match current {
            None => Err(missing(&self.table, &self.key, key)),
            Some(current) => match Cas::decide(current, expected) {
                Cas::Applied => Err(Error::new(
                    ErrorKind::Busy,
                    format!("{key} changed version concurrently"),
                )),
                other => Ok(other),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> StateMachine {
        StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED"), ("NEW", "PAID")]).unwrap()
    }

    #[test]
    fn the_statements_carry_each_databases_placeholders() {
        let g = StateGuard::new("orders", "order_id", "status", machine()).unwrap();
        let q = g.update::<sqlx::Sqlite, _>("ORD-1", "PAID").unwrap();
        let sql = q.sql();
        assert!(
            sql.starts_with("UPDATE orders SET status = ? WHERE order_id = ? AND status IN (?, ?)"),
            "{sql}"
        );
        assert!(
            g.update::<sqlx::Sqlite, _>("ORD-1", "PENDING").is_none(),
            "nothing leads to PENDING"
        );
        let v = VersionGuard::new("accounts", "id", "version").unwrap();
        assert_eq!(
            v.update::<sqlx::Sqlite, _>("42", 3).sql(),
            "UPDATE accounts SET version = version + 1 WHERE id = ? AND version = ?"
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_placeholders_are_numbered() {
        let g = StateGuard::new("orders", "order_id", "status", machine()).unwrap();
        let q = g.update::<sqlx::Postgres, _>("ORD-1", "PAID").unwrap();
        assert_eq!(
            q.sql(),
            "UPDATE orders SET status = $1 WHERE order_id = $2 AND status IN ($3, $4)"
        );
        let v = VersionGuard::new("accounts", "id", "version").unwrap();
        assert_eq!(
            v.read::<sqlx::Postgres, _>(42_i64).sql(),
            "SELECT version FROM accounts WHERE id = $1"
        );
    }

    #[test]
    fn an_update_that_changed_nothing_is_decided_by_what_is_there() {
        let g = StateGuard::new("orders", "order_id", "status", machine()).unwrap();
        assert_eq!(
            g.decide(Some("PAID".into()), &"ORD-1", "PAID").unwrap(),
            Transition::AlreadyDone
        );
        assert_eq!(
            g.decide(None, &"ORD-1", "PAID").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // PENDING -> PAID is allowed: the update missed it only because it moved meanwhile.
        assert_eq!(
            g.decide(Some("PENDING".into()), &"ORD-1", "PAID")
                .unwrap_err()
                .kind(),
            ErrorKind::Busy
        );
        let v = VersionGuard::new("accounts", "id", "version").unwrap();
        assert_eq!(v.decide(Some(7), &42, 3).unwrap(), Cas::decide(7, 3));
        assert_eq!(
            v.decide(None, &42, 3).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
}
