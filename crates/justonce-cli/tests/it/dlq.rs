//! `justonce dlq` on the embedded SQLite queue: dead letters listed by failure, shown,
//! replayed (a dry run first), purged; bad input moves nothing.

use std::process::Output;
use std::time::Duration;

use crate::tool::json;
use justonce::sql::SqliteQueue;
use justonce::{DeadLetterReason, Message, Publisher, Source};

fn dlq(args: &[&str]) -> Output {
    crate::tool::run("dlq", args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Three dead letters: two payments to missing accounts (one failure group), one bad
/// payload.
async fn dead_letters(url: &str) -> SqliteQueue {
    let q = SqliteQueue::open(url, "orders").await.unwrap();
    let msgs = [
        ("ORD-1", "account 8 does not exist (order ORD-1)"),
        ("ORD-2", "account 9 does not exist (order ORD-2)"),
        (
            "ORD-3",
            "decode: payload is not the expected JSON: EOF at line 1",
        ),
    ];
    for (id, _) in msgs {
        q.publish(
            &Message::new(format!(r#"{{"order_id":"{id}"}}"#))
                .with_id(id)
                .unwrap(),
        )
        .await
        .unwrap();
    }
    let got = q.receive(10, Duration::from_secs(2)).await.unwrap();
    assert_eq!(got.len(), 3);
    for (d, (_, error)) in got.iter().zip(msgs) {
        let reason = DeadLetterReason {
            error: error.into(),
            attempts: 1,
            source_queue: "orders".into(),
            consumer: "payments".into(),
        };
        q.dead_letter(d, &reason).await.unwrap();
    }
    q
}

#[tokio::test]
async fn dead_letters_are_grouped_shown_replayed_and_purged() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let q = dead_letters(&url).await;
    let t = ["--transport", url.as_str(), "--queue", "orders"];

    let list = json(&dlq(&[&["list"][..], &t, &["--json"]].concat()));
    assert_eq!(list["dead_letters"], 3);
    let groups = list["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{list}");
    let missing = groups
        .iter()
        .find(|g| g["count"] == 2)
        .expect("the two missing accounts are one group");
    assert_eq!(missing["reason"], "account # does not exist (order ORD-#)");
    assert_eq!(missing["consumers"][0], "payments");
    assert!(missing["first"].as_str().unwrap().ends_with('Z'));
    let group = missing["group"].as_str().unwrap();

    let show = json(&dlq(&[&["show", "ORD-3"][..], &t, &["--json"]].concat()));
    assert_eq!(show["attempts"], 1);
    assert!(show["reason"].as_str().unwrap().starts_with("decode:"));
    assert_eq!(show["payload"], r#"{"order_id":"ORD-3"}"#);
    let raw = dlq(&[&["show", "ORD-3", "--raw"][..], &t].concat());
    assert_eq!(raw.stdout, br#"{"order_id":"ORD-3"}"#);

    let dry = json(&dlq(&[
        &["replay", "--group", group, "--dry-run"][..],
        &t,
        &["--json"],
    ]
    .concat()));
    assert_eq!(
        (dry["chosen"].as_u64(), dry["replayed"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(
        q.dead_letters().await.unwrap().len(),
        3,
        "a dry run moves nothing"
    );

    let done = json(&dlq(
        &[&["replay", "--group", group][..], &t, &["--json"]].concat()
    ));
    assert_eq!(done["replayed"], 2);
    assert_eq!(
        done["ids"],
        serde_json::json!(["ORD-1", "ORD-2"]),
        "the ids are kept"
    );
    assert_eq!(q.stats().await.unwrap().pending, 2, "back in the queue");
    assert_eq!(q.dead_letters().await.unwrap().len(), 1);

    let refused = dlq(&[&["purge", "--id", "ORD-3"][..], &t].concat());
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    assert_eq!(
        q.dead_letters().await.unwrap().len(),
        1,
        "not without --yes"
    );
    let purged = json(&dlq(&[
        &["purge", "--id", "ORD-3", "--yes"][..],
        &t,
        &["--json"],
    ]
    .concat()));
    assert_eq!(purged["purged"], 1);
    assert!(q.dead_letters().await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_input_is_a_clear_error_and_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("q.db").display());
    let q = dead_letters(&url).await;

    let unknown = dlq(&["list", "--transport", &url, "--queue", "nope"]);
    assert!(!unknown.status.success());
    assert!(
        stderr(&unknown).contains("no queue nope") && stderr(&unknown).contains("orders"),
        "{}",
        stderr(&unknown)
    );
    let again = dlq(&["list", "--transport", &url, "--queue", "nope"]);
    assert!(
        stderr(&again).contains("no queue nope"),
        "the failed open made no queue"
    );
    let typo = dir.path().join("typo.db");
    let missing = dlq(&["list", "--transport", &format!("sqlite:{}", typo.display())]);
    assert!(!missing.status.success());
    assert!(!typo.exists(), "a mistyped file is not created");
    let app = dir.path().join("app.db");
    std::fs::write(&app, b"").unwrap();
    let bare = dlq(&["list", "--transport", &format!("sqlite:{}", app.display())]);
    assert!(
        stderr(&bare).contains("no queue orders") && stderr(&bare).contains("none"),
        "{}",
        stderr(&bare)
    );
    let bytes = std::fs::read(&app).unwrap();
    assert!(
        !bytes.windows(8).any(|w| w == b"jo_queue"),
        "no queue tables made in it"
    );

    let t = ["--transport", url.as_str(), "--queue", "orders"];
    let nowhere = dlq(&[&["replay", "--all", "--to", "elsewhere"][..], &t].concat());
    assert!(!nowhere.status.success());
    assert!(
        stderr(&nowhere).contains("no queue elsewhere"),
        "{}",
        stderr(&nowhere)
    );
    let no_group = dlq(&[&["replay", "--group", "00000000"][..], &t].concat());
    assert!(stderr(&no_group).contains("no dead letters in failure group 00000000"));
    let no_id = dlq(&[&["replay", "--id", "ORD-404"][..], &t].concat());
    assert!(stderr(&no_id).contains("no dead letter with id ORD-404"));
    assert_eq!(q.dead_letters().await.unwrap().len(), 3, "nothing moved");
    assert_eq!(q.stats().await.unwrap().pending, 0);

    let unreachable = dlq(&[
        "list",
        "--transport",
        "postgres://postgres@127.0.0.1:1/test",
    ]);
    assert!(!unreachable.status.success());
    assert!(
        stderr(&unreachable)
            .contains("cannot connect to PostgreSQL at postgres://postgres@127.0.0.1:1/test"),
        "{}",
        stderr(&unreachable)
    );
    let wrong = dlq(&["list", "--transport", "redis://127.0.0.1"]);
    assert!(!wrong.status.success(), "{}", stderr(&wrong));
}
