use justonce_core::{Cas, Result, StateMachine, Transition};

use crate::guard::{StateGuard, VersionGuard};

/// A state-machine guard on a SQLite table: the transition is one conditional `UPDATE` in
/// the handler's transaction, so two deliveries of one message cannot both pass. The current
/// state is read only when the update changed nothing.
///
/// ```no_run
/// use justonce_core::StateMachine;
/// use justonce_sql::{SqliteStateGuard, SqliteTx};
///
/// # async fn handle(tx: &mut SqliteTx) -> justonce_core::Result<justonce_core::Disposition> {
/// let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
/// let guard = SqliteStateGuard::new("orders", "order_id", "status", machine)?;
/// if let Some(done) = guard.transition(tx, "ORD-1", "PAID").await?.to_disposition() {
///     return Ok(done); // Duplicate, or DeadLetter naming the states
/// }
/// // ... the payment's other writes, in the same transaction
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStateGuard(StateGuard);

impl SqliteStateGuard {
    /// A guard on `table`, finding the entity by `key_column` and its state in
    /// `state_column`. The names are validated as SQL identifiers.
    pub fn new(
        table: &str,
        key_column: &str,
        state_column: &str,
        machine: StateMachine,
    ) -> Result<Self> {
        StateGuard::new(table, key_column, state_column, machine).map(Self)
    }

    /// Moves the entity `key` to `target`. [`Transition::Apply`] means it moved; the other
    /// answers changed nothing. A missing entity is an
    /// [`ErrorKind::InvalidInput`](justonce_core::ErrorKind::InvalidInput) error.
    pub async fn transition(
        &self,
        conn: &mut sqlx::SqliteConnection,
        key: &str,
        target: &str,
    ) -> Result<Transition> {
        self.0
            .transition::<sqlx::Sqlite, _>(conn, key, target)
            .await
    }
}

/// A version check (compare-and-set) on a SQLite table:
/// `UPDATE t SET version = version + 1 WHERE key = ? AND version = ?` in the handler's
/// transaction; the affected rows and the current version decide [`Cas`].
///
/// ```no_run
/// use justonce_sql::{SqliteTx, SqliteVersionGuard};
///
/// # async fn handle(tx: &mut SqliteTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
/// let guard = SqliteVersionGuard::new("accounts", "id", "version")?;
/// if let Some(done) = guard.bump(tx, "42", expected).await?.to_disposition(expected) {
///     return Ok(done); // Duplicate when stale, Retry when an earlier change is missing
/// }
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteVersionGuard(VersionGuard);

impl SqliteVersionGuard {
    /// A guard on `table`, finding the entity by `key_column`, its version in
    /// `version_column`.
    pub fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self> {
        VersionGuard::new(table, key_column, version_column).map(Self)
    }

    /// Bumps the version of `key` if it is `expected`.
    pub async fn bump(
        &self,
        conn: &mut sqlx::SqliteConnection,
        key: &str,
        expected: i64,
    ) -> Result<Cas> {
        self.0.bump::<sqlx::Sqlite, _>(conn, key, expected).await
    }
}
