use std::sync::Arc;
use std::time::Duration;

use justonce_core::conformance;
use justonce_core::memory::{MemoryQueue, MemoryStore};

#[tokio::test]
async fn memory_store_keeps_the_dedup_contract() {
    conformance::dedup_store(Arc::new(MemoryStore::new()), "mem").await;
}

#[tokio::test]
async fn memory_queue_keeps_the_queue_contract() {
    let lease = Duration::from_millis(100);
    conformance::queue(&MemoryQueue::new("q", lease), lease, "mem").await;
}

#[tokio::test]
async fn memory_claims_keep_the_claim_contract() {
    conformance::claim_store(
        Arc::new(justonce_core::memory::MemoryClaims::default()),
        Duration::from_millis(100),
        "mem",
    )
    .await;
}
