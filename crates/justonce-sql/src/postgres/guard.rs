use justonce_core::{Cas, Result, StateMachine, Transition};

use crate::guard::{StateGuard, VersionGuard};

/// A state-machine guard on a PostgreSQL table: the transition is one conditional `UPDATE` in
/// the handler's transaction, so two deliveries of one message cannot both pass. The current
/// state is read only when the update changed nothing.
///
/// ```no_run
/// use justonce_core::StateMachine;
/// use justonce_sql::{PgStateGuard, PgTx};
///
/// # async fn handle(tx: &mut PgTx) -> justonce_core::Result<justonce_core::Disposition> {
/// let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
/// let guard = PgStateGuard::new("orders", "order_id", "status", machine)?;
/// if let Some(done) = guard.transition(tx, "ORD-1", "PAID").await?.to_disposition() {
///     return Ok(done);
/// }
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct PgStateGuard(StateGuard);

impl PgStateGuard {
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
    pub async fn transition<K>(
        &self,
        conn: &mut sqlx::PgConnection,
        key: K,
        target: &str,
    ) -> Result<Transition>
    where
        K: for<'q> sqlx::Encode<'q, sqlx::Postgres>
            + sqlx::Type<sqlx::Postgres>
            + Clone
            + std::fmt::Display
            + Send,
    {
        self.0
            .transition::<sqlx::Postgres, _>(conn, key, target)
            .await
    }
}

/// A version check (compare-and-set) on a PostgreSQL table:
/// `UPDATE t SET version = version + 1 WHERE key = ? AND version = ?` in the handler's
/// transaction; the affected rows and the current version decide [`Cas`].
///
/// ```no_run
/// use justonce_sql::{PgTx, PgVersionGuard};
///
/// # async fn handle(tx: &mut PgTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
/// let guard = PgVersionGuard::new("accounts", "id", "version")?;
/// if let Some(done) = guard.bump(tx, 42_i64, expected).await?.to_disposition(expected) {
///     return Ok(done);
/// }
/// # Ok(justonce_core::Disposition::Ok) }
/// ```
#[derive(Debug, Clone)]
pub struct PgVersionGuard(VersionGuard);

impl PgVersionGuard {
    /// A guard on `table`, finding the entity by `key_column`, its version in
    /// `version_column`.
    pub fn new(table: &str, key_column: &str, version_column: &str) -> Result<Self> {
        VersionGuard::new(table, key_column, version_column).map(Self)
    }

    /// Bumps the version of `key` if it is `expected`.
    pub async fn bump<K>(&self, conn: &mut sqlx::PgConnection, key: K, expected: i64) -> Result<Cas>
    where
        K: for<'q> sqlx::Encode<'q, sqlx::Postgres>
            + sqlx::Type<sqlx::Postgres>
            + Clone
            + std::fmt::Display
            + Send,
    {
        self.0.bump::<sqlx::Postgres, _>(conn, key, expected).await
    }
}
