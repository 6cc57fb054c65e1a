//! Unique key: the order id is the primary key of the business row. A second delivery's
//! insert fails with a unique violation, which `Idempotency::UniqueKey` turns into an ack.
//!
//! `cargo run -p example-unique-key`

use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Error, Handler, Idempotency, Message,
    Publisher, Result,
};

struct CreateOrder;

impl Handler<SqliteTx> for CreateOrder {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let order: serde_json::Value = cx.message().decode_json()?;
        // No dedup table: the business row's own unique key is the record.
        sqlx::query("INSERT INTO orders (order_id, total) VALUES (?, ?)")
            .bind(order["order_id"].as_str())
            .bind(order["total"].as_i64())
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::config(e.to_string()))?;
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("queue.db"), "orders").await?;
    let store = SqliteStore::open(&url("app.db")).await?;
    sqlx::query("CREATE TABLE orders (order_id TEXT PRIMARY KEY, total INTEGER NOT NULL)")
        .execute(store.pool())
        .await?;

    // The same order created twice, with two different message ids: the key is the order.
    let body = r#"{"order_id":"ORD-9","total":1200}"#;
    queue
        .publish(&Message::new(body).with_id("attempt-1")?)
        .await?;
    queue
        .publish(&Message::new(body).with_id("attempt-2")?)
        .await?;

    let opts = ConsumerOptions::new("orders").idempotency(Idempotency::UniqueKey);
    let consumer = Consumer::new(opts, queue.clone(), store.clone(), CreateOrder)?;
    while queue.stats().await?.pending > 0 {
        consumer.run_once().await?;
    }

    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(store.pool())
        .await?;
    println!("published twice, orders = {n}");
    if n != 1 {
        return Err(Error::config(format!("expected 1 order, got {n}")));
    }
    Ok(())
}
