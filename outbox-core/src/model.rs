//! The records the operations read and write: queue statistics, message and worker
//! information, dead-letter selections. The storage backends build them, so they live apart from
//! the operations on [`Store`](crate::store::Store), which call the backends.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Counts of one topic (or of all topics, in [`Stats::total`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TopicStats {
    /// The topic (`"*"` in the total).
    pub topic: String,
    /// Due now and not claimed (including claims whose lease ran out), and free to start:
    /// messages held back by an earlier message of their ordering key are in `blocked`, and
    /// those of a version no live worker of the topic knows are in `awaiting_version`.
    pub ready: i64,
    /// Due now but held back by an earlier message of their ordering key (one that is pending,
    /// running, waiting for a retry, delayed, or dead and holding the key).
    pub blocked: i64,
    /// Of `blocked`, those behind a dead letter of their key: they wait until an operator
    /// retries or discards it (`outbox dead retry` / `outbox dead discard`).
    pub blocked_by_dead: i64,
    /// Waiting for a backoff or a delay.
    pub scheduled: i64,
    /// Claimed by a worker, lease running.
    pub in_flight: i64,
    /// Claimed by a worker that stopped renewing its lease (it crashed, was killed or lost
    /// the database): ready again, counted in `ready` too, until a live worker claims them.
    pub stalled: i64,
    /// Dead-lettered.
    pub dead: i64,
    /// Done in the last five minutes (counted per whole minute).
    pub done_last_5m: i64,
    /// How long the oldest ready message has been due (messages awaiting a worker that knows
    /// their version are not ready, and do not count here).
    pub oldest_ready_age: Option<Duration>,
    /// How long ago the oldest stalled message's lease ran out.
    pub oldest_stalled_age: Option<Duration>,
    /// How long the oldest blocked message has been due.
    pub oldest_blocked_age: Option<Duration>,
    /// Live workers (heartbeat within seconds) that serve this topic. In [`Stats::total`],
    /// the largest per-topic count.
    pub live_workers: i64,
    /// The newest version of this topic's live messages when live workers serve the topic
    /// but none of them knows that version: those messages wait, pending and never claimed,
    /// until a worker built with the newer event type starts. `None` when every version is
    /// known (and in [`Stats::total`]).
    pub unknown_version: Option<i32>,
    /// Due now and free to start but for their version: live workers serve the topic and none
    /// of them knows that version (a producer deployed ahead of its workers). They wait,
    /// never claimed, until a worker that knows it starts; they are not in `ready`.
    pub awaiting_version: i64,
    /// How long the oldest of `awaiting_version` has been due.
    pub oldest_awaiting_version_age: Option<Duration>,
}

impl TopicStats {
    fn add(&mut self, o: &TopicStats) {
        self.ready += o.ready;
        self.blocked += o.blocked;
        self.blocked_by_dead += o.blocked_by_dead;
        self.oldest_blocked_age = self.oldest_blocked_age.max(o.oldest_blocked_age);
        self.scheduled += o.scheduled;
        self.in_flight += o.in_flight;
        self.stalled += o.stalled;
        self.dead += o.dead;
        self.done_last_5m += o.done_last_5m;
        self.oldest_ready_age = self.oldest_ready_age.max(o.oldest_ready_age);
        self.oldest_stalled_age = self.oldest_stalled_age.max(o.oldest_stalled_age);
        self.live_workers = self.live_workers.max(o.live_workers);
        self.awaiting_version += o.awaiting_version;
        self.oldest_awaiting_version_age = self
            .oldest_awaiting_version_age
            .max(o.oldest_awaiting_version_age);
    }

    /// Messages not yet done or dead: ready + blocked + awaiting a version + scheduled + in
    /// flight.
    pub fn pending(&self) -> i64 {
        self.ready + self.blocked + self.awaiting_version + self.scheduled + self.in_flight
    }

    /// What waits for a worker that knows a newer version, as one line:
    /// `version N of topic T: no live worker knows it`.
    pub fn unknown_version_note(&self) -> Option<String> {
        self.unknown_version.map(|v| {
            format!(
                "version {v} of topic {}: no live worker knows it; deploy workers built with \
                 that version",
                self.topic
            )
        })
    }

    /// Ready messages that no live worker serves: they wait until one starts.
    pub fn unserved(&self) -> bool {
        self.ready > 0 && self.live_workers == 0
    }
}

/// The health of the queue: per topic, in total, and the topics nobody handles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Per topic, sorted by topic.
    pub topics: Vec<TopicStats>,
    /// All topics together.
    pub total: TopicStats,
    /// The pauses in force (`outbox pause`), with how many messages wait on each.
    pub pauses: Vec<crate::pause::PauseInfo>,
    /// The open breakers ([`crate::Breaker`]), with how many messages wait on each.
    pub breakers: Vec<crate::breaker::BreakerInfo>,
}

impl Stats {
    pub(crate) fn from_topics(topics: Vec<TopicStats>) -> Self {
        let mut total = TopicStats {
            topic: "*".into(),
            ..TopicStats::default()
        };
        for t in &topics {
            total.add(t);
        }
        Stats {
            topics,
            total,
            pauses: Vec::new(),
            breakers: Vec::new(),
        }
    }
}

/// Where a message is in its lifecycle (the crate docs' "Message lifecycle" draws it).
///
/// A done message has no status: its row is deleted when its last handler succeeds.
///
/// ```
/// use outbox::MessageStatus;
///
/// assert_eq!(MessageStatus::Dead.as_str(), "dead");
/// assert_eq!("running".parse::<MessageStatus>(), Ok(MessageStatus::Running));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageStatus {
    /// Waiting for its time (`available_at`) or for a worker: no live lease.
    Pending,
    /// Claimed by a worker whose lease has not run out.
    Running,
    /// Dead-lettered: out of attempts or failed permanently; waits for an operator.
    Dead,
}

impl MessageStatus {
    /// The lowercase name, as the CLI and the console show it: `pending`, `running`, `dead`.
    pub fn as_str(self) -> &'static str {
        match self {
            MessageStatus::Pending => "pending",
            MessageStatus::Running => "running",
            MessageStatus::Dead => "dead",
        }
    }
}

impl fmt::Display for MessageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A status name that is not one of [`MessageStatus`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown message status `{0}`; expected pending, running or dead")]
pub struct UnknownStatus(String);

impl FromStr for MessageStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "pending" => Ok(MessageStatus::Pending),
            "running" => Ok(MessageStatus::Running),
            "dead" => Ok(MessageStatus::Dead),
            other => Err(UnknownStatus(other.to_string())),
        }
    }
}

/// One message as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageInfo {
    /// The public id.
    pub id: Uuid,
    /// The topic.
    pub topic: String,
    /// Pending, running or dead (a done message is deleted).
    pub status: MessageStatus,
    /// Attempts made.
    pub attempts: i32,
    /// The payload, as JSON text.
    pub payload: String,
    /// The last error, if any attempt failed.
    pub last_error: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it is due; the lease deadline while running; when it died, for a dead letter.
    pub available_at: DateTime<Utc>,
    /// When it became dead.
    pub processed_at: Option<DateTime<Utc>>,
    /// The idempotency key given at enqueue, if any (handlers otherwise get
    /// `"{id}:{handler}"`).
    pub idempotency_key: Option<String>,
    /// The ordering key, if it has one.
    pub ordering_key: Option<String>,
    /// The handlers that already succeeded for it, with when: a message with several handlers
    /// retries only the others. Filled by [`Store::message`](crate::store::Store::message); empty in listings.
    pub handlers_done: Vec<(String, DateTime<Utc>)>,
}

/// A worker as its heartbeat row shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerInfo {
    /// The worker's id (fresh for every run).
    pub id: Uuid,
    /// Its name (`host:pid` by default, see [`WorkerConfig::name`](crate::WorkerConfig::name)).
    pub name: String,
    /// The host it runs on; `None` for a worker of a build that did not record it.
    pub host: Option<String>,
    /// Its process id; `None` for a worker of a build that did not record it.
    pub pid: Option<u32>,
    /// The topics it serves.
    pub topics: Vec<String>,
    /// Per topic of `topics`, at the same position, the highest version of its event type the
    /// worker decodes (and claims). Empty for a worker that did not record them.
    pub versions: Vec<i32>,
    /// Per topic of `topics`, at the same position, the names of the handlers it runs for
    /// that topic: what `outbox replay --handler` takes. Empty for a worker that did not record
    /// them.
    pub handlers: Vec<Vec<String>>,
    /// Whether it sleeps until a producer wakes it (idle), rather than claiming (busy).
    pub waiting: bool,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat: a live worker writes one every second.
    pub heartbeat_at: DateTime<Utc>,
    /// The heartbeat is fresh (within 5 s): the worker is alive.
    pub live: bool,
}

impl WorkerInfo {
    /// Each topic the worker serves, with the highest version it knows of it (when recorded)
    /// and the names of its handlers of it (empty when not recorded).
    ///
    /// ```
    /// # fn show(w: &outbox::WorkerInfo) {
    /// for (topic, version, handlers) in w.serves() {
    ///     println!("{topic} v{}: {}", version.unwrap_or(1), handlers.join(", "));
    /// }
    /// # }
    /// ```
    pub fn serves(&self) -> impl Iterator<Item = (&str, Option<i32>, &[String])> {
        self.topics.iter().enumerate().map(|(i, t)| {
            (
                t.as_str(),
                self.versions.get(i).copied(),
                self.handlers.get(i).map(Vec::as_slice).unwrap_or_default(),
            )
        })
    }
}

/// Which dead letters to list: build it with [`DeadLetterFilter::new`] and its setters.
///
/// ```
/// use outbox::DeadLetterFilter;
/// use std::time::Duration;
///
/// let filter = DeadLetterFilter::new()
///     .topic("booking.created")
///     .older_than(Duration::from_secs(3600))
///     .limit(20);
/// assert_eq!(filter.limit, Some(20));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct DeadLetterFilter {
    /// Only this topic.
    pub topic: Option<String>,
    /// Only those dead for at least this long.
    pub older_than: Option<Duration>,
    /// At most this many, newest first (default 100).
    pub limit: Option<u32>,
    /// Only those listed after this one: the next page of a listing, read through the index
    /// however deep it is (keyset paging, no offset).
    pub after: Option<DeadCursor>,
}

/// A place in the dead-letter listing, which runs newest first: the dead letter a page ended
/// with. [`DeadLetterFilter::after`] continues from it.
///
/// ```
/// use outbox::{DeadCursor, DeadLetterFilter};
/// # fn next_page(last: &outbox::MessageInfo) -> Option<DeadLetterFilter> {
/// let after = DeadCursor::of(last)?; // the last row of the page shown
/// Some(DeadLetterFilter::new().after(after).limit(50))
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadCursor {
    /// When that dead letter died.
    pub dead_at: DateTime<Utc>,
    /// Its id (dead letters that died in the same instant are listed by id, descending).
    pub id: Uuid,
}

impl DeadCursor {
    /// The place of `m`, a dead letter of a listing; `None` for a message that is not dead.
    pub fn of(m: &MessageInfo) -> Option<DeadCursor> {
        Some(DeadCursor {
            dead_at: m.processed_at?,
            id: m.id,
        })
    }
}

/// Which dead letters to retry or discard.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadSelection {
    /// One message, by public id.
    One(Uuid),
    /// Every dead message of a topic.
    Topic(String),
    /// Every dead message.
    All,
}

impl DeadLetterFilter {
    /// Every dead letter, the newest 100.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the dead letters of `topic`.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Only those dead for at least `age`.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// At most `n`, newest first.
    pub fn limit(mut self, n: u32) -> Self {
        self.limit = Some(n);
        self
    }

    /// Only those listed after `cursor`: the next page of a listing.
    pub fn after(mut self, cursor: DeadCursor) -> Self {
        self.after = Some(cursor);
        self
    }
}
