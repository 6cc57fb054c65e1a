//! The state-machine and version guards, written once for every database by
//! [`define_guards!`]: a backend names its types, its connection and its placeholders.

/// `?` placeholders (SQLite, MariaDB).
#[allow(dead_code)]
pub(crate) fn question(_: usize) -> String {
    "?".to_owned()
}

/// `$n` placeholders (PostgreSQL).
#[allow(dead_code)]
pub(crate) fn dollar(n: usize) -> String {
    format!("${n}")
}

macro_rules! define_guards {
    (
        state: $state:ident,
        version: $version:ident,
        db: $db:ty,
        conn: $conn:ty,
        placeholder: $ph:path,
        key: $key:ty $(, [$($generics:tt)*] where [$($bounds:tt)*])?,
        name: $name:literal,
        state_example: $state_example:literal,
        version_example: $version_example:literal $(,)?
    ) => {
        #[doc = concat!("A state-machine guard on a ", $name, " table: the transition is one conditional")]
        /// `UPDATE` in the handler's transaction, so two deliveries of one message cannot both
        /// pass. The current state is read only when the update changed nothing.
        ///
        #[doc = $state_example]
        #[derive(Debug, Clone)]
        pub struct $state {
            machine: justonce_core::StateMachine,
            table: String,
            key: String,
            state: String,
        }

        impl $state {
            /// A guard on `table`, finding the entity by `key_column` and its state in
            /// `state_column`. The names are validated as SQL identifiers.
            pub fn new(
                table: &str,
                key_column: &str,
                state_column: &str,
                machine: justonce_core::StateMachine,
            ) -> justonce_core::Result<Self> {
                for name in [table, key_column, state_column] {
                    justonce_core::validate_identifier(name)?;
                }
                Ok($state { machine, table: table.into(), key: key_column.into(), state: state_column.into() })
            }

            /// Moves the entity `key` to `target`. [`Transition::Apply`](justonce_core::Transition::Apply)
            /// means it moved; the other answers changed nothing. A missing entity is an
            /// [`ErrorKind::InvalidInput`](justonce_core::ErrorKind::InvalidInput) error.
            pub async fn transition $(<$($generics)*>)? (
                &self,
                conn: &mut $conn,
                key: $key,
                target: &str,
            ) -> justonce_core::Result<justonce_core::Transition>
            $(where $($bounds)*)?
            {
                use justonce_core::{Error, ErrorKind, Transition};
                let sources = self.machine.sources_of(target);
                if !sources.is_empty() {
                    let marks: Vec<String> = (3..3 + sources.len()).map($ph).collect();
                    let sql = format!(
                        "UPDATE {t} SET {s} = {p1} WHERE {k} = {p2} AND {s} IN ({marks})",
                        t = self.table,
                        s = self.state,
                        k = self.key,
                        p1 = $ph(1),
                        p2 = $ph(2),
                        marks = marks.join(", ")
                    );
                    let mut q = sqlx::query(&sql).bind(target).bind(key.clone());
                    for s in &sources {
                        q = q.bind(*s);
                    }
                    if q.execute(&mut *conn).await?.rows_affected() == 1 {
                        return Ok(Transition::Apply);
                    }
                }
                let sql = format!("SELECT {s} FROM {t} WHERE {k} = {p}", s = self.state, t = self.table, k = self.key, p = $ph(1));
                let current: Option<String> = sqlx::query_scalar(&sql).bind(key.clone()).fetch_optional(&mut *conn).await?;
                let Some(current) = current else {
                    return Err(Error::new(ErrorKind::InvalidInput, format!("no row in {} with {} = {key}", self.table, self.key)));
                };
                match self.machine.decide(&current, target) {
                    // The conditional update saw another state: someone moved it meanwhile.
                    Transition::Apply => Err(Error::new(ErrorKind::Busy, format!("{key} changed state concurrently"))),
                    other => Ok(other),
                }
            }
        }

        #[doc = concat!("A version check (compare-and-set) on a ", $name, " table:")]
        /// `UPDATE t SET version = version + 1 WHERE key = ? AND version = ?` in the handler's
        /// transaction; the affected rows and the current version decide
        /// [`Cas`](justonce_core::Cas).
        ///
        #[doc = $version_example]
        #[derive(Debug, Clone)]
        pub struct $version {
            table: String,
            key: String,
            version: String,
        }

        impl $version {
            /// A guard on `table`, finding the entity by `key_column`, its version in
            /// `version_column`.
            pub fn new(table: &str, key_column: &str, version_column: &str) -> justonce_core::Result<Self> {
                for name in [table, key_column, version_column] {
                    justonce_core::validate_identifier(name)?;
                }
                Ok($version { table: table.into(), key: key_column.into(), version: version_column.into() })
            }

            /// Bumps the version of `key` if it is `expected`.
            pub async fn bump $(<$($generics)*>)? (
                &self,
                conn: &mut $conn,
                key: $key,
                expected: i64,
            ) -> justonce_core::Result<justonce_core::Cas>
            $(where $($bounds)*)?
            {
                use justonce_core::{Cas, Error, ErrorKind};
                let sql = format!(
                    "UPDATE {t} SET {v} = {v} + 1 WHERE {k} = {p1} AND {v} = {p2}",
                    t = self.table,
                    v = self.version,
                    k = self.key,
                    p1 = $ph(1),
                    p2 = $ph(2)
                );
                if sqlx::query(&sql).bind(key.clone()).bind(expected).execute(&mut *conn).await?.rows_affected() == 1 {
                    return Ok(Cas::Applied);
                }
                let sql = format!("SELECT {v} FROM {t} WHERE {k} = {p}", v = self.version, t = self.table, k = self.key, p = $ph(1));
                let current: Option<i64> = sqlx::query_scalar(&sql).bind(key.clone()).fetch_optional(&mut *conn).await?;
                match current {
                    None => Err(Error::new(ErrorKind::InvalidInput, format!("no row in {} with {} = {key}", self.table, self.key))),
                    Some(current) => match Cas::decide(current, expected) {
                        Cas::Applied => Err(Error::new(ErrorKind::Busy, format!("{key} changed version concurrently"))),
                        other => Ok(other),
                    },
                }
            }
        }
    };
}

pub(crate) use define_guards;
