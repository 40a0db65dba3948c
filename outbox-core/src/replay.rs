//! Replays of the event log, as methods on [`Store`]: deliver a window of a retained topic's
//! events again to one handler of that topic (and to no other), in their original order per
//! ordering key, with their original message ids and idempotency keys unless asked otherwise.
//!
//! A replay is a row in the database, with a cursor: the workers that run its handler take it
//! up, one at a time under a lease, and move the cursor every 100 events handled or every second,
//! whichever comes first. It survives crashes and restarts (what a killed worker handled after
//! its cursor's last move is handled again, at least once as everywhere), can be paused, resumed and cancelled, and its progress is read with
//! [`Store::replay`].

use chrono::Utc;
use uuid::Uuid;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::retention::{ReplayFailure, ReplayInfo, ReplayPlan, ReplayRequest, ReplayState};
use crate::store::Store;

/// Replays.
///
/// ```no_run
/// use outbox::{ReplayRequest, Store};
/// use chrono::{Duration, Utc};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let store = Store::from(&pool);
/// let request = ReplayRequest::new("booking.created", "search-index")
///     .since(Utc::now() - Duration::days(7));
/// let plan = store.plan_replay(&request).await?;
/// println!("{} events from {:?} to {:?}", plan.events, plan.first, plan.last);
/// let replay = store.start_replay(&request).await?;
/// // ... later
/// let now = store.replay(replay.id).await?.expect("it exists");
/// println!("{}", now.progress_line());
/// # Ok(()) }
/// ```
impl Store {
    /// What [`start_replay`](Self::start_replay) would deliver: how many events, enqueued
    /// when. Refused as `start_replay` refuses, except for an empty window.
    ///
    /// # Errors
    ///
    /// [`Error::ReplayRefused`] for a topic without retention or a handler that never ran on
    /// it; [`Error::InvalidArgument`] for a bad window or rate; [`Error::Database`] when a query fails.
    pub async fn plan_replay(&self, request: &ReplayRequest) -> Result<ReplayPlan> {
        let until = self.check_replay(request).await?;
        self.backend().replay_plan(request, until).await
    }

    /// Makes a replay of `request`, which the workers running its handler take up. Its window
    /// ends at `until`, or now when unset: events delivered later are not part of it.
    ///
    /// # Errors
    ///
    /// [`Error::ReplayRefused`] for a topic that retains nothing, a handler that never ran on
    /// the topic (no worker with it has started), or a window without events;
    /// [`Error::InvalidArgument`] for a window that ends before it starts or a rate of 0;
    /// [`Error::Database`] when a query fails.
    pub async fn start_replay(&self, request: &ReplayRequest) -> Result<ReplayInfo> {
        let until = self.check_replay(request).await?;
        let (_, made) = make(self.backend(), request, until, false).await?;
        let Some(id) = made else {
            return Err(Error::ReplayRefused(format!(
                "topic `{}` has no retained events in that window{}: nothing to replay",
                request.topic,
                request
                    .key
                    .as_deref()
                    .map(|k| format!(" for key `{k}`"))
                    .unwrap_or_default()
            )));
        };
        self.backend()
            .replay_get(id)
            .await?
            .ok_or_else(|| Error::ReplayRefused(format!("replay {id} vanished once made")))
    }

    /// The replays, newest first, with their progress.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    pub async fn replays(&self) -> Result<Vec<ReplayInfo>> {
        self.backend().replay_list().await
    }

    /// One replay, with its progress; `None` when there is no replay `id`.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    pub async fn replay(&self, id: Uuid) -> Result<Option<ReplayInfo>> {
        self.backend().replay_get(id).await
    }

    /// The events replay `id`'s handler failed for good, with their errors.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    pub async fn replay_failures(&self, id: Uuid) -> Result<Vec<ReplayFailure>> {
        self.backend().replay_failures(id).await
    }

    /// Pauses a running replay: its worker stops after the batch in hand, and the cursor stays.
    ///
    /// # Errors
    ///
    /// [`Error::ReplayRefused`] when it is not running; [`Error::Database`] when the write
    /// fails.
    pub async fn pause_replay(&self, id: Uuid) -> Result<()> {
        self.move_replay(id, ReplayState::Paused).await
    }

    /// Resumes a paused replay from its cursor.
    ///
    /// # Errors
    ///
    /// [`Error::ReplayRefused`] when it is not paused; [`Error::Database`] when the write
    /// fails.
    pub async fn resume_replay(&self, id: Uuid) -> Result<()> {
        self.move_replay(id, ReplayState::Running).await
    }

    /// Cancels a running or paused replay: it delivers nothing more.
    ///
    /// # Errors
    ///
    /// [`Error::ReplayRefused`] when it is done or cancelled already; [`Error::Database`] when
    /// the write fails.
    pub async fn cancel_replay(&self, id: Uuid) -> Result<()> {
        self.move_replay(id, ReplayState::Cancelled).await
    }

    async fn move_replay(&self, id: Uuid, to: ReplayState) -> Result<()> {
        if self.backend().replay_set_state(id, to).await? {
            return Ok(());
        }
        let Some(now) = self.backend().replay_get(id).await? else {
            return Err(Error::ReplayRefused(format!("there is no replay {id}")));
        };
        Err(Error::ReplayRefused(format!(
            "replay {id} is {}; it cannot be {}",
            now.state,
            match to {
                ReplayState::Paused => "paused (only a running one can)",
                ReplayState::Running => "resumed (only a paused one can)",
                _ => "cancelled (only a running or paused one can)",
            }
        )))
    }

    /// Checks a request against the database; returns the end of its window.
    async fn check_replay(&self, r: &ReplayRequest) -> Result<chrono::DateTime<Utc>> {
        let until = r.until.unwrap_or_else(Utc::now);
        if let Some(since) = r.since {
            if since >= until {
                return Err(Error::InvalidArgument(format!(
                    "the replay's window starts ({since}) at or after it ends ({until})"
                )));
            }
        }
        if r.rate == Some(0) {
            return Err(Error::InvalidArgument(
                "a replay's rate is at least 1 event per second".into(),
            ));
        }
        let retained = self.backend().log_topics(false).await?;
        if !retained.iter().any(|t| t.topic == r.topic) {
            return Err(Error::ReplayRefused(format!(
                "topic `{}` retains no events, so there is nothing to replay: declare \
                 `#[outbox_event(retain = \"180d\")]` on its event type (events delivered from \
                 then on are kept)",
                r.topic
            )));
        }
        if !self.backend().handler_known(&r.topic, &r.handler).await? {
            return Err(Error::ReplayRefused(format!(
                "no worker has run a handler named `{}` for topic `{}`: check the name (`outbox \
                 workers` lists the live workers' handlers per topic) and start a worker with it first",
                r.handler, r.topic
            )));
        }
        Ok(until)
    }
}

/// Plans `request`'s window up to `until` and, when it holds events, makes the replay (a
/// `backfill` of its handler once only): the plan, and the new replay's id when one was made.
pub(crate) async fn make(
    backend: &dyn Backend,
    request: &ReplayRequest,
    until: chrono::DateTime<Utc>,
    backfill: bool,
) -> Result<(ReplayPlan, Option<Uuid>)> {
    let plan = backend.replay_plan(request, until).await?;
    if plan.events == 0 {
        return Ok((plan, None));
    }
    let id = crate::message_id::new_message_id();
    let made = backend
        .replay_create(id, request, until, plan.events, backfill)
        .await?;
    Ok((plan, made.then_some(id)))
}
