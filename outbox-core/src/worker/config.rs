//! [`WorkerConfig`] and [`Wakeup`]; the retry schedule is [`RetryPolicy`].

use std::time::Duration;

pub use super::retry::RetryPolicy;
use crate::error::{Error, Result};

/// The longest duration a setting accepts (a week): longer ones are refused at validation, so
/// that no deadline computed from them overflows.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest retention of the periodic purge (ten years).
const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// The delay before the next try of an internal reconnect or outcome write after `failures`
/// failures in a row: 100 ms doubling to 5 s, with full jitter, so workers that lost the
/// database together do not come back in lock-step.
pub(crate) fn reconnect_delay(failures: u32) -> Duration {
    RetryPolicy::default()
        .base(Duration::from_millis(100))
        .max_delay(Duration::from_secs(5))
        .backoff(failures)
        .max(Duration::from_millis(10))
}

/// How an idle worker learns about new messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Wakeup {
    /// Woken by producers, plus polling. On PostgreSQL: LISTEN on a channel that producers
    /// notify only while a worker waits. On SQLite, which has no NOTIFY: woken by `enqueue` calls
    /// in the same process, and by commits of other processes, seen as a change of the
    /// database's write-ahead log file (looked at every 10 ms).
    #[default]
    Listen,
    /// Polling only: works behind PgBouncer in transaction mode.
    Poll,
}

/// How a worker runs: concurrency, batches, leases, timeouts and retries.
///
/// ```
/// use outbox::{RetryPolicy, WorkerConfig};
/// use std::time::Duration;
///
/// let config = WorkerConfig::default()
///     .concurrency(32)
///     .batch_size(200)
///     .lease(Duration::from_secs(120))
///     .handler_timeout(Duration::from_secs(30))
///     .retry(RetryPolicy::default().max_attempts(5));
/// ```
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub(crate) name: String,
    pub(crate) concurrency: usize,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
    pub(crate) poll_interval: Duration,
    pub(crate) claim_interval: Duration,
    pub(crate) handler_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) wakeup: Wakeup,
    pub(crate) flush_interval: Duration,
    pub(crate) report_interval: Duration,
    pub(crate) max_error_bytes: usize,
    pub(crate) stats_interval: Duration,
    pub(crate) health_max_tick_age: Option<Duration>,
    pub(crate) health_max_oldest_ready: Duration,
    pub(crate) health_max_awaiting_version: Duration,
    pub(crate) purge_retention: Option<Duration>,
    pub(crate) purge_interval: Duration,
    pub(crate) breaker: crate::breaker::Breaker,
    pub(crate) control_poll: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            name: default_name(),
            concurrency: 32,
            batch_size: 100,
            lease: Duration::from_secs(5),
            poll_interval: Duration::from_secs(1),
            claim_interval: Duration::from_millis(5),
            handler_timeout: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(25),
            retry: RetryPolicy::default(),
            wakeup: Wakeup::Listen,
            flush_interval: Duration::from_millis(5),
            report_interval: Duration::from_secs(300),
            max_error_bytes: 4096,
            stats_interval: Duration::from_secs(15),
            health_max_tick_age: None,
            health_max_oldest_ready: Duration::from_secs(600),
            health_max_awaiting_version: Duration::from_secs(900),
            purge_retention: None,
            purge_interval: Duration::from_secs(600),
            breaker: crate::breaker::Breaker::default(),
            control_poll: super::pauses::PAUSE_POLL,
        }
    }
}

fn default_name() -> String {
    format!("{}:{}", crate::host::host(), std::process::id())
}

impl WorkerConfig {
    /// The worker's name in the `claimed_by` column and the logs (default `host:pid`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Handler calls in flight at once (default 32).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Messages claimed per statement, at most (default 100).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// How long a claim holds a message before another worker may take it (default 5 s).
    ///
    /// The worker renews the lease of every message it runs every fifth of this, from a thread
    /// of its own, so a long handler keeps its message however long it runs (up to its
    /// timeout), while the messages of a worker that crashed, was killed or lost the database
    /// run again elsewhere within about one lease. Longer leases ride out longer database
    /// outages without a second delivery; shorter ones hand a dead worker's messages on sooner.
    /// At least 1 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often an idle worker looks for work without a wake-up (default 1 s). On PostgreSQL an
    /// idle worker also looks every 20 s at the latest, when it rewrites the row that tells
    /// producers to wake it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// While messages keep coming, how long the worker waits after a claim that did not fill
    /// its batch before it claims again (default 5 ms).
    ///
    /// A claim that fills its batch is followed by the next one at once, and a worker woken from
    /// idle claims at once; this only spaces out claims under a steady trickle, so that each one
    /// takes several messages instead of one. Longer means fewer, larger claims (less work for
    /// the database per message); shorter means a message waits less under load.
    /// `Duration::ZERO` claims again at once.
    ///
    /// ```
    /// use outbox::WorkerConfig;
    /// use std::time::Duration;
    ///
    /// let config = WorkerConfig::default().claim_interval(Duration::from_millis(20));
    /// ```
    pub fn claim_interval(mut self, interval: Duration) -> Self {
        self.claim_interval = interval;
        self
    }

    /// How long one handler call may run (default 60 s); a handler may override it.
    pub fn handler_timeout(mut self, timeout: Duration) -> Self {
        self.handler_timeout = timeout;
        self
    }

    /// How long a stopping worker waits for handlers in flight (default 25 s).
    ///
    /// At the stop request, messages claimed but not started are handed back at once. At the
    /// deadline, the messages still running are handed back (ready again at once, their
    /// attempt not counted), their handler tasks are cancelled, and
    /// [`run_until`](crate::Worker::run_until) returns within half a second, whether or not the
    /// database answers. Set it a little below
    /// the grace period of whatever stops the process (Kubernetes waits 30 s by default before
    /// it kills, `docker stop` 10 s), so the hand-back happens before the kill.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The retry policy (default: 2 s doubling to 256 s, 8 attempts, full jitter).
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// How an idle worker is woken (default [`Wakeup::Listen`]).
    pub fn wakeup(mut self, wakeup: Wakeup) -> Self {
        self.wakeup = wakeup;
        self
    }

    /// How often successful outcomes are written in one batch (default 5 ms).
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// How often the worker logs pending topics it has no handler for (default 300 s; the
    /// first time one second after it starts, with its first statistics).
    pub fn report_interval(mut self, interval: Duration) -> Self {
        self.report_interval = interval;
        self
    }

    /// The most bytes of an error kept in `last_error` (default 4096).
    pub fn max_error_bytes(mut self, bytes: usize) -> Self {
        self.max_error_bytes = bytes;
        self
    }

    /// How often the worker refreshes its gauges and health from the queue statistics
    /// (default 15 s).
    pub fn stats_interval(mut self, interval: Duration) -> Self {
        self.stats_interval = interval;
        self
    }

    /// Health fails when the worker loop has not ticked for this long (default: the larger of
    /// 30 s and three poll intervals).
    pub fn health_max_tick_age(mut self, age: Duration) -> Self {
        self.health_max_tick_age = Some(age);
        self
    }

    /// Health fails when the oldest ready message of this worker's topics has waited this long
    /// (default 10 minutes).
    pub fn health_max_oldest_ready(mut self, age: Duration) -> Self {
        self.health_max_oldest_ready = age;
        self
    }

    /// Health fails when messages of a version no live worker knows have waited this long
    /// (default 15 minutes): a rollout whose producers run ahead of its workers is not late
    /// until then. Such messages are not ready, and never count in the oldest ready age.
    pub fn health_max_awaiting_version(mut self, age: Duration) -> Self {
        self.health_max_awaiting_version = age;
        self
    }

    /// Deletes DONE messages and processed-id records older than `retention`, every
    /// [`purge_interval`](WorkerConfig::purge_interval), in small batches. Off by default.
    pub fn purge_after(mut self, retention: Duration) -> Self {
        self.purge_retention = Some(retention);
        self
    }

    /// How often the periodic purge runs (default 10 minutes).
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = interval;
        self
    }

    pub(crate) fn max_tick_age(&self) -> Duration {
        self.health_max_tick_age
            .unwrap_or_else(|| Duration::from_secs(30).max(self.poll_interval.saturating_mul(3)))
    }

    /// How often the leases of running messages and the worker's heartbeat are renewed.
    pub(crate) fn renew_interval(&self) -> Duration {
        (self.lease / 5).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    /// The circuit breaker of every handler that sets none of its own
    /// ([`Handler::breaker`](crate::Handler::breaker)): [`Breaker::default()`](crate::Breaker::default)
    /// unless set; [`Breaker::disabled()`](crate::Breaker::disabled) turns it off.
    pub fn breaker(mut self, breaker: crate::breaker::Breaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// How often the worker reads the pauses and breakers that every worker shares (500 ms by
    /// default): a pause, a resume or a breaker that opened elsewhere reaches this worker
    /// within this time. Shorter costs one small query per worker more often.
    pub fn control_poll(mut self, interval: Duration) -> Self {
        self.control_poll = interval;
        self
    }

    pub(crate) fn validate(&self, longest_timeout: Duration) -> Result<()> {
        self.retry.validate()?;
        self.breaker.validate("").map_err(Error::Config)?;
        if self.control_poll < Duration::from_millis(10)
            || self.control_poll > Duration::from_secs(60)
        {
            return Err(Error::Config(format!(
                "control_poll is {:?}; it must be between 10 ms and 60 s",
                self.control_poll
            )));
        }
        let bounded = [
            ("lease", self.lease),
            ("poll_interval", self.poll_interval),
            ("claim_interval", self.claim_interval),
            ("handler_timeout", self.handler_timeout),
            ("the longest handler timeout", longest_timeout),
            ("shutdown_timeout", self.shutdown_timeout),
            ("flush_interval", self.flush_interval),
            ("report_interval", self.report_interval),
            ("stats_interval", self.stats_interval),
            ("health_max_oldest_ready", self.health_max_oldest_ready),
            (
                "health_max_awaiting_version",
                self.health_max_awaiting_version,
            ),
            ("purge_interval", self.purge_interval),
            ("RetryPolicy::max_delay", self.retry.max_delay),
        ];
        for (name, d) in bounded
            .into_iter()
            .chain(self.health_max_tick_age.map(|d| ("health_max_tick_age", d)))
            .chain(self.purge_retention.map(|d| ("purge_after", d)))
        {
            let max = if name == "purge_after" {
                MAX_RETENTION
            } else {
                MAX_DURATION
            };
            if d > max {
                return Err(Error::Config(format!(
                    "{name} is {d:?}; at most {max:?} is accepted"
                )));
            }
        }
        if self.concurrency == 0 || self.batch_size == 0 {
            return Err(Error::Config(
                "concurrency and batch_size must be at least 1".into(),
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(Error::Config("poll_interval must be above zero".into()));
        }
        if self.lease < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "lease ({:?}) must be at least 1 s: it is renewed every fifth of it",
                self.lease
            )));
        }
        if self.stats_interval.is_zero() || self.purge_interval.is_zero() {
            return Err(Error::Config(
                "stats_interval and purge_interval must be above zero".into(),
            ));
        }
        if self.max_error_bytes < 64 {
            return Err(Error::Config("max_error_bytes must be at least 64".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_and_leases_renewable() {
        let c = WorkerConfig::default();
        // A lease shorter than the handler timeout is fine: it is renewed while the handler runs.
        assert!(c.validate(Duration::from_secs(60)).is_ok());
        assert!(c
            .clone()
            .lease(Duration::from_millis(500))
            .validate(Duration::ZERO)
            .is_err());
        let huge = Duration::from_secs(u64::MAX / 4);
        assert!(c
            .clone()
            .poll_interval(huge)
            .validate(Duration::ZERO)
            .is_err());
        assert!(c
            .clone()
            .handler_timeout(huge)
            .validate(Duration::ZERO)
            .is_err());
        assert!(c
            .clone()
            .shutdown_timeout(huge)
            .validate(Duration::ZERO)
            .is_err());
        assert!(c.validate(huge).is_err());
        assert_eq!(
            WorkerConfig::default().renew_interval(),
            Duration::from_secs(1)
        );
        let first: Vec<Duration> = (1..=3).map(reconnect_delay).collect();
        assert!(first.iter().all(|d| *d <= Duration::from_millis(400)));
        assert!(
            (0..50)
                .map(|_| reconnect_delay(6))
                .any(|d| d != reconnect_delay(6)),
            "jittered"
        );
        assert!(WorkerConfig::default()
            .retry(RetryPolicy::default().max_attempts(0))
            .validate(Duration::ZERO)
            .is_err());
    }
}
