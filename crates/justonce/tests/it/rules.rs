//! The runtime's contracts (ARCHITECTURE.md), on the in-memory backends.

use std::sync::Arc;
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore};
use justonce::{
    async_trait, ConflictPolicy, Consumer, ConsumerOptions, Delivery, FaultHook, FaultPoint,
    Message, Publisher, Semantics, Source,
};

use crate::support::{log_of, until_empty, Log, Recording, Script};

const LEASE: Duration = Duration::from_millis(100);

fn msg(id: &str, payload: &str) -> Message {
    Message::new(payload).with_id(id).unwrap()
}

fn options(semantics: Semantics) -> ConsumerOptions {
    let mut o = ConsumerOptions::new("test");
    o.semantics = semantics;
    o.batching.linger = Duration::ZERO;
    o.batching.receive_wait = Duration::from_millis(20);
    o.retry.backoff_base = Duration::from_millis(10);
    o.retry.backoff_max = Duration::from_millis(40);
    o
}

fn consumer(
    opts: ConsumerOptions,
    q: &Arc<MemoryQueue>,
    store: &MemoryStore,
    script: &Script,
) -> Consumer<MemoryStore, Script> {
    let source: Arc<dyn Source> = q.clone();
    Consumer::new(opts, source, store.clone(), script.clone()).unwrap()
}

#[tokio::test]
async fn acks_go_out_only_after_commit_except_at_most_once() {
    for (semantics, expected) in [
        (Semantics::AtMostOnce, ["receive", "ack", "commit"]),
        (Semantics::AtLeastOnce, ["receive", "commit", "ack"]),
        (Semantics::EffectivelyOnce, ["receive", "commit", "ack"]),
    ] {
        let log = Log::default();
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        q.publish_batch(&[msg("a", "ok:a"), msg("b", "ok:b")])
            .await
            .unwrap();
        let source = Recording {
            inner: q.clone(),
            log: log.clone(),
        };
        let store = Recording {
            inner: MemoryStore::new(),
            log: log.clone(),
        };
        let c = Consumer::new(options(semantics), source, store, Script::default()).unwrap();
        let report = c.run_once().await.unwrap();
        assert_eq!(report.received, 2);
        assert_eq!(log_of(&log), expected, "{semantics}");
        assert!(q.is_empty(), "{semantics}: both acked");
    }
}

#[tokio::test]
async fn a_failing_message_rolls_back_alone() {
    let q = Arc::new(MemoryQueue::new("q", LEASE));
    let store = MemoryStore::new();
    let script = Script::default();
    q.publish_batch(&[
        msg("1", "ok:first"),
        msg("2", "fail:second"),
        msg("3", "ok:third"),
    ])
    .await
    .unwrap();
    let c = consumer(options(Semantics::EffectivelyOnce), &q, &store, &script);
    let report = c.run_once().await.unwrap();
    assert_eq!((report.acked, report.dead_lettered), (2, 1));
    assert_eq!(
        store.effects(),
        ["first", "third"],
        "the failed message's write rolled back alone"
    );
    assert_eq!(store.commits(), 1, "one transaction for the batch");
    let dead = q.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].0.id().unwrap().as_str(), "2");
    assert_eq!(dead[0].1.error, "second is not allowed");
    assert!(q.is_empty());

    // Its dedup record rolled back too: the same id with a fixed payload is fresh.
    q.publish(&msg("2", "ok:second-fixed")).await.unwrap();
    c.run_once().await.unwrap();
    assert_eq!(store.effects(), ["first", "third", "second-fixed"]);
}

#[tokio::test]
async fn a_batch_runs_again_with_savepoints_only_when_a_message_fails() {
    // Optimistic (the default): the first pass stops at the failing message (2 runs), the
    // batch rolls back and runs again with a savepoint per message, the failed message
    // keeping its answer (2 runs). Without it, one pass. The effects are the same.
    for (optimistic, runs) in [(true, 4), (false, 3)] {
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        let store = MemoryStore::new();
        let script = Script::default();
        q.publish_batch(&[
            msg("1", "ok:first"),
            msg("2", "fail:second"),
            msg("3", "ok:third"),
        ])
        .await
        .unwrap();
        let mut opts = options(Semantics::EffectivelyOnce);
        opts.batching.optimistic = optimistic;
        let c = consumer(opts, &q, &store, &script);
        let report = c.run_once().await.unwrap();
        assert_eq!(
            (report.handled, report.acked, report.dead_lettered),
            (3, 2, 1),
            "optimistic {optimistic}: the report counts the pass that committed"
        );
        assert_eq!(script.runs(), runs, "optimistic {optimistic}");
        assert_eq!(
            store.effects(),
            ["first", "third"],
            "optimistic {optimistic}"
        );
        assert_eq!(store.commits(), 1, "optimistic {optimistic}");

        // A batch where nothing fails runs once, either way.
        q.publish_batch(&[msg("4", "ok:fourth"), msg("5", "ok:fifth")])
            .await
            .unwrap();
        c.run_once().await.unwrap();
        assert_eq!(script.runs(), runs + 2, "optimistic {optimistic}");
    }
}

#[tokio::test(start_paused = true)]
async fn retries_back_off_then_dead_letter_with_the_attempts() {
    let q = Arc::new(MemoryQueue::new("q", LEASE));
    let store = MemoryStore::new();
    let script = Script::default();
    q.publish(&msg("r", "retry:r")).await.unwrap();
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.retry.max_attempts = 3;
    let c = consumer(opts, &q, &store, &script);
    let started = tokio::time::Instant::now();
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(script.runs(), 3, "the handler ran once per attempt");
    assert!(
        started.elapsed() >= Duration::from_millis(10),
        "the retries waited for their backoff"
    );
    let dead = q.dead_letters();
    assert_eq!(dead.len(), 1);
    let (m, reason) = &dead[0];
    assert_eq!(reason.attempts, 3);
    assert!(
        reason.error.contains("gave up after 3 attempts"),
        "{}",
        reason.error
    );
    assert!(
        reason.error.contains("downstream unavailable"),
        "{}",
        reason.error
    );
    assert_eq!(reason.source_queue, "q");
    assert_eq!(reason.consumer, "test");
    assert_eq!(
        m.header("x-justonce-attempts"),
        Some("3"),
        "reason headers on the dead letter"
    );
    assert!(store.effects().is_empty());
}

#[tokio::test]
async fn poison_is_dead_lettered_at_once_without_retries() {
    let q = Arc::new(MemoryQueue::new("q", LEASE));
    let store = MemoryStore::new();
    let script = Script::default();
    q.publish(&msg("p", "{\"order\": ")).await.unwrap();
    let c = consumer(options(Semantics::EffectivelyOnce), &q, &store, &script);
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(script.runs(), 1, "a decode error is permanent: no retry");
    let dead = q.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].1.attempts, 1);
    assert!(
        dead[0].1.error.starts_with("decode:"),
        "{}",
        dead[0].1.error
    );
}

#[tokio::test]
async fn bad_input_is_dead_lettered_before_the_handler_and_the_consumer_goes_on() {
    let q = Arc::new(MemoryQueue::new("q", LEASE));
    let store = MemoryStore::new();
    let script = Script::default();
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.max_payload_bytes = 64;
    q.publish_batch(&[
        Message::new("ok:no-id"),
        msg("big", &format!("ok:{}", "x".repeat(100))),
        msg("good", "ok:good"),
    ])
    .await
    .unwrap();
    let c = consumer(opts, &q, &store, &script);
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(
        script.runs(),
        1,
        "only the good message reached the handler"
    );
    assert_eq!(store.effects(), ["good"]);
    let reasons: Vec<String> = q.dead_letters().into_iter().map(|(_, r)| r.error).collect();
    assert_eq!(reasons.len(), 2);
    assert!(reasons.iter().any(|r| r.contains("no id")), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("exceeds the limit of 64 bytes")),
        "{reasons:?}"
    );
}

/// Crashes every batch holding a first delivery of `id` after its commit.
struct CrashAfterCommit(&'static str);

#[async_trait]
impl FaultHook for CrashAfterCommit {
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool {
        point == FaultPoint::AfterCommit
            && batch
                .iter()
                .any(|d| d.attempt == 1 && d.message.id().unwrap().as_str() == self.0)
    }
}

#[tokio::test]
async fn redeliveries_and_republished_ids_take_effect_once_only_when_effectively_once() {
    for (semantics, expected) in [
        (Semantics::EffectivelyOnce, vec!["a", "b"]),
        (Semantics::AtLeastOnce, vec!["a", "b", "a", "b", "b"]),
    ] {
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        let store = MemoryStore::new();
        let script = Script::default();
        // "b" is published twice with one id (a publisher retry after a lost confirm), and
        // the first batch crashes between commit and ack.
        q.publish_batch(&[msg("a", "ok:a"), msg("b", "ok:b")])
            .await
            .unwrap();
        let mut opts = options(semantics);
        opts.batching.size = 2;
        let c =
            consumer(opts, &q, &store, &script).with_fault_hook(Arc::new(CrashAfterCommit("a")));
        q.publish(&msg("b", "ok:b")).await.unwrap();
        c.run_until(until_empty(q.clone())).await.unwrap();
        let mut effects = store.effects();
        effects.sort();
        let mut expected = expected.clone();
        expected.sort();
        assert_eq!(effects, expected, "{semantics}");
        assert!(
            q.deliveries() >= 5,
            "{semantics}: the crash made the queue deliver again"
        );
    }
}

#[tokio::test]
async fn same_id_with_another_payload_is_a_conflict() {
    for (policy, dead) in [(ConflictPolicy::DeadLetter, 1), (ConflictPolicy::Ignore, 0)] {
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        let store = MemoryStore::new();
        let script = Script::default();
        let mut opts = options(Semantics::EffectivelyOnce);
        opts.dedup.on_conflict = policy;
        let c = consumer(opts, &q, &store, &script);
        q.publish(&msg("x", "ok:first")).await.unwrap();
        c.run_once().await.unwrap();
        q.publish(&msg("x", "ok:other")).await.unwrap();
        c.run_once().await.unwrap();
        assert_eq!(store.effects(), ["first"], "{policy:?}");
        let letters = q.dead_letters();
        assert_eq!(letters.len(), dead, "{policy:?}");
        if let Some((_, r)) = letters.first() {
            assert!(r.error.starts_with("conflict: message id x"), "{}", r.error);
        }
        assert!(q.is_empty());
    }
}

#[tokio::test]
async fn dedup_keys_are_scoped_by_consumer() {
    let store = MemoryStore::new();
    for name in ["billing", "shipping"] {
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        q.publish(&msg("m", &format!("ok:{name}"))).await.unwrap();
        let mut opts = options(Semantics::EffectivelyOnce);
        opts.name = name.into();
        consumer(opts, &q, &store, &Script::default())
            .run_once()
            .await
            .unwrap();
    }
    assert_eq!(store.effects(), ["billing", "shipping"]);
}

#[tokio::test]
async fn graceful_shutdown_commits_and_acks_the_batch_in_flight() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(60)));
    let store = MemoryStore::new();
    let script = Script::default();
    let batch: Vec<Message> = (0..4)
        .map(|i| msg(&format!("s{i}"), &format!("slow:s{i}")))
        .collect();
    q.publish_batch(&batch).await.unwrap();
    q.publish_batch(&[msg("later", "ok:later")]).await.unwrap();
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.batching.size = 4;
    let c = consumer(opts, &q, &store, &script);
    let runs = script.clone();
    // Shut down while the first batch is in its handler.
    let shutdown = async move {
        while runs.runs() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    c.run_until(shutdown).await.unwrap();
    assert_eq!(
        store.effects(),
        ["s0", "s1", "s2", "s3"],
        "the batch in flight committed"
    );
    assert_eq!(
        q.len(),
        1,
        "and was acked; the next message was never received"
    );
    assert_eq!(q.deliveries(), 4);
}

#[tokio::test]
async fn retention_shorter_than_the_redelivery_horizon_refuses_to_start() {
    let q: Arc<dyn Source> = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.retry.max_attempts = 5;
    opts.retry.backoff_max = Duration::from_secs(60);
    opts.dedup.retention = Some(Duration::from_secs(300));
    let err = Consumer::new(
        opts.clone(),
        q.clone(),
        MemoryStore::new(),
        Script::default(),
    )
    .err()
    .expect("must refuse");
    let text = err.to_string();
    // 4 retries x 60 s + 5 x 30 s lease = 390 s.
    assert!(text.contains("300s") && text.contains("390s"), "{text}");
    opts.dedup.retention = Some(Duration::from_secs(24 * 3600));
    assert!(Consumer::new(opts, q, MemoryStore::new(), Script::default()).is_ok());
}

/// A claim store that forgets completed claims by expiry (as Redis keys expire): the
/// consumer refuses it when the expiry is not longer than the redelivery horizon.
#[tokio::test]
async fn a_claim_expiry_shorter_than_the_redelivery_horizon_is_refused() {
    use justonce::memory::MemoryClaims;
    use justonce::{ClaimState, ClaimStore, DedupKey, Fingerprint};

    struct Expiring(MemoryClaims, Duration);

    #[async_trait]
    impl ClaimStore for Expiring {
        async fn acquire(
            &self,
            key: DedupKey<'_>,
            fp: Fingerprint,
            lease: Duration,
        ) -> justonce::Result<ClaimState> {
            self.0.acquire(key, fp, lease).await
        }
        async fn complete(
            &self,
            key: DedupKey<'_>,
            token: u64,
            result: Option<&[u8]>,
        ) -> justonce::Result<()> {
            self.0.complete(key, token, result).await
        }
        async fn release(&self, key: DedupKey<'_>, token: u64) -> justonce::Result<()> {
            self.0.release(key, token).await
        }
        async fn purge(&self, retention: Duration, batch: u32) -> justonce::Result<u64> {
            self.0.purge(retention, batch).await
        }
        fn expiry(&self) -> Option<Duration> {
            Some(self.1)
        }
    }

    let q: Arc<dyn Source> = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.retry.max_attempts = 5;
    opts.retry.backoff_max = Duration::from_secs(60);
    let consumer = || {
        Consumer::new(
            opts.clone(),
            q.clone(),
            MemoryStore::new(),
            Script::default(),
        )
    };
    let short = Arc::new(Expiring(MemoryClaims::default(), Duration::from_secs(300)));
    let err = consumer()
        .unwrap()
        .with_claims(short)
        .err()
        .expect("must refuse");
    let text = err.to_string();
    // 4 retries x 60 s + 5 x 30 s lease = 390 s.
    assert!(text.contains("300s") && text.contains("390s"), "{text}");
    let day = Arc::new(Expiring(
        MemoryClaims::default(),
        Duration::from_secs(86_400),
    ));
    assert!(consumer().unwrap().with_claims(day).is_ok());
}

/// A source whose top-up receives (every second call) fail, as a connection cut between
/// a batch's first receive and its linger's top-up does.
struct FailingTopUp {
    inner: Arc<MemoryQueue>,
    calls: std::sync::atomic::AtomicU64,
}

#[async_trait]
impl Source for FailingTopUp {
    fn queue(&self) -> &str {
        self.inner.queue()
    }
    async fn receive(&self, max: usize, wait: Duration) -> justonce::Result<Vec<Delivery>> {
        let n = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n % 2 == 1 {
            return Err(justonce::Error::new(
                justonce::ErrorKind::Io,
                "the connection was cut",
            ));
        }
        self.inner.receive(max, wait).await
    }
    async fn ack(&self, receipts: &[&justonce::Receipt]) -> justonce::Result<()> {
        self.inner.ack(receipts).await
    }
    async fn nack(&self, receipt: &justonce::Receipt, delay: Duration) -> justonce::Result<()> {
        self.inner.nack(receipt, delay).await
    }
    async fn release(&self, receipts: &[&justonce::Receipt]) -> justonce::Result<()> {
        self.inner.release(receipts).await
    }
    async fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &justonce::DeadLetterReason,
    ) -> justonce::Result<()> {
        self.inner.dead_letter(delivery, reason).await
    }
    fn redelivery_delay(&self) -> Duration {
        self.inner.redelivery_delay()
    }
}

/// A batch already received runs when the linger's top-up fails: dropping it would leave
/// its deliveries held and unsettled (on a broker that holds them per connection, until
/// the connection goes).
#[tokio::test]
async fn a_failed_top_up_keeps_the_batch_in_hand() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(60)));
    q.publish_batch(&[msg("a", "ok:a"), msg("b", "ok:b")])
        .await
        .unwrap();
    let store = MemoryStore::new();
    let mut opts = options(Semantics::EffectivelyOnce);
    opts.batching.size = 10;
    opts.batching.linger = Duration::from_millis(5);
    let source = FailingTopUp {
        inner: q.clone(),
        calls: Default::default(),
    };
    let c = Consumer::new(opts, source, store.clone(), Script::default()).unwrap();
    let report = c
        .run_once()
        .await
        .expect("the top-up's failure is not the batch's");
    assert_eq!(report.received, 2);
    assert_eq!(store.effects(), ["a", "b"]);
    assert!(q.is_empty(), "both acked");
}
