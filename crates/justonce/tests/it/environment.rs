//! Failures that are not the message's: a deploy or schema mistake, an outage, lock
//! contention. They must pause the consumer and hand the batch back, never dead-letter good
//! messages or count attempts against them. And the breaker, the backstop for the ones the
//! classification misses. On the in-memory backends.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
use justonce::{
    async_trait, BreakerOptions, Claim, Consumer, ConsumerOptions, Context, DedupKey, DedupStore,
    Disposition, Error, ErrorKind, Fingerprint, Handler, Message, Publisher, Result, Semantics,
    Source, Store, Turn,
};

use crate::support::until_empty;

/// Applies `NAME` payloads while the environment is fine; while `broken`, fails with an
/// error of `kind` (a missing table, as the database would report it).
#[derive(Clone)]
struct Deploy {
    broken: Arc<AtomicBool>,
    kind: ErrorKind,
    /// The attempt number of every applied message.
    attempts: Arc<Mutex<Vec<u32>>>,
    /// Failures seen while broken.
    failures: Arc<AtomicU32>,
}

impl Deploy {
    fn new(kind: ErrorKind) -> Self {
        Deploy {
            broken: Arc::new(AtomicBool::new(true)),
            kind,
            attempts: Arc::default(),
            failures: Arc::default(),
        }
    }

    /// Fixes the environment once the handler has failed `after` times.
    async fn fix_after(self, after: u32) {
        while self.failures.load(Ordering::SeqCst) < after {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.broken.store(false, Ordering::SeqCst);
    }
}

impl Handler<MemoryTx> for Deploy {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        if self.broken.load(Ordering::SeqCst) {
            self.failures.fetch_add(1, Ordering::SeqCst);
            return Err(Error::new(
                self.kind,
                "relation \"accounts\" does not exist",
            ));
        }
        tx.record(String::from_utf8_lossy(cx.message().payload()));
        self.attempts.lock().unwrap().push(cx.attempt());
        Ok(Disposition::Ok)
    }
}

fn options(batch: usize) -> ConsumerOptions {
    let mut o = ConsumerOptions::new("test");
    o.semantics = Semantics::EffectivelyOnce;
    o.batching.linger = Duration::ZERO;
    o.batching.receive_wait = Duration::from_millis(20);
    o.retry.backoff_base = Duration::from_millis(5);
    o.retry.backoff_max = Duration::from_millis(20);
    o.batching.size = batch;
    o.retry.max_attempts = 2;
    o
}

async fn orders(q: &MemoryQueue, n: usize) {
    let batch: Vec<Message> = (0..n)
        .map(|i| {
            Message::new(format!("o{i}"))
                .with_id(format!("o{i}"))
                .unwrap()
        })
        .collect();
    q.publish_batch(&batch).await.unwrap();
}

/// Runs `handler` on 50 orders until every one is settled.
async fn run(handler: Deploy, opts: ConsumerOptions) -> (Arc<MemoryQueue>, MemoryStore) {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    orders(&q, 50).await;
    let store = MemoryStore::new();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(opts, source, store.clone(), handler.clone()).unwrap();
    let fixed = tokio::spawn(handler.fix_after(200));
    c.run_until(until_empty(q.clone())).await.unwrap();
    fixed.await.unwrap();
    (q, store)
}

#[tokio::test]
async fn a_schema_error_pauses_the_consumer_and_hands_the_batch_back_without_counting_attempts() {
    let handler = Deploy::new(ErrorKind::Schema);
    let (q, store) = run(handler.clone(), options(10)).await;
    assert!(handler.failures.load(Ordering::SeqCst) >= 200);
    assert!(q.dead_letters().is_empty(), "{:?}", q.dead_letters());
    assert_eq!(
        store.effects().len(),
        50,
        "every order applied once the table is back"
    );
    let attempts = handler.attempts.lock().unwrap().clone();
    assert!(
        attempts.iter().all(|&a| a == 1),
        "no hand-back counted an attempt: {attempts:?}"
    );
}

#[tokio::test]
async fn the_same_error_taken_for_the_messages_own_dead_letters_them_all_without_the_breaker() {
    // The twin: an error the classification misses (here: tagged as the message's) with the
    // breaker off empties the queue into the dead letters. This is what the breaker stops.
    let handler = Deploy::new(ErrorKind::Database);
    let mut opts = options(10);
    opts.breaker = BreakerOptions::disabled();
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    orders(&q, 50).await;
    let store = MemoryStore::new();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(opts, source, store.clone(), handler).unwrap();
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(q.dead_letters().len(), 50);
    assert!(store.effects().is_empty());
}

#[tokio::test]
async fn the_breaker_stops_dead_lettering_when_every_message_fails_for_one_reason() {
    let handler = Deploy::new(ErrorKind::Database);
    let (q, store) = run(handler.clone(), options(10)).await;
    let dead = q.dead_letters();
    // The first batch of 10 settles as decided; the second brings the streak to 20 and
    // opens the breaker, which then holds every failure of that reason.
    assert_eq!(dead.len(), 10, "{dead:?}");
    assert!(dead.iter().all(|(_, r)| r.error.contains("does not exist")));
    assert_eq!(
        store.effects().len(),
        40,
        "the rest applied once the table is back"
    );
    let attempts = handler.attempts.lock().unwrap().clone();
    assert!(
        attempts.iter().all(|&a| a == 1),
        "the held messages were handed back without counting an attempt: {attempts:?}"
    );
}

#[tokio::test]
async fn a_batch_that_trips_the_breaker_dead_letters_none_of_its_failures() {
    let handler = Deploy::new(ErrorKind::Database);
    let (q, store) = run(handler, options(100)).await;
    assert!(q.dead_letters().is_empty(), "{:?}", q.dead_letters());
    assert_eq!(store.effects().len(), 50);
}

#[tokio::test]
async fn poison_among_good_messages_is_still_dead_lettered_at_once() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let mut batch = Vec::new();
    for i in 0..60 {
        let payload = if i % 3 == 0 {
            "bad".to_owned()
        } else {
            format!("o{i}")
        };
        batch.push(Message::new(payload).with_id(format!("m{i}")).unwrap());
    }
    q.publish_batch(&batch).await.unwrap();
    let store = MemoryStore::new();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(options(10), source, store.clone(), Picky).unwrap();
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(q.dead_letters().len(), 20);
    assert_eq!(store.effects().len(), 40);
}

/// Dead-letters `bad` payloads, applies the rest.
struct Picky;

impl Handler<MemoryTx> for Picky {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        if cx.message().payload() == b"bad" {
            return Ok(Disposition::dead_letter("invalid input: bad order"));
        }
        tx.record(String::from_utf8_lossy(cx.message().payload()));
        Ok(Disposition::Ok)
    }
}

/// Locks the account named after the `:` of its payload; records the order it ran in.
/// Fails with a deadlock the first `deadlocks` times it runs in a batch of more than one
/// message, as a batch that met another in the wrong order would.
#[derive(Clone, Default)]
struct Accounts {
    ran: Arc<Mutex<Vec<String>>>,
    deadlocks: Arc<AtomicU32>,
}

impl Handler<MemoryTx> for Accounts {
    fn lock_key(&self, message: &Message) -> Option<String> {
        let text = std::str::from_utf8(message.payload()).ok()?;
        Some(text.split_once(':')?.1.to_owned())
    }

    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        let text = String::from_utf8_lossy(cx.message().payload()).into_owned();
        if self.deadlocks.load(Ordering::SeqCst) > 0 && text.starts_with("pair") {
            self.deadlocks.fetch_sub(1, Ordering::SeqCst);
            return Err(Error::new(ErrorKind::Busy, "deadlock detected"));
        }
        self.ran.lock().unwrap().push(text.clone());
        tx.record(text);
        Ok(Disposition::Ok)
    }
}

#[tokio::test]
async fn a_batch_runs_in_the_order_of_its_lock_keys_keeping_the_order_of_each_key() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let payloads = ["a:9", "b:1", "c:5", "none", "d:1", "e:5"];
    let batch: Vec<Message> = payloads
        .iter()
        .map(|p| Message::new(*p).with_id(*p).unwrap())
        .collect();
    q.publish_batch(&batch).await.unwrap();
    let handler = Accounts::default();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(options(10), source, MemoryStore::new(), handler.clone()).unwrap();
    c.run_once().await.unwrap();
    assert_eq!(
        *handler.ran.lock().unwrap(),
        ["none", "b:1", "d:1", "c:5", "e:5", "a:9"]
    );
}

/// After a lock conflict the batches take a quarter as many messages (of those the
/// conflicting batch had), and one more a second while batches commit whole, up to the
/// configured size.
#[tokio::test]
async fn a_lock_conflict_shrinks_the_batches_and_clean_batches_grow_them_back() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let msg = |p: String, id: String| Message::new(p).with_id(id).unwrap();
    let mut first: Vec<Message> = (0..7)
        .map(|i| msg(format!("o{i}:{i}"), format!("m{i}")))
        .collect();
    first.push(msg("pair:7".into(), "m7".into()));
    q.publish_batch(&first).await.unwrap();
    let handler = Accounts::default();
    handler.deadlocks.store(1, Ordering::SeqCst);
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(options(8), source, MemoryStore::new(), handler.clone()).unwrap();
    assert_eq!(c.run_once().await.unwrap().acked, 8);
    let rest: Vec<Message> = (0..60)
        .map(|i| msg(format!("r{i}:{i}"), format!("r{i}")))
        .collect();
    q.publish_batch(&rest).await.unwrap();
    // One more a second: the clock is the runtime's, paused here and moved by hand.
    tokio::time::pause();
    let mut sizes = Vec::new();
    for _ in 0..3 {
        sizes.push(c.run_once().await.unwrap().received);
    }
    for _ in 0..8 {
        tokio::time::advance(Duration::from_millis(1001)).await;
        sizes.push(c.run_once().await.unwrap().received);
    }
    // Each batch takes the window as it was when it was received.
    assert_eq!(sizes, [2, 2, 2, 2, 3, 4, 5, 6, 7, 8, 8]);
}

/// A memory store that takes turns, as PostgreSQL does: counts the turns taken alone and
/// beside.
#[derive(Clone, Default)]
struct Turned {
    inner: MemoryStore,
    turns: Arc<AtomicU32>,
    beside: Arc<AtomicU32>,
    /// Another replica holds the turn alone: a turn beside is refused.
    taken_alone: Arc<AtomicBool>,
}

impl Turned {
    fn turns(&self) -> u32 {
        self.turns.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for Turned {
    type Tx = MemoryTx;
    fn backend(&self) -> &'static str {
        "turned"
    }
    async fn begin(&self) -> Result<MemoryTx> {
        self.inner.begin().await
    }
    async fn commit(&self, tx: MemoryTx) -> Result<()> {
        self.inner.commit(tx).await
    }
    async fn rollback(&self, tx: MemoryTx) -> Result<()> {
        self.inner.rollback(tx).await
    }
    async fn savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.savepoint(tx).await
    }
    async fn release_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.release_savepoint(tx).await
    }
    async fn rollback_to_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.rollback_to_savepoint(tx).await
    }
    fn takes_turns(&self) -> bool {
        true
    }
    async fn take_turn(&self, _tx: &mut MemoryTx, consumer: &str, turn: Turn) -> Result<bool> {
        assert_eq!(consumer, "test", "the turn is the consumer's");
        if turn == Turn::Alone {
            self.turns.fetch_add(1, Ordering::SeqCst);
            return Ok(true);
        }
        self.beside.fetch_add(1, Ordering::SeqCst);
        Ok(!self.taken_alone.load(Ordering::SeqCst))
    }
}

#[async_trait]
impl DedupStore for Turned {
    async fn claim(&self, tx: &mut MemoryTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        self.inner.claim(tx, key, fp).await
    }
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        self.inner.purge(retention, batch).await
    }
}

/// Where the store takes turns, a batch that met a lock conflict runs again whole in the
/// consumer's turn (not one message per transaction), and the batches after it take turns
/// for ten seconds; a conflict soon after they end doubles the hold. A batch that finds
/// another replica taking the turn alone takes turns too. The batches keep their size.
#[tokio::test]
async fn a_conflict_makes_the_batches_take_turns_for_a_while_at_full_size() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let batch = |tag: &str, pair: bool| -> Vec<Message> {
        (0..8)
            .map(|i| {
                let p = if pair && i == 5 {
                    format!("pair:{tag}{i}")
                } else {
                    format!("{tag}{i}:{i}")
                };
                Message::new(p).with_id(format!("{tag}{i}")).unwrap()
            })
            .collect()
    };
    let handler = Accounts::default();
    let store = Turned::default();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(options(8), source, store.clone(), handler.clone()).unwrap();
    tokio::time::pause();
    let run = |tag: &'static str, pair: bool| {
        let (q, c, handler) = (q.clone(), &c, handler.clone());
        async move {
            handler.deadlocks.store(u32::from(pair), Ordering::SeqCst);
            q.publish_batch(&batch(tag, pair)).await.unwrap();
            c.run_once().await.unwrap()
        }
    };
    let report = run("a", false).await;
    assert_eq!(
        (report.acked, store.turns()),
        (8, 0),
        "no turns alone before a conflict"
    );
    assert_eq!(
        store.beside.load(Ordering::SeqCst),
        1,
        "the batch took its turn beside"
    );
    let report = run("b", true).await;
    assert_eq!(report.acked, 8);
    assert_eq!(store.turns(), 1, "the batch ran again whole, in its turn");
    assert_eq!(store.inner.commits(), 2, "a's batch and b's, once each");
    assert_eq!(run("c", false).await.received, 8, "full size");
    assert_eq!(store.turns(), 2, "the next batch took its turn");
    tokio::time::advance(Duration::from_millis(10_001)).await;
    run("d", false).await;
    assert_eq!(store.turns(), 2, "the hold of 10 s ended");
    // A conflict within a hold of its end: twenty seconds.
    run("e", true).await;
    assert_eq!(store.turns(), 3);
    tokio::time::advance(Duration::from_secs(19)).await;
    run("f", false).await;
    assert_eq!(store.turns(), 4, "still taking turns after 19 s");
    tokio::time::advance(Duration::from_secs(2)).await;
    run("g", false).await;
    assert_eq!(store.turns(), 4, "the hold of 20 s ended");
    // Another replica takes the turn alone: this one does too, from the batch that found
    // it so, for ten seconds (its last hold ended long before), without a conflict.
    tokio::time::advance(Duration::from_secs(41)).await;
    store.taken_alone.store(true, Ordering::SeqCst);
    run("h", false).await;
    assert_eq!(store.turns(), 5, "the refused batch took its turn alone");
    store.taken_alone.store(false, Ordering::SeqCst);
    run("i", false).await;
    assert_eq!(store.turns(), 6, "and the next one");
    tokio::time::advance(Duration::from_millis(10_001)).await;
    run("j", false).await;
    assert_eq!(store.turns(), 6, "the hold of 10 s ended");
    assert_eq!(store.inner.effects().len(), 80, "every order applied once");
    assert!(q.dead_letters().is_empty());
}

#[tokio::test]
async fn a_deadlocked_batch_runs_again_one_message_per_transaction_without_going_back() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    let batch: Vec<Message> = (0..8)
        .map(|i| {
            let p = if i == 5 {
                "pair:5".to_owned()
            } else {
                format!("o{i}:{i}")
            };
            Message::new(p).with_id(format!("m{i}")).unwrap()
        })
        .collect();
    q.publish_batch(&batch).await.unwrap();
    let handler = Accounts::default();
    handler.deadlocks.store(1, Ordering::SeqCst);
    let store = MemoryStore::new();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(options(8), source, store.clone(), handler.clone()).unwrap();
    let report = c.run_once().await.unwrap();
    assert_eq!(report.acked, 8, "{report:?}");
    assert_eq!(store.effects().len(), 8);
    assert!(q.dead_letters().is_empty());
    assert_eq!(q.deliveries(), 8, "no delivery went back to the queue");
    assert_eq!(
        store.commits(),
        8,
        "the batch failed, then each message committed alone"
    );

    // A message that deadlocks even alone goes back to the queue, its attempt not counted.
    q.publish(&Message::new("pair:9").with_id("m9").unwrap())
        .await
        .unwrap();
    handler.deadlocks.store(1, Ordering::SeqCst);
    assert_eq!(c.run_once().await.unwrap_err().kind(), ErrorKind::Busy);
    let again = q.receive(1, Duration::from_secs(1)).await.unwrap();
    assert_eq!(again[0].attempt, 1, "the hand-back counted no attempt");
}

/// Records, per lock key, how many of its messages are in a handler at once, and how many
/// handlers run at once in all.
#[derive(Clone, Default)]
struct Keyed {
    busy: Arc<Mutex<std::collections::HashMap<String, usize>>>,
    most_per_key: Arc<AtomicU32>,
    now: Arc<AtomicU32>,
    most: Arc<AtomicU32>,
}

impl Handler<MemoryTx> for Keyed {
    fn lock_key(&self, message: &Message) -> Option<String> {
        // "k{key}-{n}": the key before the dash.
        let text = String::from_utf8_lossy(message.payload()).into_owned();
        text.split('-').next().map(str::to_owned)
    }

    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        let key = self.lock_key(cx.message()).unwrap_or_default();
        let here = {
            let mut busy = self.busy.lock().unwrap();
            let n = busy.entry(key.clone()).or_default();
            *n += 1;
            *n as u32
        };
        self.most_per_key.fetch_max(here, Ordering::SeqCst);
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
        *self.busy.lock().unwrap().get_mut(&key).unwrap() -= 1;
        tx.record(String::from_utf8_lossy(cx.message().payload()));
        Ok(Disposition::Ok)
    }
}

/// At `concurrency(4)`, batches of one consumer that share a lock key run one after the
/// other (the gate), while batches with other keys run beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_that_share_a_lock_key_run_one_after_the_other_and_the_rest_side_by_side() {
    let q = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
    // Batches of 5, one key each: k0, k1, k2, k0, k1, … (each meets the batch three before
    // it, never its neighbours).
    let batch: Vec<Message> = (0..200)
        .map(|i| {
            let key = (i / 5) % 3;
            Message::new(format!("k{key}-{i}"))
                .with_id(format!("o{i}"))
                .unwrap()
        })
        .collect();
    q.publish_batch(&batch).await.unwrap();
    let store = MemoryStore::new();
    let mut opts = options(5);
    opts.batching.concurrency = 4;
    let handler = Keyed::default();
    let source: Arc<dyn Source> = q.clone();
    let c = Consumer::new(opts, source, store.clone(), handler.clone()).unwrap();
    c.run_until(until_empty(q.clone())).await.unwrap();
    assert_eq!(store.effects().len(), 200, "every order applied once");
    assert_eq!(
        handler.most_per_key.load(Ordering::SeqCst),
        1,
        "two batches with a key in common ran at once"
    );
    assert!(
        handler.most.load(Ordering::SeqCst) >= 2,
        "batches with other keys never ran side by side"
    );
}
