//! Recording wrappers and a small handler for the runtime tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use justonce::memory::{MemoryQueue, MemoryStore, MemoryTx};
use justonce::{
    async_trait, Claim, Context, DeadLetterReason, DedupKey, DedupStore, Delivery, Disposition,
    Fingerprint, Handler, Receipt, Result, Source, Store,
};

/// An ordered log of what the source and store were asked to do.
pub(crate) type Log = Arc<Mutex<Vec<&'static str>>>;

pub(crate) fn log_of(log: &Log) -> Vec<&'static str> {
    log.lock().unwrap().clone()
}

/// A [`MemoryQueue`] that logs receives (non-empty), acks, nacks and dead letters.
pub(crate) struct Recording<T> {
    pub(crate) inner: T,
    pub(crate) log: Log,
}

#[async_trait]
impl Source for Recording<Arc<MemoryQueue>> {
    fn queue(&self) -> &str {
        self.inner.queue()
    }
    async fn receive(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>> {
        let got = self.inner.receive(max, wait).await?;
        if !got.is_empty() {
            self.log.lock().unwrap().push("receive");
        }
        Ok(got)
    }
    async fn ack(&self, receipts: &[&Receipt]) -> Result<()> {
        self.log.lock().unwrap().push("ack");
        self.inner.ack(receipts).await
    }
    async fn nack(&self, receipt: &Receipt, delay: Duration) -> Result<()> {
        self.log.lock().unwrap().push("nack");
        self.inner.nack(receipt, delay).await
    }
    async fn release(&self, receipts: &[&Receipt]) -> Result<()> {
        self.log.lock().unwrap().push("release");
        self.inner.release(receipts).await
    }
    async fn dead_letter(&self, delivery: &Delivery, reason: &DeadLetterReason) -> Result<()> {
        self.log.lock().unwrap().push("dead-letter");
        self.inner.dead_letter(delivery, reason).await
    }
    fn redelivery_delay(&self) -> Duration {
        self.inner.redelivery_delay()
    }
}

#[async_trait]
impl Store for Recording<MemoryStore> {
    type Tx = MemoryTx;
    fn backend(&self) -> &'static str {
        "recording"
    }
    async fn begin(&self) -> Result<MemoryTx> {
        self.inner.begin().await
    }
    async fn commit(&self, tx: MemoryTx) -> Result<()> {
        self.log.lock().unwrap().push("commit");
        self.inner.commit(tx).await
    }
    async fn rollback(&self, tx: MemoryTx) -> Result<()> {
        self.inner.rollback(tx).await
    }
    async fn savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.savepoint(tx).await
    }
    async fn release_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.release_savepoint(tx).await
    }
    async fn rollback_to_savepoint(&self, tx: &mut MemoryTx) -> Result<()> {
        self.inner.rollback_to_savepoint(tx).await
    }
}

#[async_trait]
impl DedupStore for Recording<MemoryStore> {
    async fn claim(&self, tx: &mut MemoryTx, key: DedupKey<'_>, fp: Fingerprint) -> Result<Claim> {
        self.inner.claim(tx, key, fp).await
    }
    async fn purge(&self, retention: Duration, batch: u32) -> Result<u64> {
        self.inner.purge(retention, batch).await
    }
}

/// What the test handler does with a message, chosen by its payload.
///
/// - `ok:NAME` records effect NAME;
/// - `fail:NAME` records effect NAME, then asks to dead-letter (the effect must roll back);
/// - `retry:NAME` asks for a retry every time;
/// - `slow:NAME` sleeps 50 ms, then records NAME;
/// - anything else is decoded as JSON and fails to decode.
#[derive(Clone, Default)]
pub(crate) struct Script {
    pub(crate) runs: Arc<AtomicU64>,
}

impl Script {
    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Handler<MemoryTx> for Script {
    async fn handle(&self, cx: &Context<'_>, tx: &mut MemoryTx) -> Result<Disposition> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let text = String::from_utf8_lossy(cx.message().payload()).into_owned();
        match text.split_once(':') {
            Some(("ok", name)) => {
                tx.record(name);
                Ok(Disposition::Ok)
            }
            Some(("fail", name)) => {
                tx.record(name);
                Ok(Disposition::dead_letter(format!("{name} is not allowed")))
            }
            Some(("retry", _)) => Ok(Disposition::retry("downstream unavailable")),
            Some(("slow", name)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.record(name);
                Ok(Disposition::Ok)
            }
            _ => {
                let _: serde_json::Value = cx.message().decode_json()?;
                Ok(Disposition::Ok)
            }
        }
    }
}

/// Resolves once the queue holds nothing.
pub(crate) async fn until_empty(q: Arc<MemoryQueue>) {
    while !q.is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
