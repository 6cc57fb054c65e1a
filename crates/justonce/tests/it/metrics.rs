//! The metrics a consumer emits, read through a recorder of the `metrics` facade and
//! checked against the business data: applied deliveries are the ledger's rows, and every
//! delivery received ends as exactly one outcome.

use std::collections::HashMap;
use std::time::Duration;

use justonce::sql::{SqliteQueue, SqliteQueueOptions, SqliteStore, SqliteTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

struct Pay;

impl Handler<SqliteTx> for Pay {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        let account: i64 = cx.message().decode_json()?;
        if account == 0 {
            return Ok(Disposition::dead_letter("account 0 does not exist"));
        }
        sqlx::query("INSERT INTO ledger (account) VALUES (?)")
            .bind(account)
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

fn pay(id: &str, account: i64) -> Message {
    Message::new(account.to_string()).with_id(id).unwrap()
}

/// Counter totals by name and `outcome` label (empty for counters without one), and
/// histogram sample counts by name.
fn read(recorder: &DebuggingRecorder) -> (HashMap<(String, String), u64>, HashMap<String, usize>) {
    let mut counters = HashMap::new();
    let mut histograms = HashMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        let key = key.key();
        let outcome = key
            .labels()
            .find(|l| l.key() == "outcome")
            .map_or(String::new(), |l| l.value().to_owned());
        assert!(
            key.labels()
                .any(|l| l.key() == "messaging.consumer.group.name" && l.value() == "payments"),
            "{key:?} names its consumer group"
        );
        match value {
            DebugValue::Counter(n) => {
                *counters
                    .entry((key.name().to_owned(), outcome))
                    .or_default() += n;
            }
            DebugValue::Histogram(samples) => {
                *histograms.entry(key.name().to_owned()).or_default() += samples.len();
            }
            DebugValue::Gauge(_) => {}
        }
    }
    (counters, histograms)
}

#[test]
fn every_delivery_ends_as_one_counted_outcome_and_applied_ones_are_the_ledger() {
    let recorder = DebuggingRecorder::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("app.db").display());
    let (ledger, handled) = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let queue = SqliteQueue::open_with(
                &url,
                "orders",
                SqliteQueueOptions::default().lease(Duration::from_secs(5)),
            )
            .await
            .unwrap();
            let store = SqliteStore::open(&url).await.unwrap();
            sqlx::raw_sql("CREATE TABLE ledger (account INTEGER NOT NULL)")
                .execute(store.pool())
                .await
                .unwrap();
            let mut opts = ConsumerOptions::new("payments");
            opts.batching.receive_wait = Duration::from_millis(100);
            let consumer = Consumer::new(opts, queue.clone(), store.clone(), Pay).unwrap();
            let messages = [
                pay("P-1", 1),
                pay("P-2", 2),
                pay("P-3", 3),
                pay("P-0", 0),     // dead-lettered by the handler
                Message::new("4"), // no id: dead-lettered before it runs
                pay("P-1", 1),     // published twice: a duplicate
                pay("P-2", 9),     // the id of P-2 with another payload: a conflict
                Message::new("not a number").with_id("P-x").unwrap(), // not decodable
            ];
            let mut handled = 0;
            for m in &messages {
                // One at a time, so that the duplicate and the conflict come after the first.
                queue.publish(m).await.unwrap();
                handled += consumer.run_once().await.unwrap().handled;
            }
            let ledger: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger")
                .fetch_one(store.pool())
                .await
                .unwrap();
            (ledger as u64, handled)
        })
    });
    let (counters, histograms) = read(&recorder);
    let outcome = |o: &str| {
        counters
            .get(&("justonce_deliveries_total".to_owned(), o.to_owned()))
            .copied()
            .unwrap_or(0)
    };
    let received = counters[&(
        "justonce_deliveries_received_total".to_owned(),
        String::new(),
    )];
    assert_eq!(received, 8);
    assert_eq!(
        outcome("applied"),
        ledger,
        "applied deliveries are the ledger's rows"
    );
    assert_eq!(ledger, 3);
    assert_eq!(outcome("duplicate"), 1);
    assert_eq!(outcome("conflict"), 1);
    assert_eq!(outcome("dead_letter"), 3, "P-0, the one with no id, P-x");
    let all: u64 = [
        "applied",
        "duplicate",
        "retry",
        "dead_letter",
        "conflict",
        "released",
        "lost",
    ]
    .iter()
    .map(|o| outcome(o))
    .sum();
    assert_eq!(
        all, received,
        "every delivery ends as exactly one outcome: {counters:?}"
    );
    assert_eq!(histograms["justonce_handler_duration_seconds"], handled);
    assert_eq!(histograms["justonce_batch_duration_seconds"], 8);
}
