//! What differs between the RabbitMQ of Debian 12 (3.10, the machine's) and of Debian 13
//! (4.0, from `scripts/debian13.sh`'s root, a node of the test's own).

use super::*;
use justonce_amqp::harness::Cluster;
use justonce_core::Inspect;

/// A RabbitMQ 4.0 node of the test's own, from Debian 13's root; `None` (loudly) when the
/// root is not built.
async fn rabbitmq_4() -> Option<Cluster> {
    let root = justonce_test::debian13_root()?;
    let node = Cluster::start_in(&root, 1)
        .await
        .expect("a RabbitMQ node from Debian 13's root starts");
    let version = node.version().await.unwrap();
    eprintln!("RabbitMQ {version} (Debian 13)");
    assert!(version.starts_with("4."), "{version}");
    // The node denies what 4.3 denies by default: a transient non-exclusive queue, say.
    let conn = lapin::Connection::connect(&node.url(0), lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let transient = ch
        .queue_declare(
            unique_name("jo-transient").as_str().into(),
            lapin::options::QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await;
    assert!(
        transient.is_err(),
        "the node permits transient non-exclusive queues: deprecated features are not denied"
    );
    let _ = conn.close(200, "checked".into()).await;
    Some(node)
}

/// The transport contract on RabbitMQ 4.0 with every deprecated feature denied (4.3's
/// defaults): a node of each rule's own.
mod contract_rabbitmq_4 {
    use super::*;
    use justonce_test::{transport::Queue, Backend};

    justonce_test::transport_tests!(|| async {
        let node = rabbitmq_4().await?;
        let mut o = options("contract4");
        o.retry_delays = vec![Duration::from_millis(300), Duration::from_millis(900)];
        let q = AmqpSource::connect(&node.url(0), o).await.unwrap();
        Some(Backend::new(Queue::new(q, Duration::from_millis(300))).keeping(node))
    });
}

/// Two dead letters, read in place 100 times the way `justonce dlq list` and a worker's
/// metrics read them: both still there, and drained at the end.
async fn reading_dead_letters_keeps_them(url: &str) {
    let q = AmqpSource::connect(url, options("dlq-reads"))
        .await
        .unwrap();
    q.publish_batch(&[msg("r-1"), msg("r-2")]).await.unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(q.receive(2, Duration::from_secs(2)).await.unwrap());
    }
    assert_eq!(got.len(), 2);
    for d in &got {
        let reason = DeadLetterReason {
            error: "invalid input".into(),
            attempts: d.attempt,
            source_queue: q.queue().into(),
            consumer: "billing".into(),
        };
        q.dead_letter(d, &reason).await.unwrap();
    }
    for read in 1..=100 {
        let letters = q.dead_letters().await.unwrap();
        assert_eq!(
            letters.len(),
            2,
            "read {read}: {} dead letters",
            letters.len()
        );
    }
    assert_eq!(q.drain_dead_letters().await.unwrap().len(), 2);
    q.delete_topology().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_read_100_times_stay_on_rabbitmq_3() {
    let Some(url) = url() else { return };
    reading_dead_letters_keeps_them(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_read_100_times_stay_on_rabbitmq_4() {
    let Some(node) = rabbitmq_4().await else {
        return;
    };
    reading_dead_letters_keeps_them(&node.url(0)).await;
}

/// A dead-letter queue made before justonce gave it an explicit limit (none, as justonce
/// 0.1 declared it) is used as it is: the connect works, and a dead letter lands in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_queue_declared_without_a_limit_is_still_used() {
    use lapin::types::{AMQPValue, FieldTable};
    let Some(url) = url() else { return };
    let o = options("old-dlq");
    let dlq = o.dead_letter_queue().unwrap().to_owned();
    {
        let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        let durable = lapin::options::QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(dlq.as_str().into(), durable, args)
            .await
            .unwrap();
        let _ = conn.close(200, "made".into()).await;
    }
    let q = AmqpSource::connect(&url, o)
        .await
        .expect("the old queue is used as it is");
    q.publish(&msg("old-1")).await.unwrap();
    let got = q.receive(1, Duration::from_secs(5)).await.unwrap();
    let reason = DeadLetterReason {
        error: "invalid input".into(),
        attempts: got[0].attempt,
        source_queue: q.queue().into(),
        consumer: "billing".into(),
    };
    q.dead_letter(&got[0], &reason).await.unwrap();
    assert_eq!(q.drain_dead_letters().await.unwrap().len(), 1);
    q.delete_topology().await.unwrap();
}
