//! The Redis backends against real servers: the shared one (JUSTONCE_REDIS_URL, default
//! the local :6379), each test under a key prefix of its own, and `redis-server`s the tests
//! start themselves (on ports of their own) where a server must restart.

mod proxy;
mod server;

use std::sync::Arc;
use std::time::Duration;

use justonce_core::{ClaimState, ClaimStore, DedupKey, ErrorKind, Fingerprint, MessageId};
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
        Some(Backend::new(Arc::new(claims_at(&url, "claims").await)))
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
}

/// A server that keeps nothing on disk, killed and started again: every key is gone, and
/// the fences issued after the restart are still higher than every fence before it.
#[tokio::test]
async fn fences_grow_across_a_restart_that_loses_every_key() {
    let Some(mut server) = server::OwnServer::start(&["--save", "", "--appendonly", "no"]).await
    else {
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
    server.restart().await;
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
}

/// With `appendonly yes` and `appendfsync always`, the start-up check has nothing to say.
#[tokio::test]
async fn a_durable_server_draws_no_warning() {
    let Some(server) = server::OwnServer::start(&[
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])
    .await
    else {
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
