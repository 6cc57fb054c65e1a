//! The transport contract ([`Source`], [`Publisher`], [`Inspect`]), one function per rule,
//! on a fresh, empty queue. [`transport_tests!`](crate::transport_tests) stamps them as tests.
//!
//! A delivery that is never settled comes back: on a queue with leases when its lease runs
//! out, on a broker when its consumer's connection drops ([`Source::abandon`]). The rules
//! abandon and then wait a few leases, so both kinds pass the same rules.

use std::time::{Duration, Instant};

use justonce_core::{DeadLetter, DeadLetterReason, Inspect, Message, Publisher, Replay, Source};

/// A queue under test and its lease (on a broker without leases: how long a redelivery may
/// take after the connection dropped). A nack delay of three leases must be a delay the
/// queue can wait (a RabbitMQ retry tier of that length).
pub struct Queue<Q> {
    /// The queue.
    pub queue: Q,
    /// Its lease.
    pub lease: Duration,
    /// Whether its consumer fetches ahead in the background ([`Queue::prefetching`]).
    pub prefetching: bool,
}

impl<Q: Source + Publisher + Inspect> Queue<Q> {
    /// A queue of `lease`.
    pub fn new(queue: Q, lease: Duration) -> Self {
        Queue {
            queue,
            lease,
            prefetching: false,
        }
    }

    /// The queue's consumer fetches ahead in the background (Kafka): a receive returns
    /// what the consumer has fetched, and records published a moment apart may come in
    /// two fetches, so in two receives. The rule that receives several messages at once
    /// then reads until they all came, still in publish order, the first receive not
    /// empty; on a queue that does not fetch ahead one receive must return them all.
    pub fn prefetching(mut self) -> Self {
        self.prefetching = true;
        self
    }

    fn msg(&self, ns: &str, n: &str) -> Message {
        Message::new(format!("payload {n}"))
            .with_id(format!("{ns}-{n}"))
            .unwrap()
    }

    async fn receive(&self, max: usize, wait: Duration) -> Vec<justonce_core::Delivery> {
        self.queue.receive(max, wait).await.unwrap()
    }

    /// Receives (up to 10 at a time, so that one too many shows) onto `got` until it holds
    /// `n` deliveries or `within` ran out.
    async fn receive_until(
        &self,
        got: &mut Vec<justonce_core::Delivery>,
        n: usize,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        while got.len() < n && Instant::now() < deadline {
            got.extend(self.receive(10, Duration::from_millis(500)).await);
        }
    }

    async fn one(&self, what: &str) -> justonce_core::Delivery {
        let mut got = self
            .receive(10, self.lease * 4 + Duration::from_secs(2))
            .await;
        assert_eq!(got.len(), 1, "{what}: one delivery");
        got.remove(0)
    }

    /// Nothing more arrives within `wait`.
    async fn nothing(&self, wait: Duration, what: &str) {
        let got = self.receive(10, wait).await;
        assert!(got.is_empty(), "{what}: got {} deliveries", got.len());
    }

    async fn done(&self) {
        self.queue.cleanup().await.unwrap();
    }
}

fn id_of(d: &justonce_core::Delivery) -> String {
    d.message
        .id()
        .map_or_else(String::new, |i| i.as_str().to_owned())
}

/// Every ready message, in publish order, up to `max`, each a first delivery.
pub async fn publish_then_receive_in_order<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    q.queue
        .publish_batch(&[q.msg(ns, "b"), q.msg(ns, "c")])
        .await
        .unwrap();
    let mut got = q.receive(10, Duration::from_secs(2)).await;
    assert!(!got.is_empty(), "a receive returns the ready messages");
    if q.prefetching {
        q.receive_until(&mut got, 3, Duration::from_secs(5)).await;
    }
    let ids: Vec<String> = got.iter().map(id_of).collect();
    assert_eq!(
        ids,
        [format!("{ns}-a"), format!("{ns}-b"), format!("{ns}-c")],
        "receive returns every ready message up to max (over receives if the consumer \
         fetches ahead), in publish order"
    );
    assert!(
        got.iter().all(|d| d.attempt == 1 && !d.redelivered),
        "a first delivery is attempt 1, not redelivered"
    );
    assert_eq!(got[0].message.payload(), b"payload a");
    let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
    q.queue.ack(&receipts).await.unwrap();
    q.done().await;
}

/// A delivery is leased to its receiver: a second receive does not get it.
pub async fn leased_deliveries_are_not_delivered_twice<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let d = q.one("the first receive").await;
    q.nothing(Duration::ZERO, "leased messages are not delivered twice")
        .await;
    q.queue.ack(&[&d.receipt]).await.unwrap();
    q.done().await;
}

/// An acked delivery never comes back, and nothing is pending any more.
pub async fn an_ack_settles_for_good<Q: Source + Publisher + Inspect>(q: &Queue<Q>, ns: &str) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let d = q.one("the first receive").await;
    q.queue.ack(&[&d.receipt]).await.unwrap();
    q.queue.abandon().await;
    q.nothing(q.lease * 2, "an acked message never returns")
        .await;
    assert_eq!(
        q.queue.pending().await.unwrap(),
        0,
        "nothing pending after an ack"
    );
    q.done().await;
}

/// A delivery whose lease runs out, or whose consumer's connection drops, is delivered
/// again, marked redelivered, with its attempt counted.
pub async fn an_expired_lease_or_a_dropped_connection_redelivers<
    Q: Source + Publisher + Inspect,
>(
    q: &Queue<Q>,
    ns: &str,
) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let first = q.one("the first receive").await;
    q.queue.abandon().await;
    let again = q.one("an unsettled delivery comes back").await;
    assert_eq!(id_of(&again), id_of(&first));
    assert_eq!(again.attempt, 2, "the transport counts attempts");
    assert!(again.redelivered, "a redelivery is marked redelivered");
    q.queue.ack(&[&again.receipt]).await.unwrap();
    if let Some(n) = q.queue.deliveries().await.unwrap() {
        assert_eq!(
            n, 2,
            "the transport's own count: one delivery and one redelivery"
        );
    }
    q.done().await;
}

/// A receipt whose delivery went to someone else since acks nothing.
pub async fn a_stale_receipt_acks_nothing<Q: Source + Publisher + Inspect>(q: &Queue<Q>, ns: &str) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let first = q.one("the first receive").await;
    q.queue.abandon().await;
    let second = q.one("the redelivery").await;
    q.queue.ack(&[&first.receipt]).await.unwrap();
    q.queue.nack(&second.receipt, Duration::ZERO).await.unwrap();
    let third = q.one("a stale ack is ignored").await;
    assert_eq!(third.attempt, 3);
    q.queue.ack(&[&third.receipt]).await.unwrap();
    q.done().await;
}

/// A nack with a delay is delivered again after the delay, not before, its attempt counted.
pub async fn a_nack_with_a_delay_is_not_delivered_before_it<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let d = q.one("the first receive").await;
    let delay = q.lease * 3;
    let nacked = Instant::now();
    q.queue.nack(&d.receipt, delay).await.unwrap();
    q.nothing(q.lease * 2, "a nacked message waits out its delay")
        .await;
    let again = q.one("a nacked message comes back after its delay").await;
    assert!(
        nacked.elapsed() >= delay.mul_f64(0.9),
        "delivered again after {:?}, before the delay of {delay:?}",
        nacked.elapsed()
    );
    assert_eq!(again.attempt, 2, "a nack counts an attempt");
    q.queue.ack(&[&again.receipt]).await.unwrap();
    q.done().await;
}

/// A release (the consumer could not process it, through no fault of the message's) is
/// delivered again at once, with no attempt counted.
pub async fn a_release_counts_no_attempt<Q: Source + Publisher + Inspect>(q: &Queue<Q>, ns: &str) {
    q.queue.publish(&q.msg(ns, "a")).await.unwrap();
    let d = q.one("the first receive").await;
    q.queue.release(&[&d.receipt]).await.unwrap();
    let again = q
        .receive(10, Duration::from_secs(2))
        .await
        .into_iter()
        .next()
        .expect("a released message is delivered again at once");
    assert_eq!(id_of(&again), id_of(&d));
    assert_eq!(again.attempt, 1, "a release counts no attempt");
    q.queue.ack(&[&again.receipt]).await.unwrap();
    q.done().await;
}

/// A dead letter leaves the queue and keeps its payload, id and headers, with the reason;
/// reading the dead letters leaves them there.
pub async fn a_dead_letter_keeps_payload_id_headers_and_reason<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    let m = q.msg(ns, "poison").with_header("tenant", "acme");
    q.queue.publish(&m).await.unwrap();
    let d = q.one("the first receive").await;
    let reason = DeadLetterReason {
        error: "invalid input: test".into(),
        attempts: d.attempt,
        source_queue: q.queue.queue().into(),
        consumer: "conformance".into(),
    };
    q.queue.dead_letter(&d, &reason).await.unwrap();
    q.queue.abandon().await;
    q.nothing(q.lease * 2, "a dead-lettered message never returns")
        .await;
    for read in ["first", "second"] {
        let letters = q.queue.dead_letters().await.unwrap();
        assert_eq!(
            letters.len(),
            1,
            "{read} read: one dead letter, left in place"
        );
        let l = &letters[0];
        assert_eq!(l.message.id(), m.id(), "the dead letter keeps its id");
        assert_eq!(l.message.payload(), m.payload(), "and its payload");
        assert_eq!(l.message.header("tenant"), Some("acme"), "and its headers");
        assert_eq!(l.reason.error, reason.error, "and the reason");
        assert_eq!(l.reason.consumer, reason.consumer);
    }
    assert_eq!(
        q.queue.pending().await.unwrap(),
        0,
        "a dead letter is not pending"
    );
    q.done().await;
}

/// Publishes `names`, receives them and dead-letters each with the reason `boom N`.
async fn dead_letters_of<Q: Source + Publisher + Inspect>(q: &Queue<Q>, ns: &str, names: &[&str]) {
    for n in names {
        q.queue.publish(&q.msg(ns, n)).await.unwrap();
    }
    let mut got = Vec::new();
    q.receive_until(&mut got, names.len(), Duration::from_secs(10))
        .await;
    assert_eq!(
        got.len(),
        names.len(),
        "every message to dead-letter is delivered"
    );
    for (i, d) in got.iter().enumerate() {
        let reason = DeadLetterReason {
            error: format!("boom {i}"),
            attempts: d.attempt,
            source_queue: q.queue.queue().into(),
            consumer: "conformance".into(),
        };
        q.queue.dead_letter(d, &reason).await.unwrap();
    }
}

/// A replay publishes a dead letter back to its queue under its own id, with its history
/// ([`DeadLetter::REPLAYS`]) and without its reason, and takes it off the dead letters; the
/// others stay, oldest first.
pub async fn a_replay_returns_a_dead_letter_under_its_own_id<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    dead_letters_of(q, ns, &["a", "b"]).await;
    let entries = q.queue.dead_letter_entries().await.unwrap();
    assert_eq!(entries.len(), 2, "two dead letters, listed with keys");
    let b = entries
        .iter()
        .find(|e| {
            e.letter
                .message
                .id()
                .is_some_and(|i| i.as_str().ends_with("-b"))
        })
        .expect("the dead letter of b");
    let moved = q
        .queue
        .replay_dead_letters(std::slice::from_ref(&b.key), &Replay::new())
        .await
        .unwrap();
    assert_eq!(moved, 1, "one replayed");
    let d = q.one("the replayed message").await;
    assert_eq!(id_of(&d), format!("{ns}-b"), "a replay keeps the id");
    assert_eq!(d.message.payload(), b"payload b", "and the payload");
    assert_eq!(
        d.message.header(DeadLetter::REPLAYS),
        Some("1"),
        "and records the replay"
    );
    assert_eq!(d.attempt, 1, "a replayed message starts its attempts over");
    assert!(
        d.message.header(DeadLetterReason::ERROR).is_none(),
        "the old reason is not a header of the new delivery"
    );
    q.queue.ack(&[&d.receipt]).await.unwrap();
    let left = q.queue.dead_letters().await.unwrap();
    let ids: Vec<_> = left
        .iter()
        .map(|l| l.message.id().map(|i| i.as_str().to_owned()))
        .collect();
    assert_eq!(
        ids,
        [Some(format!("{ns}-a"))],
        "the other dead letter stays"
    );
    q.done().await;
}

/// A replay or purge naming a key that is not there, or a replay into a queue that does
/// not exist, moves nothing; a purge deletes what it names and nothing else.
pub async fn a_bad_replay_moves_nothing_and_a_purge_deletes_what_it_names<
    Q: Source + Publisher + Inspect,
>(
    q: &Queue<Q>,
    ns: &str,
) {
    dead_letters_of(q, ns, &["a", "b"]).await;
    let keys: Vec<String> = q
        .queue
        .dead_letter_entries()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    let with_missing = [keys[0].clone(), "999999".to_owned()];
    assert!(
        q.queue
            .replay_dead_letters(&with_missing, &Replay::new())
            .await
            .is_err(),
        "a key that is not there fails the replay"
    );
    let nowhere = Replay::new().to(format!("{ns}-no-such-queue"));
    assert!(
        q.queue
            .replay_dead_letters(&keys[..1], &nowhere)
            .await
            .is_err(),
        "a target queue that does not exist fails the replay"
    );
    assert!(
        q.queue.purge_dead_letters(&with_missing).await.is_err(),
        "and the purge"
    );
    assert_eq!(
        q.queue.dead_letters().await.unwrap().len(),
        2,
        "nothing moved"
    );
    q.nothing(Duration::from_millis(300), "nothing was published")
        .await;
    assert_eq!(q.queue.purge_dead_letters(&keys[..1]).await.unwrap(), 1);
    let left = q.queue.dead_letters().await.unwrap();
    assert_eq!(left.len(), 1, "the purge deleted the one it named");
    assert_eq!(
        left[0].message.id().map(|i| i.as_str().to_owned()),
        Some(format!("{ns}-b"))
    );
    q.done().await;
}

/// A receive on an empty queue waits about as long as asked, then answers empty.
pub async fn receive_waits_as_long_as_asked<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    _ns: &str,
) {
    let wait = Duration::from_millis(400);
    let t0 = Instant::now();
    q.nothing(wait, "an empty queue").await;
    let took = t0.elapsed();
    assert!(
        took >= wait.mul_f64(0.8),
        "receive returned after {took:?}, asked to wait {wait:?}"
    );
    assert!(
        took <= wait + Duration::from_secs(2),
        "receive took {took:?}, asked to wait {wait:?}"
    );
    q.done().await;
}

/// A message without an id, and one larger than a consumer accepts (1 MiB by default), are
/// delivered all the same: the consumer, not the transport, dead-letters them with a reason.
pub async fn bad_messages_are_still_delivered<Q: Source + Publisher + Inspect>(
    q: &Queue<Q>,
    ns: &str,
) {
    let big = Message::new(vec![b'x'; (1 << 20) + 1024])
        .with_id(format!("{ns}-big"))
        .unwrap();
    q.queue.publish(&Message::new("no id")).await.unwrap();
    q.queue.publish(&big).await.unwrap();
    let mut got = Vec::new();
    q.receive_until(&mut got, 2, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 2, "both messages are delivered");
    assert!(
        got[0].message.id().is_none(),
        "the message without an id has none"
    );
    assert_eq!(
        got[1].message.payload().len(),
        big.payload().len(),
        "the payload is whole"
    );
    let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
    q.queue.ack(&receipts).await.unwrap();
    q.done().await;
}
