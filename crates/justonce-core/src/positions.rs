//! Where a log's consumer positions live when they live in the business database.
//!
//! A log (a Kafka topic) does not forget what a consumer read: the consumer keeps a
//! position per partition, the offset of the next record to read. Kafka's own committed
//! offsets are written after the effects commit, so a crash in between reads records
//! again. Kept in the store instead, the position moves in the same transaction as the
//! effects and the dedup records ([`TransactionalAck`](crate::TransactionalAck)): the
//! records are read again if and only if their effects rolled back. The KafkaConsumer
//! documentation recommends this ("storing offsets outside Kafka").

use async_trait::async_trait;

use crate::Result;

/// One partition's position: the offset of the next record to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The partition.
    pub partition: i32,
    /// The offset of the next record to read.
    pub offset: i64,
}

/// Positions read from a store, outside any transaction: a consumer that was assigned
/// partitions seeks to them. Object-safe.
#[async_trait]
pub trait Positions: Send + Sync {
    /// The positions stored for `consumer` on `topic`, for those of `partitions` that
    /// have one; a partition with none stored is absent.
    async fn load(&self, consumer: &str, topic: &str, partitions: &[i32]) -> Result<Vec<Position>>;

    /// Moves positions forward outside any business transaction: past records that were
    /// finished without one (dead-lettered, or acked after a commit that did not write
    /// their position). Never moves one back.
    async fn save(&self, consumer: &str, topic: &str, positions: &[Position]) -> Result<()>;
}

/// Positions written in a store's transaction `Tx`.
#[async_trait]
pub trait PositionsIn<Tx>: Positions {
    /// Moves `consumer`'s positions on `topic` forward to `positions` inside `tx`. A
    /// position never moves back: one already past what is written stays (a partition's
    /// new owner got further than a worker that held it before).
    async fn save_in(
        &self,
        tx: &mut Tx,
        consumer: &str,
        topic: &str,
        positions: &[Position],
    ) -> Result<()>;
}

#[async_trait]
impl<T: Positions + ?Sized> Positions for std::sync::Arc<T> {
    async fn load(&self, consumer: &str, topic: &str, partitions: &[i32]) -> Result<Vec<Position>> {
        (**self).load(consumer, topic, partitions).await
    }

    async fn save(&self, consumer: &str, topic: &str, positions: &[Position]) -> Result<()> {
        (**self).save(consumer, topic, positions).await
    }
}

#[async_trait]
impl<Tx: Send, T: PositionsIn<Tx> + ?Sized> PositionsIn<Tx> for std::sync::Arc<T> {
    async fn save_in(
        &self,
        tx: &mut Tx,
        consumer: &str,
        topic: &str,
        positions: &[Position],
    ) -> Result<()> {
        (**self).save_in(tx, consumer, topic, positions).await
    }
}
