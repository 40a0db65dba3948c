//! The backend seam: every SQL statement lives in one folder per database below this one,
//! `postgres/`, `sqlite/` and `mysql/` (MariaDB and MySQL), each with the same files: `mod.rs` (the backend and its
//! [`Backend`] impl, which hands each method to the file of its part), `migrate.rs`,
//! `enqueue.rs`, `claim.rs`, `outcome.rs`, `ops.rs`, `pause.rs`, `log.rs`, `replay.rs`,
//! `workers.rs` and `wake.rs`.
//!
//! The [`Backend`] trait is internal and unstable; users see [`Store`](crate::store::Store) and
//! [`Connection`].

use async_trait::async_trait;

use crate::error::Result;

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
pub(crate) mod sqlite;

pub(crate) mod schema;
pub(crate) mod types;

/// The (public id, topic) a selection of dead letters filters on; `None` means any.
pub(crate) fn selection(which: &crate::model::DeadSelection) -> (Option<uuid::Uuid>, Option<&str>) {
    match which {
        crate::model::DeadSelection::One(id) => (Some(*id), None),
        crate::model::DeadSelection::Topic(t) => (None, Some(t.as_str())),
        crate::model::DeadSelection::All => (None, None),
    }
}
pub(crate) use types::*;

/// One topic's row of every backend's statistics query, in its column order: topic, ready,
/// scheduled, in flight, stalled, dead, done in the last 5 minutes, the oldest ready message,
/// the oldest stall, live workers, blocked, blocked by a dead letter, the oldest blocked
/// message, messages of an unknown version, messages awaiting a worker that knows their
/// version, the oldest of those. The four times are `A`, in whatever the backend reads them as.
pub(crate) type StatsRow<A, V> = (
    String,
    i64,
    i64,
    i64,
    i64,
    i64,
    i64,
    Option<A>,
    Option<A>,
    i64,
    i64,
    i64,
    Option<A>,
    Option<V>,
    i64,
    Option<A>,
);

/// The `handlers` column of the workers table (a JSON array, per topic, of handler names), as
/// [`WorkerInfo::handlers`](crate::model::WorkerInfo::handlers): empty when missing or
/// unreadable.
pub(crate) fn worker_handlers(json: Option<&str>) -> Vec<Vec<String>> {
    json.and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// A [`StatsRow`] as the model's `TopicStats`, its times turned into ages by `age`.
pub(crate) fn topic_stats<A, V: TryInto<i32>>(
    row: StatsRow<A, V>,
    age: impl Fn(Option<A>) -> Option<std::time::Duration>,
) -> crate::model::TopicStats {
    let (
        topic,
        ready,
        scheduled,
        in_flight,
        stalled,
        dead,
        done_last_5m,
        oldest,
        stalled_for,
        workers,
        blocked,
        blocked_by_dead,
        oldest_blocked,
        unknown_version,
        awaiting_version,
        oldest_awaiting,
    ) = row;
    crate::model::TopicStats {
        topic,
        ready,
        blocked,
        blocked_by_dead,
        oldest_blocked_age: age(oldest_blocked),
        scheduled,
        in_flight,
        stalled,
        dead,
        done_last_5m,
        oldest_ready_age: age(oldest),
        oldest_stalled_age: age(stalled_for),
        live_workers: workers,
        unknown_version: unknown_version.and_then(|v| v.try_into().ok()),
        awaiting_version,
        oldest_awaiting_version_age: age(oldest_awaiting),
    }
}

/// While a worker's done writes keep releasing ordering keys, whose next messages its claims
/// look up key by key, how often those claims still walk every key (for the heads that other
/// workers' writes, new keys and due retries made).
#[cfg(any(
    feature = "postgres",
    feature = "sqlite",
    feature = "sqlite-unbundled",
    feature = "mysql"
))]
pub(crate) const RELEASED_WALK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(25);
/// The longest [`RELEASED_WALK_INTERVAL`] grows to, doubling after each walk that found no
/// head, while a worker's own done writes claim the next messages of its keys (PostgreSQL):
/// those walks then only look for new keys, due retries and keys of other workers' topics.
#[cfg(feature = "postgres")]
pub(crate) const CHAINED_WALK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

mod sealed {
    pub trait Sealed {}
    pub trait SealedMut {}
}

/// A database connection that [`enqueue`](crate::enqueue) can write to: `sqlx::PgConnection`,
/// `sqlx::SqliteConnection` or `sqlx::MySqlConnection` (and so `&mut *tx` for a `sqlx::Transaction` of either).
///
/// Sealed: the outbox's SQL lives in this crate, one module per database.
#[async_trait]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection that `enqueue` can write to",
    label = "pass `&mut *tx` (your transaction) or `&mut *conn` (a connection) here",
    note = "enqueue writes into your own transaction, so that the event commits or rolls back with your change: `let mut tx = pool.begin().await?; enqueue(&mut *tx, &event).await?; tx.commit().await?;`",
    note = "a pool is not a connection, and a `Transaction` is passed as `&mut *tx`, which derefs to the connection it holds"
)]
pub trait Connection: sealed::Sealed + Send {
    #[doc(hidden)]
    async fn __insert(&mut self, rows: &[NewMessage]) -> Result<()>;

    /// Records `(handler, message_id)` in `outbox_processed` (the dedup wrapper of
    /// `outbox-handlers`); false when it already was. A concurrent transaction recording the
    /// same pair makes this wait for it to end.
    #[doc(hidden)]
    async fn __record_processed(
        &mut self,
        handler: &str,
        message_id: uuid::Uuid,
    ) -> Result<bool, sqlx::Error>;
}

/// What [`enqueue`](crate::enqueue) and its siblings take as their first argument: a mutable
/// borrow of a [`Connection`], `&mut *tx` for a `sqlx::Transaction` or `&mut *conn` for a
/// connection, as sqlx's own queries take it.
///
/// Implemented for `&mut C` where `C: Connection`; sealed. It exists so that a wrong argument
/// (a pool, a transaction not dereferenced) is answered with what to pass instead.
///
/// # Example
///
/// ```no_run
/// use outbox::{enqueue, outbox_event};
///
/// #[outbox_event]
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct BookingCreated { booking_id: i64 }
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// enqueue(&mut *tx, &BookingCreated { booking_id: 1 }).await?; // a `ConnectionMut`
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a connection that `enqueue` can write to",
    label = "pass `&mut *tx` (your transaction) or `&mut *conn` (a connection) here",
    note = "enqueue writes into your own transaction, so that the event commits or rolls back with your change: `let mut tx = pool.begin().await?; enqueue(&mut *tx, &event).await?; tx.commit().await?;`",
    note = "a pool is not a connection, and a `Transaction` is passed as `&mut *tx`, which derefs to the connection it holds"
)]
pub trait ConnectionMut: sealed::SealedMut + Send {
    /// The connection borrowed.
    #[doc(hidden)]
    type Target: Connection + ?Sized;

    #[doc(hidden)]
    fn __connection(&mut self) -> &mut Self::Target;
}

impl<C: Connection + ?Sized> sealed::SealedMut for &mut C {}

impl<C: Connection + ?Sized> ConnectionMut for &mut C {
    type Target = C;

    fn __connection(&mut self) -> &mut C {
        self
    }
}

/// All the operations the worker and the operations tools need from a database.
///
/// Internal and unstable: `pub(crate)`, not part of the public API, changed whenever the worker
/// needs it to. Each backend implements it in a folder of its own (`postgres/`, `sqlite/`) with
/// the same files, and its methods are grouped here in the order and under the names of those
/// files: the pool (`mod.rs`), then migrate, enqueue, claim, outcome, ops, pause, log,
/// replay, workers and wake.
#[async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    // ---- the pool (`mod.rs`) ----

    /// A backend on a new pool with the same connect options, opened on the calling runtime:
    /// the worker's own loop uses it, so that no connection it needs is driven by the runtime
    /// its handlers run (and may block) on. It opens `connections` connections before it
    /// returns, so the first claims do not wait for a connect.
    async fn detached(&self, connections: u32) -> Result<std::sync::Arc<dyn Backend>>;

    /// Closes this backend's pool, waiting for its connections to close: the engine calls it
    /// on its own pool when it stops, so no connection of a stopped worker lingers.
    async fn close(&self);

    // ---- migrate (`migrate.rs`) ----

    /// Applies the embedded migrations, up to version `up_to` when given (the tests of an
    /// upgrade stop at an earlier release's schema).
    async fn migrate(&self, up_to: Option<i64>) -> Result<()>;

    // ---- enqueue (`enqueue.rs`) ----
    // Enqueue runs on the application's own connection, through [`Connection`], not here.

    // ---- claim (`claim.rs`) ----

    /// Claims up to `limit` ready messages of `topics`: counts the attempt and takes the lease.
    async fn outbox_claim_batch(&self, params: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>>;

    /// The handlers that already succeeded for these messages.
    async fn delivery_completed(
        &self,
        message_ids: &[uuid::Uuid],
    ) -> Result<Vec<(uuid::Uuid, String)>>;

    // ---- outcome (`outcome.rs`) ----

    /// Deletes done messages, each only if its claim token still matches, and counts them for
    /// the statistics under `worker`. Returns how many were deleted.
    async fn outbox_mark_done(&self, worker: uuid::Uuid, done: &[Done]) -> Result<u64>;

    /// As [`outbox_mark_done`](Self::outbox_mark_done), and in the same statement claims under
    /// `next` the messages that became the heads of the keys it released, on the terms of
    /// [`outbox_claim_batch`](Self::outbox_claim_batch) (`next.limit` and `next.released` are
    /// not used). `None` in place of the claimed messages: this backend does not claim there,
    /// and the caller looks up the released keys' heads with its next claim instead.
    async fn outbox_mark_done_and_claim(
        &self,
        worker: uuid::Uuid,
        done: &[Done],
        next: &ClaimParams<'_>,
    ) -> Result<(u64, Option<Vec<ClaimedMessage>>)> {
        let _ = next;
        Ok((self.outbox_mark_done(worker, done).await?, None))
    }

    /// How many done writes of one worker may run at once. Each is one statement, and a
    /// server runs a statement on one core: a second write in flight lets a server with more
    /// cores work on both, where the next messages of the first write's keys wait for it.
    /// (SQLite writes one transaction at a time, so a second would only wait for the lock.)
    fn done_writes_in_flight(&self) -> usize {
        1
    }

    /// Writes one failed attempt (retry or dead), fenced; records the handlers that succeeded.
    async fn outbox_mark_failed(&self, failure: &Failure<'_>) -> Result<bool>;

    /// Gives claimed messages back, ready at once, their attempt not counted (shutdown).
    async fn outbox_hand_back(&self, fences: &[Fence]) -> Result<u64>;

    /// Extends the leases of messages still running under these claims.
    async fn outbox_renew(&self, fences: &[Fence], lease: std::time::Duration) -> Result<u64>;

    /// Parks a claimed message for the paused handler `handler`: back to pending, its attempt
    /// not counted, skipped by claims until the handler is resumed, recording the handlers
    /// `succeeded` in this attempt. Fenced; false when the claim was taken over. When the
    /// handler's pause ended meanwhile, the message is only given back (not parked), so a
    /// resume can never strand it.
    async fn outbox_park(&self, fence: Fence, handler: &str, succeeded: &[&str]) -> Result<bool>;

    // ---- ops (`ops.rs`) ----

    /// Pending topics with their counts, among topics not in `known`.
    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>>;

    /// Per-topic counts for [`Store::stats`](crate::store::Store::stats).
    async fn outbox_stats(&self) -> Result<Vec<crate::model::TopicStats>>;

    /// Messages done per minute over the last `minutes` minutes, oldest first: `(minute start,
    /// count)`, minutes without any left out.
    async fn outbox_done_per_minute(
        &self,
        minutes: u32,
    ) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>>;

    /// Dead letters, newest first.
    async fn outbox_dead_list(
        &self,
        filter: &crate::model::DeadLetterFilter,
    ) -> Result<Vec<crate::model::MessageInfo>>;

    /// One message by id, live or dead.
    async fn outbox_message(&self, id: uuid::Uuid) -> Result<Option<crate::model::MessageInfo>>;

    /// Dead letters back to pending, attempts reset.
    async fn outbox_dead_retry(&self, which: &crate::model::DeadSelection) -> Result<u64>;

    /// Deletes dead letters.
    async fn outbox_dead_discard(&self, which: &crate::model::DeadSelection) -> Result<u64>;

    /// Deletes one batch of per-minute done counts older than `older_than`.
    async fn outbox_purge_done(&self, older_than: std::time::Duration, batch: i64) -> Result<u64>;

    /// Deletes one batch of processed-id records older than `older_than`.
    async fn outbox_purge_processed(
        &self,
        older_than: std::time::Duration,
        batch: i64,
    ) -> Result<u64>;

    // ---- pause (`pause.rs`) ----

    /// Pauses a handler or a topic (or sets the end of its pause); returns the stored row.
    async fn pause_set(&self, p: &crate::pause::PauseWrite<'_>) -> Result<crate::pause::PauseInfo>;

    /// Deletes the pause of `target` and, for a handler, makes its parked messages claimable;
    /// `None` when there was no pause, else how many messages were unparked.
    async fn pause_remove(&self, target: &crate::pause::PauseTarget) -> Result<Option<u64>>;

    /// Every pause, by scope and name; with `counts`, how many messages wait on each (without,
    /// only the pauses table is read: what workers poll).
    async fn pause_list(&self, counts: bool) -> Result<Vec<crate::pause::PauseInfo>>;

    /// Deletes the pauses whose end has passed and makes the messages parked for those
    /// handlers claimable; returns how many pauses it deleted.
    async fn pause_expire(&self) -> Result<u64>;

    /// Every (topic, handler) pair a worker has run (`outbox_handlers`).
    async fn handlers_known(&self) -> Result<Vec<(String, String)>>;

    // ---- breaker (`breaker.rs`) ----

    /// Every breaker row, by handler; with `counts`, how many messages are parked for each
    /// open one (without, only the breakers table is read: what workers poll).
    async fn breaker_list(&self, counts: bool) -> Result<Vec<crate::breaker::BreakerRow>>;

    /// Reads `handler`'s breaker row under its lock, with the database's clock, and writes
    /// what `change` makes of it (deleting the row for `None`), in one transaction. When an
    /// open breaker's row goes, the messages parked for the handler are made claimable in the
    /// same transaction, unless the handler is paused. Returns the row before and after.
    async fn breaker_update(
        &self,
        handler: &str,
        change: crate::breaker::Transition<'_>,
    ) -> Result<(
        Option<crate::breaker::BreakerRow>,
        Option<crate::breaker::BreakerRow>,
    )>;

    /// Claims one message parked for `handler`, of the topics and versions of `p`, as a claim
    /// does (attempt counted, lease taken under `p.claim_token`) and no longer parked: the
    /// message a breaker's probe runs. `None` when none is parked.
    async fn claim_parked(
        &self,
        handler: &str,
        p: &ClaimParams<'_>,
    ) -> Result<Option<ClaimedMessage>>;

    // ---- log (`log.rs`) ----

    /// Records the event log's windows `windows` (topic, window), each growing a recorded one
    /// and never shortening it, and creates their partitions `days_ahead` days ahead, in one
    /// transaction: no delivery of a newly retained topic finds its day missing.
    async fn log_declare(
        &self,
        windows: &[(&str, std::time::Duration)],
        days_ahead: u32,
    ) -> Result<()>;

    /// Sets the window of `topic` (longer or shorter), or stops retaining it and drops its
    /// events (`None`). Returns false when `None` found nothing retained.
    async fn log_set(
        &self,
        topic: &str,
        window: Option<std::time::Duration>,
        days_ahead: u32,
    ) -> Result<bool>;

    /// Creates the days ahead of `at` (the database's clock when `None`) and removes the
    /// events whose window ended, if no other process is doing it: `None` then.
    async fn log_upkeep(
        &self,
        days_ahead: u32,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<crate::retention::LogUpkeep>>;

    /// The retained topics; with `sizes`, each log's count, size and oldest event, which
    /// read the log (without, those are 0 and `None`, and only the catalog is read).
    async fn log_topics(&self, sizes: bool) -> Result<Vec<crate::retention::RetainedTopic>>;

    /// Events of the log, in id order.
    async fn log_events(
        &self,
        filter: &crate::retention::EventFilter,
    ) -> Result<Vec<crate::retention::RetainedEvent>>;

    // ---- replay (`replay.rs`) ----

    /// The events a replay would deliver, enqueued before `until`.
    async fn replay_plan(
        &self,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::retention::ReplayPlan>;

    /// Makes replay `id` (checked by the caller) of `total` events before `until`; false when
    /// it is a `backfill` of a handler that has one already.
    async fn replay_create(
        &self,
        id: uuid::Uuid,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
        total: i64,
        backfill: bool,
    ) -> Result<bool>;

    /// Every replay, newest first.
    async fn replay_list(&self) -> Result<Vec<crate::retention::ReplayInfo>>;

    /// One replay.
    async fn replay_get(&self, id: uuid::Uuid) -> Result<Option<crate::retention::ReplayInfo>>;

    /// The events a replay's handler failed for good.
    async fn replay_failures(&self, id: uuid::Uuid)
        -> Result<Vec<crate::retention::ReplayFailure>>;

    /// Pauses, resumes or cancels a replay; false when it was not in a state to.
    async fn replay_set_state(
        &self,
        id: uuid::Uuid,
        to: crate::retention::ReplayState,
    ) -> Result<bool>;

    /// Leases to `worker` under `token` the oldest running replay, with a free lease, of one of
    /// the (topic, handler) pairs it runs.
    async fn replay_lease(
        &self,
        worker: uuid::Uuid,
        token: uuid::Uuid,
        handlers: &[(&str, &str)],
        lease: std::time::Duration,
    ) -> Result<Option<crate::retention::ReplayInfo>>;

    /// Writes one step of a replay under its lease; `None` when the lease was taken over.
    async fn replay_advance(
        &self,
        id: uuid::Uuid,
        token: uuid::Uuid,
        step: &ReplayStep,
    ) -> Result<Option<crate::retention::ReplayState>>;

    /// Records (topic, handler) pairs as run; returns those seen for the first time.
    async fn handlers_seen(&self, handlers: &[(&str, &str)]) -> Result<Vec<(String, String)>>;

    /// Whether a handler has run on a topic.
    async fn handler_known(&self, topic: &str, handler: &str) -> Result<bool>;

    // ---- workers (`workers.rs`) ----

    /// Records a live worker: its topics, whether it sleeps on its wake-up channel, and a fresh
    /// heartbeat. Returns how many live workers (itself included) serve any of its topics.
    async fn worker_heartbeat(&self, beat: &Beat<'_>) -> Result<i64>;

    /// Registered workers, live ones first.
    async fn worker_list(&self) -> Result<Vec<crate::model::WorkerInfo>>;

    /// Removes a worker on shutdown.
    async fn worker_deregister(&self, id: uuid::Uuid) -> Result<()>;

    // ---- wake (`wake.rs`) ----

    /// Whether [`Backend::wakeup_listener`] hears every producer after its commit: a waiting
    /// worker can then sleep until notified instead of polling. (SQLite's wake-ups come before
    /// the commit, or from a file that changes for other reasons too, so its workers still poll.)
    fn listens(&self) -> bool;

    /// Opens a wake-up listener for the worker `worker`, if this backend has one.
    async fn wakeup_listener(&self, worker: uuid::Uuid) -> Result<Option<Box<dyn WakeupListener>>>;
}

/// What a wake-up says of the message that caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Its transaction has committed, or something changed that a claim should look at now.
    #[cfg_attr(
        not(any(feature = "postgres", feature = "sqlite", feature = "sqlite-unbundled")),
        allow(dead_code)
    )]
    Committed,
    /// It was inserted in this process, and its transaction may not have committed yet: a
    /// claim right away may not see it.
    BeforeCommit,
}

/// A connection that receives wake-up notifications.
#[async_trait]
pub(crate) trait WakeupListener: Send {
    /// Waits for the next notification.
    async fn recv(&mut self) -> Result<Wake>;
}

/// Helpers for the unit tests of the backends' statements (the PostgreSQL and SQLite ones use
/// them).
#[cfg(all(
    test,
    any(feature = "postgres", feature = "sqlite", feature = "sqlite-unbundled")
))]
pub(crate) mod tests {
    /// The part of `sql` from the first `start` on; empty when there is none.
    pub(crate) fn from<'a>(sql: &'a str, start: &str) -> &'a str {
        sql.find(start).map_or("", |at| &sql[at..])
    }

    /// The part of `sql` from the first `start` to the next `end`, `end` left out; empty when
    /// there is none.
    #[cfg(feature = "postgres")]
    pub(crate) fn between<'a>(sql: &'a str, start: &str, end: &str) -> &'a str {
        let rest = from(sql, start);
        rest.find(end).map_or("", |at| &rest[..at])
    }
}
