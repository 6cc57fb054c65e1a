//! The contracts on Debian 13's Redis 8.0 and Valkey 8.1 (`scripts/debian13.sh`'s root): a
//! server of each rule's own, run in the root. The machine's Redis (7.0) runs them in
//! `main.rs`.

use std::sync::Arc;
use std::time::Duration;

use justonce_redis::harness::OwnServer;
use justonce_redis::{RedisClaimOptions, RedisClaimStore, RedisStore, RedisStoreOptions};
use justonce_redis::{RedisStream, RedisStreamOptions};
use justonce_test::transport::Queue;
use justonce_test::{unique_name, Backend};

/// `program` (`redis-server` or `valkey-server`) from the root, checked to be `version`;
/// `None` (loudly) when the root is not built.
async fn server(program: &str, version: &str) -> Option<OwnServer> {
    let root = justonce_test::debian13_root()?;
    let s = OwnServer::start_in(&root, program, &[])
        .await
        .unwrap_or_else(|e| panic!("{program} from Debian 13's root starts: {e}"));
    let mut conn = redis::Client::open(s.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let key = if program.starts_with("valkey") {
        "valkey_version:"
    } else {
        "redis_version:"
    };
    assert!(
        info.lines()
            .any(|l| l.starts_with(&format!("{key}{version}"))),
        "{program} is not {version}: {info}"
    );
    Some(s)
}

macro_rules! contracts_on {
    ($module:ident, $program:literal, $version:literal) => {
        mod $module {
            use super::*;

            mod stream_contract {
                use super::*;

                justonce_test::transport_tests!(|| async {
                    let s = server($program, $version).await?;
                    let opts = RedisStreamOptions::new(unique_name("jo-test-stream"))
                        .consumer("contract")
                        .lease(Duration::from_millis(300));
                    let q = RedisStream::connect(&s.url(), opts).await.unwrap();
                    Some(Backend::new(Queue::new(q, Duration::from_millis(300))).keeping(s))
                });
            }

            mod claim_contract {
                use super::*;

                justonce_test::claim_store_tests!(|| async {
                    let s = server($program, $version).await?;
                    let store = RedisClaimStore::connect_with(
                        &s.url(),
                        RedisClaimOptions::default().prefix("jo-claims:"),
                    )
                    .await
                    .unwrap();
                    Some(Backend::new(Arc::new(store)).keeping(s))
                });
            }

            mod dedup_contract {
                use super::*;

                justonce_test::dedup_store_tests!(|| async {
                    let s = server($program, $version).await?;
                    let store = RedisStore::connect_with(
                        &s.url(),
                        RedisStoreOptions::default().prefix("jo-dedup:"),
                    )
                    .await
                    .unwrap();
                    Some(Backend::new(store).keeping(s))
                });
            }
        }
    };
}

contracts_on!(redis_8, "redis-server", "8.");
contracts_on!(valkey_8, "valkey-server", "8.");
