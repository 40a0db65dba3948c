//! [`RetryPolicy`]: when and how often a failed message is tried again.

use std::time::Duration;

use rand::Rng;

use crate::error::{Error, Result};

/// When and how often a failed message is retried.
///
/// The defaults follow the classic schedule: 2 s, doubling, capped at 256 s, 8 attempts, with
/// full jitter (each delay is drawn uniformly from zero to the computed value, so messages that
/// failed together do not retry together). Turn jitter off to get exact delays, e.g. in tests.
///
/// ```
/// use outbox::RetryPolicy;
/// use std::time::Duration;
///
/// let policy = RetryPolicy::default().jitter(false);
/// let delays: Vec<u64> = (1..=8).map(|a| policy.backoff(a).as_secs()).collect();
/// assert_eq!(delays, [2, 4, 8, 16, 32, 64, 128, 256]);
/// assert_eq!(policy.attempt_limit(), 8);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(super) base: Duration,
    pub(super) max_delay: Duration,
    pub(super) max_attempts: u32,
    pub(super) jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(2),
            max_delay: Duration::from_secs(256),
            max_attempts: 8,
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The delay after the first failure (default 2 s); it doubles with each attempt.
    pub fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The longest delay (default 256 s).
    pub fn max_delay(mut self, max: Duration) -> Self {
        self.max_delay = max;
        self
    }

    /// Attempts before a message is dead-lettered (default 8). Counted at claim, so a crash
    /// counts as an attempt.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Full jitter on (default) or off.
    pub fn jitter(mut self, on: bool) -> Self {
        self.jitter = on;
        self
    }

    /// The configured attempt limit (set with [`max_attempts`](RetryPolicy::max_attempts)).
    pub fn attempt_limit(&self) -> u32 {
        self.max_attempts
    }

    /// The delay before the next attempt after attempt number `attempt` (1-based) failed:
    /// `min(base * 2^(attempt-1), max_delay)`, then with full jitter a uniform draw below it.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(63);
        let raw = self
            .base
            .checked_mul(1u32.checked_shl(exp).unwrap_or(u32::MAX))
            .unwrap_or(self.max_delay);
        let capped = raw.min(self.max_delay);
        if self.jitter && !capped.is_zero() {
            capped.mul_f64(rand::rng().random_range(0.0..=1.0))
        } else {
            capped
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.max_attempts == 0 {
            return Err(Error::Config(
                "RetryPolicy::max_attempts must be at least 1".into(),
            ));
        }
        if self.max_delay < self.base {
            return Err(Error::Config(
                "RetryPolicy::max_delay must be at least RetryPolicy::base".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_without_jitter_doubles_and_caps() {
        let p = RetryPolicy::default().jitter(false);
        assert_eq!(p.backoff(0), Duration::from_secs(2));
        assert_eq!(p.backoff(1), Duration::from_secs(2));
        assert_eq!(p.backoff(8), Duration::from_secs(256));
        assert_eq!(p.backoff(9), Duration::from_secs(256));
        assert_eq!(p.backoff(40), Duration::from_secs(256));
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(256));
    }

    #[test]
    fn full_jitter_stays_below_the_computed_delay() {
        let p = RetryPolicy::default();
        let draws: Vec<Duration> = (0..200).map(|_| p.backoff(3)).collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_secs(8)));
        assert!(
            draws.iter().any(|d| *d != draws[0]),
            "jitter varies the delay"
        );
    }
}
