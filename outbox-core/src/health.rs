//! [`Health`]: whether a worker is alive and keeping up.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How long messages may stay held by a worker that stopped renewing their lease before
/// health fails: a live worker of their topic takes them over within a poll interval.
pub(crate) const STALLED_LIMIT: Duration = Duration::from_secs(30);

fn millis(age: Option<Duration>) -> i64 {
    age.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// What the health endpoint checks, shared with the worker that updates it.
#[derive(Debug, Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

#[derive(Debug)]
struct HealthInner {
    last_tick_ms: AtomicI64,
    oldest_ready_ms: AtomicI64,
    oldest_stalled_ms: AtomicI64,
    max_tick_age: Duration,
    max_oldest_ready: Duration,
}

impl Health {
    pub(crate) fn new(max_tick_age: Duration, max_oldest_ready: Duration) -> Self {
        Self {
            inner: Arc::new(HealthInner {
                last_tick_ms: AtomicI64::new(now_ms()),
                oldest_ready_ms: AtomicI64::new(0),
                oldest_stalled_ms: AtomicI64::new(0),
                max_tick_age,
                max_oldest_ready,
            }),
        }
    }

    pub(crate) fn tick(&self) {
        self.inner.last_tick_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn set_oldest_ready(&self, age: Option<Duration>) {
        self.inner
            .oldest_ready_ms
            .store(millis(age), Ordering::Relaxed);
    }

    pub(crate) fn set_oldest_stalled(&self, age: Option<Duration>) {
        self.inner
            .oldest_stalled_ms
            .store(millis(age), Ordering::Relaxed);
    }

    /// `Ok(())` when healthy, else the reason: the worker loop has not ticked recently, the
    /// oldest ready message has waited too long, or messages of this worker's topics are held
    /// by a worker that stopped renewing their lease and nobody has taken them over for
    /// 30 s.
    ///
    /// # Errors
    ///
    /// The reason the worker is unhealthy, one sentence.
    pub fn check(&self) -> Result<(), String> {
        let since_tick = now_ms().saturating_sub(self.inner.last_tick_ms.load(Ordering::Relaxed));
        if since_tick > i64::try_from(self.inner.max_tick_age.as_millis()).unwrap_or(i64::MAX) {
            return Err(format!(
                "the worker loop has not ticked for {since_tick} ms (limit {} ms)",
                self.inner.max_tick_age.as_millis()
            ));
        }
        let stalled = self.inner.oldest_stalled_ms.load(Ordering::Relaxed);
        if stalled > i64::try_from(STALLED_LIMIT.as_millis()).unwrap_or(i64::MAX) {
            return Err(format!(
                "messages held by a worker that stopped renewing their lease have not been taken \
                 over for {stalled} ms (limit {} ms): is any worker of their topic running?",
                STALLED_LIMIT.as_millis()
            ));
        }
        let oldest = self.inner.oldest_ready_ms.load(Ordering::Relaxed);
        if oldest > i64::try_from(self.inner.max_oldest_ready.as_millis()).unwrap_or(i64::MAX) {
            return Err(format!(
                "the oldest ready message has waited {oldest} ms (limit {} ms)",
                self.inner.max_oldest_ready.as_millis()
            ));
        }
        Ok(())
    }
}
