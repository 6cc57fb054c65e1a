use justonce_core::Delivery;

/// Told of every batch a consumer committed, after the commit and before any delivery of it
/// is settled: a benchmark's clock, a progress counter, a metric. Dead-lettered deliveries
/// are left out. It runs inline on the batch's task, so it must be quick and must not block.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use justonce::{CommitObserver, Delivery};
///
/// #[derive(Default)]
/// struct Committed(AtomicUsize);
///
/// impl CommitObserver for Committed {
///     fn committed(&self, batch: &[&Delivery]) {
///         self.0.fetch_add(batch.len(), Ordering::Relaxed);
///     }
/// }
/// ```
pub trait CommitObserver: Send + Sync {
    /// `batch` committed.
    fn committed(&self, batch: &[&Delivery]);
}
