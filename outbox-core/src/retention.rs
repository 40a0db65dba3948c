//! The records of the event log: the retained topics, their events, and what an upkeep did.
//! The storage backends build them; [`Store`](crate::store::Store)'s event-log methods
//! return them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// How many days of partitions ahead the workers keep for each retained topic (PostgreSQL).
pub const DAYS_AHEAD: u32 = 7;

/// Below this many days of partitions ahead, the statistics, the health check and the
/// workers' log warn that no worker keeps them (PostgreSQL).
pub const RUNWAY_WARNING: Duration = Duration::from_secs(2 * 86_400);

/// A topic whose delivered events the event log keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetainedTopic {
    /// The topic.
    pub topic: String,
    /// How long its events are kept after delivery.
    pub retain: Duration,
    /// Events in the log.
    pub events: i64,
    /// The log's size on disk, indexes included (PostgreSQL; `None` on SQLite, where the
    /// topics share one table).
    pub bytes: Option<i64>,
    /// When the oldest event in the log was created.
    pub oldest: Option<DateTime<Utc>>,
    /// The end of the last day the log has a partition for (PostgreSQL; `None` on SQLite,
    /// which needs none). A delivery after it could not be logged: the workers create days
    /// ahead, and [`runway_note`](Self::runway_note) warns when they did not.
    pub partitions_until: Option<DateTime<Utc>>,
    /// When a worker first declared the topic's retention.
    pub declared_at: DateTime<Utc>,
    /// When its window last changed.
    pub changed_at: DateTime<Utc>,
}

impl RetainedTopic {
    /// How long the log can still take this topic's deliveries at `now`: until the end of
    /// its last partition. `None` where the backend needs no partitions.
    pub fn runway(&self, now: DateTime<Utc>) -> Option<Duration> {
        let until = self.partitions_until?;
        Some((until - now).to_std().unwrap_or(Duration::ZERO))
    }

    /// A warning when fewer than two days of partitions are left at `now`: no worker has
    /// created them, and deliveries of the topic fail once they run out.
    pub fn runway_note(&self, now: DateTime<Utc>) -> Option<String> {
        let runway = self.runway(now)?;
        (runway < RUNWAY_WARNING).then(|| {
            format!(
                "the event log of topic {} has partitions for {:.1} more hours only: no worker \
                 has created the days ahead; start a worker (each creates them at start and \
                 every ten minutes) or run `outbox events upkeep`",
                self.topic,
                runway.as_secs_f64() / 3600.0
            )
        })
    }
}

/// A delivered event, as the event log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetainedEvent {
    /// The message id (UUID v7, in enqueue order).
    pub id: Uuid,
    /// The topic.
    pub topic: String,
    /// The payload as stored (JSON).
    pub payload: String,
    /// The version of the event type it was written with.
    pub version: i32,
    /// The idempotency key given at enqueue, if any.
    pub idempotency_key: Option<String>,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When its delivery ended (its last handler succeeded).
    pub delivered_at: DateTime<Utc>,
    /// The W3C traceparent it was enqueued under, if any.
    pub traceparent: Option<String>,
}

/// Which events of the log to list: one topic, optionally a window of enqueue times, one
/// ordering key, and a page after an event already listed. Listed in enqueue (id) order.
///
/// ```
/// use outbox::EventFilter;
/// use chrono::{Duration, Utc};
///
/// let filter = EventFilter::topic("booking.created")
///     .since(Utc::now() - Duration::days(30))
///     .key("booking:42")
///     .limit(50);
/// assert_eq!(filter.limit, Some(50));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct EventFilter {
    /// The topic.
    pub topic: String,
    /// Only events enqueued at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only events enqueued before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only events of this ordering key.
    pub key: Option<String>,
    /// Only events after this one (the last of the previous page).
    pub after: Option<Uuid>,
    /// At most this many (default 100).
    pub limit: Option<u32>,
}

impl EventFilter {
    /// The events of `topic`.
    pub fn topic(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            ..Self::default()
        }
    }

    /// Only events enqueued at or after `since`.
    #[must_use]
    pub fn since(mut self, since: DateTime<Utc>) -> Self {
        self.since = Some(since);
        self
    }

    /// Only events enqueued before `until`.
    #[must_use]
    pub fn until(mut self, until: DateTime<Utc>) -> Self {
        self.until = Some(until);
        self
    }

    /// Only events of the ordering key `key`.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Only events after the event `id` (keyset paging).
    #[must_use]
    pub fn after(mut self, id: Uuid) -> Self {
        self.after = Some(id);
        self
    }

    /// At most `limit` events.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }
}

/// What one upkeep of the event log did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogUpkeep {
    /// Day partitions created ahead (PostgreSQL).
    pub created: u32,
    /// Day partitions dropped, each with every event of one topic delivered that day
    /// (PostgreSQL).
    pub dropped: u32,
    /// Expired events deleted (SQLite, in batches).
    pub deleted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(until: Option<DateTime<Utc>>) -> RetainedTopic {
        let now = Utc::now();
        RetainedTopic {
            topic: "booking.created".into(),
            retain: Duration::from_secs(86_400),
            events: 0,
            bytes: None,
            oldest: None,
            partitions_until: until,
            declared_at: now,
            changed_at: now,
        }
    }

    #[test]
    fn a_short_runway_is_reported_and_a_long_one_is_not() {
        let now = Utc::now();
        assert_eq!(topic(None).runway_note(now), None);
        assert_eq!(
            topic(Some(now + chrono::Duration::days(5))).runway_note(now),
            None
        );
        let note = topic(Some(now + chrono::Duration::hours(30)))
            .runway_note(now)
            .expect("a warning");
        assert!(note.contains("30.0 more hours"), "{note}");
        let gone = topic(Some(now - chrono::Duration::hours(1)));
        assert_eq!(gone.runway(now), Some(Duration::ZERO));
    }
}
