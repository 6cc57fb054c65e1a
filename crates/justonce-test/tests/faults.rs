//! The kit's faults and checker can fail: the same faults that an effectively-once
//! consumer survives make an at-least-once one apply messages twice, and a handler that
//! drops messages shows them lost.

use std::sync::Arc;
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
use justonce::{
    Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Result, Semantics,
};
use justonce_test::faults::{Effects, Faults, Verdict};

struct Ship {
    skip: Option<&'static str>,
}

impl Handler<MemoryTx> for Ship {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        let id = cx.message().id().unwrap().as_str();
        if Some(id) != self.skip {
            tx.record(id);
        }
        Ok(Disposition::Ok)
    }
}

async fn run(semantics: Semantics, skip: Option<&'static str>) -> (Verdict, u64) {
    let queue = Arc::new(MemoryQueue::new("orders", Duration::from_millis(50)));
    let store = MemoryStore::new();
    let faults = Faults::new(11)
        .crash_before_commit(0.2)
        .crash_after_commit(0.2)
        .lose_ack(0.1);
    let orders: Vec<Message> = (0..200)
        .map(|i| Message::new("{}").with_id(format!("ORD-{i}")))
        .collect::<Result<_>>()
        .unwrap();
    queue.publish_batch(&orders).await.unwrap();
    queue
        .publish_batch(&faults.published_twice(&orders))
        .await
        .unwrap();
    let mut options = ConsumerOptions::new("shipping");
    options.batching.size = 10;
    options.semantics = semantics;
    let consumer = Consumer::new(options, queue.clone(), store.clone(), Ship { skip })
        .unwrap()
        .with_fault_hook(Arc::new(faults.clone()));
    let q = queue.clone();
    let drained = async move {
        while !q.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    consumer.run_until(drained).await.unwrap();
    let verdict = Effects::count(store.effects())
        .check(orders.iter().filter_map(|m| m.id()).map(|id| id.as_str()));
    (verdict, faults.fired())
}

#[tokio::test]
async fn effectively_once_survives_the_faults() {
    let (v, fired) = run(Semantics::EffectivelyOnce, None).await;
    assert!(fired > 10, "the faults fired: {fired}");
    assert_eq!((v.lost, v.duplicate_effects), (0, 0), "{v:?}");
}

#[tokio::test]
async fn at_least_once_shows_duplicates_under_the_same_faults() {
    let (v, _) = run(Semantics::AtLeastOnce, None).await;
    assert_eq!(v.lost, 0, "{v:?}");
    assert!(
        v.duplicate_effects > 10,
        "crashes after commit and a publisher's retries apply twice: {v:?}"
    );
    assert!(!v.duplicated_ids.is_empty());
}

#[tokio::test]
async fn a_handler_that_drops_a_message_shows_it_lost() {
    let (v, _) = run(Semantics::EffectivelyOnce, Some("ORD-7")).await;
    assert_eq!(v.lost, 1, "{v:?}");
    assert_eq!(v.lost_ids, ["ORD-7"]);
}

#[test]
fn the_same_seed_draws_the_same_faults() {
    let orders: Vec<Message> = (0..100)
        .map(|i| Message::new("{}").with_id(format!("ORD-{i}")).unwrap())
        .collect();
    let ids = |f: &Faults| -> Vec<String> {
        f.published_twice(&orders)
            .iter()
            .map(|m| m.id().unwrap().as_str().to_owned())
            .collect()
    };
    assert_eq!(ids(&Faults::new(3)), ids(&Faults::new(3)));
    assert_ne!(ids(&Faults::new(3)), ids(&Faults::new(4)));
}
