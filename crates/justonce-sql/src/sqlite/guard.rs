use justonce_core::{validate_identifier, Cas, Error, ErrorKind, Result, StateMachine, Transition};
use sqlx::SqliteConnection;

/// A state-machine guard on a SQLite table: the transition is one conditional `UPDATE`
/// in the handler's transaction, so two deliveries of one message cannot both pass.
///
/// ```no_run
/// use justonce_core::StateMachine;
/// use justonce_sql::{SqliteStateGuard, SqliteTx};
///
/// # async fn handle(tx: &mut SqliteTx) -> justonce_core::Result<justonce_core::Disposition> {
/// let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
/// let guard = SqliteStateGuard::new("orders", "order_id", "status", machine)?;
/// let t = guard.transition(&mut **tx, "ORD-1", "PAID").await?;
/// if let Some(done) = t.to_disposition() {
///     return Ok(done); // Duplicate, or DeadLetter naming the states
/// }
/// // ... the payment's other writes, in the same transaction
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStateGuard {
    machine: StateMachine,
    table: String,
    key: String,
    state: String,
}

impl SqliteStateGuard {
    /// A guard on `table`, finding the entity by `key_column` and its state in
    /// `state_column`. The names are validated as SQL identifiers.
    pub fn new(
        table: &str,
        key_column: &str,
        state_column: &str,
        machine: StateMachine,
    ) -> Result<Self> {
        for name in [table, key_column, state_column] {
            validate_identifier(name)?;
        }
        Ok(SqliteStateGuard {
            machine,
            table: table.into(),
            key: key_column.into(),
            state: state_column.into(),
        })
    }

    /// Moves the entity `key` to `target`. [`Transition::Apply`] means it moved; the other
    /// answers changed nothing. A missing entity is an [`ErrorKind::InvalidInput`] error.
    pub async fn transition(
        &self,
        conn: &mut SqliteConnection,
        key: &str,
        target: &str,
    ) -> Result<Transition> {
        let sources = self.machine.sources_of(target);
        if !sources.is_empty() {
            let marks = vec!["?"; sources.len()].join(", ");
            let sql = format!(
                "UPDATE {t} SET {s} = ? WHERE {k} = ? AND {s} IN ({marks})",
                t = self.table,
                s = self.state,
                k = self.key
            );
            let mut q = sqlx::query(&sql).bind(target).bind(key);
            for s in &sources {
                q = q.bind(*s);
            }
            if q.execute(&mut *conn).await?.rows_affected() == 1 {
                return Ok(Transition::Apply);
            }
        }
        let sql = format!(
            "SELECT {s} FROM {t} WHERE {k} = ?",
            s = self.state,
            t = self.table,
            k = self.key
        );
        let current: Option<String> = sqlx::query_scalar(&sql)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(current) = current else {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("no row in {} with {} = {key}", self.table, self.key),
            ));
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

/// A version check (compare-and-set) on a SQLite table:
/// `UPDATE t SET version = version + 1 WHERE key = ? AND version = ?`, in the handler's
/// transaction. The affected rows and the current version decide [`Cas`].
///
/// ```no_run
/// use justonce_sql::{SqliteTx, SqliteVersionGuard};
///
/// # async fn handle(tx: &mut SqliteTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
/// let guard = SqliteVersionGuard::new("accounts", "id", "version")?;
/// let cas = guard.bump(&mut **tx, "42", expected).await?;
/// if let Some(done) = cas.to_disposition(expected) {
///     return Ok(done); // Duplicate when stale, Retry when an earlier change is missing
/// }
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteVersionGuard {
    table: String,
    key: String,
    version: String,
}

impl SqliteVersionGuard {
    /// A guard on `table`, finding the entity by `key_column`, its version in `version_column`.
    pub fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self> {
        for name in [table, key_column, version_column] {
            validate_identifier(name)?;
        }
        Ok(SqliteVersionGuard {
            table: table.into(),
            key: key_column.into(),
            version: version_column.into(),
        })
    }

    /// Bumps the version of `key` if it is `expected`.
    pub async fn bump(&self, conn: &mut SqliteConnection, key: &str, expected: i64) -> Result<Cas> {
        let sql = format!(
            "UPDATE {t} SET {v} = {v} + 1 WHERE {k} = ? AND {v} = ?",
            t = self.table,
            v = self.version,
            k = self.key
        );
        if sqlx::query(&sql)
            .bind(key)
            .bind(expected)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1
        {
            return Ok(Cas::Applied);
        }
        let sql = format!(
            "SELECT {v} FROM {t} WHERE {k} = ?",
            v = self.version,
            t = self.table,
            k = self.key
        );
        let current: Option<i64> = sqlx::query_scalar(&sql)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
        match current {
            None => Err(Error::new(
                ErrorKind::InvalidInput,
                format!("no row in {} with {} = {key}", self.table, self.key),
            )),
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
