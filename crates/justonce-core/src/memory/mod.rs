//! In-memory transport and store, for tests of the runtime and of your handlers.
//!
//! They keep the contracts of the traits (leases, attempts, savepoints, atomic commit)
//! but nothing survives the process: use the SQL backends for anything real.

mod claims;
mod outbox;
mod queue;
mod store;

pub use claims::MemoryClaims;
pub use queue::MemoryQueue;
pub use store::{MemoryStore, MemoryTx};
