//! The test's own `redis-server` (the crate's `harness`), skipped loudly when the binary
//! is missing and services are not required.

use justonce_redis::harness::OwnServer;

/// Starts a server of the test's own with `args`; `None` when `redis-server` is missing.
pub(crate) async fn own(args: &[&str]) -> Option<OwnServer> {
    if !installed() {
        return None;
    }
    Some(OwnServer::start(args).await.expect("redis-server starts"))
}

/// [`own`], durable ([`OwnServer::start_durable`]).
pub(crate) async fn own_durable() -> Option<OwnServer> {
    if !installed() {
        return None;
    }
    Some(
        OwnServer::start_durable()
            .await
            .expect("redis-server starts"),
    )
}

fn installed() -> bool {
    if !OwnServer::installed() {
        assert!(
            std::env::var("JUSTONCE_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "redis-server is not installed and JUSTONCE_REQUIRE_SERVICES=1"
        );
        eprintln!("SKIPPED: redis-server is not installed");
        return false;
    }
    true
}
