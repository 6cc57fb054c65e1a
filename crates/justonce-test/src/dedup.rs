//! The [`DedupStore`] contract, one function per rule. Each takes a store and a namespace
//! of its own (`ns`, for keys that no other test uses on a shared database), and panics with
//! the rule's sentence when the store breaks it. [`dedup_store_tests!`](crate::dedup_store_tests)
//! stamps them as tests.

use std::time::Duration;

use justonce_core::{Claim, DedupKey, DedupStore, Fingerprint, Message, MessageId};

fn id(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"payload")
}

fn other_fp() -> Fingerprint {
    Fingerprint::of(b"another payload")
}

/// One claim in a transaction of its own, committed or rolled back: its answer.
async fn claim_alone<S: DedupStore>(
    store: &S,
    consumer: &str,
    message_id: &MessageId,
    fp: Fingerprint,
    commit: bool,
) -> Claim {
    let mut tx = store.begin().await.unwrap();
    let key = DedupKey {
        consumer,
        message_id,
    };
    let claim = store.claim(&mut tx, key, fp).await.unwrap();
    if commit {
        store.commit(tx).await.unwrap();
    } else {
        store.rollback(tx).await.unwrap();
    }
    claim
}

/// The message whose payload has fingerprint `fp` ([`fp`] or [`other_fp`]).
fn message_of(fp: Fingerprint) -> Message {
    let m = Message::new("payload");
    if m.fingerprint() == fp {
        m
    } else {
        Message::new("another payload")
    }
}

/// `keys` as messages, each with the payload of its fingerprint.
fn messages_of(keys: &[(&MessageId, Fingerprint)]) -> Vec<Message> {
    keys.iter().map(|(_, f)| message_of(*f)).collect()
}

/// `begin_with_claims` of messages with `keys`' ids and fingerprints, then its transaction
/// committed or rolled back: the answers.
async fn begin_claimed_then<S: DedupStore>(
    store: &S,
    consumer: &str,
    keys: Vec<(&MessageId, Fingerprint)>,
    commit: bool,
) -> Vec<Claim> {
    let messages = messages_of(&keys);
    let pairs: Vec<(&MessageId, &Message)> = keys
        .iter()
        .zip(&messages)
        .map(|((id, _), m)| (*id, m))
        .collect();
    let begun = store.begin_with_claims(consumer, &pairs).await.unwrap();
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

/// A fresh key is `Fresh`; once committed, the same key is a `Duplicate`, and the same id
/// with another payload a `Conflict` naming the stored fingerprint.
pub async fn fresh_then_duplicate_then_conflict<S: DedupStore + Clone>(store: &S, ns: &str) {
    let (consumer, m1) = (format!("{ns}-c"), id(&format!("{ns}-m1")));
    let key = DedupKey {
        consumer: &consumer,
        message_id: &m1,
    };
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key, fp()).await.unwrap(),
        Claim::Fresh,
        "first claim is fresh"
    );
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key, fp()).await.unwrap(),
        Claim::Duplicate,
        "a committed claim makes the same key a duplicate"
    );
    assert_eq!(
        store.claim(&mut tx, key, other_fp()).await.unwrap(),
        Claim::Conflict { stored: fp() },
        "same id, other payload is a conflict naming the stored fingerprint"
    );
    store.rollback(tx).await.unwrap();
}

/// A dedup key is (consumer, message id): another consumer's claim of the same id is fresh
/// (contract 2).
pub async fn keys_are_scoped_by_consumer<S: DedupStore + Clone>(store: &S, ns: &str) {
    let m1 = id(&format!("{ns}-m1"));
    let (a, b) = (format!("{ns}-a"), format!("{ns}-b"));
    assert_eq!(claim_alone(store, &a, &m1, fp(), true).await, Claim::Fresh);
    assert_eq!(
        claim_alone(store, &b, &m1, fp(), true).await,
        Claim::Fresh,
        "another consumer's claim of the same message id is fresh"
    );
}

/// A claim rolled back with its transaction leaves nothing behind.
pub async fn rollback_forgets_a_claim<S: DedupStore + Clone>(store: &S, ns: &str) {
    let (consumer, m2) = (format!("{ns}-c"), id(&format!("{ns}-m2")));
    assert_eq!(
        claim_alone(store, &consumer, &m2, fp(), false).await,
        Claim::Fresh
    );
    assert_eq!(
        claim_alone(store, &consumer, &m2, fp(), false).await,
        Claim::Fresh,
        "rollback discards a claim"
    );
}

/// A claim rolled back to its savepoint is gone, one whose savepoint was released commits
/// with the rest of the transaction.
pub async fn savepoints_keep_or_discard_their_claims<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let (kept, dropped) = (id(&format!("{ns}-kept")), id(&format!("{ns}-dropped")));
    let key = |m| DedupKey {
        consumer: &consumer,
        message_id: m,
    };
    let mut tx = store.begin().await.unwrap();
    store.savepoint(&mut tx).await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key(&kept), fp()).await.unwrap(),
        Claim::Fresh
    );
    store.release_savepoint(&mut tx).await.unwrap();
    store.savepoint(&mut tx).await.unwrap();
    assert_eq!(
        store.claim(&mut tx, key(&dropped), fp()).await.unwrap(),
        Claim::Fresh
    );
    store.rollback_to_savepoint(&mut tx).await.unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(
        claim_alone(store, &consumer, &kept, fp(), false).await,
        Claim::Duplicate,
        "released savepoint commits"
    );
    assert_eq!(
        claim_alone(store, &consumer, &dropped, fp(), false).await,
        Claim::Fresh,
        "rolled-back savepoint discards"
    );
}

/// Two transactions claiming one key at the same time: exactly one commits it as `Fresh`.
pub async fn concurrent_claims_of_one_key_one_wins<S: DedupStore + Clone>(store: &S, ns: &str) {
    let (consumer, m4) = (format!("{ns}-c"), id(&format!("{ns}-m4")));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (store, consumer, m4) = (store.clone(), consumer.clone(), m4.clone());
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
                match store.claim(&mut tx, key, fp()).await {
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
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.unwrap());
    }
    assert_eq!(
        wins, 1,
        "two concurrent claims of one key: exactly one wins"
    );
}

/// Two batches of the same two keys through `begin_with_claims` (which a store may run as an
/// insert that fails on a stored key): one commits both as `Fresh`, the other then finds
/// both.
pub async fn concurrent_batches_of_the_same_keys_one_wins<S: DedupStore + Clone>(
    store: &S,
    ns: &str,
) {
    let consumer = format!("{ns}-c");
    let (m11, m12) = (id(&format!("{ns}-m11")), id(&format!("{ns}-m12")));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (store, consumer) = (store.clone(), consumer.clone());
        let (m11, m12) = (m11.clone(), m12.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let payload = message_of(fp());
                match store
                    .begin_with_claims(&consumer, &[(&m12, &payload), (&m11, &payload)])
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
                    Err(e) => panic!("begin_with_claims failed: {e}"),
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
}

/// `claim_many` answers each key as claims one by one would, in order, with repeats inside
/// the batch and keys recorded before; a committed `claim_many` records its keys.
pub async fn claim_many_answers_as_claims_one_by_one<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let (m1, m5, m6, m7) = (
        id(&format!("{ns}-m1")),
        id(&format!("{ns}-m5")),
        id(&format!("{ns}-m6")),
        id(&format!("{ns}-m7")),
    );
    assert_eq!(
        claim_alone(store, &consumer, &m1, fp(), true).await,
        Claim::Fresh
    );
    // m5 is new and comes twice; m6 is new, then again with another payload; m7 is new.
    // The order is not sorted on purpose.
    let keys = [
        (&m7, fp()),
        (&m5, fp()),
        (&m1, fp()),
        (&m5, fp()),
        (&m6, fp()),
        (&m1, other_fp()),
        (&m6, other_fp()),
    ];
    let mut tx = store.begin().await.unwrap();
    let answers = store.claim_many(&mut tx, &consumer, &keys).await.unwrap();
    assert_eq!(
        answers,
        vec![
            Claim::Fresh,
            Claim::Fresh,
            Claim::Duplicate,
            Claim::Duplicate,
            Claim::Fresh,
            Claim::Conflict { stored: fp() },
            Claim::Conflict { stored: fp() },
        ],
        "claim_many answers each key as one-by-one claims would, in order"
    );
    store.commit(tx).await.unwrap();
    assert_eq!(
        claim_alone(store, &consumer, &m7, fp(), false).await,
        Claim::Duplicate,
        "a committed claim_many records its keys"
    );
}

/// A `claim_many` rolled back with its transaction leaves nothing behind.
pub async fn a_rolled_back_claim_many_leaves_nothing<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let (m5, m7) = (id(&format!("{ns}-m5")), id(&format!("{ns}-m7")));
    for _ in 0..2 {
        let mut tx = store.begin().await.unwrap();
        let answers = store
            .claim_many(&mut tx, &consumer, &[(&m5, fp()), (&m7, fp())])
            .await
            .unwrap();
        assert_eq!(
            answers,
            vec![Claim::Fresh, Claim::Fresh],
            "a rolled-back claim_many leaves nothing behind"
        );
        store.rollback(tx).await.unwrap();
    }
}

/// `begin_with_claims` of one key (a store may fold that claim into its `BEGIN`): fresh, gone
/// after a rollback, then a duplicate or a conflict, its transaction usable and rolled back
/// cleanly.
pub async fn begin_with_claims_answers_one_key<S: DedupStore + Clone>(store: &S, ns: &str) {
    let (consumer, m8) = (format!("{ns}-c"), id(&format!("{ns}-m8")));
    assert_eq!(
        begin_claimed_then(store, &consumer, vec![(&m8, fp())], false).await,
        vec![Claim::Fresh],
        "begin_with_claims: a new key is fresh"
    );
    assert_eq!(
        begin_claimed_then(store, &consumer, vec![(&m8, fp())], true).await,
        vec![Claim::Fresh],
        "a rolled-back begin_with_claims leaves nothing behind"
    );
    for (fp_now, want, what) in [
        (fp(), Claim::Duplicate, "a committed key is a duplicate"),
        (
            other_fp(),
            Claim::Conflict { stored: fp() },
            "another payload conflicts",
        ),
    ] {
        assert_eq!(
            begin_claimed_then(store, &consumer, vec![(&m8, fp_now)], false).await,
            vec![want],
            "begin_with_claims: {what}"
        );
    }
}

/// `begin_with_claims` answers a batch with stored, conflicting and new keys as `claim_many`
/// does, and a batch of new keys with a repeat (which a store may insert without looking
/// first).
pub async fn begin_with_claims_answers_a_batch<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let (m1, m8, m3) = (
        id(&format!("{ns}-m1")),
        id(&format!("{ns}-m8")),
        id(&format!("{ns}-m3")),
    );
    claim_alone(store, &consumer, &m1, fp(), true).await;
    claim_alone(store, &consumer, &m8, fp(), true).await;
    assert_eq!(
        begin_claimed_then(
            store,
            &consumer,
            vec![(&m1, fp()), (&m8, other_fp()), (&m3, fp())],
            false
        )
        .await,
        vec![
            Claim::Duplicate,
            Claim::Conflict { stored: fp() },
            Claim::Fresh
        ],
        "begin_with_claims answers a batch as claim_many does"
    );
    // Out of byte order ("m10" sorts first), one of them twice.
    let (m9, m10) = (id(&format!("{ns}-m9")), id(&format!("{ns}-m10")));
    assert_eq!(
        begin_claimed_then(
            store,
            &consumer,
            vec![(&m9, other_fp()), (&m10, fp()), (&m9, other_fp())],
            false
        )
        .await,
        vec![Claim::Fresh, Claim::Fresh, Claim::Duplicate],
        "begin_with_claims: a new batch with a repeat"
    );
}

/// A committed `begin_with_claims` records each key with its own fingerprint, and an id that SQL
/// would have to quote exactly as `claim` reads it.
pub async fn begin_with_claims_records_each_fingerprint_and_odd_ids<S: DedupStore + Clone>(
    store: &S,
    ns: &str,
) {
    let consumer = format!("{ns}-c");
    let (m9, m10) = (id(&format!("{ns}-m9")), id(&format!("{ns}-m10")));
    let odd = id(&format!("{ns}-it's a \\'quoted'\\ id"));
    assert_eq!(
        begin_claimed_then(
            store,
            &consumer,
            vec![(&m9, other_fp()), (&m10, fp())],
            true
        )
        .await,
        vec![Claim::Fresh, Claim::Fresh],
        "begin_with_claims: a new batch"
    );
    assert_eq!(
        claim_alone(store, &consumer, &m9, other_fp(), false).await,
        Claim::Duplicate,
        "a committed batch records each key with its fingerprint"
    );
    assert_eq!(
        claim_alone(store, &consumer, &m10, other_fp(), false).await,
        Claim::Conflict { stored: fp() },
        "a committed batch records each key with its fingerprint"
    );
    assert_eq!(
        begin_claimed_then(store, &consumer, vec![(&odd, fp())], true).await,
        vec![Claim::Fresh],
        "an id with quotes and backslashes"
    );
    assert_eq!(
        claim_alone(store, &consumer, &odd, fp(), false).await,
        Claim::Duplicate,
        "begin_with_claims recorded the id exactly as claim reads it"
    );
}

/// `begin_with_claims` hashes the payloads itself (while its transaction begins, or before a
/// claim folded into the `BEGIN`): the answers of `begin_with_claims`, for a batch and for one
/// message, and the payloads' fingerprints recorded.
pub async fn begin_with_claims_hashes_the_payloads<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let (m1, m8, m13, m14) = (
        id(&format!("{ns}-m1")),
        id(&format!("{ns}-m8")),
        id(&format!("{ns}-m13")),
        id(&format!("{ns}-m14")),
    );
    claim_alone(store, &consumer, &m1, fp(), true).await;
    claim_alone(store, &consumer, &m8, fp(), true).await;
    let (same, other) = (Message::new("payload"), Message::new("another payload"));
    let begun = store
        .begin_with_claims(&consumer, &[(&m8, &other), (&m13, &same), (&m1, &same)])
        .await
        .unwrap();
    assert_eq!(
        end(store, begun, true).await,
        vec![
            Claim::Conflict { stored: fp() },
            Claim::Fresh,
            Claim::Duplicate
        ],
        "begin_with_claims answers a batch of payloads as claim_many does"
    );
    assert_eq!(
        claim_alone(store, &consumer, &m13, fp(), false).await,
        Claim::Duplicate,
        "begin_with_claims recorded the payload's fingerprint"
    );
    for (m, want) in [
        (&m14, Claim::Fresh),
        (&m13, Claim::Conflict { stored: fp() }),
    ] {
        let begun = store
            .begin_with_claims(&consumer, &[(m, &other)])
            .await
            .unwrap();
        assert_eq!(
            end(store, begun, false).await,
            vec![want],
            "begin_with_claims of one message"
        );
    }
}

/// Records older than the retention go, at most `batch` at a time, and only those.
pub async fn purge_removes_old_records_in_batches<S: DedupStore + Clone>(store: &S, ns: &str) {
    let consumer = format!("{ns}-c");
    let old: Vec<MessageId> = (0..3).map(|i| id(&format!("{ns}-old{i}"))).collect();
    for m in &old {
        claim_alone(store, &consumer, m, fp(), true).await;
    }
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
    assert!(purged >= 3, "every expired record is purged ({purged})");
    assert_eq!(
        claim_alone(store, &consumer, &old[0], fp(), false).await,
        Claim::Fresh,
        "a purged key is fresh again"
    );
    let young = id(&format!("{ns}-young"));
    claim_alone(store, &consumer, &young, fp(), true).await;
    store.purge(Duration::from_secs(3600), 1000).await.unwrap();
    assert_eq!(
        claim_alone(store, &consumer, &young, fp(), false).await,
        Claim::Duplicate,
        "a record within the retention stays"
    );
}
