//! [`Health`]: whether a worker is alive and keeping up.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::now_ms;

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
    unknown_versions: std::sync::Mutex<Vec<(String, i32, Duration)>>,
    log_runway: std::sync::Mutex<Vec<(String, Duration)>>,
    pauses: std::sync::Mutex<Vec<(String, Duration)>>,
    max_tick_age: Duration,
    max_oldest_ready: Duration,
    max_awaiting_version: Duration,
}

impl Health {
    pub(crate) fn new(
        max_tick_age: Duration,
        max_oldest_ready: Duration,
        max_awaiting_version: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(HealthInner {
                last_tick_ms: AtomicI64::new(now_ms()),
                oldest_ready_ms: AtomicI64::new(0),
                oldest_stalled_ms: AtomicI64::new(0),
                oldest_queued_ms: AtomicI64::new(0),
                unserved: std::sync::Mutex::new(Vec::new()),
                blocked_by_dead: std::sync::Mutex::new(Vec::new()),
                unknown_versions: std::sync::Mutex::new(Vec::new()),
                log_runway: std::sync::Mutex::new(Vec::new()),
                pauses: std::sync::Mutex::new(Vec::new()),
                max_tick_age,
                max_oldest_ready,
                max_awaiting_version,
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

    pub(crate) fn set_unknown_versions(&self, topics: Vec<(String, i32, Duration)>) {
        *self
            .inner
            .unknown_versions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topics;
    }

    /// Topics whose newest version of live messages no live worker knows, with that version
    /// and how long the topic's oldest message awaiting a worker that knows its version has
    /// been due, as of the last statistics refresh.
    pub fn unknown_versions(&self) -> Vec<(String, i32, Duration)> {
        self.inner
            .unknown_versions
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

    pub(crate) fn set_log_runway(&self, topics: Vec<(String, Duration)>) {
        *self
            .inner
            .log_runway
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = topics;
    }

    /// Retained topics whose event log has day partitions for less than
    /// [`RUNWAY_WARNING`](crate::RUNWAY_WARNING) ahead, with how long, as of the worker's last
    /// upkeep of the log (PostgreSQL).
    pub fn log_runway(&self) -> Vec<(String, Duration)> {
        self.inner
            .log_runway
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_pauses(&self, pauses: Vec<(String, Duration)>) {
        *self
            .inner
            .pauses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = pauses;
    }

    /// The pauses in force (`outbox pause`), as this worker last read them (twice a second):
    /// each as `handler NAME` or `topic NAME`, with how long it has lasted. A pause is not
    /// unhealthy: [`check`](Self::check) never fails for one.
    pub fn pauses(&self) -> Vec<(String, Duration)> {
        self.inner
            .pauses
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

    /// `Ok(())` when healthy, else the first reason found, in the order of [`Unhealthy`]'s
    /// variants.
    ///
    /// ```no_run
    /// # async fn run(worker: outbox::Worker) {
    /// match worker.health().check() {
    ///     Ok(()) => {}
    ///     Err(outbox::Unhealthy::UnservedTopics { topics, .. }) => {
    ///         eprintln!("nobody serves {topics:?}: is a handler crate not linked?");
    ///     }
    ///     Err(other) => eprintln!("unhealthy: {other}"),
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The reason the worker is unhealthy; its `Display` is one sentence.
    pub fn check(&self) -> Result<(), Unhealthy> {
        let limit_ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        let since_tick = now_ms().saturating_sub(self.inner.last_tick_ms.load(Ordering::Relaxed));
        if since_tick > limit_ms(self.inner.max_tick_age) {
            return Err(Unhealthy::LoopStalled {
                since_tick: ms(since_tick),
                limit: self.inner.max_tick_age,
            });
        }
        let late: Vec<(String, Duration)> = self
            .unserved_topics()
            .into_iter()
            .filter(|(_, age)| *age > UNSERVED_LIMIT)
            .collect();
        if !late.is_empty() {
            return Err(Unhealthy::UnservedTopics {
                topics: late,
                limit: UNSERVED_LIMIT,
            });
        }
        let awaiting = self.inner.max_awaiting_version;
        let unknown: Vec<(String, i32, Duration)> = self
            .unknown_versions()
            .into_iter()
            .filter(|(_, _, age)| *age > awaiting)
            .collect();
        if !unknown.is_empty() {
            return Err(Unhealthy::UnknownVersions {
                topics: unknown,
                limit: awaiting,
            });
        }
        let blocked: Vec<(String, i64)> = self
            .blocked_by_dead()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        if !blocked.is_empty() {
            return Err(Unhealthy::BlockedByDead { topics: blocked });
        }
        let short = self.log_runway();
        if !short.is_empty() {
            return Err(Unhealthy::EventLogRunway { topics: short });
        }
        let stalled = self.inner.oldest_stalled_ms.load(Ordering::Relaxed);
        if stalled > limit_ms(STALLED_LIMIT) {
            return Err(Unhealthy::StalledLeases {
                oldest: ms(stalled),
                limit: STALLED_LIMIT,
            });
        }
        let limit = self.inner.max_oldest_ready;
        let queued = self.inner.oldest_queued_ms.load(Ordering::Relaxed);
        if queued > limit_ms(limit) {
            return Err(Unhealthy::HandlersBusy {
                oldest_queued: ms(queued),
                limit,
            });
        }
        let oldest = self.inner.oldest_ready_ms.load(Ordering::Relaxed);
        if oldest > limit_ms(limit) {
            return Err(Unhealthy::ReadyTooOld {
                oldest: ms(oldest),
                limit,
            });
        }
        Ok(())
    }
}

/// Why a worker is unhealthy: what [`Health::check`] and the `/health` endpoint report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unhealthy {
    /// The worker's own loop has not ticked for longer than its limit: it is stuck.
    #[error("the worker loop has not ticked for {} ms (limit {} ms)", .since_tick.as_millis(), .limit.as_millis())]
    LoopStalled {
        /// Time since the last tick.
        since_tick: Duration,
        /// The limit ([`WorkerConfig::health_max_tick_age`](crate::WorkerConfig::health_max_tick_age)).
        limit: Duration,
    },
    /// Ready messages of topics that no live worker serves have waited longer than 60 s.
    #[error("ready messages of topics that no live worker serves: {} (limit {} s): is a handler \
             crate not linked into the worker binary, or its workers down?", late(.topics), .limit.as_secs())]
    UnservedTopics {
        /// The topics, with the age of their oldest ready message.
        topics: Vec<(String, Duration)>,
        /// The limit.
        limit: Duration,
    },
    /// Messages of a version that no live worker knows have waited longer than their limit
    /// (15 minutes unless set): a rollout whose workers never caught up with its producers.
    #[error("{} (limit {} s): deploy workers built with the newer event types (workers first, \
             then producers)", unknown(.topics), .limit.as_secs())]
    UnknownVersions {
        /// The topics, with the newest version no live worker knows and how long the oldest
        /// message awaiting it has been due.
        topics: Vec<(String, i32, Duration)>,
        /// The limit ([`WorkerConfig::health_max_awaiting_version`](crate::WorkerConfig::health_max_awaiting_version)).
        limit: Duration,
    },
    /// Messages wait behind a dead letter of their ordering key, which holds the key until it
    /// is retried or discarded.
    #[error("messages wait behind a dead letter of their ordering key: {}: retry or discard \
             the dead letters (`outbox dead list`, `outbox dead retry`, `outbox dead discard`)", blocked(.topics))]
    BlockedByDead {
        /// The topics, with how many messages of each wait so.
        topics: Vec<(String, i64)>,
    },
    /// The event log of a retained topic has day partitions for less than two days ahead:
    /// the workers' upkeep has not created them, and once they run out the deliveries of the
    /// topic fail.
    #[error("the event log has partitions for less than two days ahead for {}: the workers' \
             upkeep could not create them (see their log), or run `outbox events upkeep`", runway(.topics))]
    EventLogRunway {
        /// The topics, with how long their partitions last.
        topics: Vec<(String, Duration)>,
    },
    /// Messages held by a worker that stopped renewing their lease have not been taken over.
    #[error("messages held by a worker that stopped renewing their lease have not been taken \
             over for {} ms (limit {} ms): is any worker of their topic running?", .oldest.as_millis(), .limit.as_millis())]
    StalledLeases {
        /// How long the oldest such message has waited since its lease ran out.
        oldest: Duration,
        /// The limit.
        limit: Duration,
    },
    /// A message this worker claimed has waited too long for a free handler.
    #[error("the oldest message claimed by this worker has waited {} ms for a free handler \
             (limit {} ms): its handlers are all busy", .oldest_queued.as_millis(), .limit.as_millis())]
    HandlersBusy {
        /// How long the oldest claimed message has waited for a handler.
        oldest_queued: Duration,
        /// The limit ([`WorkerConfig::health_max_oldest_ready`](crate::WorkerConfig::health_max_oldest_ready)).
        limit: Duration,
    },
    /// The oldest ready message has waited longer than the limit: the workers do not keep up.
    #[error("the oldest ready message has waited {} ms (limit {} ms)", .oldest.as_millis(), .limit.as_millis())]
    ReadyTooOld {
        /// How long the oldest ready message has been due.
        oldest: Duration,
        /// The limit ([`WorkerConfig::health_max_oldest_ready`](crate::WorkerConfig::health_max_oldest_ready)).
        limit: Duration,
    },
}

fn blocked(topics: &[(String, i64)]) -> String {
    topics
        .iter()
        .map(|(topic, n)| format!("`{topic}` ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown(topics: &[(String, i32, Duration)]) -> String {
    topics
        .iter()
        .map(|(topic, v, age)| {
            format!(
                "version {v} of topic {topic}: no live worker knows it, its oldest message due \
                 for {} s",
                age.as_secs()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn late(topics: &[(String, Duration)]) -> String {
    topics
        .iter()
        .map(|(topic, age)| format!("`{topic}` ({} s)", age.as_secs()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn runway(topics: &[(String, Duration)]) -> String {
    topics
        .iter()
        .map(|(topic, left)| format!("`{topic}` ({:.1} h)", left.as_secs_f64() / 3600.0))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_awaiting_a_version_fail_health_only_past_their_own_limit() {
        let minute = Duration::from_secs(60);
        let health = Health::new(minute, minute, 15 * minute);
        health.tick();
        // A rollout's producers ahead of its workers for five minutes: past the oldest-ready
        // limit, not past the version's own.
        health.set_unknown_versions(vec![("booking".into(), 2, 5 * minute)]);
        assert_eq!(health.check(), Ok(()));
        health.set_unknown_versions(vec![("booking".into(), 2, 16 * minute)]);
        let e = health.check().unwrap_err();
        assert_eq!(
            e,
            Unhealthy::UnknownVersions {
                topics: vec![("booking".into(), 2, 16 * minute)],
                limit: 15 * minute,
            }
        );
        assert!(
            e.to_string().starts_with(
                "version 2 of topic booking: no live worker knows it, its oldest message due for \
                 960 s (limit 900 s)"
            ),
            "{e}"
        );
    }
}
