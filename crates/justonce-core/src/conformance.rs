//! Conformance suites: the contracts of [`Source`], [`Publisher`] and [`DedupStore`],
//! written once and run against every backend (the in-memory ones on every `cargo test`,
//! the SQL and broker ones against real services).
//!
//! Each suite panics with a message naming the broken rule. Backend authors call them from
//! their own tests:
//!
//! ```
//! use std::sync::Arc;
//! use justonce_core::{conformance, memory::MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! conformance::dedup_store(Arc::new(MemoryStore::new()), "doc").await;
//! # }
//! ```

#![allow(clippy::unwrap_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::{
    Claim, DeadLetterReason, DedupKey, DedupStore, Fingerprint, Message, MessageId, Publisher,
    Source,
};

fn id(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

/// The [`DedupStore`] contract. `ns` keeps the keys of one run apart from other runs on
/// a shared database.
pub async fn dedup_store<S: DedupStore>(store: Arc<S>, ns: &str) {
    dedup_claims(store.clone(), ns).await;
    dedup_purge(store, ns).await;
}

/// The claim half of [`dedup_store`]: fresh, duplicate, conflict, rollback, and two
/// concurrent claims of one key. A store whose purge works in whole days (a partitioned
/// table) runs this half and tests its purge on its own.
pub async fn dedup_claims<S: DedupStore>(store: Arc<S>, ns: &str) {
    let consumer = format!("{ns}-c");
    let other = format!("{ns}-other");
    let fp = Fingerprint::of(b"payload");
    let m1 = id(&format!("{ns}-m1"));
    let key = DedupKey {
        consumer: &consumer,
        message_id: &m1,
    };

    // A fresh key is Fresh; after commit it is a Duplicate; with another payload a Conflict.
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key, fp).await.unwrap(),
        Claim::Fresh,
        "first claim is fresh"
    );
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key, fp).await.unwrap(),
        Claim::Duplicate,
        "a committed claim makes the same key a duplicate"
    );
    let other_fp = Fingerprint::of(b"another payload");
    assert_eq!(
        store.claim(&mut tx, key, other_fp).await.unwrap(),
        Claim::Conflict { stored: fp },
        "same id, other payload is a conflict naming the stored fingerprint"
    );
    store.rollback(tx).await.unwrap();

    // Keys are scoped by consumer (invariant 2).
    let mut tx = store.begin().await.unwrap();
    let other_key = DedupKey {
        consumer: &other,
        message_id: &m1,
    };
    assert_eq!(
        store.claim(&mut tx, other_key, fp).await.unwrap(),
        Claim::Fresh,
        "another consumer's claim of the same message id is fresh"
    );
    store.commit(tx).await.unwrap();

    // A rolled-back claim leaves nothing behind.
    let m2 = id(&format!("{ns}-m2"));
    let key2 = DedupKey {
        consumer: &consumer,
        message_id: &m2,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(store.claim(&mut tx, key2, fp).await.unwrap(), Claim::Fresh);
    store.rollback(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key2, fp).await.unwrap(),
        Claim::Fresh,
        "rollback discards a claim"
    );
    store.rollback(tx).await.unwrap();

    // A claim rolled back to its savepoint is gone; the rest of the transaction commits.
    let m3 = id(&format!("{ns}-m3"));
    let key3 = DedupKey {
        consumer: &consumer,
        message_id: &m3,
    };
    let mut tx = store.begin().await.unwrap();
    store.savepoint(&mut tx).await.unwrap();
    assert_eq!(store.claim(&mut tx, key2, fp).await.unwrap(), Claim::Fresh);
    store.release_savepoint(&mut tx).await.unwrap();
    store.savepoint(&mut tx).await.unwrap();
    assert_eq!(store.claim(&mut tx, key3, fp).await.unwrap(), Claim::Fresh);
    store.rollback_to_savepoint(&mut tx).await.unwrap();
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key2, fp).await.unwrap(),
        Claim::Duplicate,
        "released savepoint commits"
    );
    assert_eq!(
        store.claim(&mut tx, key3, fp).await.unwrap(),
        Claim::Fresh,
        "rolled-back savepoint discards"
    );
    store.rollback(tx).await.unwrap();

    // Two transactions claiming one key at the same time: exactly one commits it as Fresh.
    let m4 = id(&format!("{ns}-m4"));
    let mut wins = 0;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let store = store.clone();
        let consumer = consumer.clone();
        let m4 = m4.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let mut tx = match store.begin().await {
                    Ok(tx) => tx,
                    Err(e) if e.is_transient() => continue,
                    Err(e) => panic!("begin failed: {e}"),
                };
                let key = DedupKey {
                    consumer: &consumer,
                    message_id: &m4,
                };
                match store.claim(&mut tx, key, fp).await {
                    Ok(Claim::Fresh) => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        match store.commit(tx).await {
                            Ok(()) => return true,
                            Err(e) if e.is_transient() => continue,
                            Err(e) => panic!("commit failed: {e}"),
                        }
                    }
                    Ok(_) => return false,
                    Err(e) if e.is_transient() => {
                        drop(tx);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("claim failed: {e}"),
                }
            }
            panic!("a concurrent claim never settled");
        }));
    }
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(
        wins, 1,
        "two concurrent claims of one key: exactly one wins"
    );

    // The same with one batch of two keys through `begin_claimed` (which a store may run
    // as an insert that fails on a stored key): one commits both as Fresh, the other then
    // finds both.
    let (m11, m12) = (id(&format!("{ns}-m11")), id(&format!("{ns}-m12")));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (store, consumer) = (store.clone(), consumer.clone());
        let (m11, m12) = (m11.clone(), m12.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                match store
                    .begin_claimed(&consumer, &[(&m12, fp), (&m11, fp)])
                    .await
                {
                    Ok((tx, answers)) if answers == [Claim::Fresh, Claim::Fresh] => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        match store.commit(tx).await {
                            Ok(()) => return Some(true),
                            Err(e) if e.is_transient() => continue,
                            Err(e) => panic!("commit failed: {e}"),
                        }
                    }
                    Ok((tx, answers)) => {
                        store.rollback(tx).await.unwrap();
                        assert_eq!(
                            answers,
                            [Claim::Duplicate, Claim::Duplicate],
                            "the batch that lost finds both keys"
                        );
                        return Some(false);
                    }
                    Err(e) if e.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("begin_claimed failed: {e}"),
                }
            }
            None
        }));
    }
    let mut wins = 0;
    for t in tasks {
        let won = t.await.unwrap().expect("a concurrent batch never settled");
        wins += usize::from(won);
    }
    assert_eq!(
        wins, 1,
        "two concurrent batches of the same keys: exactly one wins"
    );

    dedup_claim_many(store.as_ref(), &consumer, ns).await;
}

/// `claim_many`: the same answers as claims one by one, in order, with repeats inside the
/// batch and keys recorded before; rolled back with its transaction.
async fn dedup_claim_many<S: DedupStore>(store: &S, consumer: &str, ns: &str) {
    let fp = Fingerprint::of(b"payload");
    let other_fp = Fingerprint::of(b"another payload");
    // m1 was committed above with `fp`; m5 is new and comes twice; m6 is new, then again
    // with another payload; m7 is new. The order is not sorted on purpose.
    let (m1, m5, m6, m7) = (
        id(&format!("{ns}-m1")),
        id(&format!("{ns}-m5")),
        id(&format!("{ns}-m6")),
        id(&format!("{ns}-m7")),
    );
    let keys = [
        (&m7, fp),
        (&m5, fp),
        (&m1, fp),
        (&m5, fp),
        (&m6, fp),
        (&m1, other_fp),
        (&m6, other_fp),
    ];
    let mut tx = store.begin().await.unwrap();
    let answers = store.claim_many(&mut tx, consumer, &keys).await.unwrap();
    assert_eq!(
        answers,
        vec![
            Claim::Fresh,
            Claim::Fresh,
            Claim::Duplicate,
            Claim::Duplicate,
            Claim::Fresh,
            Claim::Conflict { stored: fp },
            Claim::Conflict { stored: fp },
        ],
        "claim_many answers each key as one-by-one claims would, in order"
    );
    store.rollback(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let answers = store
        .claim_many(&mut tx, consumer, &[(&m5, fp), (&m7, fp)])
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![Claim::Fresh, Claim::Fresh],
        "a rolled-back claim_many leaves nothing behind"
    );
    store.commit(tx).await.unwrap();
    assert_eq!(
        claim_and_roll_back(store, consumer, &m7, fp).await,
        Claim::Duplicate,
        "a committed claim_many records its keys"
    );
    dedup_begin_claimed(store, consumer, ns).await;
}

/// `begin_claimed`: the answers of `begin` then `claim_many`, for one key (a store may fold
/// that claim into its `BEGIN`) and for several, including an id that SQL would have to
/// quote.
async fn dedup_begin_claimed<S: DedupStore>(store: &S, consumer: &str, ns: &str) {
    let fp = Fingerprint::of(b"payload");
    let other_fp = Fingerprint::of(b"another payload");
    let (m1, m8, odd) = (
        id(&format!("{ns}-m1")),
        id(&format!("{ns}-m8")),
        id(&format!("{ns}-it's a \\'quoted'\\ id")),
    );
    assert_eq!(
        begin_claimed_then(store, consumer, vec![(&m8, fp)], false).await,
        vec![Claim::Fresh],
        "begin_claimed: a new key is fresh"
    );
    assert_eq!(
        begin_claimed_then(store, consumer, vec![(&m8, fp)], true).await,
        vec![Claim::Fresh],
        "a rolled-back begin_claimed leaves nothing behind"
    );
    for (fp_now, want, what) in [
        (fp, Claim::Duplicate, "a committed key is a duplicate"),
        (
            other_fp,
            Claim::Conflict { stored: fp },
            "another payload conflicts",
        ),
    ] {
        // The transaction is usable after a stored key, and rolls back cleanly.
        assert_eq!(
            begin_claimed_then(store, consumer, vec![(&m8, fp_now)], false).await,
            vec![want],
            "begin_claimed: {what}"
        );
    }
    assert_eq!(
        begin_claimed_then(
            store,
            consumer,
            vec![(&m1, fp), (&m8, other_fp), (&odd, fp)],
            false
        )
        .await,
        vec![
            Claim::Duplicate,
            Claim::Conflict { stored: fp },
            Claim::Fresh
        ],
        "begin_claimed answers a batch as claim_many does"
    );
    // New keys only (a store may insert them without looking first), out of byte order
    // ("m10" sorts first), one of them twice; then once each, committed: each recorded
    // with its own payload.
    let (m9, m10) = (id(&format!("{ns}-m9")), id(&format!("{ns}-m10")));
    assert_eq!(
        begin_claimed_then(
            store,
            consumer,
            vec![(&m9, other_fp), (&m10, fp), (&m9, other_fp)],
            false
        )
        .await,
        vec![Claim::Fresh, Claim::Fresh, Claim::Duplicate],
        "begin_claimed: a new batch with a repeat"
    );
    assert_eq!(
        begin_claimed_then(store, consumer, vec![(&m9, other_fp), (&m10, fp)], true).await,
        vec![Claim::Fresh, Claim::Fresh],
        "begin_claimed: a new batch"
    );
    assert_eq!(
        claim_and_roll_back(store, consumer, &m9, other_fp).await,
        Claim::Duplicate,
        "a committed batch records each key with its fingerprint"
    );
    assert_eq!(
        claim_and_roll_back(store, consumer, &m10, other_fp).await,
        Claim::Conflict { stored: fp },
        "a committed batch records each key with its fingerprint"
    );
    assert_eq!(
        begin_claimed_then(store, consumer, vec![(&odd, fp)], true).await,
        vec![Claim::Fresh],
        "an id with quotes and backslashes"
    );
    assert_eq!(
        claim_and_roll_back(store, consumer, &odd, fp).await,
        Claim::Duplicate,
        "begin_claimed recorded the id exactly as claim reads it"
    );
    // `begin_claiming` hashes the payloads itself (while its transaction begins, or
    // before a claim folded into the `BEGIN`): the same answers, for a batch and for one
    // message, and the fingerprints of the payloads recorded.
    let m13 = id(&format!("{ns}-m13"));
    let (same, other) = (Message::new("payload"), Message::new("another payload"));
    let begun = store
        .begin_claiming(consumer, &[(&m8, &other), (&m13, &same), (&m1, &same)])
        .await
        .unwrap();
    assert_eq!(
        end(store, begun, true).await,
        vec![
            Claim::Conflict { stored: fp },
            Claim::Fresh,
            Claim::Duplicate
        ],
        "begin_claiming answers a batch as begin_claimed does"
    );
    assert_eq!(
        claim_and_roll_back(store, consumer, &m13, fp).await,
        Claim::Duplicate,
        "begin_claiming recorded the payload's fingerprint"
    );
    let m14 = id(&format!("{ns}-m14"));
    for (m, want) in [(&m14, Claim::Fresh), (&m13, Claim::Conflict { stored: fp })] {
        let begun = store
            .begin_claiming(consumer, &[(m, &other)])
            .await
            .unwrap();
        assert_eq!(
            end(store, begun, false).await,
            vec![want],
            "begin_claiming of one message"
        );
    }
}

/// `begin_claimed` of `keys`, then its transaction committed or rolled back: the answers.
async fn begin_claimed_then<S: DedupStore>(
    store: &S,
    consumer: &str,
    keys: Vec<(&MessageId, Fingerprint)>,
    commit: bool,
) -> Vec<Claim> {
    let begun = store.begin_claimed(consumer, &keys).await.unwrap();
    end(store, begun, commit).await
}

/// A begun transaction committed or rolled back: its claims' answers.
async fn end<S: DedupStore>(
    store: &S,
    (tx, answers): (S::Tx, Vec<Claim>),
    commit: bool,
) -> Vec<Claim> {
    if commit {
        store.commit(tx).await.unwrap();
    } else {
        store.rollback(tx).await.unwrap();
    }
    answers
}

/// One claim in a transaction of its own, rolled back: what the store holds for the key.
async fn claim_and_roll_back<S: DedupStore>(
    store: &S,
    consumer: &str,
    message_id: &MessageId,
    fp: Fingerprint,
) -> Claim {
    let mut tx = store.begin().await.unwrap();
    let key = DedupKey {
        consumer,
        message_id,
    };
    let claim = store.claim(&mut tx, key, fp).await.unwrap();
    store.rollback(tx).await.unwrap();
    claim
}

/// The purge half of [`dedup_store`], after [`dedup_claims`] with the same `ns`: records
/// older than the retention go, batch by batch, and only those.
pub async fn dedup_purge<S: DedupStore>(store: Arc<S>, ns: &str) {
    let consumer = format!("{ns}-c");
    let fp = Fingerprint::of(b"payload");
    let m1 = id(&format!("{ns}-m1"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut purged = 0;
    loop {
        let n = store.purge(Duration::from_millis(1), 2).await.unwrap();
        assert!(n <= 2, "purge deletes at most its batch");
        purged += n;
        if n == 0 {
            break;
        }
    }
    assert!(
        purged >= 4,
        "purge deleted the old records (deleted {purged})"
    );
    assert_eq!(
        claim_and_roll_back(store.as_ref(), &consumer, &m1, fp).await,
        Claim::Fresh,
        "a purged key is fresh again"
    );
    assert_eq!(
        store.purge(Duration::from_secs(3600), 1000).await.unwrap(),
        0,
        "recent records stay"
    );
}

/// The [`Source`] + [`Publisher`] contract, on a queue constructed with `lease` and
/// holding no messages.
pub async fn queue<Q: Source + Publisher>(q: &Q, lease: Duration, ns: &str) {
    let m = |n: &str| {
        Message::new(format!("payload {n}"))
            .with_id(format!("{ns}-{n}"))
            .unwrap()
    };
    q.publish(&m("a")).await.unwrap();
    q.publish_batch(&[m("b"), m("c")]).await.unwrap();

    let got = q.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(
        got.len(),
        3,
        "receive returns every ready message up to max"
    );
    let ids: Vec<_> = got
        .iter()
        .map(|d| d.message.id().unwrap().as_str().to_owned())
        .collect();
    assert_eq!(
        ids,
        [format!("{ns}-a"), format!("{ns}-b"), format!("{ns}-c")],
        "in publish order"
    );
    assert!(
        got.iter().all(|d| d.attempt == 1 && !d.redelivered),
        "first delivery is attempt 1"
    );
    assert_eq!(got[0].message.payload(), b"payload a");
    assert!(
        q.receive(10, Duration::ZERO).await.unwrap().is_empty(),
        "leased messages are not delivered twice"
    );

    // Ack a; nack b with a delay; let c's lease run out.
    q.ack(&[&got[0].receipt]).await.unwrap();
    q.nack(&got[1].receipt, lease * 3).await.unwrap();
    let again = q.receive(10, lease * 2).await.unwrap();
    assert_eq!(
        again.len(),
        1,
        "an expired lease delivers the message again"
    );
    assert_eq!(again[0].message.id().unwrap().as_str(), format!("{ns}-c"));
    assert_eq!(again[0].attempt, 2, "the transport counts attempts");
    assert!(again[0].redelivered);

    // A stale receipt (c's first lease) does not ack the new delivery.
    q.ack(&[&got[2].receipt]).await.unwrap();
    q.nack(&again[0].receipt, Duration::ZERO).await.unwrap();
    let c3 = q.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(c3.len(), 1, "a stale ack is ignored");
    assert_eq!(c3[0].attempt, 3);

    // Dead-letter c with a reason.
    let reason = DeadLetterReason {
        error: "invalid input: test".into(),
        attempts: 3,
        source_queue: q.queue().into(),
        consumer: "conformance".into(),
    };
    q.dead_letter(&c3[0], &reason).await.unwrap();

    // b comes back after its nack delay.
    let b = q.receive(10, lease * 4).await.unwrap();
    assert_eq!(b.len(), 1, "a nacked message comes back after its delay");
    assert_eq!(b[0].message.id().unwrap().as_str(), format!("{ns}-b"));
    assert_eq!(b[0].attempt, 2, "a nack counts an attempt");

    // Released (the consumer could not process it, through no fault of its own): back at
    // once, and no attempt counted.
    q.release(&[&b[0].receipt]).await.unwrap();
    let b = q.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(b.len(), 1, "a released message is delivered again at once");
    assert_eq!(b[0].message.id().unwrap().as_str(), format!("{ns}-b"));
    assert_eq!(b[0].attempt, 2, "a release counts no attempt");
    q.ack(&[&b[0].receipt]).await.unwrap();
    assert!(
        q.receive(10, lease * 2).await.unwrap().is_empty(),
        "acked and dead-lettered messages never return"
    );
}

/// The [`ClaimStore`](crate::ClaimStore) contract. `lease` is short (a few hundred
/// milliseconds): the suite waits for leases to run out.
pub async fn claim_store<C: crate::ClaimStore + 'static>(
    claims: Arc<C>,
    lease: Duration,
    ns: &str,
) {
    use crate::ClaimState;
    let consumer = format!("{ns}-c");
    let fp = Fingerprint::of(b"effect");
    fn key_of<'a>(consumer: &'a str, m: &'a MessageId) -> DedupKey<'a> {
        DedupKey {
            consumer,
            message_id: m,
        }
    }

    // Acquire; a second acquire while the lease runs is InProgress, never done.
    let m1 = id(&format!("{ns}-k1"));
    let ClaimState::Acquired { token: t1 } = claims
        .acquire(key_of(&consumer, &m1), fp, lease)
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired");
    };
    match claims
        .acquire(key_of(&consumer, &m1), fp, lease)
        .await
        .unwrap()
    {
        ClaimState::InProgress { retry_after } => {
            assert!(
                retry_after <= lease,
                "retry_after {retry_after:?} is within the lease {lease:?}"
            )
        }
        other => panic!("a held claim is in progress, got {other:?}"),
    }
    // Release lets a retry take it at once, with a higher token.
    claims.release(key_of(&consumer, &m1), t1).await.unwrap();
    let ClaimState::Acquired { token: t2 } = claims
        .acquire(key_of(&consumer, &m1), fp, lease)
        .await
        .unwrap()
    else {
        panic!("a released claim is acquired again");
    };
    assert!(
        t2 > t1,
        "the token grows on every new holder ({t1} -> {t2})"
    );
    // Completion stores the result; later acquires get it back.
    claims
        .complete(key_of(&consumer, &m1), t2, Some(b"receipt-42"))
        .await
        .unwrap();
    assert_eq!(
        claims
            .acquire(key_of(&consumer, &m1), fp, lease)
            .await
            .unwrap(),
        ClaimState::Completed {
            result: Some(b"receipt-42".to_vec())
        },
        "a completed claim is a duplicate with its stored result"
    );
    assert_eq!(
        claims
            .acquire(key_of(&consumer, &m1), Fingerprint::of(b"other"), lease)
            .await
            .unwrap(),
        ClaimState::Conflict { stored: fp },
        "same id, other payload is a conflict"
    );

    // A holder that stalls past its lease is taken over; its late completion is refused.
    let m2 = id(&format!("{ns}-k2"));
    let ClaimState::Acquired { token: stale } = claims
        .acquire(key_of(&consumer, &m2), fp, lease)
        .await
        .unwrap()
    else {
        panic!("acquire");
    };
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    let ClaimState::Acquired { token: fresh } = claims
        .acquire(key_of(&consumer, &m2), fp, lease)
        .await
        .unwrap()
    else {
        panic!("an expired lease is taken over");
    };
    assert!(fresh > stale, "the takeover has a higher fencing token");
    let err = claims
        .complete(key_of(&consumer, &m2), stale, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        crate::ErrorKind::Conflict,
        "a stale completion is refused: {err}"
    );
    claims.release(key_of(&consumer, &m2), stale).await.unwrap();
    assert!(
        matches!(
            claims
                .acquire(key_of(&consumer, &m2), fp, lease)
                .await
                .unwrap(),
            ClaimState::InProgress { .. }
        ),
        "a stale release does not free the new holder's claim"
    );
    claims
        .complete(key_of(&consumer, &m2), fresh, None)
        .await
        .unwrap();

    // Claims are scoped by consumer.
    let other = format!("{ns}-other");
    assert!(matches!(
        claims
            .acquire(
                DedupKey {
                    consumer: &other,
                    message_id: &m1
                },
                fp,
                lease
            )
            .await
            .unwrap(),
        ClaimState::Acquired { .. }
    ));

    // Two holders acquiring one key at once: exactly one gets it.
    let m3 = id(&format!("{ns}-k3"));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let claims = claims.clone();
        let consumer = consumer.clone();
        let m3 = m3.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let key = DedupKey {
                    consumer: &consumer,
                    message_id: &m3,
                };
                match claims.acquire(key, fp, Duration::from_secs(30)).await {
                    Ok(state) => return matches!(state, ClaimState::Acquired { .. }),
                    Err(e) if e.is_transient() => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(e) => panic!("acquire failed: {e}"),
                }
            }
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += usize::from(t.await.unwrap());
    }
    assert_eq!(winners, 1, "concurrent acquires: exactly one holder");

    // The batch forms answer as the single ones, item by item.
    let (b1, b2) = (id(&format!("{ns}-b1")), id(&format!("{ns}-b2")));
    let batch = [
        (key_of(&consumer, &b1), fp),
        (key_of(&consumer, &b2), fp),
        (key_of(&consumer, &m1), fp),
    ];
    let got = claims.acquire_batch(&batch, lease).await.unwrap();
    let (ClaimState::Acquired { token: tb1 }, ClaimState::Acquired { token: tb2 }) =
        (got[0].clone(), got[1].clone())
    else {
        panic!("fresh keys in a batch are acquired: {got:?}");
    };
    assert!(
        matches!(got[2], ClaimState::Completed { .. }),
        "a completed key in a batch: {got:?}"
    );
    let done = claims
        .finish_batch(&[
            (
                key_of(&consumer, &b1),
                tb1,
                crate::Finish::Complete(Some(b"one")),
            ),
            (key_of(&consumer, &b2), tb2, crate::Finish::Release),
            (key_of(&consumer, &m2), stale, crate::Finish::Complete(None)),
        ])
        .await
        .unwrap();
    assert!(done[0].is_ok() && done[1].is_ok(), "{done:?}");
    assert_eq!(
        done[2].as_ref().unwrap_err().kind(),
        crate::ErrorKind::Conflict,
        "a fenced item fails alone"
    );
    let again = claims.acquire_batch(&batch[..2], lease).await.unwrap();
    assert_eq!(
        again[0],
        ClaimState::Completed {
            result: Some(b"one".to_vec())
        }
    );
    assert!(
        matches!(again[1], ClaimState::Acquired { token } if token > tb2),
        "released in a batch: {again:?}"
    );

    // Purge removes old completed claims only.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = claims.purge(Duration::from_millis(1), 1000).await.unwrap();
    assert!(purged >= 2, "old completed claims are purged ({purged})");
    assert!(
        matches!(
            claims
                .acquire(key_of(&consumer, &m3), fp, Duration::from_secs(30))
                .await
                .unwrap(),
            ClaimState::InProgress { .. }
        ),
        "in-progress claims are never purged"
    );
}

/// Whether the service at `addr` (`host:port`) answers, for tests that need a real one.
///
/// When it does not: with `JUSTONCE_REQUIRE_SERVICES=1` (as `.ci/run` sets) this panics, so
/// the test fails; without it, it prints a loud line saying the test skipped and returns
/// `false`, and the caller returns early.
pub fn service_available(name: &str, addr: &str) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    let up = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    if up {
        return true;
    }
    if std::env::var("JUSTONCE_REQUIRE_SERVICES").is_ok_and(|v| v == "1") {
        panic!("{name} is not reachable at {addr} and JUSTONCE_REQUIRE_SERVICES=1: start it (see DEVELOPERS.md)");
    }
    eprintln!("SKIPPED: {name} is not reachable at {addr}; this test did not run (set JUSTONCE_REQUIRE_SERVICES=1 to make it fail instead)");
    false
}

/// A name no other test run uses at the same time (`prefix_PID_NANOS`), for the tables,
/// queues and streams a test creates on a shared service.
///
/// ```
/// let a = justonce_core::conformance::unique_name("jo_t");
/// assert!(a.starts_with("jo_t_") && justonce_core::validate_identifier(&a).is_ok());
/// ```
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{}_{nanos:x}_{n}", std::process::id())
}
