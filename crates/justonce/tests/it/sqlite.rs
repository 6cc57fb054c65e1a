//! Bad input on the embedded SQLite default: every kind reaches the dead-letter table
//! with a reason, and the consumer keeps running.

use std::time::Duration;

use justonce::sql::{SqliteQueue, SqliteQueueOptions, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result,
};

struct Ledger;

#[derive(serde::Deserialize)]
struct Entry {
    order_id: String,
    amount: i64,
}

impl Handler<SqliteTx> for Ledger {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let e: Entry = cx.message().decode_json()?;
        sqlx::query("INSERT INTO ledger (order_id, amount) VALUES (?, ?)")
            .bind(e.order_id)
            .bind(e.amount)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

#[tokio::test]
async fn bad_input_reaches_the_dead_letter_table_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let qurl = format!("sqlite:{}", dir.path().join("q.db").display());
    let surl = format!("sqlite:{}", dir.path().join("s.db").display());
    let mut qopts = SqliteQueueOptions::default();
    qopts.lease = Duration::from_millis(300);
    let queue = SqliteQueue::open_with(&qurl, "orders", qopts)
        .await
        .unwrap();
    let store = SqliteStore::open(&surl).await.unwrap();
    sqlx::query("CREATE TABLE ledger (order_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();

    let good = |id: &str| {
        Message::new(format!(r#"{{"order_id":"{id}","amount":5}}"#))
            .with_id(id)
            .unwrap()
    };
    queue
        .publish_batch(&[
            good("before"),
            Message::new(r#"{"order_id":"m1","amount":"#)
                .with_id("malformed")
                .unwrap(),
            Message::new(r#"{"order_id":"m2","amount":1}"#), // no id
            Message::new(format!(
                r#"{{"order_id":"m3","amount":1,"pad":"{}"}}"#,
                "x".repeat(2048)
            ))
            .with_id("oversized")
            .unwrap(),
            good("after"),
        ])
        .await
        .unwrap();
    // An empty id, as another producer could write it: stored as '' in the queue.
    sqlx::query(
        "INSERT INTO jo_queue (queue, message_id, payload, headers, visible_at, enqueued_at)
         VALUES ('orders', '', '{\"order_id\":\"m4\",\"amount\":1}', '{}', 0, 0)",
    )
    .execute(queue.pool())
    .await
    .unwrap();
    queue.publish(&good("last")).await.unwrap();

    let mut opts = ConsumerOptions::new("ledger");
    opts.max_payload_bytes = 1024;
    opts.batching.size = 3;
    let consumer = Consumer::new(opts, queue.clone(), store.clone(), Ledger).unwrap();
    let q = queue.clone();
    consumer
        .run_until(async move {
            while q.stats().await.unwrap().pending > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap();

    let applied: Vec<String> = sqlx::query_scalar("SELECT order_id FROM ledger ORDER BY order_id")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(
        applied,
        ["after", "before", "last"],
        "good messages around the bad ones were applied"
    );
    let letters = queue.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 4, "{letters:?}");
    let reason_of = |pred: &dyn Fn(&Message) -> bool| {
        letters
            .iter()
            .find(|l| pred(&l.message))
            .map(|l| l.reason.error.clone())
            .unwrap()
    };
    let malformed = reason_of(&|m| m.id().is_some_and(|i| i.as_str() == "malformed"));
    assert!(
        malformed.starts_with("decode: payload is not the expected JSON"),
        "{malformed}"
    );
    let oversized = reason_of(&|m| m.id().is_some_and(|i| i.as_str() == "oversized"));
    assert!(
        oversized.contains("exceeds the limit of 1024 bytes"),
        "{oversized}"
    );
    let no_id: Vec<_> = letters
        .iter()
        .filter(|l| l.message.id().is_none())
        .collect();
    assert_eq!(no_id.len(), 2, "missing and empty ids");
    assert!(
        no_id.iter().all(|l| l.reason.error.contains("no id")),
        "{no_id:?}"
    );
    assert!(letters
        .iter()
        .all(|l| l.reason.attempts == 1 && l.reason.consumer == "ledger"));
    assert_eq!(
        letters[0].message.header("x-justonce-source-queue"),
        Some("orders")
    );
}

/// What `explain` says of a delivery, held against what a consumer does with it.
#[tokio::test]
async fn explain_says_what_the_consumer_does() {
    use justonce::consumer::{explain, Outcome};
    use justonce::sql::SqliteClaimStore;
    use justonce::{
        BatchReport, ClaimStore, ConflictPolicy, DedupKey, Idempotency, InspectClaims,
        InspectStore, MessageId,
    };

    let dir = tempfile::tempdir().unwrap();
    let url = |f: &str| format!("sqlite:{}", dir.path().join(f).display());
    let queue = SqliteQueue::open(&url("q.db"), "orders").await.unwrap();
    let store = SqliteStore::open(&url("s.db")).await.unwrap();
    let claims = std::sync::Arc::new(SqliteClaimStore::open(&url("c.db")).await.unwrap());
    sqlx::query("CREATE TABLE ledger (order_id TEXT NOT NULL, amount INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let consumer = |mode: Idempotency, policy: ConflictPolicy| {
        let mut opts = ConsumerOptions::new("ledger");
        opts.batching.size = 1;
        opts.batching.receive_wait = Duration::from_millis(200);
        opts.dedup.idempotency = mode;
        opts.dedup.on_conflict = policy;
        opts.dedup.claim_lease = Duration::from_secs(30);
        // A retried delivery stays away for the rest of the test.
        opts.retry.backoff_base = Duration::from_secs(60);
        opts.retry.backoff_max = Duration::from_secs(60);
        Consumer::new(opts, queue.clone(), store.clone(), Ledger)
            .unwrap()
            .with_claims(claims.clone())
            .unwrap()
    };
    let did = |r: BatchReport| match r {
        r if r.dead_lettered == 1 => Outcome::Conflict,
        r if r.retried == 1 => Outcome::Retry,
        r if r.duplicates == 1 => Outcome::Duplicate,
        r if r.acked == 1 && r.handled == 1 => Outcome::Applied,
        r => panic!("a report with no single outcome: {r:?}"),
    };
    let payload = |id: &str, amount: i64| {
        Message::new(format!(r#"{{"order_id":"{id}","amount":{amount}}}"#))
            .with_id(id)
            .unwrap()
    };
    // (mode, policy, id, amount, what the test expects both to say)
    let dedup = Idempotency::DedupTable;
    let claim = Idempotency::Claim;
    let dl = ConflictPolicy::DeadLetter;
    let cases = [
        (dedup, dl, "m1", 5, Outcome::Applied),
        (dedup, dl, "m1", 5, Outcome::Duplicate),
        (dedup, dl, "m1", 7, Outcome::Conflict),
        (dedup, ConflictPolicy::Ignore, "m1", 7, Outcome::Duplicate),
        (claim, dl, "c1", 5, Outcome::Applied),
        (claim, dl, "c1", 5, Outcome::Duplicate),
        (claim, dl, "c2", 5, Outcome::Retry), // held by another delivery (below)
        (claim, dl, "c2", 7, Outcome::Retry), // held: its payload is not compared yet
        (claim, dl, "c1", 7, Outcome::Conflict), // completed with another payload
        (claim, dl, "c3", 5, Outcome::Applied), // its holder's lease ran out (below)
    ];
    let held = MessageId::new("c2").unwrap();
    let key = DedupKey {
        consumer: "ledger",
        message_id: &held,
    };
    claims
        .acquire(key, payload("c2", 5).fingerprint(), Duration::from_secs(30))
        .await
        .unwrap();
    let lapsed = MessageId::new("c3").unwrap();
    let key3 = DedupKey {
        consumer: "ledger",
        message_id: &lapsed,
    };
    claims
        .acquire(
            key3,
            payload("c3", 5).fingerprint(),
            Duration::from_millis(1),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    for (i, (mode, policy, id, amount, want)) in cases.into_iter().enumerate() {
        let message = payload(id, amount);
        let mid = MessageId::new(id).unwrap();
        let key = DedupKey {
            consumer: "ledger",
            message_id: &mid,
        };
        let record = store.dedup_record(key).await.unwrap();
        let claimed = match mode {
            Idempotency::Claim => claims.claim_record(key).await.unwrap(),
            _ => None,
        };
        let said = explain(
            &mid,
            record.as_ref(),
            claimed.as_ref(),
            message.fingerprint(),
            policy,
        );
        queue.publish(&message).await.unwrap();
        let report = consumer(mode, policy).run_once().await.unwrap();
        let done = did(report);
        assert_eq!(
            (said.outcome, done),
            (want, want),
            "case {i} ({id}, amount {amount}): explain said {} ({}), the consumer did {done}",
            said.outcome,
            said.why
        );
    }
}
