//! The conformance suites on core's in-memory backends, one test per rule: the kit's
//! own check that its rules pass on a correct backend.

use std::sync::Arc;
use std::time::Duration;

use justonce_core::memory::{MemoryClaims, MemoryQueue, MemoryStore};
use justonce_test::transport::Queue;
use justonce_test::Backend;

const LEASE: Duration = Duration::from_millis(100);

mod memory_store {
    use super::*;
    justonce_test::dedup_store_tests!(|| async { Some(Backend::new(MemoryStore::new())) });
}

mod memory_outbox {
    use super::*;
    justonce_test::outbox_store_tests!(|| async {
        let store = MemoryStore::new();
        Some(Backend::new(justonce_test::outbox::Outboxed {
            outbox: store.clone(),
            store,
        }))
    });
}

mod memory_claims {
    use super::*;
    justonce_test::claim_store_tests!(|| async {
        Some(Backend::new(Arc::new(MemoryClaims::default())))
    });
}

mod memory_queue {
    use super::*;
    justonce_test::transport_tests!(|| async {
        Some(Backend::new(Queue::new(
            MemoryQueue::new("q", LEASE),
            LEASE,
        )))
    });
}
