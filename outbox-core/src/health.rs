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

/// How long ready messages of a topic that no live worker serves may wait before health fails.
pub(crate) const UNSERVED_LIMIT: Duration = Duration::from_secs(60);

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
    oldest_queued_ms: AtomicI64,
    unserved: std::sync::Mutex<Vec<(String, Duration)>>,
    blocked_by_dead: std::sync::Mutex<Vec<(String, i64)>>,
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
                oldest_queued_ms: AtomicI64::new(0),
                unserved: std::sync::Mutex::new(Vec::new()),
                blocked_by_dead: std::sync::Mutex::new(Vec::new()),
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

    pub(crate) fn set_unserved(&self, topics: Vec<(String, Duration)>) {
        *self
            .inner
            .unserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topics;
    }

    /// Topics with ready messages that no live worker serves, with the age of their oldest
    /// ready message, as of the last statistics refresh.
    pub fn unserved_topics(&self) -> Vec<(String, Duration)> {
        self.inner
            .unserved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_blocked_by_dead(&self, topics: Vec<(String, i64)>) {
        *self
            .inner
            .blocked_by_dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topics;
    }

    /// Topics with ready messages held back by a dead letter of their ordering key, with how
    /// many, as of the last statistics refresh. They wait until the dead letter is retried or
    /// discarded.
    pub fn blocked_by_dead(&self) -> Vec<(String, i64)> {
        self.inner
            .blocked_by_dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_oldest_queued(&self, age: Option<Duration>) {
        self.inner
            .oldest_queued_ms
            .store(millis(age), Ordering::Relaxed);
    }

    pub(crate) fn set_oldest_stalled(&self, age: Option<Duration>) {
        self.inner
            .oldest_stalled_ms
            .store(millis(age), Ordering::Relaxed);
    }

    /// `Ok(())` when healthy, else the reason: the worker loop has not ticked recently, ready
    /// messages of a topic that no live worker serves have waited more than 60 s, the
    /// oldest ready message has waited too long, or messages of this worker's topics are held
    /// by a worker that stopped renewing their lease and nobody has taken them over for
    /// 30 s, or messages wait behind a dead letter of their ordering key.
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
        let late: Vec<String> = self
            .unserved_topics()
            .into_iter()
            .filter(|(_, age)| *age > UNSERVED_LIMIT)
            .map(|(topic, age)| format!("`{topic}` ({} s)", age.as_secs()))
            .collect();
        if !late.is_empty() {
            return Err(format!(
                "ready messages of topics that no live worker serves: {} (limit {} s): is a handler \
                 crate not linked into the worker binary, or its workers down?",
                late.join(", "),
                UNSERVED_LIMIT.as_secs()
            ));
        }
        let blocked: Vec<String> = self
            .blocked_by_dead()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(topic, n)| format!("`{topic}` ({n})"))
            .collect();
        if !blocked.is_empty() {
            return Err(format!(
                "messages wait behind a dead letter of their ordering key: {}: retry or discard \
                 the dead letters (`outbox dead list`, `outbox dead retry`, `outbox dead discard`)",
                blocked.join(", ")
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
        let limit = i64::try_from(self.inner.max_oldest_ready.as_millis()).unwrap_or(i64::MAX);
        let queued = self.inner.oldest_queued_ms.load(Ordering::Relaxed);
        if queued > limit {
            return Err(format!(
                "the oldest message claimed by this worker has waited {queued} ms for a free handler \
                 (limit {limit} ms): its handlers are all busy"
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
