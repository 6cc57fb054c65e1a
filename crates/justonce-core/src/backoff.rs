//! Exponential backoff with jitter, seeded so retries are reproducible.

use std::sync::Mutex;
use std::time::Duration;

/// Exponential backoff with proportional jitter.
///
/// The delay before attempt `n + 1` (after `n` failed attempts) is
/// `min(max, base * 2^(n-1))`, reduced by a random fraction up to `jitter`.
///
/// ```
/// use std::time::Duration;
/// use justonce_core::ExponentialBackoff;
///
/// let b = ExponentialBackoff::new(Duration::from_millis(100), Duration::from_secs(10)).with_seed(7);
/// let d = b.delay(3);
/// assert!(d <= Duration::from_millis(400) && d >= Duration::from_millis(200));
/// ```
#[derive(Debug)]
pub struct ExponentialBackoff {
    base: Duration,
    max: Duration,
    jitter: f64,
    rng: Mutex<fastrand::Rng>,
}

impl ExponentialBackoff {
    /// Backoff from `base` doubling up to `max`, jitter 0.5, seed 0.
    pub fn new(base: Duration, max: Duration) -> Self {
        ExponentialBackoff {
            base,
            max: max.max(base),
            jitter: 0.5,
            rng: Mutex::new(fastrand::Rng::with_seed(0)),
        }
    }

    /// Sets the jitter fraction, clamped to `0.0..=1.0`.
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter.clamp(0.0, 1.0);
        self
    }

    /// Seeds the random source, so a run can be replayed.
    pub fn with_seed(self, seed: u64) -> Self {
        *self.rng.lock().unwrap_or_else(|e| e.into_inner()) = fastrand::Rng::with_seed(seed);
        self
    }

    /// The largest delay this backoff returns.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The un-jittered delay after `failed_attempts` failures (at least 1).
    pub fn ceiling(&self, failed_attempts: u32) -> Duration {
        let exp = failed_attempts.max(1) - 1;
        let factor = 2u32.checked_pow(exp.min(31)).unwrap_or(u32::MAX);
        self.base
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay after `failed_attempts` failures, jittered.
    pub fn delay(&self, failed_attempts: u32) -> Duration {
        let ceiling = self.ceiling(failed_attempts);
        let r = self.rng.lock().unwrap_or_else(|e| e.into_inner()).f64();
        ceiling.mul_f64(1.0 - self.jitter * r)
    }
}
