use std::sync::Arc;
use std::time::Duration;

use justonce_core::{DeadLetterReason, ErrorKind, Message, Publisher, Source};
use justonce_sql::{SqliteQueue, SqliteQueueOptions, SqliteStore};
use justonce_test::{transport::Queue, Backend};

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

/// The outbox contract, one test per rule, each on a database of its own.
mod sqlite_outbox {
    use super::*;

    justonce_test::outbox_store_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
        let outbox = store.outbox().await.unwrap();
        Some(Backend::new(justonce_test::outbox::Outboxed { store, outbox }).keeping(dir))
    });
}

/// The transport contract, one test per rule, each on a queue of its own.
mod sqlite_queue {
    use super::*;

    justonce_test::transport_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let lease = Duration::from_millis(200);
        let q = queue(&dir, lease).await;
        Some(Backend::new(Queue::new(q, lease)).keeping(dir))
    });
}

/// The dedup contract, one test per rule, each on a database of its own.
mod sqlite_store {
    use super::*;

    justonce_test::dedup_store_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
        Some(Backend::new(store).keeping(dir))
    });
}

/// A store whose dedup table is named `billing_dedup`.
async fn named_store(dir: &tempfile::TempDir) -> SqliteStore {
    let opts = justonce_sql::SqliteStoreOptions::default().dedup_table("billing_dedup");
    SqliteStore::open_with(&url(dir, "s.db"), opts)
        .await
        .unwrap()
}

/// The same on a dedup table of the application's own name.
mod sqlite_named_store {
    use super::*;

    justonce_test::dedup_store_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let store = named_store(&dir).await;
        Some(Backend::new(store).keeping(dir))
    });
}

/// The claim contract, one test per rule.
mod sqlite_claims {
    use super::*;

    justonce_test::claim_store_tests!(|| async {
        let dir = tempfile::tempdir().unwrap();
        let claims = justonce_sql::SqliteClaimStore::open(&url(&dir, "c.db"))
            .await
            .unwrap();
        Some(Backend::new(Arc::new(claims)).keeping(dir))
    });
}

/// The queue's receive rewrites a whole batch in one statement: its statement journal
/// stays in memory (`temp_store = MEMORY`, 2) instead of a file made and deleted per batch.
/// The store's connections run the application's queries and keep SQLite's default (0).
#[tokio::test]
async fn the_queue_keeps_its_statement_journals_in_memory_and_the_store_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let q = queue(&dir, Duration::from_secs(30)).await;
    let batch: Vec<Message> = (0..100)
        .map(|i| {
            Message::new(vec![b'x'; 1000])
                .with_id(format!("m{i}"))
                .unwrap()
        })
        .collect();
    q.publish_batch(&batch).await.unwrap();
    let got = q.receive(100, Duration::ZERO).await.unwrap();
    assert_eq!(got.len(), 100);
    let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
    q.ack(&receipts).await.unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    for (pool, want, what) in [(q.pool(), 2, "queue"), (store.pool(), 0, "store")] {
        // Every connection of the pool, held at once.
        let mut held = Vec::new();
        for _ in 0..pool.options().get_max_connections() {
            let mut c = pool.acquire().await.unwrap();
            let temp: i64 = sqlx::query_scalar("PRAGMA temp_store")
                .fetch_one(&mut *c)
                .await
                .unwrap();
            assert_eq!(temp, want, "temp_store of a {what} connection");
            held.push(c);
        }
    }
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
async fn a_dedup_table_of_your_own_name_is_the_only_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = named_store(&dir).await;
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

/// A single key's claim rides on `BEGIN IMMEDIATE` (`INSERT OR ROLLBACK`): a stored key
/// rolls that transaction back whole, so the one connection of the pool is free for the
/// next begin, and the claim answers as usual. An id with a quote and one with a NUL
/// (which SQL text cannot carry) are recorded as given.
#[tokio::test]
async fn a_claim_on_begin_leaves_no_transaction_behind_when_the_key_is_stored() {
    use justonce_core::{Claim, DedupStore, MessageId, Store};
    let dir = tempfile::tempdir().unwrap();
    let mut opts = justonce_sql::SqliteStoreOptions::default();
    opts.max_connections = 1;
    let store = SqliteStore::open_with(&url(&dir, "s.db"), opts)
        .await
        .unwrap();
    let (p, q) = (Message::new("p"), Message::new("q"));
    let fp = p.fingerprint();
    for raw in ["plain", "it's", "nul\0inside"] {
        let id = MessageId::new(raw).unwrap();
        let (tx, claims) = store.begin_with_claims("c", &[(&id, &p)]).await.unwrap();
        assert_eq!(claims, vec![Claim::Fresh], "{raw:?}: new");
        store.commit(tx).await.unwrap();
        for (m, want) in [(&p, Claim::Duplicate), (&q, Claim::Conflict { stored: fp })] {
            let (tx, claims) = store.begin_with_claims("c", &[(&id, m)]).await.unwrap();
            assert_eq!(claims, vec![want], "{raw:?}: stored");
            store.rollback(tx).await.unwrap();
        }
        let stored: String =
            sqlx::query_scalar("SELECT message_id FROM jo_dedup WHERE message_id = ?")
                .bind(raw)
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(stored, raw);
    }
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM jo_dedup")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(open, 3);
}

/// A single key's claim whose insert fails for another reason (the dedup table renamed
/// away: a deploy whose migration is missing) is a schema error, and leaves no
/// transaction behind either: the write lock is free, other writers go on, and once the
/// table is back the next claim works. Before the fix the `BEGIN IMMEDIATE` stayed open on
/// its connection for good, holding the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_begin_whose_table_is_gone_leaves_no_transaction_behind() {
    use justonce_core::{Claim, DedupStore, MessageId, Store};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    let other = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    let id = MessageId::new("m-1").unwrap();
    let m = Message::new("p");
    let rename = |from: &'static str, to: &'static str| {
        let pool = other.pool().clone();
        async move {
            tokio::time::timeout(
                Duration::from_secs(5),
                sqlx::raw_sql(&format!("ALTER TABLE {from} RENAME TO {to}")).execute(&pool),
            )
            .await
            .expect("the write lock is free: nothing waits for a transaction left open")
            .unwrap();
        }
    };
    rename("jo_dedup", "jo_dedup_away").await;
    for _ in 0..3 {
        let Err(err) = store.begin_with_claims("c", &[(&id, &m)]).await else {
            panic!("a claim without a dedup table");
        };
        assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
    }
    rename("jo_dedup_away", "jo_dedup").await;
    let (tx, claims) = store.begin_with_claims("c", &[(&id, &m)]).await.unwrap();
    assert_eq!(claims, vec![Claim::Fresh]);
    store.commit(tx).await.unwrap();
}

/// The purge sweeps the keys window by window: it deletes exactly the records older than
/// the retention, at most `batch` per call, each call going on where the last stopped. A
/// finished pass is not read again before the oldest record it left is due; a store opened
/// afresh starts a pass of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_sweeps_old_records_window_by_window() {
    use justonce_core::{DedupStore, MessageId};
    const DAY_MS: i64 = 86_400_000;
    let dir = tempfile::tempdir().unwrap();
    let u = url(&dir, "s.db");
    let store = SqliteStore::open(&u).await.unwrap();
    let ids: Vec<MessageId> = (0..120)
        .map(|i| MessageId::new(format!("m-{i:03}")).unwrap())
        .collect();
    for consumer in ["a", "b"] {
        let p = Message::new("p");
        let keys: Vec<_> = ids.iter().map(|id| (id, &p)).collect();
        let (tx, claims) = store.begin_with_claims(consumer, &keys).await.unwrap();
        assert!(claims.iter().all(|c| *c == justonce_core::Claim::Fresh));
        sqlx::Transaction::commit(tx).await.unwrap();
    }
    let count = |sql: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    // Every third key of each consumer, and all of b's last ten, are two days old.
    sqlx::query(
        "UPDATE jo_dedup SET processed_at = processed_at - ?
         WHERE CAST(substr(message_id, 3) AS INTEGER) % 3 = 0
            OR (consumer = 'b' AND message_id >= 'm-110')",
    )
    .bind(2 * DAY_MS)
    .execute(store.pool())
    .await
    .unwrap();
    let old = count(
        "SELECT COUNT(*) FROM jo_dedup
         WHERE processed_at < CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) - 86400000",
    )
    .await;
    assert_eq!(old, 40 + 40 + 7, "the keys made old");

    let day = Duration::from_secs(86_400);
    let (mut purged, mut calls) = (0, 0);
    loop {
        let n = store.purge(day, 7).await.unwrap();
        assert!(n <= 7, "a call deletes at most its batch ({n})");
        purged += n as i64;
        calls += 1;
        if n < 7 {
            break;
        }
    }
    assert_eq!(purged, old, "every old record, and only those");
    assert!(calls >= 12, "batch by batch ({calls} calls)");
    assert_eq!(count("SELECT COUNT(*) FROM jo_dedup").await, 240 - old);

    // Made old now, they would not have been found by a pass that just ended: this store
    // waits for its horizon, a new one sweeps at once.
    sqlx::query("UPDATE jo_dedup SET processed_at = processed_at - ? WHERE consumer = 'a'")
        .bind(2 * DAY_MS)
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(store.purge(day, 1000).await.unwrap(), 0);
    let fresh = SqliteStore::open(&u).await.unwrap();
    assert_eq!(fresh.purge(day, 1000).await.unwrap(), 120 - 40);
    assert_eq!(
        fresh.purge(Duration::from_secs(3600), 1000).await.unwrap(),
        0,
        "recent records stay"
    );
    assert_eq!(count("SELECT COUNT(*) FROM jo_dedup").await, 120 - 47);
}

/// A dedup table of an earlier version had an index on `processed_at`, which every batch
/// paid for and nothing reads now: opening the store drops it and keeps the records.
#[tokio::test]
async fn an_earlier_dedup_table_loses_its_time_index_and_keeps_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let u = url(&dir, "s.db");
    {
        use sqlx::Connection as _;
        let mut c = sqlx::SqliteConnection::connect(&format!("{u}?mode=rwc"))
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE jo_dedup (consumer TEXT NOT NULL, message_id TEXT NOT NULL,
                 fingerprint TEXT NOT NULL, processed_at INTEGER NOT NULL,
                 PRIMARY KEY (consumer, message_id)) WITHOUT ROWID;
             CREATE INDEX jo_dedup_processed_at ON jo_dedup (processed_at);
             INSERT INTO jo_dedup VALUES ('c', 'm-1', 'f', 0);",
        )
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    }
    let store = SqliteStore::open(&u).await.unwrap();
    let indexes: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM sqlite_master WHERE name = 'jo_dedup_processed_at'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(indexes, 0);
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jo_dedup")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(records, 1);
}

#[tokio::test]
async fn tools_read_records_and_free_stuck_claims() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "s.db")).await.unwrap();
    crate::inspect::dedup_records_read_back(&store, "sqlite").await;
    let claims = justonce_sql::SqliteClaimStore::open(&url(&dir, "c.db"))
        .await
        .unwrap();
    crate::inspect::a_forced_release_fences_the_holder(&claims, "sqlite").await;
}

#[tokio::test]
async fn positions_only_move_forward_and_roll_back_with_their_transaction() {
    use justonce_core::{Position, Positions, PositionsIn, Store};
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&url(&dir, "p.db")).await.unwrap();
    let p = store.positions().await.unwrap();
    let at = |partition, offset| Position { partition, offset };
    let mut tx = store.begin().await.unwrap();
    p.save_in(&mut tx, "c", "orders", &[at(0, 10), at(1, 3)])
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    p.save_in(&mut tx, "c", "orders", &[at(0, 5), at(1, 4)])
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(
        p.load("c", "orders", &[0, 1]).await.unwrap(),
        [at(0, 10), at(1, 4)],
        "never back"
    );
    let mut tx = store.begin().await.unwrap();
    p.save_in(&mut tx, "c", "orders", &[at(0, 99)])
        .await
        .unwrap();
    drop(tx);
    assert_eq!(
        p.load("c", "orders", &[0]).await.unwrap(),
        [at(0, 10)],
        "rolled back"
    );
}
