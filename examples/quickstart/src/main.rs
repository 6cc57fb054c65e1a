//! A payment published twice with one id (a publisher retry) is applied once.
//!
//! `cargo run -p quickstart`

use std::time::Duration;

use justonce::sql::{SqliteQueue, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result,
};

/// A payment as the producer publishes it. A message without one of these fields is a
/// decode error: dead-lettered with serde's reason, never applied.
#[derive(serde::Deserialize)]
struct Payment {
    account: i64,
    amount: i64,
}

struct Credit;

impl Handler<SqliteTx> for Credit {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let p: Payment = cx.message().decode_json()?;
        sqlx::query("UPDATE accounts SET balance = balance + ? WHERE id = ?")
            .bind(p.amount)
            .bind(p.account)
            .execute(&mut **tx) // the same transaction as the dedup record
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| justonce::Error::config(e.to_string()))?;
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("queue.db"), "payments").await?;
    let store = SqliteStore::open(&url("app.db")).await?;
    sqlx::raw_sql("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER); INSERT INTO accounts VALUES (1, 0);")
        .execute(store.pool())
        .await?;

    let pay = Message::new(r#"{"account":1,"amount":250}"#).with_id("ORD-1")?;
    queue.publish(&pay).await?;
    queue.publish(&pay).await?; // a publisher retry after a lost confirm: same id

    let consumer = Consumer::new(
        ConsumerOptions::new("billing"),
        queue.clone(),
        store.clone(),
        Credit,
    )?;
    let drained = async {
        while queue.stats().await.is_ok_and(|s| s.pending > 0) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    consumer.run_until(drained).await?;

    let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = 1")
        .fetch_one(store.pool())
        .await?;
    println!("published twice, balance = {balance}");
    if balance != 250 {
        return Err(justonce::Error::config(format!(
            "expected 250, got {balance}"
        )));
    }
    Ok(())
}
