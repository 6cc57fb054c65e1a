//! The [`ClaimStore`] contract, one function per rule, for stores built with leases of
//! [`LEASE`]: the rules wait for leases to run out. [`claim_store_tests!`](crate::claim_store_tests)
//! stamps them as tests.

use std::sync::Arc;
use std::time::Duration;

use justonce_core::{ClaimState, ClaimStore, DedupKey, ErrorKind, Fingerprint, Finish, MessageId};

/// The lease the rules take claims with.
pub const LEASE: Duration = Duration::from_millis(200);

fn id(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"effect")
}

fn key<'a>(consumer: &'a str, m: &'a MessageId) -> DedupKey<'a> {
    DedupKey {
        consumer,
        message_id: m,
    }
}

async fn acquire<C: ClaimStore + ?Sized>(claims: &C, consumer: &str, m: &MessageId) -> ClaimState {
    claims.acquire(key(consumer, m), fp(), LEASE).await.unwrap()
}

async fn acquired<C: ClaimStore + ?Sized>(claims: &C, consumer: &str, m: &MessageId) -> u64 {
    match acquire(claims, consumer, m).await {
        ClaimState::Acquired { token } => token,
        other => panic!("a free key is acquired, got {other:?}"),
    }
}

/// A second acquire while the lease runs is `InProgress`, never done, and says when to look
/// again (within the lease).
pub async fn a_held_claim_is_in_progress<C: ClaimStore + 'static>(claims: &Arc<C>, ns: &str) {
    let (consumer, m) = (format!("{ns}-c"), id(&format!("{ns}-k1")));
    acquired(claims.as_ref(), &consumer, &m).await;
    match acquire(claims.as_ref(), &consumer, &m).await {
        ClaimState::InProgress { retry_after } => assert!(
            retry_after <= LEASE,
            "retry_after {retry_after:?} is within the lease {LEASE:?}"
        ),
        other => panic!("a held claim is in progress, got {other:?}"),
    }
}

/// A release lets a retry take the claim at once, with a higher fencing token.
pub async fn a_release_lets_a_retry_in_with_a_higher_token<C: ClaimStore + 'static>(
    claims: &Arc<C>,
    ns: &str,
) {
    let (consumer, m) = (format!("{ns}-c"), id(&format!("{ns}-k1")));
    let t1 = acquired(claims.as_ref(), &consumer, &m).await;
    claims.release(key(&consumer, &m), t1).await.unwrap();
    let t2 = acquired(claims.as_ref(), &consumer, &m).await;
    assert!(
        t2 > t1,
        "the token grows on every new holder ({t1} -> {t2})"
    );
}

/// A completion stores the result; later acquires get it back, and the same id with another
/// payload is a conflict.
pub async fn a_completed_claim_returns_its_result<C: ClaimStore + 'static>(
    claims: &Arc<C>,
    ns: &str,
) {
    let (consumer, m) = (format!("{ns}-c"), id(&format!("{ns}-k1")));
    let t = acquired(claims.as_ref(), &consumer, &m).await;
    claims
        .complete(key(&consumer, &m), t, Some(b"receipt-42"))
        .await
        .unwrap();
    assert_eq!(
        acquire(claims.as_ref(), &consumer, &m).await,
        ClaimState::Completed {
            result: Some(b"receipt-42".to_vec())
        },
        "a completed claim is a duplicate with its stored result"
    );
    assert_eq!(
        claims
            .acquire(key(&consumer, &m), Fingerprint::of(b"other"), LEASE)
            .await
            .unwrap(),
        ClaimState::Conflict { stored: fp() },
        "same id, other payload is a conflict"
    );
}

/// A holder that stalls past its lease is taken over with a higher token; its late
/// completion is refused, and its late release does not free the new holder's claim.
pub async fn an_expired_holder_is_taken_over_and_fenced<C: ClaimStore + 'static>(
    claims: &Arc<C>,
    ns: &str,
) {
    let (consumer, m) = (format!("{ns}-c"), id(&format!("{ns}-k2")));
    let stale = acquired(claims.as_ref(), &consumer, &m).await;
    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    let ClaimState::Acquired { token: fresh } = acquire(claims.as_ref(), &consumer, &m).await
    else {
        panic!("an expired lease is taken over");
    };
    assert!(fresh > stale, "the takeover has a higher fencing token");
    let err = claims
        .complete(key(&consumer, &m), stale, None)
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Conflict,
        "a stale completion is refused: {err}"
    );
    claims.release(key(&consumer, &m), stale).await.unwrap();
    assert!(
        matches!(
            acquire(claims.as_ref(), &consumer, &m).await,
            ClaimState::InProgress { .. }
        ),
        "a stale release does not free the new holder's claim"
    );
    claims
        .complete(key(&consumer, &m), fresh, None)
        .await
        .unwrap();
}

/// Claims are scoped by consumer: another consumer acquires the same id.
pub async fn claims_are_scoped_by_consumer<C: ClaimStore + 'static>(claims: &Arc<C>, ns: &str) {
    let m = id(&format!("{ns}-k1"));
    acquired(claims.as_ref(), &format!("{ns}-a"), &m).await;
    acquired(claims.as_ref(), &format!("{ns}-b"), &m).await;
}

/// Two holders acquiring one key at once: exactly one gets it.
pub async fn concurrent_acquires_one_holder<C: ClaimStore + 'static>(claims: &Arc<C>, ns: &str) {
    let (consumer, m) = (format!("{ns}-c"), id(&format!("{ns}-k3")));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (claims, consumer, m) = (claims.clone(), consumer.clone(), m.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                match claims
                    .acquire(key(&consumer, &m), fp(), Duration::from_secs(30))
                    .await
                {
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
}

/// The batch forms answer as the single ones, item by item; a fenced item fails alone.
pub async fn batch_forms_answer_as_single_ones<C: ClaimStore + 'static>(claims: &Arc<C>, ns: &str) {
    let consumer = format!("{ns}-c");
    let (b1, b2, done_id, stale_id) = (
        id(&format!("{ns}-b1")),
        id(&format!("{ns}-b2")),
        id(&format!("{ns}-done")),
        id(&format!("{ns}-stale")),
    );
    let t = acquired(claims.as_ref(), &consumer, &done_id).await;
    claims
        .complete(key(&consumer, &done_id), t, None)
        .await
        .unwrap();
    let stale = acquired(claims.as_ref(), &consumer, &stale_id).await;
    tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
    acquired(claims.as_ref(), &consumer, &stale_id).await;

    let batch = [
        (key(&consumer, &b1), fp()),
        (key(&consumer, &b2), fp()),
        (key(&consumer, &done_id), fp()),
    ];
    let got = claims.acquire_batch(&batch, LEASE).await.unwrap();
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
            (key(&consumer, &b1), tb1, Finish::Complete(Some(b"one"))),
            (key(&consumer, &b2), tb2, Finish::Release),
            (key(&consumer, &stale_id), stale, Finish::Complete(None)),
        ])
        .await
        .unwrap();
    assert!(done[0].is_ok() && done[1].is_ok(), "{done:?}");
    assert_eq!(
        done[2].as_ref().unwrap_err().kind(),
        ErrorKind::Conflict,
        "a fenced item fails alone"
    );
    let again = claims.acquire_batch(&batch[..2], LEASE).await.unwrap();
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
}

/// The purge removes old completed claims, never one in progress.
pub async fn purge_removes_old_completed_claims_only<C: ClaimStore + 'static>(
    claims: &Arc<C>,
    ns: &str,
) {
    let consumer = format!("{ns}-c");
    let (done1, done2, held) = (
        id(&format!("{ns}-d1")),
        id(&format!("{ns}-d2")),
        id(&format!("{ns}-held")),
    );
    for m in [&done1, &done2] {
        let t = acquired(claims.as_ref(), &consumer, m).await;
        claims.complete(key(&consumer, m), t, None).await.unwrap();
    }
    claims
        .acquire(key(&consumer, &held), fp(), Duration::from_secs(30))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = claims.purge(Duration::from_millis(1), 1000).await.unwrap();
    assert!(purged >= 2, "old completed claims are purged ({purged})");
    assert!(
        matches!(
            acquire(claims.as_ref(), &consumer, &done1).await,
            ClaimState::Acquired { .. }
        ),
        "a purged claim is free again"
    );
    assert!(
        matches!(
            claims
                .acquire(key(&consumer, &held), fp(), Duration::from_secs(30))
                .await
                .unwrap(),
            ClaimState::InProgress { .. }
        ),
        "in-progress claims are never purged"
    );
}
