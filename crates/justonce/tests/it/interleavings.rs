//! The consumer loop's decision table under generated interleavings, on the in-memory
//! backends: ids published once or several times (a producer's re-sends), batches of 1 to
//! 4, one or two consumers on one queue, crashes before and after the commit, lost acks,
//! and handlers slower than the lease (so that another consumer takes the message over
//! while the first still holds its claim). Whatever the interleaving, effectively-once ends
//! with every id applied exactly once, nothing dead-lettered and the queue empty; the same
//! generator finds at-least-once cases that apply an id twice, so the property can fail.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
use justonce::{
    async_trait, Consumer, ConsumerOptions, Context, Delivery, Disposition, FaultHook, FaultPoint,
    Handler, Message, Publisher, Result, Semantics, Source,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

/// The queue's lease: short, so that a case's redeliveries come within milliseconds.
const LEASE: Duration = Duration::from_millis(30);

/// One generated interleaving.
#[derive(Debug, Clone)]
struct Case {
    /// Ids in publish order; an id more than once is a producer's re-send.
    publishes: Vec<u8>,
    /// `(id, attempt, point)`: the consumer crashes at `point` with a batch holding that
    /// delivery (each fires once).
    crashes: Vec<(u8, u32, FaultPoint)>,
    /// `(id, attempt)`: the ack of that delivery is lost on its way to the queue.
    lost_acks: Vec<(u8, u32)>,
    /// `(id, attempt)`: the handler of that delivery takes two leases.
    slow: Vec<(u8, u32)>,
    batch: usize,
    consumers: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (1u8..=8).prop_flat_map(|n| {
        let point = prop_oneof![
            Just(FaultPoint::BeforeCommit),
            Just(FaultPoint::AfterCommit)
        ];
        (
            prop::collection::vec(0..n, 0..=n as usize)
                .prop_map(move |extra| (0..n).chain(extra).collect::<Vec<u8>>())
                .prop_shuffle(),
            prop::collection::vec((0..n, 1u32..=3, point), 0..=4),
            prop::collection::vec((0..n, 1u32..=3), 0..=3),
            prop::collection::vec((0..n, 1u32..=2), 0..=2),
            1usize..=4,
            1usize..=2,
        )
            .prop_map(
                |(publishes, crashes, lost_acks, slow, batch, consumers)| Case {
                    publishes,
                    crashes,
                    lost_acks,
                    slow,
                    batch,
                    consumers,
                },
            )
    })
}

fn id_of(m: &Message) -> u8 {
    m.id()
        .and_then(|id| id.as_str().strip_prefix('m'))
        .and_then(|n| n.parse().ok())
        .expect("the case's ids are m<n>")
}

/// Takes `(id, attempt)` off `plan` if it is there: each planned fault fires once.
fn take<T: PartialEq>(plan: &Mutex<Vec<T>>, wanted: impl Fn(&T) -> bool) -> bool {
    let mut plan = plan.lock().unwrap();
    match plan.iter().position(wanted) {
        Some(i) => {
            plan.remove(i);
            true
        }
        None => false,
    }
}

/// The case's crashes and lost acks.
struct Faults {
    crashes: Mutex<Vec<(u8, u32, FaultPoint)>>,
    lost_acks: Mutex<Vec<(u8, u32)>>,
}

#[async_trait]
impl FaultHook for Faults {
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool {
        batch.iter().any(|d| {
            take(&self.crashes, |&(id, attempt, p)| {
                (id, attempt, p) == (id_of(&d.message), d.attempt, point)
            })
        })
    }

    fn lose_ack(&self, d: &Delivery) -> bool {
        take(&self.lost_acks, |&(id, attempt)| {
            (id, attempt) == (id_of(&d.message), d.attempt)
        })
    }
}

/// Records the id as the effect; slow where the case says.
#[derive(Clone)]
struct Apply {
    slow: Arc<Mutex<Vec<(u8, u32)>>>,
}

impl Handler<MemoryTx> for Apply {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        let id = id_of(cx.message());
        if take(&self.slow, |&(i, attempt)| {
            (i, attempt) == (id, cx.attempt())
        }) {
            tokio::time::sleep(LEASE * 2).await;
        }
        tx.record(format!("m{id}"));
        Ok(Disposition::Ok)
    }
}

/// Runs `case` under `semantics`; the effects per id, the dead letters, whether the queue
/// drained within 20 s.
fn run(case: &Case, semantics: Semantics) -> (HashMap<String, usize>, usize, bool) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let q = Arc::new(MemoryQueue::new("q", LEASE));
        let store = MemoryStore::new();
        for id in &case.publishes {
            q.publish(
                &Message::new(format!("m{id}"))
                    .with_id(format!("m{id}"))
                    .unwrap(),
            )
            .await
            .unwrap();
        }
        let faults = Arc::new(Faults {
            crashes: Mutex::new(case.crashes.clone()),
            lost_acks: Mutex::new(case.lost_acks.clone()),
        });
        let handler = Apply {
            slow: Arc::new(Mutex::new(case.slow.clone())),
        };
        let mut runs = tokio::task::JoinSet::new();
        for _ in 0..case.consumers {
            let mut o = ConsumerOptions::new("prop");
            o.semantics = semantics;
            o.batching.size = case.batch;
            o.batching.linger = Duration::ZERO;
            o.batching.receive_wait = Duration::from_millis(5);
            o.retry.backoff_base = Duration::from_millis(2);
            o.retry.backoff_max = Duration::from_millis(10);
            let source: Arc<dyn Source> = q.clone();
            let c = Consumer::new(o, source, store.clone(), handler.clone())
                .unwrap()
                .with_fault_hook(faults.clone());
            let q = q.clone();
            runs.spawn(async move { c.run_until(crate::support::until_empty(q)).await });
        }
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(r) = runs.join_next().await {
                r.expect("a consumer task").expect("a consumer run");
            }
        })
        .await
        .is_ok();
        let mut effects = HashMap::new();
        for e in store.effects() {
            *effects.entry(e).or_insert(0) += 1;
        }
        (effects, q.dead_letters().len(), drained)
    })
}

fn once(case: &Case, semantics: Semantics) -> std::result::Result<(), TestCaseError> {
    let (effects, dead, drained) = run(case, semantics);
    prop_assert!(drained, "the queue did not drain: {effects:?}");
    prop_assert_eq!(dead, 0, "nothing here is poison");
    let n = case.publishes.iter().copied().max().map_or(0, |m| m + 1);
    for id in 0..n {
        let got = effects.get(&format!("m{id}")).copied().unwrap_or(0);
        prop_assert_eq!(got, 1, "m{} applied {} times: {:?}", id, got, effects);
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 48, ..Config::default() })]

    /// Every interleaving: each id applied exactly once.
    #[test]
    fn effectively_once_applies_every_id_once_under_any_interleaving(case in case()) {
        once(&case, Semantics::EffectivelyOnce)?;
    }
}

/// The same property under at-least-once: the generator finds a case that applies an id
/// twice (a re-send, a crash after the commit, a lost ack), so the property above is not
/// one that cannot fail.
#[test]
fn the_generator_finds_the_duplicates_of_at_least_once() {
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&case(), |case| once(&case, Semantics::AtLeastOnce));
    match result {
        Err(TestError::Fail(why, case)) => {
            assert!(why.message().contains("times"), "{why}: {case:?}");
        }
        other => panic!("at-least-once passed every generated case: {other:?}"),
    }
}
