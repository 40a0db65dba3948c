//! The records of the event log: the retained topics, their events, what an upkeep did, and
//! the replays of the log to one handler. The storage backends build them;
//! [`Store`](crate::store::Store)'s event-log methods return them.

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
    /// The message id (UUID v7).
    pub id: Uuid,
    /// The message's place in its key's order, as the database numbered it at insert: a key's
    /// events are listed and replayed in this order. 0 for unkeyed messages, and for events
    /// logged before the database numbered them (those come first, in id order).
    pub seq: i64,
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
/// ordering key, and a page after an event already listed. Listed in (`seq`, id) order: each
/// key's events in the order the database inserted their messages.
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
    /// The `seq` of [`after`](Self::after), when known; otherwise the backend looks it up.
    pub(crate) after_seq: Option<i64>,
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

/// Where a handler starts when it is first deployed: [`Handler::START`](crate::Handler::START).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// With the messages delivered from now on (the default): no backfill.
    #[default]
    Present,
    /// With the retained events enqueued this long before its first start, then on.
    Since(Duration),
    /// With every retained event of its topic, then on.
    Beginning,
}

/// What to replay: a window of one retained topic's events, to one handler of that topic.
///
/// ```
/// use outbox::ReplayRequest;
/// use chrono::{Duration, Utc};
///
/// let replay = ReplayRequest::new("booking.created", "search-index")
///     .since(Utc::now() - Duration::days(7))
///     .rate(500);
/// assert_eq!(replay.rate, Some(500));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ReplayRequest {
    /// The topic, which must retain its events.
    pub topic: String,
    /// The handler, which must have run on this topic (a worker with it has started).
    pub handler: String,
    /// Events enqueued at or after this time; all retained ones when `None`.
    pub since: Option<DateTime<Utc>>,
    /// Events enqueued before this time; up to the replay's creation when `None`.
    pub until: Option<DateTime<Utc>>,
    /// Only the events of this ordering key.
    pub key: Option<String>,
    /// At most this many events per second.
    pub rate: Option<u32>,
    /// Deliver with new message ids, and so new derived idempotency keys: a re-run that a
    /// dedup-wrapped handler does not skip. By default each event keeps its id and keys.
    pub fresh: bool,
}

impl ReplayRequest {
    /// The retained events of `topic`, to its handler `handler`.
    pub fn new(topic: impl Into<String>, handler: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            handler: handler.into(),
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

    /// Only the events of ordering key `key`.
    #[must_use]
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// At most `per_second` events per second.
    #[must_use]
    pub fn rate(mut self, per_second: u32) -> Self {
        self.rate = Some(per_second);
        self
    }

    /// New message ids and idempotency keys (see [`fresh`](Self::fresh)).
    #[must_use]
    pub fn fresh(mut self) -> Self {
        self.fresh = true;
        self
    }
}

/// What a replay would deliver: how many events, enqueued when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayPlan {
    /// Events in the window.
    pub events: i64,
    /// When the first of them was enqueued.
    pub first: Option<DateTime<Utc>>,
    /// When the last of them was enqueued.
    pub last: Option<DateTime<Utc>>,
}

/// Where a replay stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayState {
    /// Delivering, or waiting for a worker with its handler.
    Running,
    /// Paused by an operator: resumed from its cursor.
    Paused,
    /// Cancelled by an operator: it delivers nothing more.
    Cancelled,
    /// Every event of its window was handled.
    Done,
}

impl ReplayState {
    /// The state's name as stored: `running`, `paused`, `cancelled`, `done`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayState::Running => "running",
            ReplayState::Paused => "paused",
            ReplayState::Cancelled => "cancelled",
            ReplayState::Done => "done",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "paused" => ReplayState::Paused,
            "cancelled" => ReplayState::Cancelled,
            "done" => ReplayState::Done,
            _ => ReplayState::Running,
        }
    }
}

impl std::fmt::Display for ReplayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A replay and its progress.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayInfo {
    /// Its id.
    pub id: Uuid,
    /// What it replays.
    pub request: ReplayRequestInfo,
    /// Made for a handler's [`Start`] rather than by an operator.
    pub backfill: bool,
    /// Where it stands.
    pub state: ReplayState,
    /// Events in its window when it was made.
    pub total: i64,
    /// Events handled (including those that failed for good).
    pub delivered: i64,
    /// Events its handler failed for good: recorded with their errors, and the replay went on.
    pub failed: i64,
    /// The last event handled: where it resumes.
    pub cursor: Option<Uuid>,
    /// The `seq` of [`cursor`](Self::cursor): its place in the log's order.
    pub(crate) cursor_seq: Option<i64>,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// When a worker first took it up.
    pub started_at: Option<DateTime<Utc>>,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
    /// When it was done or cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// Whether a worker is running it now (its lease is live).
    pub leased: bool,
}

/// The window and handler of a stored replay.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayRequestInfo {
    /// The topic.
    pub topic: String,
    /// The handler.
    pub handler: String,
    /// Events enqueued from.
    pub since: Option<DateTime<Utc>>,
    /// Events enqueued before.
    pub until: DateTime<Utc>,
    /// Only this ordering key.
    pub key: Option<String>,
    /// Events per second at most.
    pub rate: Option<u32>,
    /// New message ids.
    pub fresh: bool,
}

impl ReplayInfo {
    /// Handled over total, from 0 to 1 (1 for an empty window).
    pub fn progress(&self) -> f64 {
        if self.total <= 0 {
            1.0
        } else {
            (self.delivered as f64 / self.total as f64).min(1.0)
        }
    }

    /// Events handled per second since it started.
    pub fn rate(&self) -> Option<f64> {
        let started = self.started_at?;
        let end = self.finished_at.unwrap_or(self.updated_at);
        let secs = (end - started).num_milliseconds() as f64 / 1000.0;
        (secs > 0.0).then(|| self.delivered as f64 / secs)
    }

    /// The time left at [`rate`](Self::rate), while it runs.
    pub fn time_left(&self) -> Option<Duration> {
        if self.state != ReplayState::Running {
            return None;
        }
        let rate = self.rate()?;
        let left = (self.total - self.delivered).max(0) as f64;
        (rate > 0.0).then(|| Duration::from_secs_f64(left / rate))
    }

    /// One line: `[#########-----------]  45%  4,500/10,000  310/s  ~18s left  running`.
    pub fn progress_line(&self) -> String {
        const WIDTH: usize = 20;
        let filled = ((self.progress() * WIDTH as f64).round() as usize).min(WIDTH);
        let mut line = format!(
            "[{}{}] {:>3.0}%  {}/{}",
            "#".repeat(filled),
            "-".repeat(WIDTH - filled),
            self.progress() * 100.0,
            self.delivered,
            self.total
        );
        if let Some(rate) = self.rate() {
            line.push_str(&format!("  {rate:.0}/s"));
        }
        if let Some(left) = self.time_left() {
            line.push_str(&format!("  ~{}s left", left.as_secs()));
        }
        if self.failed > 0 {
            line.push_str(&format!("  {} failed", self.failed));
        }
        line.push_str(&format!("  {}", self.state));
        line
    }
}

/// An event a replay's handler failed for good.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayFailure {
    /// The event's id.
    pub event_id: Uuid,
    /// Attempts made.
    pub attempts: i32,
    /// The last error.
    pub error: String,
    /// When it failed for good.
    pub failed_at: DateTime<Utc>,
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
