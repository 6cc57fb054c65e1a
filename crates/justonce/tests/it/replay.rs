//! Replaying dead letters through the consumer: a poison message fixed and replayed is
//! applied once; an applied message replayed under its own id is a duplicate and adds no
//! effect; a replay with a new id is applied again, as it says. On the embedded SQLite
//! default, counted from the ledger.

use std::time::Duration;

use justonce::sql::{SqliteQueue, SqliteQueueOptions, SqliteStore, SqliteTx};
use justonce::{
    failure_group, Consumer, ConsumerOptions, Context, DeadLetterReason, Disposition, Handler,
    Inspect, Message, Publisher, Replay, Result, Source,
};

struct Pay;

#[derive(serde::Deserialize)]
struct Payment {
    order_id: String,
    account: i64,
}

impl Handler<SqliteTx> for Pay {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let p: Payment = cx.message().decode_json()?;
        let paid = sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = ?")
            .bind(p.account)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        if paid == 0 {
            return Ok(Disposition::dead_letter(format!(
                "account {} does not exist (order {})",
                p.account, p.order_id
            )));
        }
        sqlx::query("INSERT INTO ledger (order_id) VALUES (?)")
            .bind(p.order_id)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

fn order(id: &str, account: i64) -> Message {
    Message::new(format!(r#"{{"order_id":"{id}","account":{account}}}"#))
        .with_id(id)
        .unwrap()
}

async fn ledger(store: &SqliteStore, order_id: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM ledger WHERE order_id = ?")
        .bind(order_id)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Runs batches until one receives nothing; the duplicates they acked.
async fn drain(consumer: &Consumer<SqliteStore, Pay>) -> usize {
    let mut duplicates = 0;
    loop {
        let r = consumer.run_once().await.unwrap();
        if r.received == 0 {
            return duplicates;
        }
        duplicates += r.duplicates;
    }
}

/// Dead-letters a second copy of `m` as if its delivery had failed after the first copy
/// was applied (a broker's delivery limit, an operator's mistake).
async fn dead_letter_a_copy(queue: &SqliteQueue, m: &Message) {
    queue.publish(m).await.unwrap();
    let got = queue.receive(1, Duration::from_secs(2)).await.unwrap();
    let reason = DeadLetterReason {
        error: "delivery limit reached".into(),
        attempts: got[0].attempt,
        source_queue: "orders".into(),
        consumer: "payments".into(),
    };
    queue.dead_letter(&got[0], &reason).await.unwrap();
}

#[tokio::test]
async fn a_replay_applies_a_fixed_poison_once_and_an_applied_message_never_again() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("app.db").display());
    let queue = SqliteQueue::open_with(
        &url,
        "orders",
        SqliteQueueOptions::default().lease(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let store = SqliteStore::open(&url).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
         CREATE TABLE ledger (order_id TEXT NOT NULL);
         INSERT INTO accounts VALUES (1, 0);",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let mut opts = ConsumerOptions::new("payments");
    opts.batching.receive_wait = Duration::from_millis(100);
    let consumer = Consumer::new(opts, queue.clone(), store.clone(), Pay).unwrap();

    queue
        .publish_batch(&[order("ORD-1", 1), order("ORD-2", 2), order("ORD-3", 2)])
        .await
        .unwrap();
    drain(&consumer).await;
    assert_eq!(ledger(&store, "ORD-1").await, 1);
    let entries = queue.dead_letter_entries().await.unwrap();
    assert_eq!(
        entries.len(),
        2,
        "the payments to account 2 are dead letters"
    );
    let group = entries[0].group();
    assert_eq!(group.pattern, "account # does not exist (order ORD-#)");
    assert!(
        entries.iter().all(|e| e.group() == group),
        "one failure, one group"
    );
    assert_eq!(failure_group(&entries[1].letter.reason.error), group);

    // The fix: the account exists now. The group goes back, and each payment is made once.
    sqlx::query("INSERT INTO accounts VALUES (2, 0)")
        .execute(store.pool())
        .await
        .unwrap();
    let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
    assert_eq!(
        queue
            .replay_dead_letters(&keys, &Replay::new())
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        drain(&consumer).await,
        0,
        "the fixed poison was never applied before"
    );
    assert_eq!(
        ledger(&store, "ORD-2").await,
        1,
        "a fixed poison replayed applies once"
    );
    assert_eq!(ledger(&store, "ORD-3").await, 1);
    assert!(queue.dead_letters().await.unwrap().is_empty());

    // An applied message that reached the dead letters anyway, replayed under its own id.
    dead_letter_a_copy(&queue, &order("ORD-1", 1)).await;
    let keys: Vec<String> = queue
        .dead_letter_entries()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    queue
        .replay_dead_letters(&keys, &Replay::new())
        .await
        .unwrap();
    assert_eq!(
        drain(&consumer).await,
        1,
        "the replay is acked as a duplicate"
    );
    assert_eq!(
        ledger(&store, "ORD-1").await,
        1,
        "and makes no second effect"
    );

    // With a new id it is a new message, and is applied again, as --new-id warns.
    dead_letter_a_copy(&queue, &order("ORD-1", 1)).await;
    let entries = queue.dead_letter_entries().await.unwrap();
    let keys: Vec<String> = entries.iter().map(|e| e.key.clone()).collect();
    queue
        .replay_dead_letters(&keys, &Replay::new().new_id(true))
        .await
        .unwrap();
    assert_eq!(drain(&consumer).await, 0);
    assert_eq!(ledger(&store, "ORD-1").await, 2, "a new id is a new effect");
    let balance: i64 = sqlx::query_scalar("SELECT SUM(balance) FROM accounts")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(balance, 4, "the balances add up to the ledger");
}
