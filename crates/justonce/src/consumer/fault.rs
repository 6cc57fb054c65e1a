use async_trait::async_trait;

use justonce_core::Delivery;

/// The places in a batch's life where a fault hook (`FaultHook`, feature `fault-injection`)
/// may crash the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// At-most-once only: after the acks, before the handler runs.
    AfterAck,
    /// After the handlers ran, before the transaction commits.
    BeforeCommit,
    /// After the commit, before any delivery is settled.
    AfterCommit,
}

impl FaultPoint {
    /// The kebab-case name (`after-ack`, `before-commit`, `after-commit`).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultPoint::AfterAck => "after-ack",
            FaultPoint::BeforeCommit => "before-commit",
            FaultPoint::AfterCommit => "after-commit",
        }
    }
}

/// Fault injection for tests, the demo and the lab: decides where a consumer "crashes".
///
/// A crash abandons the batch exactly as a dead process would: the transaction is dropped
/// (rolled back if not yet committed) and no delivery is settled, so the transport itself
/// delivers them again once their lease runs out. Production consumers set no hook; without
/// the `fault-injection` feature none can be set.
#[cfg_attr(not(feature = "fault-injection"), allow(unreachable_pub))]
#[async_trait]
pub trait FaultHook: Send + Sync {
    /// Whether the consumer crashes at `point`, with `batch` in flight.
    async fn crash_at(&self, point: FaultPoint, batch: &[&Delivery]) -> bool;

    /// Whether the ack of `delivery` is lost on its way to the transport.
    fn lose_ack(&self, delivery: &Delivery) -> bool {
        let _ = delivery;
        false
    }
}
