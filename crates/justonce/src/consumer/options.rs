use std::time::Duration;

use justonce_core::{IdStrategy, Semantics};

use super::BreakerOptions;

/// How an effectively-once consumer recognises a message it already applied.
///
/// | method | how | needs |
/// |---|---|---|
/// | `DedupTable` (default) | the runtime inserts `(consumer, id)` into the dedup table in the handler's transaction | a message id |
/// | `UniqueKey` | the handler inserts a row keyed by a business id; the unique violation means "done" | a unique index on the business id |
/// | `Guard` | the handler's own guard decides: a state-machine transition or a version check (CAS) that returns [`Disposition::Duplicate`](justonce_core::Disposition::Duplicate) | an entity with a state or a version |
/// | `Claim` | a claim with a lease and a fencing token, for effects outside the database; the effect must accept the idempotency key | a [`ClaimStore`](justonce_core::ClaimStore) |
///
/// At-most-once and at-least-once consumers ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Idempotency {
    /// A dedup record in the business transaction.
    #[default]
    DedupTable,
    /// A unique business key: a unique violation from the handler is a duplicate.
    UniqueKey,
    /// The handler's guard (state machine, version/CAS) returns `Duplicate` itself.
    Guard,
    /// A claim with a lease, for effects no transaction covers.
    Claim,
}

impl Idempotency {
    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Idempotency::DedupTable => "dedup-table",
            Idempotency::UniqueKey => "unique-key",
            Idempotency::Guard => "guard",
            Idempotency::Claim => "claim",
        }
    }
}

/// What to do when a message id arrives again with a different payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConflictPolicy {
    /// Dead-letter it with both fingerprints in the reason (the default).
    #[default]
    DeadLetter,
    /// Treat it as a duplicate: ack and skip.
    Ignore,
}

/// How a consumer runs. Plain data; [`ConsumerOptions::new`] gives the defaults.
///
/// ```
/// use std::time::Duration;
/// use justonce::{ConsumerOptions, Semantics};
///
/// let mut o = ConsumerOptions::new("billing");
/// o.semantics = Semantics::EffectivelyOnce;
/// o.batch_size = 100;
/// o.linger = Duration::from_millis(5);
/// assert_eq!(o.max_attempts, 5);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerOptions {
    /// The consumer's name: the first half of every dedup key.
    pub name: String,
    /// When deliveries are acked; effectively-once by default.
    pub semantics: Semantics,
    /// How an effectively-once consumer recognises duplicates.
    pub idempotency: Idempotency,
    /// Where a message's id comes from.
    pub id_strategy: IdStrategy,
    /// How long a claim is held before another consumer may take it over
    /// ([`Idempotency::Claim`] only).
    pub claim_lease: Duration,
    /// Deliveries per batch, one transaction per batch.
    pub batch_size: usize,
    /// How long to wait for a batch to fill once it has its first delivery.
    pub linger: Duration,
    /// How long one receive call waits for a first delivery.
    pub receive_wait: Duration,
    /// Batches processed at the same time.
    pub concurrency: usize,
    /// Deliveries before a message that keeps asking for retries is dead-lettered.
    pub max_attempts: u32,
    /// The first retry delay; doubled for each further attempt.
    pub backoff_base: Duration,
    /// The longest retry delay.
    pub backoff_max: Duration,
    /// Seed of the retry jitter, so a run can be replayed.
    pub seed: u64,
    /// Payloads larger than this are dead-lettered without running the handler.
    pub max_payload_bytes: usize,
    /// Same id, different payload.
    pub on_conflict: ConflictPolicy,
    /// How long dedup records are kept. Must exceed the redelivery horizon (see
    /// [`ConsumerOptions::redelivery_horizon`]); `None` keeps them forever.
    pub retention: Option<Duration>,
    /// How often the purge of records older than `retention` runs.
    pub purge_interval: Duration,
    /// Run a batch with no savepoint per message, and only when one of its messages
    /// fails, roll it back and run it again with a savepoint per message (default
    /// `true`): two round trips per message saved on the path where nothing fails. The
    /// handlers of a batch with a failing message then run twice, their writes rolled back
    /// in between; set `false` if a handler does work outside its transaction. Batches
    /// under [`Idempotency::Claim`] always use savepoints.
    pub optimistic_batches: bool,
    /// When to stop dead-lettering because every message fails the same way (a deploy
    /// mistake the error classification missed); on by default.
    pub breaker: BreakerOptions,
}

impl ConsumerOptions {
    /// Defaults: effectively-once, batches of 100 with 5 ms linger, one batch at a time,
    /// 5 attempts with backoff from 100 ms to 30 s, payloads up to 1 MiB, no retention.
    pub fn new(name: impl Into<String>) -> Self {
        ConsumerOptions {
            name: name.into(),
            semantics: Semantics::EffectivelyOnce,
            idempotency: Idempotency::DedupTable,
            id_strategy: IdStrategy::Header,
            claim_lease: Duration::from_secs(60),
            batch_size: 100,
            linger: Duration::from_millis(5),
            receive_wait: Duration::from_millis(500),
            concurrency: 1,
            max_attempts: 5,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            seed: 0,
            max_payload_bytes: 1 << 20,
            on_conflict: ConflictPolicy::DeadLetter,
            retention: None,
            purge_interval: Duration::from_secs(60),
            optimistic_batches: true,
            breaker: BreakerOptions::default(),
        }
    }

    /// The longest time between two deliveries of one message: every retry delay at its
    /// ceiling, plus one transport hold-back (lease, broker delay) per attempt.
    pub fn redelivery_horizon(&self, transport_delay: Duration) -> Duration {
        let retries = self
            .backoff_max
            .saturating_mul(self.max_attempts.saturating_sub(1));
        retries.saturating_add(transport_delay.saturating_mul(self.max_attempts.max(1)))
    }
}
