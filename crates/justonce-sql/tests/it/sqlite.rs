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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_claims_keep_the_claim_contract() {
    let dir = tempfile::tempdir().unwrap();
    let claims = justonce_sql::SqliteClaimStore::open(&url(&dir, "c.db"))
        .await
        .unwrap();
    conformance::claim_store(Arc::new(claims), Duration::from_millis(200), "sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dedup_table_of_your_own_name_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = justonce_sql::SqliteStoreOptions::default();
    opts.dedup_table = "billing_dedup".into();
    let store = SqliteStore::open_with(&url(&dir, "s.db"), opts)
        .await
        .unwrap();
    conformance::dedup_store(Arc::new(store.clone()), "named").await;
    use justonce_core::{DedupKey, DedupStore, Fingerprint, MessageId, Store};
    let id = MessageId::new("named-1").unwrap();
    let mut tx = store.begin().await.unwrap();
    store
        .claim(
            &mut tx,
            DedupKey {
                consumer: "c",
                message_id: &id,
            },
            Fingerprint::of(b"x"),
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    let n: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM billing_dedup WHERE message_id = 'named-1'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(n, 1, "the record is in the named table");
    let default_table: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = 'jo_dedup'")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(default_table, 0, "and jo_dedup was never created");

    let mut bad = justonce_sql::SqliteStoreOptions::default();
    bad.dedup_table = "dedup; DROP TABLE ledger".into();
    let e = SqliteStore::open_with(&url(&dir, "s.db"), bad)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("not a valid SQL identifier"), "{e}");
}

#[tokio::test]
async fn the_state_machine_guard_moves_once_and_names_the_states_when_it_cannot() {
    use justonce_core::{Disposition, StateMachine, Transition};
    use justonce_sql::SqliteStateGuard;

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE orders (order_id TEXT PRIMARY KEY, status TEXT NOT NULL);
         INSERT INTO orders VALUES ('a', 'PENDING'), ('b', 'SHIPPED'), ('c', 'CANCELLED');",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let machine = StateMachine::new([
        ("PENDING", "PAID"),
        ("PAID", "SHIPPED"),
        ("PENDING", "CANCELLED"),
    ])
    .unwrap();
    let guard = SqliteStateGuard::new("orders", "order_id", "status", machine).unwrap();
    let mut conn = store.pool().acquire().await.unwrap();

    let check = [
        ("a", "PAID", Transition::Apply),
        ("a", "PAID", Transition::AlreadyDone),
        ("b", "PAID", Transition::AlreadyDone),
    ];
    for (key, target, expected) in check {
        assert_eq!(
            guard.transition(&mut conn, key, target).await.unwrap(),
            expected,
            "{key} -> {target}"
        );
    }
    let status: String = sqlx::query_scalar("SELECT status FROM orders WHERE order_id = 'a'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(status, "PAID");
    let invalid = guard.transition(&mut conn, "c", "PAID").await.unwrap();
    match invalid.to_disposition() {
        Some(Disposition::DeadLetter { reason }) => {
            assert_eq!(
                reason,
                "invalid transition CANCELLED -> PAID: PAID may only be reached from PENDING"
            )
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    let missing = guard
        .transition(&mut conn, "zzz", "PAID")
        .await
        .unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::InvalidInput);
    assert!(SqliteStateGuard::new(
        "orders;",
        "order_id",
        "status",
        StateMachine::new([("A", "B")]).unwrap()
    )
    .is_err());
}

#[tokio::test]
async fn the_version_guard_tells_stale_from_ahead() {
    use justonce_core::{Cas, Disposition};
    use justonce_sql::SqliteVersionGuard;

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    sqlx::raw_sql("CREATE TABLE accounts (id INTEGER PRIMARY KEY, version INTEGER NOT NULL); INSERT INTO accounts VALUES (7, 3);")
        .execute(store.pool())
        .await
        .unwrap();
    let guard = SqliteVersionGuard::new("accounts", "id", "version").unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    assert_eq!(guard.bump(&mut conn, "7", 3).await.unwrap(), Cas::Applied);
    assert_eq!(
        guard.bump(&mut conn, "7", 3).await.unwrap(),
        Cas::Stale { current: 4 },
        "a replay is stale"
    );
    assert_eq!(
        Cas::Stale { current: 4 }.to_disposition(3),
        Some(Disposition::Duplicate)
    );
    let ahead = guard.bump(&mut conn, "7", 6).await.unwrap();
    assert_eq!(
        ahead,
        Cas::Ahead { current: 4 },
        "a change from the future is not a duplicate"
    );
    assert!(matches!(
        ahead.to_disposition(6),
        Some(Disposition::Retry { .. })
    ));
    assert_eq!(
        guard.bump(&mut conn, "8", 0).await.unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}
