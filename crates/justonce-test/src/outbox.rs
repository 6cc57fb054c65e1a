//! The [`OutboxStore`] contract, one function per rule, each on an outbox of its own (a
//! `take` sees every row). [`outbox_store_tests!`](crate::outbox_store_tests) stamps them.

use std::collections::HashSet;
use std::time::Duration;

use justonce_core::{ErrorKind, Message, OutboxFailure, OutboxStore, Store};

/// A business store and its outbox, written in the store's transactions.
#[derive(Debug)]
pub struct Outboxed<S, O> {
    /// Begins and commits the transactions.
    pub store: S,
    /// The outbox, empty at the start of a rule.
    pub outbox: O,
}

/// The lease the rules take rows with.
pub const LEASE: Duration = Duration::from_millis(300);

fn msg(ns: &str, name: &str) -> Message {
    Message::new(format!("{{\"n\":\"{name}\"}}"))
        .with_id(format!("{ns}-{name}"))
        .unwrap()
}

/// The names (`{ns}-NAME` ids, less the prefix) of rows taken.
fn names(ns: &str, rows: &[justonce_core::OutboxRow]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            let id = r.message.id().expect("an outbox row keeps its id").as_str();
            id.strip_prefix(&format!("{ns}-")).unwrap_or(id).to_owned()
        })
        .collect()
}

/// Enqueues `(name, key)` in one committed transaction.
async fn enqueue_committed<S, O>(b: &Outboxed<S, O>, ns: &str, rows: &[(&str, Option<&str>)])
where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    let mut tx = b.store.begin().await.unwrap();
    for (name, key) in rows {
        b.outbox
            .enqueue(&mut tx, &msg(ns, name), *key)
            .await
            .unwrap();
    }
    b.store.commit(tx).await.unwrap();
}

/// A row exists only once its transaction commits: a relay sees nothing before, and a
/// rolled back transaction leaves nothing. A taken row carries its message whole.
pub async fn nothing_leaves_before_the_commit_and_a_rollback_leaves_nothing<S, O>(
    b: &Outboxed<S, O>,
    ns: &str,
) where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    let mut tx = b.store.begin().await.unwrap();
    let m = msg(ns, "a").with_header("trace", "t-1");
    b.outbox.enqueue(&mut tx, &m, None).await.unwrap();
    // Read, not taken: on a single-writer database a relay's take waits for the commit.
    assert_eq!(
        b.outbox.outbox_stats().await.unwrap().pending,
        0,
        "an uncommitted row is not there for a relay"
    );
    b.store.commit(tx).await.unwrap();
    let mut tx = b.store.begin().await.unwrap();
    b.outbox
        .enqueue(&mut tx, &msg(ns, "gone"), None)
        .await
        .unwrap();
    b.store.rollback(tx).await.unwrap();
    let rows = b.outbox.take("r1", 10, LEASE).await.unwrap();
    assert_eq!(names(ns, &rows), ["a"], "the committed row only");
    assert_eq!(rows[0].message.payload(), m.payload());
    assert_eq!(
        rows[0].message.headers().get("trace").map(String::as_str),
        Some("t-1")
    );
    assert_eq!(rows[0].attempts, 0);
}

/// A leased row is not taken again while its lease runs; after it runs out any relay
/// takes it again (the first may have died before its mark: a duplicate, under its id).
pub async fn a_leased_row_is_taken_again_only_after_its_lease<S, O>(b: &Outboxed<S, O>, ns: &str)
where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    enqueue_committed(b, ns, &[("a", None), ("b", None)]).await;
    let first = b.outbox.take("r1", 1, LEASE).await.unwrap();
    assert_eq!(names(ns, &first), ["a"], "outbox order, at most max");
    let second = b.outbox.take("r2", 10, LEASE).await.unwrap();
    assert_eq!(names(ns, &second), ["b"], "a leased row is not taken twice");
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    let again = b.outbox.take("r2", 10, LEASE).await.unwrap();
    assert_eq!(
        names(ns, &again),
        ["a", "b"],
        "expired leases are taken again, in order"
    );
}

/// Rows of one key go out in enqueue order and to one relay at a time: while an earlier
/// row of the key is leased, the later ones wait; other keys and keyless rows do not.
pub async fn rows_of_a_key_go_out_in_order_one_relay_at_a_time<S, O>(b: &Outboxed<S, O>, ns: &str)
where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    enqueue_committed(b, ns, &[("a1", Some("A")), ("a2", Some("A"))]).await;
    enqueue_committed(b, ns, &[("b1", Some("B")), ("n1", None), ("a3", Some("A"))]).await;
    let r1 = b.outbox.take("r1", 2, LEASE).await.unwrap();
    assert_eq!(names(ns, &r1), ["a1", "a2"]);
    let r2 = b.outbox.take("r2", 10, LEASE).await.unwrap();
    assert_eq!(
        names(ns, &r2),
        ["b1", "n1"],
        "a3 waits behind the leased rows of A"
    );
    b.outbox
        .mark_sent(&r1.iter().map(|r| r.seq).collect::<Vec<_>>())
        .await
        .unwrap();
    let r3 = b.outbox.take("r2", 10, LEASE).await.unwrap();
    assert_eq!(
        names(ns, &r3),
        ["a3"],
        "A goes on once its earlier rows are sent"
    );
}

/// A sent row is gone; marking it again is harmless, and so is a tidy.
pub async fn a_sent_row_is_gone_and_marking_it_again_is_harmless<S, O>(b: &Outboxed<S, O>, ns: &str)
where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    enqueue_committed(b, ns, &[("a", None), ("b", None)]).await;
    let rows = b.outbox.take("r1", 10, LEASE).await.unwrap();
    let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
    assert_eq!(
        seqs.iter().collect::<HashSet<_>>().len(),
        2,
        "seqs are distinct"
    );
    assert!(seqs[0] < seqs[1], "seqs grow in outbox order");
    b.outbox.mark_sent(&seqs).await.unwrap();
    b.outbox.mark_sent(&seqs).await.unwrap();
    let stats = b.outbox.outbox_stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.leased, stats.dead),
        (0, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.oldest, None);
    // A tidy (PostgreSQL's VACUUM) runs outside any transaction and changes no row.
    b.outbox.tidy().await.unwrap();
    tokio::time::sleep(LEASE + Duration::from_millis(100)).await;
    assert!(b.outbox.take("r1", 10, LEASE).await.unwrap().is_empty());
}

/// A failed publish counts an attempt and waits out its delay, holding its key back; a
/// release counts none. At the last attempt the row is dead with its reason: it stays,
/// counted, and blocks its key, which never goes on silently.
pub async fn a_failed_row_waits_blocking_its_key_then_dies_visibly<S, O>(
    b: &Outboxed<S, O>,
    ns: &str,
) where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    enqueue_committed(
        b,
        ns,
        &[("a1", Some("A")), ("a2", Some("A")), ("b1", Some("B"))],
    )
    .await;
    let rows = b.outbox.take("r1", 10, LEASE).await.unwrap();
    assert_eq!(names(ns, &rows), ["a1", "a2", "b1"]);
    let (a1, a2, b1) = (rows[0].seq, rows[1].seq, rows[2].seq);
    let wait = Duration::from_millis(300);
    assert_eq!(
        b.outbox
            .mark_failed(a1, "unroutable", wait, 2)
            .await
            .unwrap(),
        OutboxFailure::Retrying
    );
    b.outbox.release(&[a2]).await.unwrap();
    b.outbox.mark_sent(&[b1]).await.unwrap();
    assert!(
        b.outbox.take("r1", 10, LEASE).await.unwrap().is_empty(),
        "a1 waits out its delay, and a2 waits behind it"
    );
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    let rows = b.outbox.take("r2", 10, LEASE).await.unwrap();
    assert_eq!(names(ns, &rows), ["a1", "a2"]);
    assert_eq!(
        (rows[0].attempts, rows[1].attempts),
        (1, 0),
        "a release counts no attempt"
    );
    assert_eq!(
        b.outbox
            .mark_failed(a1, "unroutable", wait, 2)
            .await
            .unwrap(),
        OutboxFailure::Dead
    );
    b.outbox.release(&[a2]).await.unwrap();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    assert!(
        b.outbox.take("r2", 10, LEASE).await.unwrap().is_empty(),
        "a dead row blocks its key"
    );
    let stats = b.outbox.outbox_stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead),
        (1, 1),
        "a2 waits, a1 is dead: {stats:?}"
    );
    assert!(stats.oldest.is_some());
}

/// A message without an id, or over the outbox's size limit, is refused at enqueue as bad
/// input, and the caller's transaction goes on: what it commits is there, whole.
pub async fn bad_outgoing_messages_are_refused_inside_the_transaction<S, O>(
    b: &Outboxed<S, O>,
    ns: &str,
) where
    S: Store,
    O: OutboxStore<Tx = S::Tx>,
{
    let mut tx = b.store.begin().await.unwrap();
    let no_id = b.outbox.enqueue(&mut tx, &Message::new("{}"), None).await;
    assert_eq!(no_id.unwrap_err().kind(), ErrorKind::InvalidInput);
    let big = Message::new(vec![b'x'; justonce_core::DEFAULT_OUTBOX_MAX_PAYLOAD + 1])
        .with_id(format!("{ns}-big"))
        .unwrap();
    let err = b.outbox.enqueue(&mut tx, &big, None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("exceeds"), "{err}");
    b.outbox
        .enqueue(&mut tx, &msg(ns, "ok"), None)
        .await
        .unwrap();
    b.store.commit(tx).await.unwrap();
    let rows = b.outbox.take("r1", 10, LEASE).await.unwrap();
    assert_eq!(names(ns, &rows), ["ok"]);
}

/// The operator's view ([`InspectOutbox`](justonce_core::InspectOutbox)): who holds leases,
/// the dead rows with their reasons; a revived row goes out again in its place, a
/// discarded one frees its key.
pub async fn dead_rows_are_shown_revived_and_discarded<S, O>(b: &Outboxed<S, O>, ns: &str)
where
    S: Store,
    O: OutboxStore<Tx = S::Tx> + justonce_core::InspectOutbox,
{
    enqueue_committed(
        b,
        ns,
        &[
            ("a1", Some("A")),
            ("a2", Some("A")),
            ("b1", Some("B")),
            ("b2", Some("B")),
        ],
    )
    .await;
    let rows = b.outbox.take("relay-x", 10, LEASE * 10).await.unwrap();
    assert_eq!(rows.len(), 4);
    let owners = b.outbox.owners().await.unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!((owners[0].owner.as_str(), owners[0].rows), ("relay-x", 4));
    assert!(owners[0].until.is_some());
    // a1 and b1 die at their first refusal; a2 and b2 go back behind them.
    for r in [&rows[0], &rows[2]] {
        let fate = b.outbox.mark_failed(r.seq, "NO_ROUTE", Duration::ZERO, 1);
        assert_eq!(fate.await.unwrap(), OutboxFailure::Dead);
    }
    b.outbox.release(&[rows[1].seq, rows[3].seq]).await.unwrap();
    let dead = b.outbox.dead_rows(10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].seq, rows[0].seq);
    assert_eq!(dead[0].key.as_deref(), Some("A"));
    assert_eq!(dead[0].message_id, format!("{ns}-a1"));
    assert_eq!((dead[0].attempts, dead[0].reason.as_str()), (1, "NO_ROUTE"));
    assert!(
        b.outbox.owners().await.unwrap().is_empty(),
        "nothing leased now"
    );
    assert!(
        b.outbox.take("r", 10, LEASE).await.unwrap().is_empty(),
        "both keys blocked"
    );

    assert_eq!(b.outbox.revive(Some(&[rows[0].seq])).await.unwrap(), 1);
    assert_eq!(b.outbox.discard(Some(&[rows[2].seq])).await.unwrap(), 1);
    let again = b.outbox.take("r", 10, LEASE).await.unwrap();
    assert_eq!(
        names(ns, &again),
        ["a1", "a2", "b2"],
        "a1 revived in its place; b1 discarded, b2 goes on"
    );
    assert_eq!(again[0].attempts, 0, "revived with its attempts back");
    assert_eq!(b.outbox.revive(None).await.unwrap(), 0);
    assert_eq!(b.outbox.discard(None).await.unwrap(), 0);
}
