//! Tests of `store.rs` that need no server.

use super::*;

#[test]
fn writes_become_four_arguments_each() {
    assert_eq!(
        Write::HIncrBy("b".into(), "a7".into(), -5).args(),
        [
            b"hincrby".to_vec(),
            b"b".to_vec(),
            b"a7".to_vec(),
            b"-5".to_vec()
        ]
    );
    assert_eq!(
        Write::Set("k".into(), b"v".to_vec(), Some(Duration::from_secs(2))).args()[3],
        b"2000".to_vec()
    );
    assert_eq!(Write::Del("k".into()).args()[2], Vec::<u8>::new());
}

#[test]
fn a_savepoint_rolls_back_its_writes_and_claims_only() {
    let mut tx = RedisTx::default();
    tx.incr_by("a", 1);
    tx.claims.push(Pending {
        key: "k1".into(),
        fp: Fingerprint::of(b"1"),
    });
    tx.savepoints.push((tx.writes.len(), tx.claims.len()));
    tx.incr_by("b", 1);
    tx.claims.push(Pending {
        key: "k2".into(),
        fp: Fingerprint::of(b"2"),
    });
    let (w, c) = tx.savepoints.pop().unwrap();
    tx.writes.truncate(w);
    tx.claims.truncate(c);
    assert_eq!(tx.writes, vec![Write::IncrBy("a".into(), 1)]);
    assert_eq!(tx.claims.len(), 1);
}
