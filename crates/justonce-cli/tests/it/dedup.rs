//! `justonce dedup` on the embedded SQLite store: records per consumer, one key, what a
//! delivery would do, a stuck claim freed, the purge; a missing file is an error.

use std::process::Output;
use std::time::Duration;

use crate::tool::json;
use justonce::sql::{SqliteClaimStore, SqliteStore};
use justonce::{
    Claim, ClaimState, ClaimStore, DedupKey, DedupStore, Fingerprint, MessageId, Store,
};

fn dedup(args: &[&str]) -> Output {
    crate::tool::run("dedup", args)
}

#[tokio::test]
async fn dedup_state_is_read_explained_and_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let surl = format!("sqlite:{}", dir.path().join("app.db").display());
    let curl = format!("sqlite:{}", dir.path().join("claims.db").display());
    let store = SqliteStore::open(&surl).await.unwrap();
    let ids: Vec<MessageId> = ["ORD-1", "ORD-2", "ORD-3"]
        .map(|i| MessageId::new(i).unwrap())
        .into();
    let fp = Fingerprint::of(br#"{"order_id":"ORD-1"}"#);
    let mut tx = store.begin().await.unwrap();
    for (consumer, id) in [
        ("payments", &ids[0]),
        ("payments", &ids[1]),
        ("shipping", &ids[2]),
    ] {
        let key = DedupKey {
            consumer,
            message_id: id,
        };
        assert_eq!(store.claim(&mut tx, key, fp).await.unwrap(), Claim::Fresh);
    }
    store.commit(tx).await.unwrap();
    let claims = SqliteClaimStore::open(&curl).await.unwrap();
    let mail = MessageId::new("MAIL-1").unwrap();
    let key = DedupKey {
        consumer: "mailer",
        message_id: &mail,
    };
    let hour = Duration::from_secs(3600);
    let ClaimState::Acquired { token: stuck } = claims.acquire(key, fp, hour).await.unwrap() else {
        panic!("the first acquire takes the claim")
    };

    let s = ["--store", surl.as_str(), "--json"];
    let stats = json(&dedup(
        &[&["stats"][..], &s, &["--retention-secs", "86400"]].concat(),
    ));
    let consumers = stats["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 2, "{stats}");
    assert_eq!(
        (
            consumers[0]["consumer"].as_str(),
            consumers[0]["records"].as_u64()
        ),
        (Some("payments"), Some(2))
    );
    assert_eq!(consumers[0]["oldest_past_retention"], false);

    let show = json(&dedup(&[&["show", "payments", "ORD-1"][..], &s].concat()));
    assert_eq!(show["recorded"], true);
    assert_eq!(show["fingerprint"], fp.to_hex());

    let same = dir.path().join("same.json");
    std::fs::write(&same, br#"{"order_id":"ORD-1"}"#).unwrap();
    let other = dir.path().join("other.json");
    std::fs::write(&other, br#"{"order_id":"ORD-1","amount":9}"#).unwrap();
    let explain = |id: &str, file: &std::path::Path| {
        let file = file.to_str().unwrap().to_owned();
        json(&dedup(
            &[&["explain", "payments", id, "--payload", &file][..], &s].concat(),
        ))["outcome"]
            .clone()
    };
    assert_eq!(explain("ORD-1", &same), "duplicate");
    assert_eq!(explain("ORD-1", &other), "conflict");
    assert_eq!(explain("ORD-9", &same), "applied");
    let ignored = json(&dedup(
        &[
            &[
                "explain",
                "payments",
                "ORD-1",
                "--payload",
                other.to_str().unwrap(),
            ][..],
            &["--on-conflict", "ignore"],
            &s,
        ]
        .concat(),
    ));
    assert_eq!(ignored["outcome"], "duplicate", "{ignored}");

    let c = ["--claims", curl.as_str()];
    let held = json(&dedup(
        &[&["show", "mailer", "MAIL-1"][..], &s, &c].concat(),
    ));
    assert_eq!(held["claim"]["state"], "in_progress");
    assert_eq!(held["claim"]["fence"], stuck);
    let released = json(&dedup(
        &[&["release", "mailer", "MAIL-1"][..], &s, &c].concat(),
    ));
    assert_eq!(released["released"], true);
    let fence = released["fence"].as_u64().unwrap();
    assert!(fence > stuck, "the release raises the fence");
    assert!(
        claims.complete(key, stuck, None).await.is_err(),
        "the stuck holder is refused"
    );
    let ClaimState::Acquired { token } = claims.acquire(key, fp, hour).await.unwrap() else {
        panic!("the freed claim is taken by the next delivery")
    };
    assert!(token > fence, "with a higher fence");
    let again = dedup(&[&["release", "mailer", "MAIL-9"][..], &s, &c].concat());
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(text.contains("\"released\":false"), "{text}");

    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = json(&dedup(
        &[&["purge", "--retention-secs", "0"][..], &s].concat(),
    ));
    assert_eq!(purged["deleted"], 3);
    let stats = json(&dedup(&[&["stats"][..], &s].concat()));
    assert!(stats["consumers"].as_array().unwrap().is_empty());

    let missing = dedup(&["stats", "--store", "sqlite:/nonexistent/dir/app.db"]);
    assert!(!missing.status.success());
    let e = String::from_utf8_lossy(&missing.stderr);
    assert!(e.contains("does not exist"), "{e}");
}
