//! Operations: queue statistics, dead letters and purging, as methods on [`Store`].
//!
//! Every query here reads the pending, dead or done rows through a partial index of its own,
//! so its cost follows what it reports, never the size of the table.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, Stats, WorkerInfo};
use crate::pause::{
    PauseError, PauseInfo, PauseTarget, PauseWrite, Paused, Resumed, MAX_NAME, MAX_PAUSE,
};
use crate::store::Store;

/// The default batch of [`Store::purge_done`]: small enough that no lock is held for long.
pub const DEFAULT_PURGE_BATCH: usize = 1000;

/// Operations: what the `outbox` binary and the console do, callable from your own code.
///
/// ```no_run
/// use outbox::{DeadLetterFilter, DeadSelection, Store, DEFAULT_PURGE_BATCH};
/// use std::time::Duration;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let store = Store::from(&pool);
///
/// let stats = store.stats().await?;
/// for t in &stats.topics {
///     println!("{}: {} ready, {} dead, oldest {:?}", t.topic, t.ready, t.dead, t.oldest_ready_age);
/// }
///
/// let dead = store.dead_letters(&DeadLetterFilter::new().topic("booking.created")).await?;
/// for m in &dead {
///     println!("{} {} after {} attempts: {:?}", m.id, m.status, m.attempts, m.last_error);
/// }
/// // The provider is fixed: send them all again.
/// let retried = store.retry_dead(&DeadSelection::Topic("booking.created".into())).await?;
///
/// store.purge_done(Duration::from_secs(7 * 24 * 3600), DEFAULT_PURGE_BATCH).await?;
/// # Ok(()) }
/// ```
impl Store {
    /// Per-topic and total counts: ready, scheduled, in flight, dead, done in the last five
    /// minutes, and the age of the oldest ready message; and the messages blocked behind an
    /// earlier message of their ordering key (behind a dead letter, among them), with the age
    /// of the oldest. Each due message with an ordering key costs one index probe. And the
    /// pauses in force ([`Store::pause`]) and the open breakers ([`Store::breakers`]), with how
    /// many messages wait on each.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn stats(&self) -> Result<Stats> {
        let mut stats = Stats::from_topics(self.backend().outbox_stats().await?);
        stats.pauses = self
            .backend()
            .pause_list(true)
            .await?
            .into_iter()
            .filter(|p| p.active)
            .collect();
        stats.breakers = self.breakers().await?;
        Ok(stats)
    }

    /// The open circuit breakers ([`Breaker`](crate::Breaker)): which handlers' deliveries
    /// wait for their dependency, since when, how many messages are parked for each, and when
    /// the next probe is due. `outbox stats` prints them.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn breakers(&self) -> Result<Vec<crate::breaker::BreakerInfo>> {
        Ok(self
            .backend()
            .breaker_list(true)
            .await?
            .iter()
            .filter_map(crate::breaker::BreakerRow::info)
            .collect())
    }

    /// The workers that registered and have not been gone for a minute, live ones first:
    /// who each is (name, host, process id), what it serves ([`WorkerInfo::serves`]: each
    /// topic with the version it knows and its handlers' names), and its last heartbeat.
    /// `outbox workers` prints the live ones, and the console's workers page shows them.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        self.backend().worker_list().await
    }

    /// Messages done per minute over the last `minutes` minutes (the current one included),
    /// oldest first, as `(minute start, count)`; minutes in which nothing was done are left
    /// out. Read from the per-minute counts a worker keeps of done messages, through their
    /// index.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    pub async fn done_per_minute(&self, minutes: u32) -> Result<Vec<(DateTime<Utc>, i64)>> {
        self.backend().outbox_done_per_minute(minutes).await
    }

    /// Dead letters, newest first.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn dead_letters(&self, filter: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        self.backend().outbox_dead_list(filter).await
    }

    /// One message by its public id, in any state.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        self.backend().outbox_message(id).await
    }

    /// Sends dead letters back to pending, due now, with their attempts reset. Returns how many.
    ///
    /// On PostgreSQL the same statement wakes the idle workers of their topics, from whatever
    /// process it runs in; SQLite workers find them at their next poll.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the update fails.
    ///
    /// # Cancellation safety
    ///
    /// One statement: it happened or it did not.
    pub async fn retry_dead(&self, which: &DeadSelection) -> Result<u64> {
        self.backend().outbox_dead_retry(which).await
    }

    /// Deletes dead letters for good. Returns how many.
    ///
    /// A dead letter with an ordering key held back the later messages of its key; on
    /// PostgreSQL the same statement wakes the idle workers to take them.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the delete fails.
    ///
    /// # Cancellation safety
    ///
    /// One statement: it happened or it did not.
    pub async fn discard_dead(&self, which: &DeadSelection) -> Result<u64> {
        self.backend().outbox_dead_discard(which).await
    }

    /// Deletes the per-minute counts of done messages older than `older_than` (a done
    /// message itself is deleted as soon as its handlers succeed; these counts feed
    /// `done_last_5m` and throughput over time), `batch` rows per statement so no lock is held
    /// for long. Returns how many count rows were deleted.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when a delete fails (earlier batches stay deleted);
    /// [`Error::InvalidArgument`] when `batch` is 0.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: each batch commits on its own; a later call carries on.
    pub async fn purge_done(&self, older_than: Duration, batch: usize) -> Result<u64> {
        self.purge(older_than, batch, false).await
    }

    /// Deletes processed-id records (of the dedup wrapper) older than `older_than`, in batches.
    ///
    /// # Errors
    ///
    /// As [`purge_done`](Store::purge_done).
    ///
    /// # Cancellation safety
    ///
    /// As [`purge_done`](Store::purge_done).
    pub async fn purge_processed(&self, older_than: Duration, batch: usize) -> Result<u64> {
        self.purge(older_than, batch, true).await
    }

    async fn purge(&self, older_than: Duration, batch: usize, processed: bool) -> Result<u64> {
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "the purge batch must be at least 1".into(),
            ));
        }
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let n = if processed {
                self.backend()
                    .outbox_purge_processed(older_than, batch)
                    .await?
            } else {
                self.backend().outbox_purge_done(older_than, batch).await?
            };
            total += n;
            if n < u64::try_from(batch).unwrap_or(u64::MAX) {
                return Ok(total);
            }
        }
    }
}

/// Who a pause is by when the caller does not say: `user@host` of this process.
fn default_paused_by() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", crate::host::host())
}

fn check_name(target: &PauseTarget) -> Result<()> {
    let name = target.name();
    if name.trim().is_empty() {
        return Err(PauseError::EmptyName {
            scope: target.scope(),
        }
        .into());
    }
    if name.len() > MAX_NAME {
        return Err(Error::InvalidArgument(format!(
            "the {} name is {} bytes, over the limit of {MAX_NAME}",
            target.scope(),
            name.len()
        )));
    }
    Ok(())
}

/// Pause and resume: what `outbox pause`, `outbox resume` and `outbox pauses` do.
///
/// ```no_run
/// use outbox::{PauseTarget, Store};
/// use std::time::Duration;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let store = Store::from(&pool);
/// // The search cluster is being migrated: hold its handler for half an hour at most.
/// let target = PauseTarget::handler("index-booking");
/// store.pause(&target, Some(Duration::from_secs(30 * 60))).await?;
/// for p in store.pauses().await? {
///     println!("{} since {} ({} waiting)", p.target, p.paused_at, p.waiting);
/// }
/// // Done early: its parked messages run now.
/// let resumed = store.resume(&target).await?;
/// println!("{} messages unparked", resumed.unparked);
/// # Ok(()) }
/// ```
impl Store {
    /// Pauses `target` for every worker, until [`resume`](Store::resume) or, with `until`,
    /// for that long. Pausing what is paused already sets its end (and keeps its start).
    /// Reaches every running worker within a second; messages already running finish.
    ///
    /// # Errors
    ///
    /// [`Error::Pause`] with [`PauseError::UnknownHandler`] when no worker has ever run a
    /// handler of that name (the error lists the known ones), [`PauseError::EmptyName`] or
    /// [`PauseError::DurationOutOfRange`]; [`Error::Database`] when the write fails. A topic
    /// nobody serves is paused all the same: [`Paused::served`] says so.
    ///
    /// # Cancellation safety
    ///
    /// One statement: it happened or it did not.
    pub async fn pause(&self, target: &PauseTarget, until: Option<Duration>) -> Result<Paused> {
        self.pause_because(target, until, None).await
    }

    /// As [`pause`](Store::pause), with the operator's reason, shown by `outbox pauses` and
    /// `outbox stats`.
    ///
    /// # Errors
    ///
    /// As [`pause`](Store::pause).
    pub async fn pause_because(
        &self,
        target: &PauseTarget,
        until: Option<Duration>,
        reason: Option<&str>,
    ) -> Result<Paused> {
        check_name(target)?;
        if let Some(d) = until {
            if d.is_zero() || d > MAX_PAUSE {
                return Err(PauseError::DurationOutOfRange { given: d }.into());
            }
        }
        let known = self.backend().handlers_known().await?;
        let served = match target {
            PauseTarget::Handler(name) => {
                if !known.iter().any(|(_, h)| h == name) {
                    let mut names: Vec<String> = known.into_iter().map(|(_, h)| h).collect();
                    names.sort();
                    names.dedup();
                    return Err(PauseError::UnknownHandler {
                        name: name.clone(),
                        known: names,
                    }
                    .into());
                }
                true
            }
            PauseTarget::Topic(topic) => known.iter().any(|(t, _)| t == topic),
        };
        let by = default_paused_by();
        let pause = self
            .backend()
            .pause_set(&PauseWrite {
                target,
                until,
                paused_by: &by,
                reason: reason.filter(|r| !r.trim().is_empty()),
            })
            .await?;
        Ok(Paused { pause, served })
    }

    /// Lifts the pause of `target`, expired or not: a handler's parked messages are claimable
    /// again at once (only its handlers that have not succeeded run), and a topic's messages
    /// are claimed again. Reaches every running worker within a second.
    ///
    /// # Errors
    ///
    /// [`Error::Pause`] with [`PauseError::EmptyName`]; [`Error::Database`] when the write
    /// fails.
    ///
    /// # Cancellation safety
    ///
    /// One transaction: it happened or it did not.
    pub async fn resume(&self, target: &PauseTarget) -> Result<Resumed> {
        check_name(target)?;
        let removed = self.backend().pause_remove(target).await?;
        Ok(Resumed {
            was_paused: removed.is_some(),
            unparked: removed.unwrap_or(0),
        })
    }

    /// Every pause, by scope and name, with how many messages wait on each; expired ones
    /// (not yet deleted by a worker) have [`PauseInfo::active`] false.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads.
    pub async fn pauses(&self) -> Result<Vec<PauseInfo>> {
        self.backend().pause_list(true).await
    }
}
