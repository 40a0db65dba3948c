//! The event log, as methods on [`Store`]: which topics retain their delivered events, for how
//! long, what they hold, and the upkeep that keeps them to their windows.
//!
//! A topic retains its delivered events when its event type says so
//! (`#[outbox_event(retain = "180d")]`): each worker records the windows of the events it links
//! when it starts, and from then on every done write of that topic, by any worker, copies the
//! message into the log in the statement that deletes it. Topics without retention are deleted
//! when delivered, as before.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::retention::{EventFilter, LogUpkeep, RetainedEvent, RetainedTopic, DAYS_AHEAD};
use crate::store::Store;

/// The longest window a topic may retain its events for (100 years).
const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The event log's operations.
///
/// ```no_run
/// use outbox::{EventFilter, Store};
/// use std::time::Duration;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let store = Store::from(&pool);
/// for t in store.retained_topics().await? {
///     println!("{}: {} events kept {:?}, oldest {:?}", t.topic, t.events, t.retain, t.oldest);
/// }
/// let page = store.events(&EventFilter::topic("booking.created").limit(50)).await?;
/// for e in &page {
///     println!("{} {} {}", e.id, e.created_at, e.payload);
/// }
/// // Keep a topic's events longer than its event type declares.
/// store.set_retention("booking.created", Some(Duration::from_secs(365 * 86_400))).await?;
/// # Ok(()) }
/// ```
impl Store {
    /// The topics whose delivered events are kept, with each log's event count, size, oldest
    /// event and (on PostgreSQL) how far ahead its day partitions go.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn retained_topics(&self) -> Result<Vec<RetainedTopic>> {
        self.backend().log_topics(true).await
    }

    /// Events of one topic's log, each key's in the order the database inserted their messages
    /// ([`RetainedEvent::seq`](crate::retention::RetainedEvent::seq)): a page of at most
    /// [`limit`](EventFilter::limit) (100 unless set); continue with
    /// [`after`](EventFilter::after) the last one. A topic that retains nothing has none.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn events(&self, filter: &EventFilter) -> Result<Vec<RetainedEvent>> {
        self.backend().log_events(filter).await
    }

    /// Sets how long `topic` keeps its delivered events, longer or shorter than its event type
    /// declares, for good: the workers' declarations no longer change a window set here.
    /// `None` stops keeping them and deletes the topic's log; a worker whose event type still
    /// declares `retain` records it again at its start, so remove it from the type too.
    /// Returns false when `None` found the topic not retained.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a window under a minute or over 100 years, or a topic
    /// that is empty or longer than 64 characters; [`Error::Database`] when the write fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: one transaction, committed or rolled back whole.
    pub async fn set_retention(&self, topic: &str, window: Option<Duration>) -> Result<bool> {
        check_topic(topic)?;
        if let Some(window) = window {
            check_window(topic, window)?;
        }
        self.backend().log_set(topic, window, DAYS_AHEAD).await
    }

    /// Records the windows of `windows` (topic, window), lengthening a recorded one and never
    /// shortening it (nor changing one an operator [set](Self::set_retention)), as a worker
    /// does at start for the events it links; on PostgreSQL the
    /// topics' partitions for the next days are created in the same transaction.
    ///
    /// # Errors
    ///
    /// As [`set_retention`](Self::set_retention).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: one transaction.
    pub async fn declare_retention(&self, windows: &[(&str, Duration)]) -> Result<()> {
        for (topic, window) in windows {
            check_topic(topic)?;
            check_window(topic, *window)?;
        }
        self.backend().log_declare(windows, DAYS_AHEAD).await
    }

    /// The event log's upkeep, as each worker runs it every ten minutes: on PostgreSQL it
    /// creates the day partitions for the next days and drops the days whose window ended
    /// (`None` when another process is doing it now); on SQLite it deletes expired events in
    /// batches.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when a statement fails, a lock wait of more than two seconds
    /// included (the next round tries again).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: each step is a transaction of its own.
    pub async fn log_upkeep(&self) -> Result<Option<LogUpkeep>> {
        self.backend().log_upkeep(DAYS_AHEAD, None).await
    }

    /// The warnings of retained topics whose day partitions run short
    /// ([`RetainedTopic::runway_note`]); reads the catalog only.
    #[cfg(feature = "cli")]
    pub(crate) async fn log_runway_notes(&self) -> Result<Vec<String>> {
        let now = chrono::Utc::now();
        let topics = self.backend().log_topics(false).await?;
        Ok(topics.iter().filter_map(|t| t.runway_note(now)).collect())
    }

    /// The retained topics from the catalog only: windows and (on PostgreSQL) how far ahead
    /// the partitions go, with no count, size nor oldest event (0, `Some(0)` and `None`).
    /// What a page that refreshes itself, or pages through one log, can afford to ask.
    #[cfg(feature = "console")]
    pub(crate) async fn retained_topics_brief(&self) -> Result<Vec<RetainedTopic>> {
        self.backend().log_topics(false).await
    }

    /// [`log_upkeep`](Self::log_upkeep) as if the time were `at`: what the tests of the
    /// retention windows use instead of waiting for days.
    #[doc(hidden)]
    pub async fn __log_upkeep_at(
        &self,
        at: chrono::DateTime<chrono::Utc>,
        days_ahead: u32,
    ) -> Result<Option<LogUpkeep>> {
        self.backend().log_upkeep(days_ahead, Some(at)).await
    }
}

fn check_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.chars().count() > 64 {
        return Err(Error::InvalidArgument(format!(
            "`{topic}` is not a topic: a topic has 1 to 64 characters"
        )));
    }
    Ok(())
}

fn check_window(topic: &str, window: Duration) -> Result<()> {
    if window < Duration::from_secs(60) || window > MAX_WINDOW {
        return Err(Error::InvalidArgument(format!(
            "the retention of topic `{topic}` must be from one minute to 100 years, not {window:?}"
        )));
    }
    Ok(())
}
