//! The state-machine and version guards, written once for every database: the statements
//! are built here with sqlx's `QueryBuilder` (which writes each database's placeholders),
//! and what the answers mean is decided here, with `StateMachine::decide` and
//! `Cas::decide` of the core. Each backend's public guard types (`PgStateGuard`, …) name
//! their connection and key types and run the two statements: sqlx cannot run a
//! `QueryBuilder` over a database left generic (its arguments' lifetime would have to
//! outlive the builder; "lack of lazy normalization", sqlx's source says).

use std::fmt::Display;

use justonce_core::{validate_identifier, Cas, Error, ErrorKind, Result, StateMachine, Transition};
use sqlx::{Database, Encode, QueryBuilder, Type};

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
