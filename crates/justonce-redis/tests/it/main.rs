//! The Redis backends against real servers: the shared one (JUSTONCE_REDIS_URL, default
//! the local :6379), each test under a key prefix of its own, and `redis-server`s the tests
//! start themselves (on ports of their own) where a server must restart.

mod proxy;
mod server;
mod tls;
mod versions;

use std::sync::Arc;
use std::time::Duration;

use justonce_core::{
    ClaimState, ClaimStore, DedupKey, DedupStore, ErrorKind, Fingerprint, MessageId, Store,
};
use justonce_redis::{RedisClaimOptions, RedisClaimStore};
use justonce_test::unique_name;

fn url() -> Option<String> {
    let url =
        std::env::var("JUSTONCE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    justonce_test::service_available("Redis", "127.0.0.1:6379").then_some(url)
}

fn prefix(test: &str) -> String {
    format!("{}:", unique_name(&format!("jo-test-{test}")))
}

/// Deletes every key under `prefix`: a test leaves nothing behind on the shared server.
async fn forget(url: &str, prefix: &str) {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

async fn claims_at(url: &str, test: &str) -> RedisClaimStore {
    RedisClaimStore::connect_with(url, RedisClaimOptions::default().prefix(prefix(test)))
        .await
        .unwrap()
}

fn id(s: &str) -> MessageId {
    MessageId::new(s).unwrap()
}

fn key<'a>(consumer: &'a str, m: &'a MessageId) -> DedupKey<'a> {
    DedupKey {
        consumer,
        message_id: m,
    }
}

fn fp() -> Fingerprint {
    Fingerprint::of(b"effect")
}

/// The claim store contract, one test per rule, each under a prefix of its own.
mod claim_contract {
    use super::*;
    use justonce_test::Backend;

    justonce_test::claim_store_tests!(|| async {
        let url = url()?;
        let store = Arc::new(claims_at(&url, "claims").await);
        let p = store.options().prefix.clone();
        Some(Backend::new(store).cleaning_up(move || async move { forget(&url, &p).await }))
    });
}

/// Twenty workers, each on a connection of its own, race for the same fifty keys: every
/// key has exactly one holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_workers_leave_one_holder_per_key() {
    let Some(url) = url() else { return };
    let p = prefix("race");
    let mut workers = Vec::new();
    for _ in 0..20 {
        let store = RedisClaimStore::connect_with(&url, RedisClaimOptions::default().prefix(&p))
            .await
            .unwrap();
        workers.push(tokio::spawn(async move {
            let ids: Vec<MessageId> = (0..50).map(|i| id(&format!("k{i}"))).collect();
            let keys: Vec<_> = ids.iter().map(|m| (key("race", m), fp())).collect();
            let got = store
                .acquire_batch(&keys, Duration::from_secs(30))
                .await
                .unwrap();
            got.iter()
                .map(|s| matches!(s, ClaimState::Acquired { .. }))
                .collect::<Vec<bool>>()
        }));
    }
    let mut holders = vec![0; 50];
    for w in workers {
        for (i, won) in w.await.unwrap().into_iter().enumerate() {
            holders[i] += usize::from(won);
        }
    }
    assert!(
        holders.iter().all(|&h| h == 1),
        "holders per key: {holders:?}"
    );
    forget(&url, &p).await;
}

/// A worker paused past its lease: another worker takes the claim over, and the paused
/// one's completion is refused; the new holder's result stands.
#[tokio::test]
async fn a_worker_paused_past_its_lease_cannot_complete() {
    let Some(url) = url() else { return };
    let p = prefix("paused");
    let open = || RedisClaimStore::connect_with(&url, RedisClaimOptions::default().prefix(&p));
    let (paused, other) = (open().await.unwrap(), open().await.unwrap());
    let m = id("ORD-1");
    let lease = Duration::from_millis(150);
    let ClaimState::Acquired { token: old } =
        paused.acquire(key("c", &m), fp(), lease).await.unwrap()
    else {
        panic!("a free key is acquired");
    };
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let ClaimState::Acquired { token: new } =
        other.acquire(key("c", &m), fp(), lease).await.unwrap()
    else {
        panic!("an expired lease is taken over");
    };
    assert!(new > old, "the takeover's fence is higher ({old} -> {new})");
    other
        .complete(key("c", &m), new, Some(b"the new holder's"))
        .await
        .unwrap();
    let err = paused
        .complete(key("c", &m), old, Some(b"the paused worker's"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(
        other.acquire(key("c", &m), fp(), lease).await.unwrap(),
        ClaimState::Completed {
            result: Some(b"the new holder's".to_vec())
        },
        "the paused worker overwrote nothing"
    );
    forget(&url, &p).await;
}

/// A server that keeps nothing on disk, killed and started again: every key is gone, and
/// the fences issued after the restart are still higher than every fence before it.
#[tokio::test]
async fn fences_grow_across_a_restart_that_loses_every_key() {
    let Some(mut server) = server::own(&["--save", "", "--appendonly", "no"]).await else {
        return;
    };
    let store = claims_at(&server.url(), "restart").await;
    assert_eq!(store.server().keeps_nothing(), Some(true));
    assert!(
        store.server().warnings()[0].contains("keeps nothing"),
        "{:?}",
        store.server().warnings()
    );
    let (a, b) = (id("a"), id("b"));
    let mut before = Vec::new();
    for m in [&a, &b] {
        match store
            .acquire(key("c", m), fp(), Duration::from_secs(30))
            .await
            .unwrap()
        {
            ClaimState::Acquired { token } => before.push(token),
            other => panic!("{other:?}"),
        }
    }
    server.restart().await.expect("redis-server restarts");
    // The manager reconnects; a call that meets the broken connection fails, transient.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let after = loop {
        match store
            .acquire(key("c", &a), fp(), Duration::from_secs(30))
            .await
        {
            Ok(ClaimState::Acquired { token }) => break token,
            Ok(other) => panic!("the restart lost the held claim, so it is free: {other:?}"),
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                assert!(std::time::Instant::now() < deadline, "no reconnect: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let max_before = before.iter().copied().max().unwrap();
    assert!(
        after > max_before,
        "a fence after the restart ({after}) is above every fence before it ({before:?})"
    );
}

/// The reply of the claim script is lost (the proxy takes it and closes the connection):
/// the store asks again with the same owner, and the claim the first run took is answered
/// as the caller's, with its fence; nobody else can take it meanwhile. A completion whose
/// reply is lost is a success when asked again.
#[tokio::test]
async fn an_ambiguous_reply_is_resolved_as_the_owners() {
    let Some(url) = url() else { return };
    let direct = claims_at(&url, "ambiguous").await;
    let upstream = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let proxy = proxy::LossyProxy::start(upstream).await;
    let through = RedisClaimStore::connect_with(
        &proxy.url(),
        RedisClaimOptions::default().prefix(direct.options().prefix.clone()),
    )
    .await
    .unwrap();
    let m = id("ORD-9");
    proxy.lose_next_reply();
    let token = match through
        .acquire(key("c", &m), fp(), Duration::from_secs(30))
        .await
        .unwrap()
    {
        ClaimState::Acquired { token } => token,
        other => panic!("the claim the lost reply took is the caller's, got {other:?}"),
    };
    assert_eq!(proxy.lost(), 1, "a reply was lost");
    assert!(
        matches!(
            direct
                .acquire(key("c", &m), fp(), Duration::from_secs(30))
                .await
                .unwrap(),
            ClaimState::InProgress { .. }
        ),
        "held by the caller, not by anyone else"
    );
    proxy.lose_next_reply();
    through
        .complete(key("c", &m), token, Some(b"done"))
        .await
        .unwrap();
    assert_eq!(proxy.lost(), 2);
    assert_eq!(
        direct
            .acquire(key("c", &m), fp(), Duration::from_secs(30))
            .await
            .unwrap(),
        ClaimState::Completed {
            result: Some(b"done".to_vec())
        }
    );
    forget(&url, &direct.options().prefix).await;
}

/// With `appendonly yes` and `appendfsync always`, the start-up check has nothing to say.
#[tokio::test]
async fn a_durable_server_draws_no_warning() {
    let Some(server) = server::own_durable().await else {
        return;
    };
    let store = claims_at(&server.url(), "durable").await;
    assert_eq!(store.server().keeps_nothing(), Some(false));
    assert!(
        store.server().warnings().is_empty(),
        "{:?}",
        store.server().warnings()
    );
}

/// Nothing listens: a clear error, soon, naming the server without its password.
#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("redis://:s3cret@127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let err = RedisClaimStore::connect(&url).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    let text = err.to_chain_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    let err = RedisClaimStore::connect("http://nowhere")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// The dedup store contract, one test per rule, each under a prefix of its own.
mod dedup_contract {
    use super::*;
    use justonce_redis::{RedisStore, RedisStoreOptions};
    use justonce_test::Backend;

    justonce_test::dedup_store_tests!(|| async {
        let url = url()?;
        let p = prefix("dedup");
        let opts = RedisStoreOptions::default().prefix(&p);
        let store = RedisStore::connect_with(&url, opts).await.unwrap();
        Some(Backend::new(store).cleaning_up(move || async move { forget(&url, &p).await }))
    });
}

mod effects {
    use std::collections::HashMap;

    use justonce::memory::MemoryQueue;
    use justonce::{
        Consumer, ConsumerOptions, Context, Disposition, Handler, Message, Publisher, Semantics,
    };
    use justonce_redis::{RedisStore, RedisStoreOptions, RedisTx};
    use justonce_test::faults::{Effects, Faults};
    use redis::AsyncCommands;

    use super::*;

    /// A payment kept in Redis: the balance and a ledger entry, not idempotent by itself.
    struct Pay {
        prefix: String,
    }

    impl Handler<RedisTx> for Pay {
        async fn handle(
            &self,
            cx: &Context<'_>,
            tx: &mut RedisTx,
        ) -> justonce::Result<Disposition> {
            let id = cx
                .message()
                .id()
                .map(|i| i.as_str().to_owned())
                .unwrap_or_default();
            let amount: i64 = String::from_utf8_lossy(cx.message().payload())
                .parse()
                .unwrap_or(0);
            tx.hincr_by(format!("{}balances", self.prefix), "acct-1", amount);
            tx.rpush(format!("{}ledger", self.prefix), id);
            Ok(Disposition::Ok)
        }
    }

    async fn run(semantics: Semantics) -> (Vec<String>, i64, u64, usize) {
        let url = url().unwrap();
        let p = prefix("effects");
        let store = RedisStore::connect_with(&url, RedisStoreOptions::default().prefix(&p))
            .await
            .unwrap();
        let queue = Arc::new(MemoryQueue::new("payments", Duration::from_millis(50)));
        let faults = Faults::new(11)
            .crash_before_commit(0.15)
            .crash_after_commit(0.15)
            .lose_ack(0.1);
        let sent: Vec<Message> = (0..300)
            .map(|i| Message::new("5").with_id(format!("PAY-{i}")).unwrap())
            .collect();
        queue.publish_batch(&sent).await.unwrap();
        queue
            .publish_batch(&faults.published_twice(&sent))
            .await
            .unwrap();
        let mut opts = ConsumerOptions::new("billing").batch_size(20);
        opts.semantics = semantics;
        let consumer = Consumer::new(
            opts,
            queue.clone(),
            store.clone(),
            Pay { prefix: p.clone() },
        )
        .unwrap()
        .with_fault_hook(Arc::new(faults.clone()));
        let q = queue.clone();
        consumer
            .run_until(async move {
                while !q.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap();
        let mut conn = store.connection();
        let ledger: Vec<String> = conn.lrange(format!("{p}ledger"), 0, -1).await.unwrap();
        let balance: i64 = conn
            .hget(format!("{p}balances"), "acct-1")
            .await
            .unwrap_or(0);
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{p}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = conn.del(keys).await.unwrap();
        (ledger, balance, faults.fired(), sent.len())
    }

    /// Crashes before and after the commit, lost acks and duplicate publishes: every
    /// payment once in the ledger, and the balance is the ledger's sum, read from Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn effects_in_redis_apply_once_under_faults() {
        if url().is_none() {
            return;
        }
        let (ledger, balance, fired, sent) = run(Semantics::EffectivelyOnce).await;
        assert!(fired > 5, "the faults happened ({fired})");
        let verdict = Effects::count(ledger.clone()).check(
            (0..sent)
                .map(|i| format!("PAY-{i}"))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        assert_eq!(
            (verdict.lost, verdict.duplicate_effects),
            (0, 0),
            "{verdict:?}"
        );
        assert_eq!(
            balance,
            5 * ledger.len() as i64,
            "the balance is the ledger's sum"
        );
    }

    /// The twin: at-least-once under the same faults applies some payments twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_least_once_under_the_same_faults_applies_twice() {
        if url().is_none() {
            return;
        }
        let (ledger, _, _, _) = run(Semantics::AtLeastOnce).await;
        let mut per: HashMap<&str, usize> = HashMap::new();
        for id in &ledger {
            *per.entry(id.as_str()).or_default() += 1;
        }
        assert!(per.values().any(|&n| n > 1), "duplicates without dedup");
    }

    /// The records' expiry is the store's retention: a consumer whose redelivery horizon
    /// is not shorter refuses to start, saying both numbers.
    #[tokio::test]
    async fn an_expiry_shorter_than_the_redelivery_horizon_is_refused() {
        let Some(url) = url() else { return };
        let open = |secs| {
            let opts = RedisStoreOptions::default()
                .prefix(prefix("expiry"))
                .expiry(Duration::from_secs(secs));
            RedisStore::connect_with(&url, opts)
        };
        let queue = Arc::new(MemoryQueue::new("q", Duration::from_secs(30)));
        let mut opts = ConsumerOptions::new("billing");
        opts.retry.max_attempts = 5;
        opts.retry.backoff_max = Duration::from_secs(60);
        let short = open(300).await.unwrap();
        let p = Pay {
            prefix: "x:".into(),
        };
        let err = Consumer::new(opts.clone(), queue.clone(), short, p)
            .err()
            .expect("must refuse");
        // 4 retries x 60 s + 5 x 30 s lease = 390 s.
        let text = err.to_string();
        assert!(text.contains("300s") && text.contains("390s"), "{text}");
        let day = open(86_400).await.unwrap();
        assert!(Consumer::new(
            opts,
            queue,
            day,
            Pay {
                prefix: "x:".into()
            }
        )
        .is_ok());
    }

    /// Two batches find one key fresh: the second to commit writes nothing (not its
    /// dedup key, not its writes) and fails as transient.
    #[tokio::test]
    async fn the_second_of_two_commits_of_one_key_writes_nothing() {
        let Some(url) = url() else { return };
        let p = prefix("race2");
        let store = RedisStore::connect_with(&url, RedisStoreOptions::default().prefix(&p))
            .await
            .unwrap();
        let m = id("PAY-1");
        let (mut a, mut b) = (store.begin().await.unwrap(), store.begin().await.unwrap());
        for tx in [&mut a, &mut b] {
            assert_eq!(
                store.claim(tx, key("c", &m), fp()).await.unwrap(),
                justonce_core::Claim::Fresh
            );
            tx.incr_by(format!("{p}n"), 1);
        }
        store.commit(a).await.unwrap();
        let err = store.commit(b).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
        assert!(err.is_transient());
        let n: i64 = store.connection().get(format!("{p}n")).await.unwrap();
        assert_eq!(n, 1, "the losing batch wrote nothing");
        forget(&url, &p).await;
    }

    /// What tools read (`justonce dedup`, `doctor`): records counted per consumer, one
    /// record by its key with its fingerprint, the server's clock.
    #[tokio::test]
    async fn tools_read_the_records_per_consumer() {
        use justonce_core::InspectStore as _;
        let Some(url) = url() else { return };
        let p = prefix("inspect");
        let store = RedisStore::connect_with(&url, RedisStoreOptions::default().prefix(&p))
            .await
            .unwrap();
        let mut tx = store.begin().await.unwrap();
        let (a, b, c) = (id("A"), id("B"), id("C"));
        for (consumer, m) in [("pay", &a), ("pay", &b), ("pay:ments", &c)] {
            store.claim(&mut tx, key(consumer, m), fp()).await.unwrap();
        }
        store.commit(tx).await.unwrap();
        let stats = store.dedup_stats().await.unwrap();
        let counts: Vec<(&str, u64)> = stats
            .iter()
            .map(|c| (c.consumer.as_str(), c.records))
            .collect();
        assert_eq!(counts, [("pay", 2), ("pay:ments", 1)]);
        assert!(stats.iter().all(|c| c.oldest.is_some()));
        let record = store.dedup_record(key("pay", &a)).await.unwrap().unwrap();
        assert_eq!(record.fingerprint, fp());
        assert!(store.dedup_record(key("pay", &c)).await.unwrap().is_none());
        let clock = store.clock().await.unwrap().unwrap();
        let skew = clock
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_else(|e| e.duration());
        assert!(skew < Duration::from_secs(5), "{skew:?}");
        forget(&url, &p).await;
    }

    /// A write Redis would refuse halfway (a push onto a key that holds a string) is found
    /// before anything is written: no dedup key, no earlier write, an error that is not
    /// the message's fault.
    #[tokio::test]
    async fn a_write_that_cannot_run_writes_nothing() {
        let Some(url) = url() else { return };
        let p = prefix("refused");
        let store = RedisStore::connect_with(&url, RedisStoreOptions::default().prefix(&p))
            .await
            .unwrap();
        let mut conn = store.connection();
        let _: () = conn.set(format!("{p}text"), "x").await.unwrap();
        let m = id("PAY-2");
        let mut tx = store.begin().await.unwrap();
        store.claim(&mut tx, key("c", &m), fp()).await.unwrap();
        tx.incr_by(format!("{p}first"), 1);
        tx.rpush(format!("{p}text"), "y");
        let err = store.commit(tx).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Schema, "{err}");
        assert!(!err.kind().is_message_fault());
        let first: Option<i64> = conn.get(format!("{p}first")).await.unwrap();
        assert_eq!(first, None, "the write before it did not run");
        let mut tx = store.begin().await.unwrap();
        assert_eq!(
            store.claim(&mut tx, key("c", &m), fp()).await.unwrap(),
            justonce_core::Claim::Fresh,
            "and the message was not recorded"
        );
        forget(&url, &p).await;
    }
}

/// The transport contract on a Redis stream, one test per rule, each on a stream of its
/// own (deleted through `Inspect::cleanup`), with a lease of 300 ms.
mod stream_contract {
    use super::*;
    use justonce_redis::{RedisStream, RedisStreamOptions};
    use justonce_test::{transport::Queue, Backend};

    justonce_test::transport_tests!(|| async {
        let url = url()?;
        let opts = RedisStreamOptions::new(unique_name("jo-test-stream"))
            .consumer("contract")
            .lease(Duration::from_millis(300));
        let q = RedisStream::connect(&url, opts).await.unwrap();
        Some(Backend::new(Queue::new(q, Duration::from_millis(300))))
    });
}

mod stream {
    use std::collections::HashMap;

    use justonce::memory::{MemoryStore, MemoryTx};
    use justonce::{Consumer, ConsumerOptions, Context, Disposition, Handler, Semantics};
    use justonce_core::{Inspect, Message, Publisher, Source};
    use justonce_redis::{RedisStore, RedisStoreOptions, RedisStream, RedisStreamOptions, RedisTx};
    use justonce_test::faults::{Effects, Faults};
    use redis::AsyncCommands;

    use super::*;

    fn opts(stream: &str, consumer: &str, lease_ms: u64) -> RedisStreamOptions {
        RedisStreamOptions::new(stream)
            .consumer(consumer)
            .lease(Duration::from_millis(lease_ms))
    }

    fn msgs(n: usize, prefix: &str) -> Vec<Message> {
        (0..n)
            .map(|i| Message::new("5").with_id(format!("{prefix}-{i}")).unwrap())
            .collect()
    }

    /// A server without a command the stream's scripts send (here `XAUTOCLAIM`, renamed
    /// away as a managed service may; a server older than Redis 6.2 lacks it) is refused at
    /// connect, by name, from what `COMMAND INFO` says, not its version; the same server
    /// with it connects.
    #[tokio::test]
    async fn a_server_without_a_command_the_stream_sends_is_refused_at_connect_by_name() {
        let Some(server) = crate::server::own(&["--rename-command", "XAUTOCLAIM", ""]).await else {
            return;
        };
        let Err(e) =
            RedisStream::connect(&server.url(), opts(&unique_name("jo-cmd"), "c", 300)).await
        else {
            panic!("a server without XAUTOCLAIM is refused");
        };
        assert_eq!(e.kind(), justonce_core::ErrorKind::Config, "{e}");
        assert!(
            e.to_string().contains("needs the command XAUTOCLAIM"),
            "{e}"
        );
        let Some(full) = crate::server::own(&[]).await else {
            return;
        };
        RedisStream::connect(&full.url(), opts(&unique_name("jo-cmd"), "c", 300))
            .await
            .expect("a server with every command connects");
    }

    /// A worker that dies holding entries, restarted under its name, takes them back at
    /// once (attempt 2); another name would wait out the lease.
    #[tokio::test]
    async fn a_restarted_worker_takes_its_own_entries_back_at_once() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-resume");
        let first = RedisStream::connect(&url, opts(&name, "w1", 30_000))
            .await
            .unwrap();
        first.publish_batch(&msgs(2, "R")).await.unwrap();
        assert_eq!(
            first
                .receive(10, Duration::from_secs(1))
                .await
                .unwrap()
                .len(),
            2
        );
        drop(first); // dies holding both, for a lease of 30 s
        let other = RedisStream::connect(&url, opts(&name, "w2", 30_000))
            .await
            .unwrap();
        assert!(
            other
                .receive(10, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty(),
            "another name waits for the lease"
        );
        let again = RedisStream::connect(&url, opts(&name, "w1", 30_000))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let got = again.receive(10, Duration::from_secs(1)).await.unwrap();
        assert_eq!(got.len(), 2, "the same name takes them back");
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(got.iter().all(|d| d.attempt == 2 && d.redelivered));
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        again.ack(&receipts).await.unwrap();
        again.delete().await.unwrap();
    }

    /// A batch held for five leases by a live worker is not taken over (its heartbeat
    /// keeps it fresh), and its ack still counts; held by a worker that let go, it is.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_heartbeat_keeps_a_long_batch_from_being_taken_over() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-heartbeat");
        let slow = RedisStream::connect(&url, opts(&name, "slow", 300))
            .await
            .unwrap();
        let other = RedisStream::connect(&url, opts(&name, "other", 300))
            .await
            .unwrap();
        slow.publish(&msgs(1, "H")[0]).await.unwrap();
        let held = slow.receive(1, Duration::from_secs(1)).await.unwrap();
        assert_eq!(held.len(), 1);
        let deadline = std::time::Instant::now() + Duration::from_millis(1500);
        while std::time::Instant::now() < deadline {
            assert!(
                other
                    .receive(1, Duration::from_millis(100))
                    .await
                    .unwrap()
                    .is_empty(),
                "a live holder's entry is not taken over"
            );
        }
        slow.ack(&[&held[0].receipt]).await.unwrap();
        assert_eq!(slow.pending().await.unwrap(), 0, "its ack counted");

        slow.publish(&msgs(1, "H2")[0]).await.unwrap();
        let held = slow.receive(1, Duration::from_secs(1)).await.unwrap();
        assert_eq!(held.len(), 1);
        slow.abandon().await; // as a dead worker: no heartbeat for it
        let taken = other.receive(1, Duration::from_secs(3)).await.unwrap();
        assert_eq!(
            taken.len(),
            1,
            "an abandoned entry is taken over after its lease"
        );
        assert_eq!(taken[0].attempt, 2);
        other.ack(&[&taken[0].receipt]).await.unwrap();
        other.delete().await.unwrap();
    }

    /// A released delivery comes back with the attempt it had, marked redelivered: it was
    /// delivered before (the lab counts first deliveries by that mark).
    #[tokio::test]
    async fn a_released_delivery_comes_back_redelivered_with_its_attempt() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-release");
        let s = RedisStream::connect(&url, opts(&name, "w", 30_000))
            .await
            .unwrap();
        s.publish(&msgs(1, "R")[0]).await.unwrap();
        let first = s.receive(1, Duration::from_secs(1)).await.unwrap();
        assert_eq!((first[0].attempt, first[0].redelivered), (1, false));
        s.release(&[&first[0].receipt]).await.unwrap();
        let again = s.receive(1, Duration::from_secs(1)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].attempt, again[0].redelivered), (1, true));
        s.ack(&[&again[0].receipt]).await.unwrap();
        s.delete().await.unwrap();
    }

    /// An ack reads the receipts' delivery counts with one `XPENDING` over their id range;
    /// when this consumer holds more entries in that range than the answer can carry, the
    /// receipts left out are still checked and acked (one by one).
    #[tokio::test]
    async fn an_ack_across_a_wide_range_of_held_entries_acks_each_receipt() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-widerange");
        let s = RedisStream::connect(&url, opts(&name, "w", 30_000))
            .await
            .unwrap();
        s.publish_batch(&msgs(300, "W")).await.unwrap();
        let mut held = Vec::new();
        while held.len() < 300 {
            held.extend(s.receive(300, Duration::from_secs(1)).await.unwrap());
        }
        let (first, last) = (&held[0].receipt, &held[299].receipt);
        s.ack(&[first, last]).await.unwrap();
        assert_eq!(s.pending().await.unwrap(), 298, "both ends acked");
        let rest: Vec<_> = held[1..299].iter().map(|d| &d.receipt).collect();
        s.ack(&rest).await.unwrap();
        assert_eq!(s.pending().await.unwrap(), 0);
        s.delete().await.unwrap();
    }

    /// A release whose request never reaches the server fails, and the entry is no longer
    /// heartbeated: its lease runs out and another consumer takes it (a heartbeat that
    /// went on touching it kept it from everyone while the worker lived).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settle_that_never_ran_lets_the_lease_run_out() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-lostsettle");
        let upstream = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        let proxy = proxy::LossyProxy::start(upstream).await;
        let slow = RedisStream::connect(&proxy.url(), opts(&name, "slow", 300))
            .await
            .unwrap();
        let other = RedisStream::connect(&url, opts(&name, "other", 300))
            .await
            .unwrap();
        slow.publish_batch(&msgs(3, "L")).await.unwrap();
        let held = slow.receive(3, Duration::from_secs(1)).await.unwrap();
        assert_eq!(held.len(), 3);
        proxy.drop_next_request_with(b"release");
        let receipts: Vec<_> = held.iter().map(|d| &d.receipt).collect();
        slow.release(&receipts)
            .await
            .expect_err("the release never reached the server");
        let mut taken = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while taken.len() < 3 && std::time::Instant::now() < deadline {
            taken.extend(other.receive(3, Duration::from_secs(1)).await.unwrap());
        }
        assert_eq!(
            taken.len(),
            3,
            "the entries are taken over after their lease"
        );
        assert!(taken.iter().all(|d| d.attempt == 2));
        let receipts: Vec<_> = taken.iter().map(|d| &d.receipt).collect();
        other.ack(&receipts).await.unwrap();
        assert_eq!(other.pending().await.unwrap(), 0);
        other.delete().await.unwrap();
    }

    /// A blocking read waits longer than redis-rs's 500 ms command timeout, on its own
    /// connection: the source's other commands go on meanwhile, and a publish wakes it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_blocking_read_has_a_connection_of_its_own() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-block");
        let q = RedisStream::connect(&url, opts(&name, "b", 30_000))
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        assert!(q
            .receive(10, Duration::from_millis(1200))
            .await
            .unwrap()
            .is_empty());
        assert!(
            t0.elapsed() >= Duration::from_millis(1100),
            "{:?}",
            t0.elapsed()
        );
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.receive(10, Duration::from_secs(10)).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t1 = std::time::Instant::now();
        q.publish(&msgs(1, "B")[0]).await.unwrap();
        assert!(
            t1.elapsed() < Duration::from_millis(500),
            "the publish did not wait for the read"
        );
        let got = waiting.await.unwrap();
        assert_eq!(got.len(), 1, "the publish woke the read");
        q.ack(&[&got[0].receipt]).await.unwrap();
        q.delete().await.unwrap();
    }

    /// Another group on the same stream has read nothing: trimming removes nothing; once it
    /// acked the first five, those five go, and never an entry pending in a group.
    #[tokio::test]
    async fn trimming_never_removes_what_a_group_still_needs() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-trim");
        let a = RedisStream::connect(&url, opts(&name, "a", 30_000))
            .await
            .unwrap();
        let b = RedisStream::connect(&url, opts(&name, "b", 30_000).group("other"))
            .await
            .unwrap();
        a.publish_batch(&msgs(10, "T")).await.unwrap();
        let got = a.receive(10, Duration::from_secs(1)).await.unwrap();
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        a.ack(&receipts).await.unwrap();
        a.trim().await.unwrap();
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let len: u64 = conn.xlen(&name).await.unwrap();
        assert_eq!(len, 10, "group other has read nothing: nothing trimmed");
        let got = b.receive(5, Duration::from_secs(1)).await.unwrap();
        assert_eq!(got.len(), 5);
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        b.ack(&receipts[..3]).await.unwrap(); // two stay pending in group other
        b.trim().await.unwrap();
        let len: u64 = conn.xlen(&name).await.unwrap();
        assert_eq!(
            len, 7,
            "the three both groups settled went, the pending two stayed"
        );
        b.ack(&receipts[3..]).await.unwrap();
        b.trim().await.unwrap();
        let len: u64 = conn.xlen(&name).await.unwrap();
        assert_eq!(len, 5, "the five group other has not read stay");
        a.delete().await.unwrap();
        let _: () = conn.del(b.options().retry_key()).await.unwrap();
    }

    /// An entry another producer wrote without a `payload` field is dead-lettered by the
    /// source with its reason; one with an empty or non-UTF-8 id is delivered with none.
    #[tokio::test]
    async fn malformed_entries_are_dead_lettered_or_delivered_without_an_id() {
        let Some(url) = url() else { return };
        let name = unique_name("jo-test-malformed");
        let q = RedisStream::connect(&url, opts(&name, "m", 30_000))
            .await
            .unwrap();
        let mut raw = redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: String = raw.xadd(&name, "*", &[("body", "{}")]).await.unwrap();
        let _: String = raw
            .xadd(
                &name,
                "*",
                &[("payload", &b"x"[..]), ("id", &[0xffu8, 0xfe][..])],
            )
            .await
            .unwrap();
        let _: String = raw
            .xadd(&name, "*", &[("payload", "y"), ("id", "")])
            .await
            .unwrap();
        let got = q.receive(10, Duration::from_secs(1)).await.unwrap();
        assert_eq!(got.len(), 2, "the entry without a payload is not delivered");
        assert!(
            got.iter().all(|d| d.message.id().is_none()),
            "bad ids are none"
        );
        let letters = q.dead_letters().await.unwrap();
        assert_eq!(letters.len(), 1);
        assert!(
            letters[0].reason.error.contains("no `payload` field"),
            "{}",
            letters[0].reason.error
        );
        let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
        q.ack(&receipts).await.unwrap();
        q.delete().await.unwrap();
    }

    struct Pay {
        prefix: String,
    }

    impl Handler<RedisTx> for Pay {
        async fn handle(
            &self,
            cx: &Context<'_>,
            tx: &mut RedisTx,
        ) -> justonce::Result<Disposition> {
            let id = cx
                .message()
                .id()
                .map(|i| i.as_str().to_owned())
                .unwrap_or_default();
            tx.hincr_by(format!("{}balances", self.prefix), "acct-1", 5);
            tx.rpush(format!("{}ledger", self.prefix), id);
            Ok(Disposition::Ok)
        }
    }

    /// The stream and the effects both in Redis, under crashes before and after the
    /// commit, lost acks and duplicate publishes: each payment once in the ledger, read
    /// from Redis; at-least-once under the same faults pays some twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stream_and_effects_in_redis_apply_once_under_faults() {
        let Some(url) = url() else { return };
        let run = |semantics: Semantics| {
            let url = url.clone();
            async move {
                let name = unique_name("jo-test-e2e");
                let p = prefix("e2e");
                let q = Arc::new(
                    RedisStream::connect(&url, opts(&name, "w", 200))
                        .await
                        .unwrap(),
                );
                let store = RedisStore::connect_with(&url, RedisStoreOptions::default().prefix(&p))
                    .await
                    .unwrap();
                let faults = Faults::new(3)
                    .crash_before_commit(0.15)
                    .crash_after_commit(0.15)
                    .lose_ack(0.1)
                    .abandoning(q.clone());
                let sent = msgs(300, "PAY");
                q.publish_batch(&sent).await.unwrap();
                q.publish_batch(&faults.published_twice(&sent))
                    .await
                    .unwrap();
                let mut o = ConsumerOptions::new("billing").batch_size(20);
                o.semantics = semantics;
                let consumer =
                    Consumer::new(o, q.clone(), store.clone(), Pay { prefix: p.clone() })
                        .unwrap()
                        .with_fault_hook(Arc::new(faults.clone()));
                let probe = q.clone();
                consumer
                    .run_until(async move {
                        while probe.pending().await.unwrap() > 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    })
                    .await
                    .unwrap();
                let mut conn = store.connection();
                let ledger: Vec<String> = conn.lrange(format!("{p}ledger"), 0, -1).await.unwrap();
                let balance: i64 = conn
                    .hget(format!("{p}balances"), "acct-1")
                    .await
                    .unwrap_or(0);
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{p}*"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                let _: () = conn.del(keys).await.unwrap();
                q.delete().await.unwrap();
                (ledger, balance, faults.fired())
            }
        };
        let (ledger, balance, fired) = run(Semantics::EffectivelyOnce).await;
        assert!(fired > 5, "the faults happened ({fired})");
        let ids: Vec<String> = (0..300).map(|i| format!("PAY-{i}")).collect();
        let verdict = Effects::count(ledger.clone()).check(ids.iter().map(String::as_str));
        assert_eq!(
            (verdict.lost, verdict.duplicate_effects),
            (0, 0),
            "{verdict:?}"
        );
        assert_eq!(balance, 5 * ledger.len() as i64);

        let (ledger, _, _) = run(Semantics::AtLeastOnce).await;
        let mut per: HashMap<&str, usize> = HashMap::new();
        for id in &ledger {
            *per.entry(id.as_str()).or_default() += 1;
        }
        assert!(
            per.values().any(|&n| n > 1),
            "at-least-once pays some twice"
        );
    }

    struct Record;

    impl Handler<MemoryTx> for Record {
        async fn handle(
            &self,
            cx: &Context<'_>,
            tx: &mut MemoryTx,
        ) -> justonce::Result<Disposition> {
            tx.record(cx.message().id().map(|i| i.as_str()).unwrap_or_default());
            tokio::time::sleep(Duration::from_millis(2)).await; // a run that lasts a second
            Ok(Disposition::Ok)
        }
    }

    /// The server is killed mid-run and started again (a server of the test's own, with
    /// `appendonly yes` and `appendfsync always`): the consumer hands its batch back,
    /// reconnects and finishes; every message applied once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_restart_mid_run_loses_nothing() {
        let Some(mut server) = server::own_durable().await else {
            return;
        };
        let q = Arc::new(
            RedisStream::connect(&server.url(), opts("orders", "w", 500))
                .await
                .unwrap(),
        );
        let sent = msgs(400, "ORD");
        q.publish_batch(&sent).await.unwrap();
        let store = MemoryStore::new();
        let consumer = Consumer::new(
            ConsumerOptions::new("shipping").batch_size(10),
            q.clone(),
            store.clone(),
            Record,
        )
        .unwrap();
        let probe = store.clone();
        let running = tokio::spawn(async move {
            consumer
                .run_until(async move {
                    while probe.effects().len() < 400 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                })
                .await
        });
        while store.effects().len() < 100 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.restart().await.expect("redis-server restarts");
        let at_restart = store.effects().len();
        assert!(
            at_restart < 400,
            "the restart came mid-run ({at_restart} applied)"
        );
        tokio::time::timeout(Duration::from_secs(60), running)
            .await
            .expect("the consumer finished after the restart")
            .unwrap()
            .unwrap();
        let ids: Vec<String> = (0..400).map(|i| format!("ORD-{i}")).collect();
        let verdict = Effects::count(store.effects()).check(ids.iter().map(String::as_str));
        assert_eq!(
            (verdict.lost, verdict.duplicate_effects),
            (0, 0),
            "{verdict:?}"
        );
    }

    /// Redis 7.0 restarted from an append-only file that was rewritten mid-run takes the
    /// group's `entries-read` back to what it was at the rewrite while its last delivered
    /// entry stays where it was: `lag` then counts entries long delivered. A group drained
    /// after such a restart must count nothing pending (the lab's soak on Redis waited on
    /// 236,005 "undelivered" entries of an empty stream).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drained_group_counts_nothing_after_a_restart_from_a_rewritten_log() {
        let Some(mut server) = server::own_durable().await else {
            return;
        };
        let q = RedisStream::connect(&server.url(), opts("orders", "w", 30_000))
            .await
            .unwrap();
        q.publish_batch(&msgs(200, "AOF")).await.unwrap();
        // Reads and acks `n` entries; an error (the first read after the restart finds
        // the connection broken) is retried, as the consumer's loop does.
        async fn drain(q: &RedisStream, n: usize) {
            let (mut done, mut errors) = (0, 0);
            while done < n {
                let got = match q.receive(n - done, Duration::from_secs(1)).await {
                    Ok(got) => got,
                    Err(e) => {
                        errors += 1;
                        assert!(errors < 50, "the stream does not come back: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                assert!(!got.is_empty(), "entries to read");
                let receipts: Vec<_> = got.iter().map(|d| &d.receipt).collect();
                q.ack(&receipts).await.unwrap();
                done += got.len();
            }
        }
        drain(&q, 50).await;
        let mut admin = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("BGREWRITEAOF")
            .query_async(&mut admin)
            .await
            .unwrap();
        loop {
            let info: String = redis::cmd("INFO")
                .arg("persistence")
                .query_async(&mut admin)
                .await
                .unwrap();
            if info.contains("aof_rewrite_in_progress:0")
                && info.contains("aof_rewrite_scheduled:0")
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drain(&q, 100).await;
        server.restart().await.expect("redis-server restarts");
        drain(&q, 50).await;
        let groups: redis::Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg("orders")
            .query_async(
                &mut redis::Client::open(server.url())
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            )
            .await
            .unwrap();
        eprintln!("the group as Redis reports it, drained: {groups:?}");
        assert_eq!(
            q.pending().await.unwrap(),
            0,
            "a drained group waits on nothing"
        );
        q.publish_batch(&msgs(3, "MORE")).await.unwrap();
        let waiting = q.pending().await.unwrap();
        assert_eq!(waiting, 3, "new entries are counted as they are");
    }

    /// Nothing listens: a clear error naming the server without its password.
    #[tokio::test]
    async fn an_unreachable_server_is_a_clear_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("redis://:s3cret@127.0.0.1:{port}");
        let err = RedisStream::connect(&url, opts("x", "w", 1000))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
        assert!(!err.to_chain_string().contains("s3cret"));
    }
}
