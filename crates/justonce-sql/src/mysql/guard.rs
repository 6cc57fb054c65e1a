use crate::guard::{define_guards, question};

define_guards! {
    state: MySqlStateGuard,
    version: MySqlVersionGuard,
    db: sqlx::MySql,
    conn: sqlx::MySqlConnection,
    placeholder: question,
    key: K, [K] where [K: for<'q> sqlx::Encode<'q, sqlx::MySql> + sqlx::Type<sqlx::MySql> + Clone + std::fmt::Display + Send],
    name: "MariaDB",
    state_example: r#"```no_run
use justonce_core::StateMachine;
use justonce_sql::{MySqlStateGuard, MySqlTx};

# async fn handle(tx: &mut MySqlTx) -> justonce_core::Result<justonce_core::Disposition> {
let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
let guard = MySqlStateGuard::new("orders", "order_id", "status", machine)?;
if let Some(done) = guard.transition(tx, "ORD-1", "PAID").await?.to_disposition() {
    return Ok(done);
}
# Ok(justonce_core::Disposition::Ok) }
```"#,
    version_example: r#"```no_run
use justonce_sql::{MySqlTx, MySqlVersionGuard};

# async fn handle(tx: &mut MySqlTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
let guard = MySqlVersionGuard::new("accounts", "id", "version")?;
if let Some(done) = guard.bump(tx, 42_i64, expected).await?.to_disposition(expected) {
    return Ok(done);
}
# Ok(justonce_core::Disposition::Ok) }
```"#,
}
