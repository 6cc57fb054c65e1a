//! What tools read and fix in stores: an optional capability beside [`DedupStore`] and
//! [`ClaimStore`], which the runtime does not need. `justonce dedup` uses it on every store.
//!
//! [`DedupStore`]: crate::DedupStore
//! [`ClaimStore`]: crate::ClaimStore

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use crate::{DedupKey, Fingerprint, Result};

/// A consumer's dedup records.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConsumerRecords {
    /// The consumer's name.
    pub consumer: String,
    /// Records it holds.
    pub records: u64,
    /// When its oldest record was made, by the store's clock.
    pub oldest: Option<SystemTime>,
}

impl ConsumerRecords {
    /// A consumer's count.
    pub fn new(consumer: impl Into<String>, records: u64, oldest: Option<SystemTime>) -> Self {
        ConsumerRecords {
            consumer: consumer.into(),
            records,
            oldest,
        }
    }
}

/// One dedup record: the key was applied, with this payload, then.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupRecord {
    /// The fingerprint of the payload it was applied with.
    pub fingerprint: Fingerprint,
    /// When, by the store's clock.
    pub recorded_at: Option<SystemTime>,
}

impl DedupRecord {
    /// A record.
    pub fn new(fingerprint: Fingerprint, recorded_at: Option<SystemTime>) -> Self {
        DedupRecord {
            fingerprint,
            recorded_at,
        }
    }
}

/// Where a claim stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRecordState {
    /// Held; the lease has this long to run (zero: it ran out, the next acquire takes it over).
    InProgress {
        /// By the store's clock.
        lease_left: Duration,
    },
    /// Let go without a result: the next acquire takes it.
    Released,
    /// Done, with its result.
    Completed {
        /// When, by the store's clock.
        at: Option<SystemTime>,
    },
}

/// One claim as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRecord {
    /// The fingerprint of the payload it was claimed for.
    pub fingerprint: Fingerprint,
    /// Where it stands.
    pub state: ClaimRecordState,
    /// Its fencing token: every takeover makes it higher.
    pub token: u64,
    /// The result a completion stored.
    pub result: Option<Vec<u8>>,
}

impl ClaimRecord {
    /// A claim.
    pub fn new(
        fingerprint: Fingerprint,
        state: ClaimRecordState,
        token: u64,
        result: Option<Vec<u8>>,
    ) -> Self {
        ClaimRecord {
            fingerprint,
            state,
            token,
            result,
        }
    }
}

/// What tools read of a dedup store, through one trait for every store.
#[async_trait]
pub trait InspectStore: Send + Sync {
    /// Records per consumer, by consumer name.
    async fn dedup_stats(&self) -> Result<Vec<ConsumerRecords>>;

    /// The record of `key`, if the key was applied (and not purged since).
    async fn dedup_record(&self, key: DedupKey<'_>) -> Result<Option<DedupRecord>>;

    /// Deletes at most `batch` records older than `retention`, as the consumer's purge
    /// loop does ([`DedupStore::purge`](crate::DedupStore::purge)).
    async fn purge_records(&self, retention: Duration, batch: u32) -> Result<u64>;

    /// The store's clock, which its leases and its retention go by; `None` where the store
    /// keeps no clock of its own (in memory).
    async fn clock(&self) -> Result<Option<SystemTime>> {
        Ok(None)
    }

    /// What the store's server says of itself that an operator should know (`justonce
    /// doctor` prints them): the SQL stores' deadlock count. None by default.
    async fn server_checks(&self) -> Result<Vec<crate::Check>> {
        Ok(Vec::new())
    }
}

/// What tools read and fix in a claim store.
#[async_trait]
pub trait InspectClaims: Send + Sync {
    /// The claim of `key`, if there is one.
    async fn claim_record(&self, key: DedupKey<'_>) -> Result<Option<ClaimRecord>>;

    /// Frees a claim held by a worker that will not finish it (stuck, or gone with a long
    /// lease): the claim is released and its token raised, so the holder's completion is
    /// refused and the next acquire takes it with a higher token. The new token; `None`
    /// when the key holds no claim in progress.
    async fn force_release(&self, key: DedupKey<'_>) -> Result<Option<u64>>;
}
