use crate::guard::{define_guards, question};

define_guards! {
    state: SqliteStateGuard,
    version: SqliteVersionGuard,
    db: sqlx::Sqlite,
    conn: sqlx::SqliteConnection,
    placeholder: question,
    key: &str,
    name: "SQLite",
    state_example: r#"```no_run
use justonce_core::StateMachine;
use justonce_sql::{SqliteStateGuard, SqliteTx};

# async fn handle(tx: &mut SqliteTx) -> justonce_core::Result<justonce_core::Disposition> {
let machine = StateMachine::new([("PENDING", "PAID"), ("PAID", "SHIPPED")])?;
let guard = SqliteStateGuard::new("orders", "order_id", "status", machine)?;
if let Some(done) = guard.transition(tx, "ORD-1", "PAID").await?.to_disposition() {
    return Ok(done); // Duplicate, or DeadLetter naming the states
}
// ... the payment's other writes, in the same transaction
# Ok(justonce_core::Disposition::Ok) }
```"#,
    version_example: r#"```no_run
use justonce_sql::{SqliteTx, SqliteVersionGuard};

# async fn handle(tx: &mut SqliteTx, expected: i64) -> justonce_core::Result<justonce_core::Disposition> {
let guard = SqliteVersionGuard::new("accounts", "id", "version")?;
if let Some(done) = guard.bump(tx, "42", expected).await?.to_disposition(expected) {
    return Ok(done); // Duplicate when stale, Retry when an earlier change is missing
}
# Ok(justonce_core::Disposition::Ok) }
```"#,
}
