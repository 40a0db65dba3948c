//! Every SQL statement for MariaDB (>= 10.6) and MySQL (>= 8.0), in one file per part of the
//! [`Backend`] trait (the PostgreSQL and SQLite backends have the same files):
//!
//! - `migrate.rs`: the embedded migrations and the runner that applies them.
//! - `enqueue.rs`: what runs on the application's own connection ([`Connection`]): the
//!   insert of `enqueue` and the dedup wrapper's processed record.
//! - `claim.rs`: the claims of unordered messages and of the heads of ordering keys, and the
//!   handlers a claimed message already passed.
//! - `outcome.rs`: what became of claimed messages: done, failed, handed back, lease renewed.
//! - `ops.rs`: statistics, dead letters and purges, for the operations tools.
//! - `pause.rs`: pauses of handlers and topics, and the messages parked for a paused handler.
//! - `breaker.rs`: the circuit breakers of handlers, and the claim of a breaker's probe.
//! - `log.rs`: the event log: retention per topic, its upkeep and its reads.
//! - `replay.rs`: replays of the log to one handler, and the handlers the deployment has run.
//! - `workers.rs`: the workers table: heartbeat, list, deregistration.
//! - `wake.rs`: the wake-ups of waiting workers, without LISTEN.
//!
//! Each statement is a `const` next to the one function that runs it and binds all its
//! parameters. A list (of ids, of topics) is bound one placeholder per item: the statement
//! text then depends on the list's length only, never on its values.
//!
//! InnoDB, as MySQL users of job tables learnt it:
//! - A claim selects `FOR UPDATE SKIP LOCKED` on the index whose columns are its filter's
//!   equalities followed by its order, so it reads candidates in the order it takes them and
//!   locks none it does not take; it then updates the rows it locked by primary key, in the
//!   same short transaction. Neither server has `UPDATE ... RETURNING` (MySQL has no
//!   `DELETE ... RETURNING` either), so no statement here returns rows from a write.
//! - The worker's own transactions run at READ COMMITTED (its pool sets it per session; on a
//!   caller's pool each transaction sets it), so no gap lock makes a producer's insert and a
//!   claim deadlock. A deadlock (1213) or a lock wait timeout (1205) in the worker's own
//!   statements is retried here, the whole transaction again; in the caller's transaction,
//!   `enqueue` returns it classified ([`DatabaseErrorKind::Conflict`]) and never retries, and
//!   rolls the caller's transaction back first (a lock wait timeout alone ends only the
//!   statement), so that a caller who commits anyway stores nothing of it.
//! - Nothing reads the tables by commit order: an id that commits late is never skipped,
//!   because claims look at every live row, not at rows after a cursor of ids.
//!
//! There is no LISTEN: the workers of the producer's process are woken directly, and other
//! processes poll, fast while messages flow and at the poll interval when idle. Times are Unix
//! milliseconds from the server's clock; ids are UUIDs as `BINARY(16)`.
//!
//! [`DatabaseErrorKind::Conflict`]: crate::error::DatabaseErrorKind::Conflict

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySql, MySqlPool, MySqlPoolOptions};
use sqlx::{MySqlConnection, Transaction};
use uuid::Uuid;

use super::{
    Backend, Beat, ClaimParams, ClaimedMessage, Connection, Done, Failure, Fence, WakeupListener,
};
use crate::backend::NewMessage;
use crate::clock::{ms, time};
use crate::error::Result;
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats, WorkerInfo};

mod breaker;
mod claim;
mod enqueue;
mod log;
mod migrate;
mod ops;
mod outcome;
mod pause;
mod replay;
mod wake;
mod workers;

/// The server's clock, in Unix milliseconds, as SQL: every time the outbox writes or compares
/// on MySQL is this one clock, whatever the clocks of the workers' hosts say. (sqlx sets each
/// session's time zone to UTC.)
macro_rules! now_ms {
    () => {
        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
    };
}
pub(crate) use now_ms;

pub(crate) struct MySqlBackend {
    pool: MySqlPool,
    /// Whether the pool's sessions already run at READ COMMITTED (the worker's own pool):
    /// otherwise each transaction here asks for it first.
    read_committed: bool,
    /// What this backend's claims remember from one call to the next.
    claims: claim::ClaimState,
}

impl MySqlBackend {
    pub(crate) fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            read_committed: false,
            claims: claim::ClaimState::new(),
        }
    }

    /// A transaction at READ COMMITTED on this backend's pool.
    async fn begin(&self) -> Result<Transaction<'static, MySql>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        if !self.read_committed {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await?;
        }
        Transaction::begin(conn, None).await
    }
}

/// The options of a pool whose sessions run at READ COMMITTED: the worker's own pool.
fn worker_pool_options(connections: u32) -> MySqlPoolOptions {
    MySqlPoolOptions::new()
        .max_connections(connections)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut *conn)
                    .await?;
                Ok(())
            })
        })
}

/// How many times a worker's own transaction is tried when it meets a deadlock or a lock wait
/// timeout.
const CONFLICT_TRIES: u32 = 5;

/// Whether `e` is a deadlock (1213) or a lock wait timeout (1205): the transaction (or, for
/// a timeout with the server's default `innodb_rollback_on_timeout = OFF`, only the
/// statement) was rolled back, and running the whole transaction again is the cure.
pub(crate) fn is_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| matches!(d.number(), 1213 | 1205))
}

/// Runs `attempt` (one whole transaction of the worker's own) again after a deadlock or a
/// lock wait timeout, up to [`CONFLICT_TRIES`] times, with a short jittered pause between.
async fn retrying<T, F, Fut>(what: &'static str, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt().await {
            Err(e) if tries < CONFLICT_TRIES && is_conflict(&e) => {
                tracing::debug!(error = %e, what, tries, "InnoDB conflict; running the transaction again");
                let pause = 2_u64.pow(tries) + rand::random::<u64>() % 5;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            r => return r.map_err(Into::into),
        }
    }
}

/// The statements whose plans a test checks (through `__private`).
pub(crate) const CLAIM_UNKEYED: &str = claim::CLAIM_UNKEYED;
pub(crate) const WALK_KEYS: &str = claim::WALK_AFTER;
pub(crate) const KEY_HEAD: &str = claim::KEY_HEAD;
pub(crate) const STATS: &str = ops::STATS;

/// Workers count as alive while their heartbeat is this fresh.
const LIVE_MS: i64 = 5_000;

/// `n` placeholders, comma-separated, for a list bound one item each: `?, ?, ?`.
fn marks(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// `sql` with each `{list}` replaced by `n` placeholders: the only way statement text is built
/// here, from a count, never from a value.
fn with_list(sql: &str, n: usize) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql.replace("{list}", &marks(n.max(1))))
}

#[async_trait]
impl Backend for MySqlBackend {
    // ---- the pool (`mod.rs`) ----

    async fn detached(&self, connections: u32) -> Result<Arc<dyn Backend>> {
        let options = (*self.pool.connect_options()).clone();
        let pool = worker_pool_options(connections.max(1))
            .min_connections(connections.max(1))
            .connect_with(options)
            .await?;
        // Open every connection now: a cold worker picks up as fast as a warm one.
        let mut open = Vec::new();
        for _ in 0..connections {
            open.push(pool.acquire());
        }
        drop(futures_util::future::try_join_all(open).await?);
        Ok(Arc::new(MySqlBackend {
            pool,
            read_committed: true,
            claims: claim::ClaimState::new(),
        }))
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    // ---- migrate (`migrate.rs`) ----

    async fn migrate(&self, up_to: Option<i64>) -> Result<()> {
        migrate::migrate(&self.pool, up_to).await
    }

    // ---- enqueue (`enqueue.rs`) ----
    // Enqueue runs on the application's own connection: see `impl Connection` below.

    // ---- claim (`claim.rs`) ----

    async fn outbox_claim_batch(&self, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
        claim::batch(self, p).await
    }

    async fn delivery_completed(&self, message_ids: &[Uuid]) -> Result<Vec<(Uuid, String)>> {
        claim::delivery_completed(self, message_ids).await
    }

    // ---- outcome (`outcome.rs`) ----
    // (`outbox_mark_done_and_claim` as the trait provides it: a done write claims nothing.)

    async fn outbox_mark_done(&self, worker: Uuid, done: &[Done]) -> Result<u64> {
        outcome::mark_done(self, worker, done).await
    }

    fn done_writes_in_flight(&self) -> usize {
        2
    }

    async fn outbox_mark_failed(&self, f: &Failure<'_>) -> Result<bool> {
        outcome::mark_failed(self, f).await
    }

    async fn outbox_hand_back(&self, fences: &[Fence]) -> Result<u64> {
        outcome::hand_back(self, fences).await
    }

    async fn outbox_renew(&self, fences: &[Fence], lease: Duration) -> Result<u64> {
        outcome::renew(self, fences, lease).await
    }

    async fn outbox_park(&self, fence: Fence, handler: &str, succeeded: &[&str]) -> Result<bool> {
        outcome::park(self, fence, handler, succeeded).await
    }

    // ---- ops (`ops.rs`) ----

    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>> {
        ops::unknown_topics(self, known).await
    }

    async fn outbox_stats(&self) -> Result<Vec<TopicStats>> {
        ops::stats(self).await
    }

    async fn outbox_done_per_minute(&self, minutes: u32) -> Result<Vec<(DateTime<Utc>, i64)>> {
        ops::done_per_minute(self, minutes).await
    }

    async fn outbox_dead_list(&self, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        ops::dead_list(self, f).await
    }

    async fn outbox_message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        ops::message(self, id).await
    }

    async fn outbox_dead_retry(&self, which: &DeadSelection) -> Result<u64> {
        ops::dead_retry(self, which).await
    }

    async fn outbox_dead_discard(&self, which: &DeadSelection) -> Result<u64> {
        ops::dead_discard(self, which).await
    }

    async fn outbox_purge_done(&self, older_than: Duration, batch: i64) -> Result<u64> {
        ops::purge_done(self, older_than, batch).await
    }

    async fn outbox_purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64> {
        ops::purge_processed(self, older_than, batch).await
    }

    // ---- breaker (`breaker.rs`) ----

    async fn breaker_list(&self, counts: bool) -> Result<Vec<crate::breaker::BreakerRow>> {
        breaker::list(self, counts).await
    }

    async fn breaker_update(
        &self,
        handler: &str,
        change: crate::breaker::Transition<'_>,
    ) -> Result<(
        Option<crate::breaker::BreakerRow>,
        Option<crate::breaker::BreakerRow>,
    )> {
        breaker::update(self, handler, change).await
    }

    async fn claim_parked(
        &self,
        handler: &str,
        p: &ClaimParams<'_>,
    ) -> Result<Option<ClaimedMessage>> {
        breaker::claim_parked(self, handler, p).await
    }

    // ---- pause (`pause.rs`) ----

    async fn pause_set(&self, p: &crate::pause::PauseWrite<'_>) -> Result<crate::pause::PauseInfo> {
        pause::set(self, p).await
    }

    async fn pause_remove(&self, target: &crate::pause::PauseTarget) -> Result<Option<u64>> {
        pause::remove(self, target).await
    }

    async fn pause_list(&self, counts: bool) -> Result<Vec<crate::pause::PauseInfo>> {
        pause::list(self, counts).await
    }

    async fn pause_expire(&self) -> Result<u64> {
        pause::expire(self).await
    }

    async fn handlers_known(&self) -> Result<Vec<(String, String)>> {
        pause::known(self).await
    }

    // ---- log (`log.rs`) ----

    async fn log_declare(
        &self,
        windows: &[(&str, std::time::Duration)],
        days_ahead: u32,
    ) -> Result<()> {
        log::declare(self, windows, days_ahead).await
    }

    async fn log_set(
        &self,
        topic: &str,
        window: Option<std::time::Duration>,
        days_ahead: u32,
    ) -> Result<bool> {
        log::set(self, topic, window, days_ahead).await
    }

    async fn log_upkeep(
        &self,
        days_ahead: u32,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<crate::retention::LogUpkeep>> {
        log::upkeep(self, days_ahead, at).await
    }

    async fn log_topics(&self, sizes: bool) -> Result<Vec<crate::retention::RetainedTopic>> {
        log::topics(self, sizes).await
    }

    async fn log_events(
        &self,
        filter: &crate::retention::EventFilter,
    ) -> Result<Vec<crate::retention::RetainedEvent>> {
        log::events(self, filter).await
    }

    // ---- replay (`replay.rs`) ----

    async fn replay_plan(
        &self,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::retention::ReplayPlan> {
        replay::plan(self, request, until).await
    }

    async fn replay_create(
        &self,
        id: Uuid,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
        total: i64,
        backfill: bool,
    ) -> Result<bool> {
        replay::create(self, id, request, until, total, backfill).await
    }

    async fn replay_list(&self) -> Result<Vec<crate::retention::ReplayInfo>> {
        replay::list(self).await
    }

    async fn replay_get(&self, id: Uuid) -> Result<Option<crate::retention::ReplayInfo>> {
        replay::get(self, id).await
    }

    async fn replay_failures(&self, id: Uuid) -> Result<Vec<crate::retention::ReplayFailure>> {
        replay::failures(self, id).await
    }

    async fn replay_set_state(&self, id: Uuid, to: crate::retention::ReplayState) -> Result<bool> {
        replay::set_state(self, id, to).await
    }

    async fn replay_lease(
        &self,
        worker: Uuid,
        token: Uuid,
        handlers: &[(&str, &str)],
        lease: std::time::Duration,
    ) -> Result<Option<crate::retention::ReplayInfo>> {
        replay::lease(self, worker, token, handlers, lease).await
    }

    async fn replay_advance(
        &self,
        id: Uuid,
        token: Uuid,
        step: &crate::backend::ReplayStep,
    ) -> Result<Option<crate::retention::ReplayState>> {
        replay::advance(self, id, token, step).await
    }

    async fn handlers_seen(&self, handlers: &[(&str, &str)]) -> Result<Vec<(String, String)>> {
        replay::seen(self, handlers).await
    }

    async fn handler_known(&self, topic: &str, handler: &str) -> Result<bool> {
        replay::known(self, topic, handler).await
    }

    // ---- workers (`workers.rs`) ----

    async fn worker_heartbeat(&self, b: &Beat<'_>) -> Result<i64> {
        workers::heartbeat(self, b).await
    }

    async fn worker_list(&self) -> Result<Vec<WorkerInfo>> {
        workers::list(self).await
    }

    async fn worker_deregister(&self, id: Uuid) -> Result<()> {
        workers::deregister(self, id).await
    }

    // ---- wake (`wake.rs`) ----

    fn listens(&self) -> bool {
        false
    }

    async fn wakeup_listener(&self, _worker: Uuid) -> Result<Option<Box<dyn WakeupListener>>> {
        Ok(Some(wake::listener()))
    }
}

impl super::sealed::Sealed for MySqlConnection {}

#[async_trait]
impl Connection for MySqlConnection {
    async fn __insert(&mut self, rows: &[NewMessage]) -> Result<()> {
        match enqueue::insert(self, rows).await {
            Err(crate::error::Error::Database(e)) if is_conflict(&e) => {
                enqueue::end_after_conflict(self).await;
                Err(e.into())
            }
            r => r,
        }
    }

    async fn __record_processed(
        &mut self,
        handler: &str,
        message_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        enqueue::record_processed(self, handler, message_id).await
    }
}
