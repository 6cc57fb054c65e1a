//! The NATS transport against real servers: the shared one (JUSTONCE_NATS_URL, default the
//! local :4222), each test on streams of its own, and `nats-server`s the tests start
//! themselves (on ports and store directories of their own) where a server must restart
//! or take larger messages than the default 1 MiB.

use std::time::Duration;

use justonce_core::{ErrorKind, Inspect, Message, Publisher, Source};
use justonce_nats::harness::OwnServer;
use justonce_nats::{NatsOptions, NatsStream, Retention};
use justonce_test::unique_name;

mod auth;

fn url() -> Option<String> {
    let url = std::env::var("JUSTONCE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    justonce_test::service_available("NATS", "127.0.0.1:4222").then_some(url)
}

/// A server of the test's own; `None` when `nats-server` is missing and services are not
/// required.
async fn own(max_payload: usize) -> Option<OwnServer> {
    if !OwnServer::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "nats-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: nats-server is not installed");
        return None;
    }
    Some(
        OwnServer::start(max_payload)
            .await
            .expect("nats-server starts"),
    )
}

/// A NATS 2.10 server of the test's own, from Debian 13's root; `None` (loudly) when the
/// root is not built.
async fn nats_2_10() -> Option<OwnServer> {
    let root = justonce_test::debian13_root()?;
    let server = OwnServer::start_in(&root, 1 << 20)
        .await
        .expect("nats-server from Debian 13's root starts");
    assert!(server.version().await.unwrap().contains("v2.10"));
    Some(server)
}

fn name(test: &str) -> String {
    unique_name(&format!("jo-{test}")).replace(['.', ':'], "-")
}

fn opts(test: &str, lease_ms: u64) -> NatsOptions {
    NatsOptions::new(name(test)).lease(Duration::from_millis(lease_ms))
}

/// The dead letters, once there are some (10 s at most), read while `q` goes on pulling
/// as a live worker does: the server sends the `MAX_DELIVERIES` advisory when a pull
/// finds a message past `max_deliver`. Each pull must deliver nothing.
async fn dead_letters_while_pulling(q: &NatsStream) -> Vec<justonce_core::DeadLetter> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = q.receive(1, Duration::from_millis(300)).await.unwrap();
        assert!(again.is_empty(), "nothing is delivered past max_deliver");
        let l = q.dead_letters().await.unwrap();
        if !l.is_empty() || std::time::Instant::now() > deadline {
            return l;
        }
    }
}

fn msg(id: &str) -> Message {
    Message::new(format!("payload {id}")).with_id(id).unwrap()
}

/// The transport contract. On a server of each test's own: the contract sends a message
/// over 1 MiB, and the default server takes at most 1 MiB (`max_payload`).
mod contract {
    use super::*;
    use justonce_test::{transport::Queue, Backend};

    justonce_test::transport_tests!(|| async {
        let server = own(4 << 20).await?;
        let q = NatsStream::connect(&server.url(), opts("contract", 300))
            .await
            .unwrap();
        Some(Backend::new(Queue::new(q, Duration::from_millis(300))).keeping(server))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_published_twice_inside_the_window_is_one_stream_message() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("dedup", 5000))
        .await
        .unwrap();
    q.publish(&msg("ORD-1")).await.unwrap();
    q.publish(&msg("ORD-1")).await.unwrap();
    q.publish_batch(&[msg("ORD-1"), msg("ORD-2")])
        .await
        .unwrap();
    assert_eq!(q.publish_duplicates(), 2, "two PubAcks said duplicate");
    assert_eq!(
        q.pending().await.unwrap(),
        2,
        "two stream messages, not four"
    );
    let got = q.receive(10, Duration::from_secs(1)).await.unwrap();
    let ids: Vec<_> = got
        .iter()
        .map(|d| d.message.id().unwrap().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["ORD-1", "ORD-2"]);
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_shorter_than_the_retry_horizon_refuses_to_start() {
    let Some(url) = url() else { return };
    // In the options themselves.
    let e = NatsStream::connect(
        &url,
        opts("window", 5000)
            .duplicate_window(Duration::from_secs(30))
            .retry_horizon(Duration::from_secs(60)),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("duplicate_window"), "{e}");
    // On a stream that exists with a short window.
    let o = opts("window", 5000)
        .duplicate_window(Duration::from_secs(10))
        .retry_horizon(Duration::from_secs(5));
    let q = NatsStream::connect(&url, o.clone()).await.unwrap();
    let e = NatsStream::connect(
        &url,
        o.retry_horizon(Duration::from_secs(60))
            .duplicate_window(Duration::from_secs(120)),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(
        e.to_string().contains("10s") && e.to_string().contains("60s"),
        "the error names both durations: {e}"
    );
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_memory_or_of_another_retention_is_refused() {
    let Some(url) = url() else { return };
    let client = async_nats::connect(&url).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let mem = name("memory");
    js.create_stream(async_nats::jetstream::stream::Config {
        name: mem.clone(),
        subjects: vec![mem.clone()],
        storage: async_nats::jetstream::stream::StorageType::Memory,
        ..Default::default()
    })
    .await
    .unwrap();
    let e = NatsStream::connect(&url, NatsOptions::new(&mem))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("memory"), "{e}");
    js.delete_stream(&mem).await.unwrap();

    let q = NatsStream::connect(&url, opts("retention", 5000).retention(Retention::Limits))
        .await
        .unwrap();
    let e = NatsStream::connect(&url, q.options().clone().retention(Retention::WorkQueue))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("limits retention"), "{e}");
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_over_max_payload_is_refused_and_nothing_is_stored() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("big", 5000)).await.unwrap();
    let big = Message::new(vec![b'x'; q.max_payload() + 1])
        .with_id("BIG-1")
        .unwrap();
    let e = q.publish(&big).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("max_payload"), "{e}");
    assert_eq!(q.pending().await.unwrap(), 0);
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_nats_msg_id_is_delivered_without_an_id() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("noid", 5000)).await.unwrap();
    // A producer that is not justonce: a plain JetStream publish, no header.
    let js = async_nats::jetstream::new(q.client().clone());
    js.publish(q.options().subject.clone(), "raw".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let got = q.receive(10, Duration::from_secs(1)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].message.id().is_none(),
        "no Nats-Msg-Id, no id: the consumer dead-letters it"
    );
    q.ack(&[&got[0].receipt]).await.unwrap();
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_or_a_wrong_url_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = NatsStream::connect(&format!("nats://127.0.0.1:{port}"), NatsOptions::new("x"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Connect, "{e}");
    assert!(e.to_string().contains("cannot connect to NATS"), "{e}");
    let e = NatsStream::connect("http://127.0.0.1:4222", NatsOptions::new("x"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let e = NatsStream::connect("nats://127.0.0.1:4222", NatsOptions::new("a.b"))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_allowed_delivery_is_dead_lettered_not_nacked() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("lastnack", 300).max_deliver(Some(2)))
        .await
        .unwrap();
    q.publish(&msg("ORD-1")).await.unwrap();
    let d = q
        .receive(1, Duration::from_secs(2))
        .await
        .unwrap()
        .remove(0);
    q.nack(&d.receipt, Duration::ZERO).await.unwrap();
    let d = q
        .receive(1, Duration::from_secs(2))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(d.attempt, 2);
    q.nack(&d.receipt, Duration::ZERO).await.unwrap();
    let letters = q.dead_letters().await.unwrap();
    assert_eq!(
        letters.len(),
        1,
        "the second nack of max_deliver 2 dead-letters"
    );
    assert!(
        letters[0].reason.error.contains("max_deliver"),
        "{}",
        letters[0].reason.error
    );
    assert_eq!(q.pending().await.unwrap(), 0);
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_workers_all_died_is_dead_lettered_from_the_advisory() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("advisory", 300).max_deliver(Some(2)))
        .await
        .unwrap();
    q.publish(&msg("ORD-1")).await.unwrap();
    for attempt in 1..=2 {
        let d = q.receive(1, Duration::from_secs(3)).await.unwrap();
        assert_eq!(d.len(), 1, "delivery {attempt}");
        q.abandon().await; // the worker dies holding it
    }
    let letters = dead_letters_while_pulling(&q).await;
    assert_eq!(
        letters.len(),
        1,
        "dead-lettered from the MAX_DELIVERIES advisory"
    );
    assert_eq!(letters[0].message.id().unwrap().as_str(), "ORD-1");
    assert!(letters[0].reason.error.contains("never settled"));
    assert_eq!(q.pending().await.unwrap(), 0);
    assert!(q
        .receive(1, Duration::from_millis(900))
        .await
        .unwrap()
        .is_empty());
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_past_half_its_ack_wait_is_kept_with_wpi() {
    let Some(url) = url() else { return };
    let o = opts("wpi", 400);
    let a = NatsStream::connect(&url, o.clone()).await.unwrap();
    let b = NatsStream::connect(&url, o).await.unwrap();
    a.publish(&msg("ORD-1")).await.unwrap();
    let d = a
        .receive(1, Duration::from_secs(2))
        .await
        .unwrap()
        .remove(0);
    // Four ack_waits: without +WPI the server would have delivered it to `b` by now.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let stolen = b.receive(10, Duration::from_millis(300)).await.unwrap();
    assert!(stolen.is_empty(), "a kept delivery is not delivered again");
    a.ack(&[&d.receipt]).await.unwrap();
    assert_eq!(a.pending().await.unwrap(), 0);
    a.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_create_off_the_consumer_is_checked_and_its_own_limits_are_used() {
    let Some(url) = url() else { return };
    let owned = NatsStream::connect(&url, opts("owned", 1000).max_deliver(Some(7)))
        .await
        .unwrap();
    let tool = NatsStream::connect(
        &url,
        NatsOptions::new(&owned.options().stream).create(false),
    )
    .await
    .unwrap();
    assert_eq!(tool.options().lease, Duration::from_millis(1000));
    assert_eq!(tool.options().max_deliver, Some(7));
    let e = NatsStream::connect(
        &url,
        NatsOptions::new(&owned.options().stream)
            .consumer("nobody")
            .create(false),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("no consumer `nobody`"), "{e}");
    let e = NatsStream::connect(&url, NatsOptions::new(name("absent")).create(false))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no JetStream stream"), "{e}");
    owned.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_an_ack_of_a_batch_returns_the_server_holds_none_of_it() {
    let Some(url) = url() else { return };
    let q = NatsStream::connect(&url, opts("batchack", 5000))
        .await
        .unwrap();
    let msgs: Vec<Message> = (0..300).map(|i| msg(&format!("ORD-{i}"))).collect();
    q.publish_batch(&msgs).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 300 {
        let more = q.receive(300, Duration::from_secs(2)).await.unwrap();
        assert!(!more.is_empty(), "all 300 are delivered");
        got.extend(more);
    }
    assert_eq!(q.pending().await.unwrap(), 300, "all delivered, none acked");
    let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
    q.ack(&receipts).await.unwrap();
    // No wait: the last ack's reply comes after the server took every ack before it.
    assert_eq!(
        q.pending().await.unwrap(),
        0,
        "every ack was taken before ack returned"
    );
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_ran_out_while_no_worker_listened_is_dead_lettered_by_the_next() {
    let Some(url) = url() else { return };
    let o = opts("restartdl", 300).max_deliver(Some(2));
    {
        let dying = NatsStream::connect(&url, o.clone()).await.unwrap();
        dying
            .publish_batch(&[msg("ORD-1"), msg("ORD-2")])
            .await
            .unwrap();
        for attempt in 1..=2 {
            let d = dying.receive(1, Duration::from_secs(2)).await.unwrap();
            assert_eq!(d[0].message.id().unwrap().as_str(), "ORD-1");
            assert_eq!(d[0].attempt, attempt);
            dying.abandon().await;
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        // The worker dies before any pull could make the server report ORD-1.
    }
    let next = NatsStream::connect(&url, o).await.unwrap();
    let got = next.receive(10, Duration::from_millis(500)).await.unwrap();
    let ids: Vec<_> = got
        .iter()
        .map(|d| d.message.id().unwrap().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["ORD-2"], "ORD-1 is past max_deliver");
    let letters = dead_letters_while_pulling(&next).await;
    assert_eq!(
        letters.len(),
        1,
        "the next worker heard the advisory its first pull caused"
    );
    assert_eq!(letters[0].message.id().unwrap().as_str(), "ORD-1");
    next.ack(&[&got[0].receipt]).await.unwrap();
    assert_eq!(next.pending().await.unwrap(), 0);
    next.cleanup().await.unwrap();
}

/// Acks of a batch pulled before the server restarted. nats-server 2.10 answers nothing for
/// a delivery its recovered consumer does not know (2.9 answers): the ack waited 5 s for
/// the last reply and 5 s more for each again, and the batch failed, so a worker stalled
/// about 110 s after a restart in the lab. Whether 2.10 knows them depends on whether it
/// wrote the consumer's state before the kill (about half the rounds here did not), so five
/// rounds: each ack returns at once now, and every message is acked in the end (a delivery
/// the server forgot comes back after `ack_wait` and is acked then).
async fn a_batch_held_across_a_restart_is_acked_at_once(mut server: OwnServer) {
    eprintln!("{}", server.version().await.unwrap());
    let q = NatsStream::connect(&server.url(), opts("held-restart", 2_000))
        .await
        .unwrap();
    let mut acked: std::collections::HashSet<String> = std::collections::HashSet::new();
    for round in 0..5 {
        let sent: Vec<Message> = (0..20).map(|i| msg(&format!("h-{round}-{i}"))).collect();
        q.publish_batch(&sent).await.unwrap();
        let held = q.receive(20, Duration::from_secs(2)).await.unwrap();
        assert!(!held.is_empty());
        server.restart().await.unwrap();
        // The client connects again (it retries every few hundred ms).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let t = std::time::Instant::now();
        let receipts: Vec<_> = held.iter().map(|d| &d.receipt).collect();
        q.ack(&receipts)
            .await
            .expect("the ack of a batch held across the restart");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "round {round}: the ack waited {:?} for replies a restarted server does not send",
            t.elapsed()
        );
        acked.extend(
            held.iter()
                .map(|d| d.message.id().unwrap().as_str().to_owned()),
        );
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        let got = q.receive(20, Duration::from_millis(300)).await.unwrap();
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        q.ack(&receipts).await.unwrap();
        acked.extend(
            got.iter()
                .map(|d| d.message.id().unwrap().as_str().to_owned()),
        );
        if acked.len() == 100 && got.is_empty() && q.pending().await.unwrap() == 0 {
            break;
        }
    }
    assert_eq!(acked.len(), 100, "every message acked");
    assert_eq!(q.pending().await.unwrap(), 0, "nothing left pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_held_across_a_restart_is_acked_at_once_on_nats_2_9() {
    let Some(server) = own(1 << 20).await else {
        return;
    };
    a_batch_held_across_a_restart_is_acked_at_once(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_held_across_a_restart_is_acked_at_once_on_nats_2_10() {
    let Some(server) = nats_2_10().await else {
        return;
    };
    a_batch_held_across_a_restart_is_acked_at_once(server).await;
}

/// A consumer whose limits differ from the options is updated in those limits only: what
/// others set on it (here a description; likewise metadata, where NATS 2.11 also writes
/// `_nats.*` keys of its own) is sent back as it was, and nothing but the keys justonce
/// sets is compared.
async fn an_update_changes_only_the_limits_justonce_sets(url: &str) {
    let o = opts("kept", 1000);
    let first = NatsStream::connect(url, o.clone()).await.unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let stream = js.get_stream(&o.stream).await.unwrap();
    let mut config = stream
        .consumer_info(&o.consumer)
        .await
        .unwrap()
        .config
        .clone();
    config.description = Some("owned by billing".into());
    stream
        .create_consumer(config)
        .await
        .expect("the consumer is updated by hand");
    let q = NatsStream::connect(url, o.clone().lease(Duration::from_millis(2000)))
        .await
        .unwrap();
    let after = stream
        .consumer_info(&o.consumer)
        .await
        .unwrap()
        .config
        .clone();
    assert_eq!(
        after.ack_wait,
        Duration::from_millis(2000),
        "the lease is updated"
    );
    assert_eq!(
        after.description.as_deref(),
        Some("owned by billing"),
        "what justonce does not set is kept"
    );
    drop(first);
    q.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_changes_only_the_limits_justonce_sets_on_nats_2_9() {
    let Some(url) = url() else { return };
    an_update_changes_only_the_limits_justonce_sets(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_changes_only_the_limits_justonce_sets_on_nats_2_10() {
    let Some(server) = nats_2_10().await else {
        return;
    };
    an_update_changes_only_the_limits_justonce_sets(&server.url()).await;
}

/// A publisher sending batches while its server is SIGKILLed and started again gets an
/// answer to every batch (stored, or an error to publish it again) within the context's
/// timeouts: it never waits for ever. (The lab's million-order soak on NATS stopped with the
/// publisher silent after the first broker restart.)
async fn a_publisher_across_a_server_restart_never_hangs(mut server: OwnServer) {
    let url = server.url();
    let q = std::sync::Arc::new(
        NatsStream::connect(&url, opts("pubrestart", 5000))
            .await
            .unwrap(),
    );
    let publisher = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut errors = 0u64;
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(12) {
                let batch: Vec<Message> = (0..250).map(|i| msg(&format!("p-{n}-{i}"))).collect();
                n += 1;
                match tokio::time::timeout(Duration::from_secs(20), q.publish_batch(&batch)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => errors += 1,
                    Err(_) => panic!("publish_batch {n} has not answered in 20 s"),
                }
            }
            (n, errors)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.kill().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.restart().await.unwrap();
    let (batches, errors) = publisher.await.unwrap();
    eprintln!("{batches} batches, {errors} errors");
    assert!(errors > 0, "the restart failed some batch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_across_a_server_restart_never_hangs_on_nats_2_9() {
    let Some(server) = own(1 << 20).await else {
        return;
    };
    a_publisher_across_a_server_restart_never_hangs(server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_across_a_server_restart_never_hangs_on_nats_2_10() {
    let Some(server) = nats_2_10().await else {
        return;
    };
    a_publisher_across_a_server_restart_never_hangs(server).await;
}
