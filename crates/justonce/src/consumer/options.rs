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

/// How a consumer runs, in groups: [`BatchOptions`], [`RetryOptions`], [`DedupOptions`]
/// and [`BreakerOptions`]. [`ConsumerOptions::new`] gives the defaults; the chained setters
/// change them, and the fields stay public to read (and to assign, one by one).
///
/// ```
/// use std::time::Duration;
/// use justonce::{BatchOptions, ConsumerOptions, DedupOptions, Idempotency, RetryOptions, Semantics};
///
/// let o = ConsumerOptions::new("billing")
///     .semantics(Semantics::EffectivelyOnce)
///     .batching(BatchOptions::default().size(100).linger(Duration::from_millis(5)))
///     .retry(RetryOptions::default().max_attempts(8).backoff(Duration::from_millis(200), Duration::from_secs(60)))
///     .dedup(DedupOptions::default().idempotency(Idempotency::UniqueKey).retention(Duration::from_secs(7 * 86_400)));
/// assert_eq!(o.retry.max_attempts, 8);
///
/// // The fields most often changed have shortcuts on the options themselves.
/// let o = ConsumerOptions::new("billing").batch_size(50).concurrency(2);
/// assert_eq!((o.batching.size, o.batching.concurrency), (50, 2));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsumerOptions {
    /// The consumer's name: the first half of every dedup key.
    pub name: String,
    /// When deliveries are acked; effectively-once by default.
    pub semantics: Semantics,
    /// How deliveries are grouped into transactions.
    pub batching: BatchOptions,
    /// How often and how late a failing message is tried again.
    pub retry: RetryOptions,
    /// How an effectively-once consumer recognises a message it already applied, and how
    /// long it remembers.
    pub dedup: DedupOptions,
    /// Payloads larger than this are dead-lettered without running the handler.
    pub max_payload_bytes: usize,
    /// When to stop dead-lettering because every message fails the same way (a deploy
    /// mistake the error classification missed); on by default.
    pub breaker: BreakerOptions,
}

/// How deliveries are grouped into transactions: one transaction per batch.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchOptions {
    /// Deliveries per batch (default 100).
    pub size: usize,
    /// How long to wait for a batch to fill once it has its first delivery (default 5 ms).
    pub linger: Duration,
    /// How long one receive call waits for a first delivery (default 500 ms).
    pub receive_wait: Duration,
    /// Batches processed at the same time (default 1).
    pub concurrency: usize,
    /// Run a batch with no savepoint per message, and only when one of its messages
    /// fails, roll it back and run it again with a savepoint per message (default
    /// `true`): two round trips per message saved on the path where nothing fails. The
    /// handlers of a batch with a failing message then run twice, their writes rolled back
    /// in between; set `false` if a handler does work outside its transaction. Batches
    /// under [`Idempotency::Claim`] always use savepoints.
    pub optimistic: bool,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            size: 100,
            linger: Duration::from_millis(5),
            receive_wait: Duration::from_millis(500),
            concurrency: 1,
            optimistic: true,
        }
    }
}

impl BatchOptions {
    /// Sets [`BatchOptions::size`].
    pub fn size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }
    /// Sets [`BatchOptions::linger`].
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }
    /// Sets [`BatchOptions::receive_wait`].
    pub fn receive_wait(mut self, wait: Duration) -> Self {
        self.receive_wait = wait;
        self
    }
    /// Sets [`BatchOptions::concurrency`].
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }
    /// Sets [`BatchOptions::optimistic`].
    pub fn optimistic(mut self, optimistic: bool) -> Self {
        self.optimistic = optimistic;
        self
    }
}

/// How often and how late a message that asks for a retry is tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryOptions {
    /// Deliveries before a message that keeps asking for retries is dead-lettered
    /// (default 5).
    pub max_attempts: u32,
    /// The first retry delay; doubled for each further attempt (default 100 ms).
    pub backoff_base: Duration,
    /// The longest retry delay (default 30 s).
    pub backoff_max: Duration,
    /// Seed of the retry jitter, so a run can be replayed (default 0).
    pub seed: u64,
}

impl Default for RetryOptions {
    fn default() -> Self {
        RetryOptions {
            max_attempts: 5,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(30),
            seed: 0,
        }
    }
}

impl RetryOptions {
    /// Sets [`RetryOptions::max_attempts`].
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }
    /// Sets [`RetryOptions::backoff_base`] and [`RetryOptions::backoff_max`].
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }
    /// Sets [`RetryOptions::seed`].
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// How an effectively-once consumer recognises a message it already applied, and how long
/// it remembers. At-most-once and at-least-once consumers use only `id_strategy` (for
/// logs and dead letters).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DedupOptions {
    /// The idempotency method (default the dedup table).
    pub idempotency: Idempotency,
    /// Where a message's id comes from (default its message-id header).
    pub id_strategy: IdStrategy,
    /// Same id, different payload (default: dead-letter it).
    pub on_conflict: ConflictPolicy,
    /// How long a claim is held before another consumer may take it over
    /// ([`Idempotency::Claim`] only; default 60 s).
    pub claim_lease: Duration,
    /// How long dedup records are kept. Must exceed the redelivery horizon (see
    /// [`ConsumerOptions::redelivery_horizon`]); `None` (the default) keeps them forever.
    pub retention: Option<Duration>,
    /// How often the purge of records older than `retention` runs (default 60 s).
    pub purge_interval: Duration,
}

impl Default for DedupOptions {
    fn default() -> Self {
        DedupOptions {
            idempotency: Idempotency::DedupTable,
            id_strategy: IdStrategy::Header,
            on_conflict: ConflictPolicy::DeadLetter,
            claim_lease: Duration::from_secs(60),
            retention: None,
            purge_interval: Duration::from_secs(60),
        }
    }
}

impl DedupOptions {
    /// Sets [`DedupOptions::idempotency`].
    pub fn idempotency(mut self, idempotency: Idempotency) -> Self {
        self.idempotency = idempotency;
        self
    }
    /// Sets [`DedupOptions::id_strategy`].
    pub fn id_strategy(mut self, id_strategy: IdStrategy) -> Self {
        self.id_strategy = id_strategy;
        self
    }
    /// Sets [`DedupOptions::on_conflict`].
    pub fn on_conflict(mut self, policy: ConflictPolicy) -> Self {
        self.on_conflict = policy;
        self
    }
    /// Sets [`DedupOptions::claim_lease`].
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.claim_lease = lease;
        self
    }
    /// Keeps dedup records for `retention` ([`DedupOptions::retention`]).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }
    /// Sets [`DedupOptions::purge_interval`].
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = interval;
        self
    }
}

impl ConsumerOptions {
    /// Defaults: effectively-once, batches of 100 with 5 ms linger, one batch at a time,
    /// 5 attempts with backoff from 100 ms to 30 s, payloads up to 1 MiB, no retention.
    pub fn new(name: impl Into<String>) -> Self {
        ConsumerOptions {
            name: name.into(),
            semantics: Semantics::EffectivelyOnce,
            batching: BatchOptions::default(),
            retry: RetryOptions::default(),
            dedup: DedupOptions::default(),
            max_payload_bytes: 1 << 20,
            breaker: BreakerOptions::default(),
        }
    }

    /// Sets [`ConsumerOptions::semantics`].
    pub fn semantics(mut self, semantics: Semantics) -> Self {
        self.semantics = semantics;
        self
    }
    /// Sets [`ConsumerOptions::batching`].
    pub fn batching(mut self, batching: BatchOptions) -> Self {
        self.batching = batching;
        self
    }
    /// Sets [`ConsumerOptions::retry`].
    pub fn retry(mut self, retry: RetryOptions) -> Self {
        self.retry = retry;
        self
    }
    /// Sets [`ConsumerOptions::dedup`].
    pub fn dedup(mut self, dedup: DedupOptions) -> Self {
        self.dedup = dedup;
        self
    }
    /// Sets [`ConsumerOptions::breaker`].
    pub fn breaker(mut self, breaker: BreakerOptions) -> Self {
        self.breaker = breaker;
        self
    }
    /// Sets [`ConsumerOptions::max_payload_bytes`].
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }
    /// Sets [`BatchOptions::size`].
    pub fn batch_size(mut self, size: usize) -> Self {
        self.batching.size = size;
        self
    }
    /// Sets [`BatchOptions::concurrency`].
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.batching.concurrency = concurrency;
        self
    }
    /// Sets [`DedupOptions::idempotency`].
    pub fn idempotency(mut self, idempotency: Idempotency) -> Self {
        self.dedup.idempotency = idempotency;
        self
    }
    /// Sets [`DedupOptions::id_strategy`].
    pub fn id_strategy(mut self, id_strategy: IdStrategy) -> Self {
        self.dedup.id_strategy = id_strategy;
        self
    }

    /// The longest time between two deliveries of one message: every retry delay at its
    /// ceiling, plus one transport hold-back (lease, broker delay) per attempt.
    pub fn redelivery_horizon(&self, transport_delay: Duration) -> Duration {
        let r = &self.retry;
        let retries = r
            .backoff_max
            .saturating_mul(r.max_attempts.saturating_sub(1));
        retries.saturating_add(transport_delay.saturating_mul(r.max_attempts.max(1)))
    }
}
