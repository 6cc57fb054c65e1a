//! The relay and the consumer outbox on the in-memory backends: confirm then mark, a
//! crash between the two, refused rows retried then dead, follow-ups with stable ids.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
use justonce::relay::{Relay, RelayFaultHook, RelayFaultPoint, RelayOptions};
use justonce::{
    async_trait, outgoing_id, Consumer, ConsumerOptions, Context, Disposition, Error, ErrorKind,
    Handler, Message, MessageId, OutboxRow, OutboxStore, Publisher, Result, Source, Store,
};

fn opts() -> RelayOptions {
    RelayOptions::default()
        .lease(Duration::from_millis(300))
        .publish_timeout(Duration::from_millis(200))
        .poll_interval(Duration::from_millis(20))
        .retry(Duration::from_millis(10), Duration::from_millis(20))
        .max_attempts(3)
}

fn msg(id: &str) -> Message {
    Message::new(format!(r#"{{"n":"{id}"}}"#))
        .with_id(id)
        .unwrap()
}

async fn enqueue(store: &MemoryStore, rows: &[(&str, Option<&str>)]) {
    let mut tx = store.begin().await.unwrap();
    for (id, key) in rows {
        store.enqueue(&mut tx, &msg(id), *key).await.unwrap();
    }
    store.commit(tx).await.unwrap();
}

/// Ids and payloads of everything in `queue`, in delivery order, acked.
async fn drain(queue: &MemoryQueue) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let got = queue.receive(100, Duration::ZERO).await.unwrap();
        if got.is_empty() {
            return out;
        }
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        out.extend(got.iter().map(|d| d.message.id().unwrap().to_string()));
        queue.ack(&receipts).await.unwrap();
    }
}

#[tokio::test]
async fn rows_leave_after_the_commit_in_order_and_are_marked_sent() {
    let store = MemoryStore::new();
    let queue = Arc::new(MemoryQueue::new("out", Duration::from_secs(5)));
    let relay = Relay::new(store.clone(), queue.clone(), opts()).unwrap();

    let mut tx = store.begin().await.unwrap();
    store.enqueue(&mut tx, &msg("a1"), Some("a")).await.unwrap();
    assert_eq!(
        relay.relay_once().await.unwrap().taken,
        0,
        "nothing before the commit"
    );
    store.commit(tx).await.unwrap();
    enqueue(&store, &[("a2", Some("a")), ("x", None)]).await;
    let mut tx = store.begin().await.unwrap();
    store.enqueue(&mut tx, &msg("never"), None).await.unwrap();
    store.rollback(tx).await.unwrap();

    let r = relay.relay_once().await.unwrap();
    assert_eq!((r.taken, r.sent), (3, 3));
    assert_eq!(drain(&queue).await, ["a1", "a2", "x"]);
    assert_eq!(
        store.outbox_stats().await.unwrap().pending,
        0,
        "sent rows are gone"
    );
}

/// Crashes once, after the first confirm.
#[derive(Default)]
struct CrashOnce(AtomicBool);

#[async_trait]
impl RelayFaultHook for CrashOnce {
    async fn crash_at(&self, point: RelayFaultPoint, _: &[OutboxRow]) -> bool {
        point == RelayFaultPoint::AfterConfirm && !self.0.swap(true, Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_relay_that_dies_between_confirm_and_mark_publishes_again_under_the_same_ids() {
    let store = MemoryStore::new();
    let queue = Arc::new(MemoryQueue::new("out", Duration::from_secs(5)));
    enqueue(&store, &[("m1", Some("k")), ("m2", Some("k"))]).await;
    let dying = Relay::new(store.clone(), queue.clone(), opts().owner("dying"))
        .unwrap()
        .with_fault_hook(Arc::new(CrashOnce::default()));
    assert!(dying.relay_once().await.is_err(), "the injected crash");
    let other = Relay::new(store.clone(), queue.clone(), opts().owner("other")).unwrap();
    assert_eq!(
        other.relay_once().await.unwrap().taken,
        0,
        "the dead relay's lease holds its rows"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(other.relay_once().await.unwrap().sent, 2);
    assert_eq!(
        drain(&queue).await,
        ["m1", "m2", "m1", "m2"],
        "a duplicate at the broker, never a loss"
    );
    assert_eq!(store.outbox_stats().await.unwrap().pending, 0);
}

/// Refuses every message whose id starts with `bad`, as a broker refuses an unroutable one;
/// fails every publish with an outage while `down`.
struct Picky {
    queue: Arc<MemoryQueue>,
    down: AtomicBool,
    refused: AtomicUsize,
}

#[async_trait]
impl Publisher for Picky {
    async fn publish(&self, m: &Message) -> Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Connect, "broker unreachable"));
        }
        if m.id().unwrap().as_str().starts_with("bad") {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "unroutable: no queue bound",
            ));
        }
        self.queue.publish(m).await
    }
    async fn publish_batch(&self, ms: &[Message]) -> Result<()> {
        for m in ms {
            self.publish(m).await?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_refused_row_is_retried_then_dead_blocking_only_its_own_key() {
    let store = MemoryStore::new();
    let queue = Arc::new(MemoryQueue::new("out", Duration::from_secs(5)));
    let picky = Arc::new(Picky {
        queue: queue.clone(),
        down: AtomicBool::new(false),
        refused: AtomicUsize::new(0),
    });
    enqueue(
        &store,
        &[
            ("bad1", Some("k")),
            ("k2", Some("k")),
            ("j1", Some("j")),
            ("free", None),
        ],
    )
    .await;
    let relay = Relay::new(store.clone(), picky.clone(), opts()).unwrap();
    let r = relay.relay_once().await.unwrap();
    assert_eq!((r.sent, r.failed, r.released), (2, 1, 1), "{r:?}");
    assert_eq!(drain(&queue).await, ["j1", "free"], "other keys go on");
    for _ in 0..50 {
        relay.relay_once().await.unwrap();
        if store.outbox_stats().await.unwrap().dead == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let stats = store.outbox_stats().await.unwrap();
    assert_eq!(
        (stats.dead, stats.pending),
        (1, 1),
        "dead, and k2 waits behind it"
    );
    // Each pass tries the batch, then the refused row alone: one attempt, two refusals.
    assert_eq!(
        picky.refused.load(Ordering::SeqCst),
        2 * 3,
        "max_attempts passes"
    );
    assert!(
        drain(&queue).await.is_empty(),
        "k2 never overtakes its dead predecessor"
    );
}

#[tokio::test]
async fn an_outage_counts_no_attempt_and_the_rows_go_out_once_it_ends() {
    let store = MemoryStore::new();
    let queue = Arc::new(MemoryQueue::new("out", Duration::from_secs(5)));
    let picky = Arc::new(Picky {
        queue: queue.clone(),
        down: AtomicBool::new(true),
        refused: AtomicUsize::new(0),
    });
    enqueue(&store, &[("m1", Some("k")), ("m2", None)]).await;
    let relay = Relay::new(store.clone(), picky.clone(), opts().max_attempts(1)).unwrap();
    for _ in 0..5 {
        let e = relay.relay_once().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Connect);
    }
    let stats = store.outbox_stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead, stats.leased),
        (2, 0, 0),
        "handed back, not dead"
    );
    picky.down.store(false, Ordering::SeqCst);
    assert_eq!(relay.relay_once().await.unwrap().sent, 2);
    assert_eq!(drain(&queue).await, ["m1", "m2"]);
}

#[tokio::test]
async fn a_running_relay_is_woken_by_a_commit_not_by_its_poll() {
    let store = MemoryStore::new();
    let queue = Arc::new(MemoryQueue::new("out", Duration::from_secs(5)));
    let relay = Relay::new(
        store.clone(),
        queue.clone(),
        opts()
            .poll_interval(Duration::from_secs(3600))
            .concurrency(1),
    )
    .unwrap();
    let running = relay.spawn();
    tokio::time::sleep(Duration::from_millis(50)).await;
    enqueue(&store, &[("woken", None)]).await;
    let got = queue.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        got.len(),
        1,
        "the commit woke the relay within 5 s of an hour's poll"
    );
    running.stop().await.unwrap();
}

/// Pays and sends a receipt and a notice; fails its first run of `fail-once` after sending.
struct Pay {
    runs: Mutex<Vec<MessageId>>,
    failed: AtomicBool,
}

impl Handler<MemoryTx> for Pay {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        let id = cx.message_id().unwrap().clone();
        tx.record(format!("paid {id}"));
        let receipt = cx.send_keyed("acct-1", Message::new(format!("receipt for {id}")))?;
        cx.send(Message::new("notice"))?;
        self.runs.lock().unwrap().push(receipt);
        if id.as_str() == "fail-once" && !self.failed.swap(true, Ordering::SeqCst) {
            return Ok(Disposition::retry("a transient failure after sending"));
        }
        if id.as_str() == "poison" {
            return Ok(Disposition::dead_letter("bad payment"));
        }
        Ok(Disposition::Ok)
    }
}

#[tokio::test]
async fn a_handler_sends_through_the_outbox_with_ids_stable_across_its_runs() {
    let store = MemoryStore::new();
    let payments = Arc::new(MemoryQueue::new("payments", Duration::from_secs(5)));
    for id in ["p1", "fail-once", "poison"] {
        payments.publish(&msg(id)).await.unwrap();
    }
    let handler = Pay {
        runs: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
    };
    let consumer = Consumer::new(
        ConsumerOptions::new("payments")
            .retry(justonce::RetryOptions::default().backoff(Duration::ZERO, Duration::ZERO)),
        payments.clone(),
        store.clone(),
        handler,
    )
    .unwrap()
    .with_outbox(store.clone());
    for _ in 0..4 {
        consumer.run_once().await.unwrap();
    }
    assert!(payments.is_empty());

    let receipts = Arc::new(MemoryQueue::new("receipts", Duration::from_secs(5)));
    Relay::new(store.clone(), receipts.clone(), opts())
        .unwrap()
        .relay_once()
        .await
        .unwrap();
    let sent = drain(&receipts).await;
    let want = |incoming: &str| {
        let incoming = MessageId::new(incoming).unwrap();
        [0, 1].map(|n| outgoing_id("payments", &incoming, n).to_string())
    };
    let mut expected: Vec<String> = want("p1").into();
    expected.extend(want("fail-once"));
    assert_eq!(
        sent, expected,
        "two per applied payment; none for the poison one"
    );
}

#[tokio::test]
async fn a_consumer_without_an_outbox_cannot_send_and_keeps_its_message() {
    let store = MemoryStore::new();
    let payments = Arc::new(MemoryQueue::new("payments", Duration::from_secs(5)));
    payments.publish(&msg("p1")).await.unwrap();
    let handler = Pay {
        runs: Mutex::new(Vec::new()),
        failed: AtomicBool::new(false),
    };
    let consumer = Consumer::new(
        ConsumerOptions::new("payments"),
        payments.clone(),
        store.clone(),
        handler,
    )
    .unwrap();
    let e = consumer.run_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("with_outbox"), "{e}");
    assert!(
        payments.dead_letters().is_empty(),
        "a deploy mistake is not the message's"
    );
    assert!(store.effects().is_empty());
}

#[tokio::test]
async fn an_outgoing_message_over_the_limit_dead_letters_its_incoming_one() {
    struct Big;
    impl Handler<MemoryTx> for Big {
        async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
            tx.record("wrote");
            cx.send(Message::new(vec![
                b'x';
                justonce::DEFAULT_OUTBOX_MAX_PAYLOAD + 1
            ]))?;
            Ok(Disposition::Ok)
        }
    }
    let store = MemoryStore::new();
    let payments = Arc::new(MemoryQueue::new("payments", Duration::from_secs(5)));
    payments.publish(&msg("p1")).await.unwrap();
    let consumer = Consumer::new(
        ConsumerOptions::new("big"),
        payments.clone(),
        store.clone(),
        Big,
    )
    .unwrap()
    .with_outbox(store.clone());
    consumer.run_once().await.unwrap();
    let dead = payments.dead_letters();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].1.to_string().contains("exceeds"), "{}", dead[0].1);
    assert!(store.effects().is_empty(), "its effect rolled back with it");
    assert_eq!(store.outbox_stats().await.unwrap().pending, 0);
}
