use std::sync::Arc;
use std::time::Duration;

use justonce_core::{conformance, DeadLetterReason, ErrorKind, Message, Publisher, Source};
use justonce_sql::{SqliteQueue, SqliteQueueOptions, SqliteStore};

fn url(dir: &tempfile::TempDir, file: &str) -> String {
    format!("sqlite:{}", dir.path().join(file).display())
}

async fn queue(dir: &tempfile::TempDir, lease: Duration) -> SqliteQueue {
    let mut opts = SqliteQueueOptions::default();
    opts.lease = lease;
    opts.poll_interval = Duration::from_millis(10);
    SqliteQueue::open_with(&url(dir, "q.db"), "work", opts)
        .await
        .unwrap()
}

#[tokio::test]
async fn sqlite_queue_keeps_the_queue_contract() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(200);
    let q = queue(&dir, lease).await;
    conformance::queue(&q, lease, "sqlite").await;
    let stats = q.stats().await.unwrap();
    assert_eq!(stats.pending, 0);
    assert_eq!(stats.dead_letters, 1);
    assert_eq!(
        stats.deliveries, 6,
        "3 first deliveries, c twice more, b once more"
    );
    assert_eq!(stats.redeliveries, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_keeps_the_dedup_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    conformance::dedup_store(Arc::new(store), "sqlite").await;
}

#[tokio::test]
async fn queues_sharing_a_file_stay_apart_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let u = url(&dir, "shared.db");
    let a = SqliteQueue::open(&u, "a").await.unwrap();
    let b = SqliteQueue::open(&u, "b").await.unwrap();
    a.publish(&Message::new("to a").with_id("1").unwrap())
        .await
        .unwrap();
    assert!(b.receive(10, Duration::ZERO).await.unwrap().is_empty());
    drop(a);
    let a = SqliteQueue::open(&u, "a").await.unwrap();
    let got = a.receive(10, Duration::ZERO).await.unwrap();
    assert_eq!(
        got.len(),
        1,
        "a published message is durable across a reopen"
    );
    assert_eq!(got[0].message.payload(), b"to a");
}

#[tokio::test]
async fn dead_letters_keep_the_message_and_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let q = queue(&dir, Duration::from_secs(30)).await;
    let m = Message::new("{}")
        .with_id("d-1")
        .unwrap()
        .with_header("tenant", "acme")
        .with_content_type("application/json");
    q.publish(&m).await.unwrap();
    let got = q.receive(1, Duration::ZERO).await.unwrap();
    let reason = DeadLetterReason {
        error: "invalid input: amount must be positive".into(),
        attempts: got[0].attempt,
        source_queue: "work".into(),
        consumer: "billing".into(),
    };
    q.dead_letter(&got[0], &reason).await.unwrap();
    let letters = q.dead_letters().await.unwrap();
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].reason, reason);
    let dl = &letters[0].message;
    assert_eq!(dl.id().unwrap().as_str(), "d-1");
    assert_eq!(dl.header("tenant"), Some("acme"));
    assert_eq!(
        dl.header("x-justonce-error"),
        Some("invalid input: amount must be positive")
    );
    assert_eq!(dl.content_type(), Some("application/json"));
    assert_eq!(q.stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn wrong_urls_say_what_to_do() {
    let e = SqliteQueue::open("postgres://localhost/test", "q")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("use sqlite:PATH"), "{e}");
    let e = SqliteStore::open("sqlite:/nonexistent-dir/justonce/x.db")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect);
    assert!(
        e.to_string()
            .contains("cannot open `sqlite:/nonexistent-dir/justonce/x.db`"),
        "{e}"
    );
}
