//! State machine: a payment moves its order PENDING -> PAID with a conditional update in
//! the handler's transaction. A second delivery finds it PAID: a duplicate. A payment for
//! a cancelled order is not allowed: dead-lettered with the states in the reason.
//!
//! `cargo run -p example-state-machine`

use justonce::sql::{SqliteQueue, SqliteStateGuard, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Idempotency, Message,
    Publisher, Result, StateMachine,
};

struct MarkPaid {
    guard: SqliteStateGuard,
}

impl Handler<SqliteTx> for MarkPaid {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let p: serde_json::Value = cx.message().decode_json()?;
        let order = p["order_id"].as_str().unwrap_or_default();
        if let Some(done) = self
            .guard
            .transition(tx, order, "PAID")
            .await?
            .to_disposition()
        {
            return Ok(done); // Duplicate (already PAID or past it) or DeadLetter (not allowed)
        }
        sqlx::query("UPDATE orders SET paid_cents = ? WHERE order_id = ?")
            .bind(p["cents"].as_i64())
            .bind(order)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::config(e.to_string()))?;
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("queue.db"), "payments").await?;
    let store = SqliteStore::open(&url("app.db")).await?;
    sqlx::raw_sql(
        "CREATE TABLE orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL, paid_cents INTEGER);
         INSERT INTO orders VALUES ('ORD-1', 'PENDING', NULL), ('ORD-2', 'CANCELLED', NULL);",
    )
    .execute(store.pool())
    .await?;

    let pay = |order: &str, id: &str| -> Result<Message> {
        Message::new(format!(r#"{{"order_id":"{order}","cents":500}}"#)).with_id(id)
    };
    queue
        .publish_batch(&[
            pay("ORD-1", "p-1")?,
            pay("ORD-1", "p-1-retry")?,
            pay("ORD-2", "p-2")?,
        ])
        .await?;

    let machine = StateMachine::new([
        ("PENDING", "PAID"),
        ("PAID", "SHIPPED"),
        ("PENDING", "CANCELLED"),
    ])?;
    let guard = SqliteStateGuard::new("orders", "order_id", "status", machine)?;
    let opts = ConsumerOptions::new("payments").idempotency(Idempotency::Guard);
    let consumer = Consumer::new(opts, queue.clone(), store.clone(), MarkPaid { guard })?;
    while queue.stats().await?.pending > 0 {
        consumer.run_once().await?;
    }

    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = 'ORD-1'")
        .fetch_one(store.pool())
        .await?;
    println!("ORD-1 paid twice: status {status}");
    for letter in queue.dead_letters().await? {
        println!("dead-lettered: {}", letter.reason.error);
    }
    Ok(())
}
