crate::backend::backend_tests! {
    service: "PostgreSQL" at "127.0.0.1:5432",
    url: "JUSTONCE_POSTGRES_URL" or "postgres://postgres@127.0.0.1:5432/test",
    store: PgStore, options: PgStoreOptions,
    claims: PgClaimStore, state: PgStateGuard, version: PgVersionGuard,
    text: "TEXT",
    wrong_scheme: "mysql://root@127.0.0.1/test",
    bad_url: "postgres://app:s3cret@127.0.0.1:1/test",
    shown: "postgres://app:***@127.0.0.1:1/test",
}

mod queue {
    use std::time::{Duration, Instant};

    use justonce_core::{
        DeadLetterReason, ErrorKind, Message, Publisher, Source, Store, TransactionalAck,
    };
    use justonce_sql::{PgQueue, PgQueueOptions, PgStore};
    use justonce_test::unique_name;

    // The backend tests' URL (`None` when the server is down and not required).
    use super::url;

    async fn open(url: &str, name: &str, lease: Duration, poll: Duration) -> PgQueue {
        let mut o = PgQueueOptions::default();
        o.lease = lease;
        o.poll_interval = poll;
        PgQueue::open_with(url, name, o).await.unwrap()
    }

    fn msg(id: &str) -> Message {
        Message::new(format!("payload {id}")).with_id(id).unwrap()
    }

    /// The transport contract, one test per rule, each on a queue of its own (the rules
    /// delete it through `Inspect::cleanup`).
    mod contract {
        use super::*;
        use justonce_test::{transport::Queue, Backend};

        justonce_test::transport_tests!(|| async {
            let url = url()?;
            let lease = Duration::from_millis(300);
            let q = open(&url, &unique_name("jo-pgq"), lease, Duration::from_secs(1)).await;
            Some(Backend::new(Queue::new(q, lease)))
        });
    }

    /// A dead letter's reason is also a header of its message, for tools that read the
    /// table directly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_letter_carries_its_reason_as_a_header() {
        let Some(url) = url() else { return };
        let q = open(
            &url,
            &unique_name("jo-pgq"),
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await;
        q.publish(&msg("poison")).await.unwrap();
        let d = q
            .receive(1, Duration::from_secs(2))
            .await
            .unwrap()
            .remove(0);
        let reason = DeadLetterReason {
            error: "invalid input: test".into(),
            attempts: d.attempt,
            source_queue: q.queue().into(),
            consumer: "t".into(),
        };
        q.dead_letter(&d, &reason).await.unwrap();
        let dead = q.dead_letters().await.unwrap();
        assert_eq!(dead[0].reason.error, "invalid input: test");
        let header = dead[0].message.headers().get(DeadLetterReason::ERROR);
        assert_eq!(header.map(String::as_str), Some("invalid input: test"));
        q.delete().await.unwrap();
    }

    /// A receiver whose fallback poll is a minute away is woken by a publish from another
    /// process's pool, through LISTEN/NOTIFY.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_publish_wakes_a_waiting_receiver() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-pgq-wake");
        let minute = Duration::from_secs(60);
        let receiver = open(&url, &name, minute, minute).await;
        let publisher = open(&url, &name, minute, minute).await;
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            let got = receiver.receive(10, minute).await.unwrap();
            (got.len(), started.elapsed(), receiver)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.publish(&msg("wake-1")).await.unwrap();
        let (got, waited, receiver) = waiting.await.unwrap();
        assert_eq!(got, 1);
        assert!(
            waited < Duration::from_secs(20),
            "woken by the notification, not the 60 s poll: waited {waited:?}"
        );
        receiver.delete().await.unwrap();
    }

    /// Two receivers at once never get the same row (`FOR UPDATE SKIP LOCKED`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_receivers_split_the_rows() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-pgq-split");
        let a = open(
            &url,
            &name,
            Duration::from_secs(60),
            Duration::from_millis(100),
        )
        .await;
        let b = open(
            &url,
            &name,
            Duration::from_secs(60),
            Duration::from_millis(100),
        )
        .await;
        let messages: Vec<Message> = (0..400).map(|i| msg(&format!("split-{i}"))).collect();
        a.publish_batch(&messages).await.unwrap();
        let take = |q: PgQueue| {
            tokio::spawn(async move {
                let mut ids = Vec::new();
                loop {
                    let got = q.receive(7, Duration::from_millis(200)).await.unwrap();
                    if got.is_empty() {
                        return ids;
                    }
                    ids.extend(
                        got.iter()
                            .map(|d| d.message.id().unwrap().as_str().to_owned()),
                    );
                }
            })
        };
        let (ta, tb) = (take(a.clone()), take(b));
        let (ia, ib) = (ta.await.unwrap(), tb.await.unwrap());
        let mut all: Vec<_> = ia.iter().chain(&ib).cloned().collect();
        all.sort();
        all.dedup();
        assert_eq!(ia.len() + ib.len(), 400, "each row delivered once");
        assert_eq!(all.len(), 400);
        a.delete().await.unwrap();
    }

    /// The ack in the business transaction: gone if and only if the transaction commits, and
    /// refused when the lease has moved on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_ack_in_the_transaction_commits_with_it() {
        let Some(url) = url() else { return };
        let lease = Duration::from_millis(300);
        let q = open(
            &url,
            &unique_name("jo-pgq-txack"),
            lease,
            Duration::from_millis(100),
        )
        .await;
        let store = PgStore::open(&url).await.unwrap();
        q.publish_batch(&[msg("tx-1"), msg("tx-2")]).await.unwrap();
        let got = q.receive(10, Duration::from_secs(2)).await.unwrap();
        assert_eq!(got.len(), 2);

        // Rolled back: the ack is undone with it.
        let mut tx = store.begin().await.unwrap();
        q.ack_in(&mut tx, &[&got[0].receipt]).await.unwrap();
        store.rollback(tx).await.unwrap();
        assert_eq!(q.stats().await.unwrap().pending, 2);

        // Committed: gone.
        let mut tx = store.begin().await.unwrap();
        q.ack_in(&mut tx, &[&got[0].receipt]).await.unwrap();
        store.commit(tx).await.unwrap();
        assert_eq!(q.stats().await.unwrap().pending, 1);

        // tx-2's lease runs out and it is delivered again: the old receipt cannot ack it.
        let again = q.receive(10, lease * 4).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempt, 2);
        let mut tx = store.begin().await.unwrap();
        let err = q.ack_in(&mut tx, &[&got[1].receipt]).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
        store.rollback(tx).await.unwrap();
        q.ack(&[&again[0].receipt]).await.unwrap();
        assert_eq!(q.stats().await.unwrap().pending, 0);
        q.delete().await.unwrap();
    }

    /// A publish in the business transaction is the outbox: rolled back, nothing is
    /// queued; committed, the message is there, and a receiver already waiting is woken.
    #[tokio::test]
    async fn a_publish_in_the_transaction_is_queued_only_if_it_commits() {
        let Some(url) = url() else { return };
        let q = open(
            &url,
            &unique_name("jo-pgq-txpub"),
            Duration::from_secs(30),
            Duration::from_secs(5),
        )
        .await;
        let store = PgStore::open(&url).await.unwrap();
        let mut tx = store.begin().await.unwrap();
        q.publish_in(&mut tx, &[msg("gone")]).await.unwrap();
        store.rollback(tx).await.unwrap();
        assert_eq!(q.stats().await.unwrap().pending, 0, "rolled back: nothing");

        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.receive(10, Duration::from_secs(5)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut tx = store.begin().await.unwrap();
        q.publish_in(&mut tx, &[msg("kept")]).await.unwrap();
        assert_eq!(q.stats().await.unwrap().pending, 0, "not before the commit");
        let committed = std::time::Instant::now();
        store.commit(tx).await.unwrap();
        let got = waiting.await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].message.id().unwrap().as_str(), "kept");
        assert!(
            committed.elapsed() < Duration::from_secs(2),
            "woken by the commit, not by the 5 s poll: {:?}",
            committed.elapsed()
        );
        q.ack(&[&got[0].receipt]).await.unwrap();
        q.delete().await.unwrap();
    }

    #[tokio::test]
    async fn a_wrong_url_is_a_clear_error() {
        let err = PgQueue::open("postgres://app:s3cret@127.0.0.1:1/test", "q")
            .await
            .unwrap_err();
        let text = err.to_chain_string();
        assert_eq!(err.kind(), ErrorKind::Connect, "{text}");
        assert!(
            text.contains("postgres://app:***@127.0.0.1:1/test") && !text.contains("s3cret"),
            "{text}"
        );
    }
}

mod partitioned {
    use justonce_sql::{PgStore, PgStoreOptions};
    use justonce_test::{unique_name, Backend};

    // The backend tests' URL (`None` when the server is down and not required).
    use super::url;

    async fn open(url: &str) -> (PgStore, String) {
        let mut o = PgStoreOptions::default();
        o.dedup_table = unique_name("jo_dedup_part");
        o.partitioned = true;
        let table = o.dedup_table.clone();
        (PgStore::open_with(url, o).await.unwrap(), table)
    }

    async fn partitions(store: &PgStore, table: &str) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
             WHERE i.inhparent = $1::regclass ORDER BY 1",
        )
        .bind(table)
        .fetch_all(store.pool())
        .await
        .unwrap()
    }

    /// A partitioned store has yesterday, today and 7 days ahead from the start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partitioned_store_starts_with_nine_days() {
        let Some(url) = url() else { return };
        let (store, table) = open(&url).await;
        assert!(store.is_partitioned());
        let parts = partitions(&store, &table).await;
        assert_eq!(
            parts.len(),
            9,
            "yesterday, today and 7 days ahead: {parts:?}"
        );
        drop_table(&store, &table).await;
    }

    async fn drop_table(store: &PgStore, table: &str) {
        sqlx::raw_sql(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }

    /// The claim half of the dedup contract (its purge works in whole days, below).
    mod contract {
        use super::*;

        justonce_test::dedup_claim_tests!(|| async {
            let url = url()?;
            let (store, table) = open(&url).await;
            let kept = store.clone();
            Some(Backend::new(store).cleaning_up(move || async move {
                drop_table(&kept, &table).await;
            }))
        });
    }

    /// Old days are dropped whole, with a consumer's transaction open, while other claims
    /// commit; then a key of a dropped day is fresh again and a recent one is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn old_partitions_are_dropped_whole_without_blocking_claims() {
        let Some(url) = url() else { return };
        let (store, table) = open(&url).await;
        // A partition for a day long past, as a store running for weeks would have.
        let old = format!("{table}_p20200101");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {old} PARTITION OF {table}
             FOR VALUES FROM ('2020-01-01 00:00:00+00') TO ('2020-01-02 00:00:00+00')"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        let store = std::sync::Arc::new(store);
        crate::backend::purge_beside_claims(store.clone(), &table, |t| {
            format!("UPDATE {t} SET processed_at = '2020-01-01 12:00:00+00'")
        })
        .await;
        let parts = partitions(&store, &table).await;
        assert!(!parts.contains(&old), "the old day was dropped: {parts:?}");
        assert_eq!(parts.len(), 9, "{parts:?}");
        sqlx::raw_sql(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

mod folded_claim {
    use justonce_core::{Claim, DedupStore, Message, MessageId, Store};
    use justonce_sql::{PgStore, PgStoreOptions};
    use justonce_test::unique_name;
    use sqlx::Connection as _;

    // The backend tests' URL (`None` when the server is down and not required).
    use super::url;

    /// A one-key claim rides on `BEGIN` (`INSERT …; BEGIN`). A stored key fails that insert;
    /// the pool's only connection must then be idle, not inside an aborted transaction, and
    /// the claim must still answer duplicate or conflict, again and again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stored_key_leaves_the_connection_idle() {
        let Some(url) = url() else { return };
        let mut o = PgStoreOptions::default();
        o.dedup_table = unique_name("jo_dedup_fold");
        o.max_connections = 1;
        let table = o.dedup_table.clone();
        let store = PgStore::open_with(&url, o).await.unwrap();
        let (a, b) = (Message::new("a"), Message::new("b"));
        let fp = a.fingerprint();
        let id = MessageId::new("fold-1").unwrap();
        let (tx, answers) = store.begin_with_claims("c", &[(&id, &a)]).await.unwrap();
        assert_eq!(answers, vec![Claim::Fresh]);
        store.commit(tx).await.unwrap();
        for round in 0..3 {
            for (now, want) in [(&a, Claim::Duplicate), (&b, Claim::Conflict { stored: fp })] {
                let (mut tx, answers) = store.begin_with_claims("c", &[(&id, now)]).await.unwrap();
                assert_eq!(answers, vec![want], "round {round}");
                // The transaction handed out is a working one.
                let one: i32 = sqlx::query_scalar("SELECT 1")
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                assert_eq!(one, 1);
                store.rollback(tx).await.unwrap();
            }
            // Outside any transaction the connection autocommits: a write is visible at once
            // to a second connection, which it would not be from an aborted transaction.
            sqlx::query(&format!(
                "INSERT INTO {table} (consumer, message_id, fingerprint) VALUES ('probe', $1, 'x')"
            ))
            .bind(format!("p{round}"))
            .execute(store.pool())
            .await
            .unwrap();
            let mut second = sqlx::PgConnection::connect(&url).await.unwrap();
            let seen: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM {table} WHERE consumer = 'probe'"
            ))
            .fetch_one(&mut second)
            .await
            .unwrap();
            assert_eq!(seen, round + 1, "round {round}: the probe committed");
        }
        // The claim was the prepared one (the pool's only connection prepared it)...
        let prepared: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_prepared_statements WHERE name = 'justonce_claim'",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(prepared, 1, "every connection prepares the folded claim");
        // ...and a session that lost it (a pooler's reset) claims the usual way.
        sqlx::raw_sql("DEALLOCATE justonce_claim")
            .execute(store.pool())
            .await
            .unwrap();
        let fresh = MessageId::new("fold-2").unwrap();
        for (id, want) in [(&fresh, Claim::Fresh), (&id, Claim::Duplicate)] {
            let (tx, answers) = store.begin_with_claims("c", &[(id, &a)]).await.unwrap();
            assert_eq!(answers, vec![want], "without the prepared claim");
            store.rollback(tx).await.unwrap();
        }
        sqlx::raw_sql(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// The PostgreSQL outbox moving its rows into a queue of its database.
mod outbox_move {
    use std::time::{Duration, Instant};

    use justonce_core::{ErrorKind, Message, OutboxMove, OutboxStore, Source, Store};
    use justonce_sql::{OutboxOptions, PgQueue, PgQueueOptions, PgStore};
    use justonce_test::unique_name;

    use super::url;

    fn msg(id: &str) -> Message {
        Message::new(format!("payload {id}")).with_id(id).unwrap()
    }

    /// A key whose first row is leased to a publishing relay stays whole; every other row
    /// moves, in outbox order per key, in one transaction, and a receiver already waiting
    /// is woken by the move's commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_move_in_order_past_a_key_that_is_leased() {
        let Some(url) = url() else { return };
        let table = unique_name("jo_obx_mv").replace('-', "_");
        let store = PgStore::open(&url).await.unwrap();
        let outbox = store
            .outbox_with(OutboxOptions::default().table(&table))
            .await
            .unwrap();
        let mut o = PgQueueOptions::default();
        o.poll_interval = Duration::from_secs(5);
        let queue = PgQueue::open_with(&url, &unique_name("jo-pgq-mv"), o)
            .await
            .unwrap();
        let mut tx = store.begin().await.unwrap();
        for n in 0..3 {
            for key in ["a", "b", "held"] {
                let m = msg(&format!("{key}-{n}"));
                outbox.enqueue(&mut tx, &m, Some(key)).await.unwrap();
            }
            outbox
                .enqueue(&mut tx, &msg(&format!("free-{n}")), None)
                .await
                .unwrap();
        }
        store.commit(tx).await.unwrap();
        // A publishing relay holds `held`'s first row.
        let leased = outbox
            .take("relay-1", 3, Duration::from_secs(60))
            .await
            .unwrap();
        let held: Vec<_> = leased
            .iter()
            .filter(|r| r.key.as_deref() == Some("held"))
            .collect();
        assert_eq!(held.len(), 1, "{leased:?}");
        let others: Vec<u64> = leased
            .iter()
            .filter(|r| r.key.as_deref() != Some("held"))
            .map(|r| r.seq)
            .collect();
        outbox.release(&others).await.unwrap();

        let mover = outbox.mover_into(&queue).await.unwrap();
        let waiting = {
            let q = queue.clone();
            tokio::spawn(async move { q.receive(100, Duration::from_secs(5)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let moved_at = Instant::now();
        assert_eq!(
            mover.move_rows(100).await.unwrap(),
            9,
            "all but `held`'s three"
        );
        let first = waiting.await.unwrap();
        assert!(
            moved_at.elapsed() < Duration::from_secs(2),
            "woken by the move's commit, not the 5 s poll: {:?}",
            moved_at.elapsed()
        );
        assert!(!first.is_empty());
        assert_eq!(
            mover.move_rows(100).await.unwrap(),
            0,
            "`held` waits for its lease"
        );
        let stats = outbox.outbox_stats().await.unwrap();
        assert_eq!((stats.pending, stats.leased), (3, 1));

        let ids: Vec<(String,)> =
            sqlx::query_as("SELECT message_id FROM jo_queue WHERE queue = $1 ORDER BY seq")
                .bind(queue.queue())
                .fetch_all(queue.pool())
                .await
                .unwrap();
        let ids: Vec<String> = ids.into_iter().map(|(i,)| i).collect();
        assert_eq!(ids.len(), 9);
        for key in ["a", "b", "free"] {
            let of_key: Vec<&String> = ids.iter().filter(|i| i.starts_with(key)).collect();
            assert_eq!(
                of_key,
                [0, 1, 2]
                    .map(|n| format!("{key}-{n}"))
                    .iter()
                    .collect::<Vec<_>>()
            );
        }
        let delivered = &first[0];
        assert_eq!(
            delivered.message.payload(),
            format!("payload {}", ids[0]).as_bytes()
        );
        queue.delete().await.unwrap();
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }

    /// A queue in another database is refused: rows moved into a table no consumer of the
    /// queue reads would be lost to it.
    #[tokio::test]
    async fn a_queue_in_another_database_is_refused() {
        let Some(url) = url() else { return };
        let Some((base, _)) = url.rsplit_once('/') else {
            return;
        };
        let store = PgStore::open(&url).await.unwrap();
        let table = unique_name("jo_obx_mvx").replace('-', "_");
        let outbox = store
            .outbox_with(OutboxOptions::default().table(&table))
            .await
            .unwrap();
        let elsewhere = PgQueue::open(&format!("{base}/postgres"), &unique_name("jo-pgq-mvx"))
            .await
            .unwrap();
        let err = outbox.mover_into(&elsewhere).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        let text = err.to_chain_string();
        assert!(text.contains("not in the outbox's database"), "{text}");
        elsewhere.delete().await.unwrap();
        sqlx::query(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}

/// `Store::take_turn`: a transaction that takes a consumer's turn alone holds it alone,
/// across connections, until it commits or rolls back; one that takes it beside never
/// waits, and gets it beside any number of others but not beside one alone; one alone
/// waits for them all; another consumer's turn is another lock.
mod turns {
    use std::time::Duration;

    use justonce_core::{Store, Turn};
    use justonce_sql::{PgStore, PgTx};
    use justonce_test::unique_name;

    use super::url;

    /// Whether a transaction that takes `consumer`'s turn alone waits (300 ms) while `held`
    /// is held; then ends `held` and checks that the wait ends.
    async fn alone_waits(store: &PgStore, held: PgTx, consumer: &str) -> bool {
        let waiting = {
            let store = store.clone();
            let consumer = consumer.to_owned();
            tokio::spawn(async move {
                let mut tx = store.begin().await.unwrap();
                assert!(store
                    .take_turn(&mut tx, &consumer, Turn::Alone)
                    .await
                    .unwrap());
                store.commit(tx).await.unwrap();
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let waited = !waiting.is_finished();
        store.rollback(held).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the turn was not handed on when its holder ended")
            .unwrap();
        waited
    }

    /// Whether a transaction gets `consumer`'s turn beside while `held` is held (at once:
    /// it never waits).
    async fn beside_gets(store: &PgStore, held: PgTx, consumer: &str) -> bool {
        let mut tx = store.begin().await.unwrap();
        let got = tokio::time::timeout(
            Duration::from_secs(5),
            store.take_turn(&mut tx, consumer, Turn::Beside { patience: None }),
        )
        .await
        .expect("a turn beside waited")
        .unwrap();
        store.rollback(tx).await.unwrap();
        store.rollback(held).await.unwrap();
        got
    }

    async fn holding(store: &PgStore, consumer: &str, turn: Turn) -> PgTx {
        let mut tx = store.begin().await.unwrap();
        assert!(store.take_turn(&mut tx, consumer, turn).await.unwrap());
        tx
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_consumer_s_turn_taken_alone_excludes_every_other_until_it_ends() {
        let Some(url) = url() else { return };
        let store = PgStore::open(&url).await.unwrap();
        assert!(store.takes_turns());
        let (alone, beside) = (Turn::Alone, Turn::Beside { patience: None });
        // Names of this test's own: another test's consumer may take turns meanwhile.
        let (payments, refunds) = (unique_name("payments"), unique_name("refunds"));
        let (payments, refunds) = (payments.as_str(), refunds.as_str());
        let held = holding(&store, payments, alone).await;
        assert!(
            alone_waits(&store, held, payments).await,
            "alone beside alone"
        );
        let held = holding(&store, payments, alone).await;
        assert!(
            !beside_gets(&store, held, payments).await,
            "beside beside alone"
        );
        let held = holding(&store, payments, beside).await;
        assert!(
            alone_waits(&store, held, payments).await,
            "alone beside beside"
        );
        let held = holding(&store, payments, beside).await;
        assert!(
            beside_gets(&store, held, payments).await,
            "beside beside beside"
        );
        let held = holding(&store, payments, alone).await;
        assert!(
            !alone_waits(&store, held, refunds).await,
            "another consumer's turn waited"
        );
        let held = holding(&store, payments, alone).await;
        assert!(
            beside_gets(&store, held, refunds).await,
            "another consumer's turn refused"
        );
        // A commit ends a turn too.
        let held = holding(&store, payments, alone).await;
        store.commit(held).await.unwrap();
        let mut tx = store.begin().await.unwrap();
        assert!(
            store.take_turn(&mut tx, payments, beside).await.unwrap(),
            "the committed turn was still held"
        );
        store.commit(tx).await.unwrap();
    }

    /// A turn taken beside with patience gives up a row lock it waits for longer than that,
    /// as a lock conflict, long before the deadlock detector's second; one refused sets
    /// nothing (the batch goes on to wait for its turn alone).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_patient_turn_gives_up_a_row_lock_it_waits_for_too_long() {
        let Some(url) = url() else { return };
        let store = PgStore::open(&url).await.unwrap();
        let consumer = unique_name("payments");
        let table = unique_name("jo_turn_rows");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {table} (id int PRIMARY KEY, n int); INSERT INTO {table} VALUES (1, 0)"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        let update = format!("UPDATE {table} SET n = n + 1 WHERE id = 1");
        let mut holder = store.begin().await.unwrap();
        sqlx::query(&update).execute(&mut *holder).await.unwrap();
        let patience = Some(Duration::from_millis(100));
        let mut tx = store.begin().await.unwrap();
        assert!(store
            .take_turn(&mut tx, &consumer, Turn::Beside { patience })
            .await
            .unwrap());
        let started = std::time::Instant::now();
        let err = sqlx::query(&update).execute(&mut *tx).await.unwrap_err();
        let waited = started.elapsed();
        let err = justonce_core::Error::from(err);
        assert_eq!(err.kind(), justonce_core::ErrorKind::Busy, "{err}");
        assert!(
            waited >= Duration::from_millis(90) && waited < Duration::from_millis(900),
            "gave up after {waited:?}"
        );
        store.rollback(tx).await.unwrap();
        // Refused: no lock timeout set.
        let alone = holding(&store, &consumer, Turn::Alone).await;
        let mut tx = store.begin().await.unwrap();
        assert!(!store
            .take_turn(&mut tx, &consumer, Turn::Beside { patience })
            .await
            .unwrap());
        let timeout: String = sqlx::query_scalar("SHOW lock_timeout")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(timeout, "0", "a refused turn set the lock timeout");
        store.rollback(tx).await.unwrap();
        store.rollback(alone).await.unwrap();
        store.rollback(holder).await.unwrap();
        sqlx::raw_sql(&format!("DROP TABLE {table}"))
            .execute(store.pool())
            .await
            .unwrap();
    }
}
