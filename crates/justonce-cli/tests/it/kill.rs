//! A consumer as a separate OS process, SIGKILLed mid-run (between commit and ack, before
//! commit, and at a random moment), restarted, and checked from the business data: on the
//! embedded SQLite queue and on RabbitMQ.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use justonce::amqp::{AmqpOptions, AmqpPublisher, AmqpSource};
use justonce::sql::{SqliteQueue, SqliteStore};
use justonce::{Message, Publisher};
use sqlx::Row;

const ORDERS: usize = 600;
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

struct Setup {
    _dir: tempfile::TempDir,
    /// The transport URL.
    transport: String,
    /// The queue's name on it.
    queue: String,
    store: String,
}

fn worker(s: &Setup, semantics: &str, pause: Option<&str>, exit_when_drained: bool) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_justonce"));
    cmd.args([
        "worker",
        "--transport",
        &s.transport,
        "--queue",
        &s.queue,
        "--store",
        &s.store,
    ])
    .args([
        "--semantics",
        semantics,
        "--batch-size",
        "50",
        "--lease-ms",
        "400",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if exit_when_drained {
        cmd.arg("--exit-when-drained");
    }
    match pause {
        Some(p) => cmd.env("JUSTONCE_FAULT_PAUSE", p),
        None => cmd.env_remove("JUSTONCE_FAULT_PAUSE"),
    };
    cmd.spawn().expect("worker starts")
}

/// Kills the worker with SIGKILL as soon as it announces its fault point.
fn kill_at_fault_point(mut child: Child, point: &str) {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let marker = format!("justonce-fault-point {point}");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&marker) {
                let _ = tx.send(());
                return;
            }
        }
    });
    let seen = rx.recv_timeout(Duration::from_secs(60));
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    seen.unwrap_or_else(|_| panic!("the worker never reached {point}"));
}

fn orders() -> Vec<Message> {
    (0..ORDERS)
        .map(|i| {
            let id = format!("ord-{i:05}");
            let body = format!(
                r#"{{"order_id":"{id}","account":{},"amount":{}}}"#,
                i % 100 + 1,
                i + 1
            );
            Message::new(body).with_id(id).unwrap()
        })
        .collect()
}

async fn setup(amqp: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("store.db").display());
    if amqp {
        let queue = format!("jo-kill-{}-{:08x}", std::process::id(), fastrand::u32(..));
        let p = AmqpPublisher::connect(AMQP, AmqpOptions::new(queue.clone()))
            .await
            .unwrap();
        p.publish_batch(&orders()).await.unwrap();
        Setup {
            _dir: dir,
            transport: AMQP.to_owned(),
            queue,
            store,
        }
    } else {
        let transport = format!("sqlite:{}", dir.path().join("queue.db").display());
        let q = SqliteQueue::open(&transport, "orders").await.unwrap();
        q.publish_batch(&orders()).await.unwrap();
        Setup {
            _dir: dir,
            transport,
            queue: "orders".to_owned(),
            store,
        }
    }
}

/// What the data says after a run.
struct Outcome {
    /// Ledger rows per order, in order.
    counts: Vec<i64>,
    /// Whether account balances add up to the ledger.
    consistent: bool,
    /// Messages still on the transport.
    pending: u64,
    /// Redeliveries, where the transport records them (the SQLite queue does; RabbitMQ's
    /// count lived in the worker processes that are gone).
    redeliveries: Option<u64>,
}

async fn check(s: &Setup) -> Outcome {
    let store = SqliteStore::open(&s.store).await.unwrap();
    let counts: Vec<i64> = sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)
         SELECT (SELECT COUNT(*) FROM jo_demo_ledger WHERE order_id = printf('ord-%05d', i)) FROM n",
    )
    .bind(ORDERS as i64)
    .fetch_all(store.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<i64, _>(0))
    .collect();
    let consistent: bool = sqlx::query_scalar(
        "SELECT (SELECT SUM(balance) FROM jo_demo_accounts) = (SELECT SUM(amount) FROM jo_demo_ledger)",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    if s.transport.starts_with("amqp") {
        let q = AmqpSource::connect(&s.transport, AmqpOptions::new(s.queue.clone()))
            .await
            .unwrap();
        let pending = q.pending().await.unwrap();
        q.delete_topology().await.unwrap();
        return Outcome {
            counts,
            consistent,
            pending,
            redeliveries: None,
        };
    }
    let stats = SqliteQueue::open(&s.transport, &s.queue)
        .await
        .unwrap()
        .stats()
        .await
        .unwrap();
    Outcome {
        counts,
        consistent,
        pending: stats.pending,
        redeliveries: Some(stats.redeliveries),
    }
}

fn run_with_kills(semantics: &str, amqp: bool) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(setup(amqp));
    // Three kills between commit and ack, one before commit, one at a random moment.
    for point in [
        "after-commit",
        "before-commit",
        "after-commit",
        "after-commit",
    ] {
        let child = worker(&s, semantics, Some(&format!("{point}:5000")), false);
        kill_at_fault_point(child, point);
    }
    let mut child = worker(&s, semantics, None, false);
    std::thread::sleep(Duration::from_millis(150 + fastrand::u64(0..200)));
    child.kill().unwrap();
    child.wait().unwrap();

    // Restart and let it drain.
    let mut child = worker(&s, semantics, None, true);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("the worker did not drain the queue in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "the final worker exits 0 once drained");
    rt.block_on(check(&s))
}

fn assert_exactly_once(o: &Outcome) {
    assert_eq!(o.pending, 0, "the transport holds nothing");
    assert!(o.consistent, "balances add up to the ledger");
    let wrong: Vec<(usize, i64)> = o
        .counts
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, c)| *c != 1)
        .collect();
    assert!(
        wrong.is_empty(),
        "orders not applied exactly once (index, count): {wrong:?}"
    );
}

fn assert_duplicated(o: &Outcome) {
    assert_eq!(o.pending, 0);
    assert!(o.consistent);
    assert!(
        o.counts.iter().all(|c| *c >= 1),
        "at-least-once loses nothing"
    );
    let duplicated = o.counts.iter().filter(|c| **c > 1).count();
    assert!(
        duplicated >= 50,
        "kills between commit and ack duplicate effects ({duplicated})"
    );
}

#[test]
fn sigkilled_consumer_applies_every_message_exactly_once_under_effectively_once() {
    let o = run_with_kills("effectively-once", false);
    let redeliveries = o.redeliveries.unwrap();
    assert!(
        redeliveries >= 50,
        "the kills after commit caused redeliveries ({redeliveries})"
    );
    assert_exactly_once(&o);
}

#[test]
fn the_same_kills_duplicate_effects_under_at_least_once() {
    assert_duplicated(&run_with_kills("at-least-once", false));
}

#[test]
fn sigkilled_consumer_on_rabbitmq_applies_every_message_exactly_once() {
    if !justonce_test::service_available("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    assert_exactly_once(&run_with_kills("effectively-once", true));
}

#[test]
fn the_same_kills_on_rabbitmq_duplicate_effects_under_at_least_once() {
    if !justonce_test::service_available("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    assert_duplicated(&run_with_kills("at-least-once", true));
}

#[test]
fn sigterm_mid_batch_finishes_commits_acks_and_exits_zero() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(setup(false));
    let mut child = worker(&s, "effectively-once", Some("before-commit:1000"), false);
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    // It says it is ready, then where it stopped.
    let line = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.starts_with("justonce-fault-point"))
        .expect("the worker announces its fault point");
    assert!(
        line.contains("justonce-fault-point before-commit batch=50"),
        "{line}"
    );
    // The batch is handled, not yet committed: ask the worker to stop.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    let o = rt.block_on(check(&s));
    assert!(o.consistent);
    assert_eq!(
        o.counts.iter().filter(|c| **c == 1).count(),
        50,
        "the batch in flight committed"
    );
    assert!(o.counts.iter().all(|c| *c <= 1));
    assert_eq!(
        o.pending,
        ORDERS as u64 - 50,
        "and was acked; nothing else was received"
    );
    assert_eq!(o.redeliveries, Some(0));
}
