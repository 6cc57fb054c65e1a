use crate::guard::{define_guards, dollar};

define_guards! {
    state: PgStateGuard,
    version: PgVersionGuard,
    db: sqlx::Postgres,
    conn: sqlx::PgConnection,
    placeholder: dollar,
    key: K, [K] where [K: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Clone + std::fmt::Display + Send],
    name: "PostgreSQL",
    state_example: r#"```no_run
use justonce_core::StateMachine;
use justonce_sql::{PgStateGuard, PgTx};

# async fn handle(tx: &mut PgTx) -> justonce_core::Result<justonce_core::Disposition> {
let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
let guard = PgStateGuard::new("orders", "order_id", "status", machine)?;
if let Some(done) = guard.transition(tx, "ORD-1", "PAID").await?.to_disposition() {
    return Ok(done);
}
# Ok(justonce_core::Disposition::Ok) }
```"#,
    version_example: r#"```no_run
use justonce_sql::{PgTx, PgVersionGuard};

# async fn handle(tx: &mut PgTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
let guard = PgVersionGuard::new("accounts", "id", "version")?;
if let Some(done) = guard.bump(tx, 42_i64, expected).await?.to_disposition(expected) {
    return Ok(done);
}
# Ok(justonce_core::Disposition::Ok) }
```"#,
}
