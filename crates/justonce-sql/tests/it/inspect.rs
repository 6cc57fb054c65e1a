//! What tools read and fix (`InspectStore`, `InspectClaims`), the same on every database.

use std::time::{Duration, SystemTime};

use justonce_core::{
    Claim, ClaimRecordState, ClaimState, ClaimStore, DedupKey, DedupStore, Fingerprint,
    InspectClaims, InspectStore, MessageId,
};

/// Records per consumer and one record read back as committed; an unknown key has none.
pub(crate) async fn dedup_records_read_back<S: DedupStore + InspectStore>(store: &S, ns: &str) {
    let (a, b) = (format!("{ns}-a"), format!("{ns}-b"));
    let ids: Vec<MessageId> = (1..=3)
        .map(|i| MessageId::new(format!("m-{i}")).unwrap())
        .collect();
    let fp = Fingerprint::of(b"payload");
    let mut tx = store.begin().await.unwrap();
    for (consumer, id) in [(&a, &ids[0]), (&a, &ids[1]), (&b, &ids[2])] {
        let key = DedupKey {
            consumer,
            message_id: id,
        };
        assert_eq!(store.claim(&mut tx, key, fp).await.unwrap(), Claim::Fresh);
    }
    store.commit(tx).await.unwrap();
    let stats = store.dedup_stats().await.unwrap();
    let of = |c: &str| stats.iter().find(|s| s.consumer == c).cloned();
    assert_eq!(of(&a).map(|s| s.records), Some(2), "{stats:?}");
    assert_eq!(of(&b).map(|s| s.records), Some(1));
    let oldest = of(&a)
        .and_then(|s| s.oldest)
        .expect("the oldest record's time");
    let skew = Duration::from_secs(300);
    let now = SystemTime::now();
    assert!(
        oldest > now - skew && oldest < now + skew,
        "{oldest:?} is about now"
    );
    let record = store
        .dedup_record(DedupKey {
            consumer: &a,
            message_id: &ids[1],
        })
        .await
        .unwrap()
        .expect("the record of a claimed key");
    assert_eq!(record.fingerprint, fp, "with the payload's fingerprint");
    assert!(record.recorded_at.is_some());
    let unknown = store
        .dedup_record(DedupKey {
            consumer: &b,
            message_id: &ids[0],
        })
        .await
        .unwrap();
    assert!(
        unknown.is_none(),
        "another consumer's key is not this one's"
    );
    assert_eq!(
        store
            .purge_records(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
}

/// A claim held by a worker that will not finish it is released by force: the holder's
/// completion is refused, and the next acquire takes it with a higher token.
pub(crate) async fn a_forced_release_fences_the_holder<C: ClaimStore + InspectClaims>(
    claims: &C,
    ns: &str,
) {
    let id = MessageId::new(format!("{ns}-stuck")).unwrap();
    let key = DedupKey {
        consumer: "mailer",
        message_id: &id,
    };
    let fp = Fingerprint::of(b"mail");
    let hour = Duration::from_secs(3600);
    let ClaimState::Acquired { token: stuck } = claims.acquire(key, fp, hour).await.unwrap() else {
        panic!("a first acquire takes the claim")
    };
    let held = claims.claim_record(key).await.unwrap().expect("the claim");
    assert_eq!(held.token, stuck);
    assert!(
        matches!(held.state, ClaimRecordState::InProgress { lease_left } if lease_left > Duration::from_secs(3000)),
        "{held:?}"
    );
    assert!(matches!(
        claims.acquire(key, fp, hour).await.unwrap(),
        ClaimState::InProgress { .. }
    ));
    let bumped = claims
        .force_release(key)
        .await
        .unwrap()
        .expect("a claim in progress");
    assert!(bumped > stuck, "the release raises the token");
    assert!(
        claims.complete(key, stuck, Some(b"late")).await.is_err(),
        "the holder is fenced"
    );
    let ClaimState::Acquired { token } = claims.acquire(key, fp, hour).await.unwrap() else {
        panic!("after the release the claim can be taken")
    };
    assert!(token > bumped, "with a higher token");
    claims.complete(key, token, Some(b"sent")).await.unwrap();
    let done = claims.claim_record(key).await.unwrap().unwrap();
    assert!(
        matches!(done.state, ClaimRecordState::Completed { at: Some(_) }),
        "{done:?}"
    );
    assert_eq!(done.result.as_deref(), Some(&b"sent"[..]));
    assert_eq!(
        claims.force_release(key).await.unwrap(),
        None,
        "nothing in progress to free"
    );
    let other = MessageId::new(format!("{ns}-none")).unwrap();
    let none = DedupKey {
        consumer: "mailer",
        message_id: &other,
    };
    assert!(claims.claim_record(none).await.unwrap().is_none());
}
