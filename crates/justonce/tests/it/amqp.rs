//! The runtime on the real RabbitMQ: channel closes, retries through the delay tiers, dead
//! letters, and a broker restart in the middle of a run. One test at a time (one of them
//! restarts the broker), each in its own queues.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use justonce::sql::{SqliteStore, SqliteTx};
use justonce::{
    async_trait, Consumer, ConsumerOptions, Context, DeadLetterReason, Delivery, Disposition,
    FaultHook, FaultPoint, Handler, Message, Publisher, Result, Source,
};
use justonce_amqp::{AmqpOptions, AmqpSource};
use tokio::sync::Mutex;

static BROKER: Mutex<()> = Mutex::const_new(());

struct Fixture {
    _dir: tempfile::TempDir,
    url: String,
    opts: AmqpOptions,
    store: SqliteStore,
}

async fn fixture(test: &str) -> Option<Fixture> {
    if !justonce_test::service_available("RabbitMQ", "127.0.0.1:5672") {
        return None;
    }
    let url = std::env::var("JUSTONCE_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&format!("sqlite:{}", dir.path().join("s.db").display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE ledger (order_id TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let mut opts = AmqpOptions::new(justonce_test::unique_name(&format!("jo-rt-{test}")));
    opts.retry_delays = vec![Duration::from_millis(200)];
    Some(Fixture {
        _dir: dir,
        url,
        opts,
        store,
    })
}

/// Writes one ledger row per message; or asks for a retry every time.
struct Ledger {
    retry: bool,
    runs: Arc<AtomicU64>,
}

impl Handler<SqliteTx> for Ledger {
    async fn handle(&self, cx: &Context<'_>, tx: &mut SqliteTx) -> Result<Disposition> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if self.retry {
            return Ok(Disposition::retry("payment provider unavailable"));
        }
        sqlx::query("INSERT INTO ledger (order_id) VALUES (?)")
            .bind(cx.message().id().unwrap().as_str())
            .execute(&mut **tx)
            .await?;
        Ok(Disposition::Ok)
    }
}

fn options() -> ConsumerOptions {
    let mut o = ConsumerOptions::new("ledger");
    o.batching.size = 50;
    o.batching.receive_wait = Duration::from_millis(100);
    o.retry.backoff_base = Duration::from_millis(50);
    o.retry.backoff_max = Duration::from_millis(100);
    o
}

/// Resolves once nothing is ready, waiting in a tier, or in flight, for half a second.
async fn drained(source: AmqpSource) {
    let mut quiet = 0;
    while quiet < 10 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let pending = source.pending().await.unwrap_or(1);
        quiet = if pending == 0 { quiet + 1 } else { 0 };
    }
}

/// Every order applied exactly once, read from the ledger.
async fn assert_exactly_once(store: &SqliteStore, orders: usize) {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT order_id, COUNT(*) FROM ledger GROUP BY order_id")
            .fetch_all(store.pool())
            .await
            .unwrap();
    let wrong: Vec<_> = rows.iter().filter(|(_, n)| *n != 1).collect();
    assert!(wrong.is_empty(), "applied more than once: {wrong:?}");
    assert_eq!(rows.len(), orders, "every order applied");
}

fn orders(range: std::ops::Range<usize>) -> Vec<Message> {
    range
        .map(|i| Message::new("{}").with_id(format!("o-{i:05}")).unwrap())
        .collect()
}

/// Crashes (closes the channel) after committing the first batch it sees.
struct CloseAfterCommit {
    source: AmqpSource,
    fired: AtomicU64,
}

#[async_trait]
impl FaultHook for CloseAfterCommit {
    async fn crash_at(&self, point: FaultPoint, _batch: &[&Delivery]) -> bool {
        if point == FaultPoint::AfterCommit && self.fired.fetch_add(1, Ordering::SeqCst) == 0 {
            self.source.abandon().await;
            return true;
        }
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_closed_between_commit_and_ack_is_redelivered_and_deduplicated() {
    let _broker = BROKER.lock().await;
    let Some(f) = fixture("close").await else {
        return;
    };
    let source = AmqpSource::connect(&f.url, f.opts.clone()).await.unwrap();
    source.publish_batch(&orders(0..300)).await.unwrap();
    let hook = Arc::new(CloseAfterCommit {
        source: source.clone(),
        fired: AtomicU64::new(0),
    });
    let handler = Ledger {
        retry: false,
        runs: Arc::default(),
    };
    let consumer = Consumer::new(options(), source.clone(), f.store.clone(), handler)
        .unwrap()
        .with_fault_hook(hook);
    consumer.run_until(drained(source.clone())).await.unwrap();
    let (_, redelivered) = source.delivery_counts();
    assert!(
        redelivered >= 50,
        "the closed channel's deliveries came back ({redelivered})"
    );
    assert_exactly_once(&f.store, 300).await;
    source.delete_topology().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_go_through_the_delay_tier_then_dead_letter_with_reason_headers() {
    let _broker = BROKER.lock().await;
    let Some(f) = fixture("retry").await else {
        return;
    };
    let source = AmqpSource::connect(&f.url, f.opts.clone()).await.unwrap();
    source
        .publish(&Message::new("{}").with_id("r-1").unwrap())
        .await
        .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let mut o = options();
    o.retry.max_attempts = 3;
    let consumer = Consumer::new(
        o,
        source.clone(),
        f.store.clone(),
        Ledger {
            retry: true,
            runs: runs.clone(),
        },
    )
    .unwrap();
    consumer.run_until(drained(source.clone())).await.unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "one handler run per attempt"
    );
    let letters = source.drain_dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    let reason = DeadLetterReason::from_headers(letters[0].headers()).expect("reason headers");
    assert_eq!(reason.attempts, 3);
    assert!(
        reason.error.contains("gave up after 3 attempts"),
        "{}",
        reason.error
    );
    assert!(
        reason.error.contains("payment provider unavailable"),
        "{}",
        reason.error
    );
    assert_eq!(reason.source_queue, source.queue());
    assert_eq!(reason.consumer, "ledger");
    source.delete_topology().await.unwrap();
}

/// Runs `rabbitmqctl` and checks it succeeded.
fn rabbitmqctl(arg: &str) {
    let out = Command::new("rabbitmqctl")
        .arg(arg)
        .output()
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {arg}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the broker's app again however the test ends.
struct StartAppOnDrop;

impl Drop for StartAppOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl").arg("start_app").output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_run_loses_nothing_and_duplicates_nothing() {
    let _broker = BROKER.lock().await;
    let Some(f) = fixture("restart").await else {
        return;
    };
    let mut opts = f.opts.clone();
    opts.publish_retries = 8; // enough backoff to span the restart
    let source = AmqpSource::connect(&f.url, opts).await.unwrap();
    source.publish_batch(&orders(0..1000)).await.unwrap();
    let handler = Ledger {
        retry: false,
        runs: Arc::default(),
    };
    let consumer =
        Arc::new(Consumer::new(options(), source.clone(), f.store.clone(), handler).unwrap());

    // The consumer stops once the publisher is done and the queues are empty.
    let (published_tx, published_rx) = tokio::sync::oneshot::channel::<()>();
    let run = {
        let (consumer, source) = (consumer.clone(), source.clone());
        tokio::spawn(async move {
            let stop = async move {
                let _ = published_rx.await;
                drained(source).await
            };
            consumer.run_until(stop).await
        })
    };
    // Restart once part of the work is done, publishing the rest across the restart.
    while sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM ledger")
        .fetch_one(f.store.pool())
        .await
        .unwrap()
        < 200
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let guard = StartAppOnDrop;
    tokio::task::spawn_blocking(|| rabbitmqctl("stop_app"))
        .await
        .unwrap();
    let publisher = {
        let source = source.clone();
        tokio::spawn(async move { source.publish_batch(&orders(1000..1500)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::spawn_blocking(|| rabbitmqctl("start_app"))
        .await
        .unwrap();
    drop(guard);
    publisher
        .await
        .unwrap()
        .expect("the publish survives the restart by re-sending");
    let _ = published_tx.send(());
    tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("drains after the restart")
        .unwrap()
        .unwrap();
    assert_exactly_once(&f.store, 1500).await;
    source.delete_topology().await.unwrap();
}

/// A system that already runs: producers (here raw AMQP, as aio-pika would) publish orders
/// to an existing topic exchange by routing key only, with `message_id` set and some of
/// them twice. The work queue is bound to the exchange by pattern, in one line, and the
/// orders are applied effectively-once; a key the pattern does not match never arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_bound_to_an_existing_topic_exchange_consumes_effectively_once() {
    let _one = BROKER.lock().await;
    let Some(f) = fixture("topic").await else {
        return;
    };
    let shop = justonce_test::unique_name("jo-rt-shop");
    let conn = lapin::Connection::connect(&f.url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        shop.as_str().into(),
        lapin::ExchangeKind::Topic,
        lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        lapin::types::FieldTable::default(),
    )
    .await
    .unwrap();

    let opts = f.opts.clone().bind_existing(shop.as_str(), "order.*");
    let source = AmqpSource::connect(&f.url, opts).await.unwrap();
    assert!(
        source.options().own_exchange().is_none(),
        "a bound queue has no exchange of its own"
    );
    let publish = |key: &'static str, id: String| {
        let ch = ch.clone();
        let shop = shop.clone();
        async move {
            let props = lapin::BasicProperties::default()
                .with_message_id(id.as_str().into())
                .with_delivery_mode(2);
            ch.basic_publish(
                shop.as_str().into(),
                key.into(),
                lapin::options::BasicPublishOptions::default(),
                br#"{"amount": 250}"#,
                props,
            )
            .await
            .unwrap();
        }
    };
    for i in 0..100 {
        publish("order.created", format!("o-{i:05}")).await;
    }
    for i in 0..20 {
        publish("order.created", format!("o-{i:05}")).await; // a producer's retry
    }
    for i in 0..10 {
        publish("invoice.paid", format!("inv-{i}")).await; // not ours
    }
    let consumer = Consumer::new(
        options(),
        source.clone(),
        f.store.clone(),
        Ledger {
            retry: false,
            runs: Arc::default(),
        },
    )
    .unwrap();
    consumer.run_until(drained(source.clone())).await.unwrap();
    assert_exactly_once(&f.store, 100).await;
    source.delete_topology().await.unwrap();
    ch.exchange_delete(shop.as_str().into(), Default::default())
        .await
        .unwrap();
}

/// The relay into RabbitMQ with confirms: every committed row reaches the queue; a row the
/// broker cannot route (mandatory, returned) is retried, then dead, holding only its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_with_confirms_and_an_unroutable_row_dies_visibly() {
    use justonce::relay::{Relay, RelayOptions};
    use justonce::{OutboxStore, Store};
    use justonce_amqp::AmqpPublisher;

    let _broker = BROKER.lock().await;
    let Some(f) = fixture("relay").await else {
        return;
    };
    let outbox = f.store.outbox().await.unwrap();
    let mut tx = f.store.begin().await.unwrap();
    for m in orders(0..200) {
        outbox.enqueue(&mut tx, &m, Some("acct")).await.unwrap();
    }
    f.store.commit(tx).await.unwrap();
    let source = AmqpSource::connect(&f.url, f.opts.clone()).await.unwrap();
    let publisher = AmqpPublisher::connect(&f.url, f.opts.clone())
        .await
        .unwrap();
    let opts = RelayOptions::default()
        .retry(Duration::from_millis(20), Duration::from_millis(40))
        .max_attempts(2);
    let relay = Relay::new(outbox.clone(), publisher, opts.clone()).unwrap();
    while relay.relay_once().await.unwrap().taken > 0 {}
    assert_eq!(outbox.outbox_stats().await.unwrap().pending, 0);
    let mut got = 0;
    while got < 200 {
        let batch = source.receive(100, Duration::from_secs(5)).await.unwrap();
        assert!(!batch.is_empty(), "only {got} of 200 reached the queue");
        got += batch.len();
        let receipts: Vec<_> = batch.iter().map(|d| &d.receipt).collect();
        source.ack(&receipts).await.unwrap();
    }

    // Routed to an exchange with nothing bound under this key.
    let nowhere = f
        .opts
        .clone()
        .publish_to("amq.direct", format!("{}-nowhere", f.opts.queue));
    let lost = AmqpPublisher::connect(&f.url, nowhere).await.unwrap();
    let mut tx = f.store.begin().await.unwrap();
    for m in orders(900..902) {
        outbox.enqueue(&mut tx, &m, Some("acct")).await.unwrap();
    }
    f.store.commit(tx).await.unwrap();
    let relay = Relay::new(outbox.clone(), lost, opts).unwrap();
    for _ in 0..50 {
        relay.relay_once().await.unwrap();
        if outbox.outbox_stats().await.unwrap().dead == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = outbox.outbox_stats().await.unwrap();
    assert_eq!(
        (stats.dead, stats.pending),
        (1, 1),
        "dead, its key's next row behind it"
    );
    let (reason,): (String,) =
        sqlx::query_as("SELECT dead_reason FROM jo_outbox WHERE dead_reason IS NOT NULL")
            .fetch_one(f.store.pool())
            .await
            .unwrap();
    assert!(
        reason.contains("NO_ROUTE") || reason.contains("unroutable") || reason.contains("312"),
        "{reason}"
    );
    source.delete_topology().await.unwrap();
}
