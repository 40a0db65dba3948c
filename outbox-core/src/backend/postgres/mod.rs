//! Every SQL statement for PostgreSQL, in one file per part of the [`Backend`] trait (the
//! SQLite backend has the same files):
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
//! - `wake.rs`: the LISTEN side of the wake-ups that producers send with NOTIFY.
//!
//! Each statement is a `const` next to the one function that runs it and binds all its
//! parameters. Statements that notify or count live workers take a worker as alive while its
//! heartbeat is less than `interval '5 seconds'` old: workers write it every second, so a
//! crashed worker stops being notified within that time.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{
    Backend, Beat, ClaimParams, ClaimedMessage, Connection, Done, Failure, Fence, WakeupListener,
};
use crate::backend::NewMessage;
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

/// The statistics statement, for the test that checks its plan (through `__private`).
pub(crate) const STATS: &str = ops::STATS;

pub(crate) struct PgBackend {
    pool: PgPool,
    /// What this backend's claims remember from one call to the next.
    claims: claim::ClaimState,
}

impl PgBackend {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            claims: claim::ClaimState::new(),
        }
    }
}

/// A duration as the seconds that `make_interval(secs => ...)` takes.
fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

#[async_trait]
impl Backend for PgBackend {
    // ---- the pool (`mod.rs`) ----

    async fn detached(&self, connections: u32) -> Result<Arc<dyn Backend>> {
        let options = (*self.pool.connect_options()).clone();
        let pool = PgPoolOptions::new()
            .max_connections(connections.max(1))
            .min_connections(connections.max(1))
            .connect_with(options)
            .await?;
        // Open every connection now: a cold worker picks up as fast as a warm one.
        let mut open = Vec::new();
        for _ in 0..connections {
            open.push(pool.acquire());
        }
        let conns = futures_util::future::try_join_all(open).await?;
        drop(conns);
        Ok(Arc::new(PgBackend::new(pool)))
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
        claim::delivery_completed(&self.pool, message_ids).await
    }

    // ---- outcome (`outcome.rs`) ----

    async fn outbox_mark_done(&self, worker: Uuid, done: &[Done]) -> Result<u64> {
        outcome::mark_done(&self.pool, worker, done).await
    }

    async fn outbox_mark_done_and_claim(
        &self,
        worker: Uuid,
        done: &[Done],
        next: &ClaimParams<'_>,
    ) -> Result<(u64, Option<Vec<ClaimedMessage>>)> {
        outcome::mark_done_and_claim(self, worker, done, next).await
    }

    fn done_writes_in_flight(&self) -> usize {
        2
    }

    async fn outbox_mark_failed(&self, f: &Failure<'_>) -> Result<bool> {
        outcome::mark_failed(&self.pool, f).await
    }

    async fn outbox_hand_back(&self, f: &[Fence]) -> Result<u64> {
        outcome::hand_back(&self.pool, f).await
    }

    async fn outbox_renew(&self, f: &[Fence], lease: std::time::Duration) -> Result<u64> {
        outcome::renew(&self.pool, f, lease).await
    }

    async fn outbox_park(&self, fence: Fence, handler: &str, succeeded: &[&str]) -> Result<bool> {
        outcome::park(&self.pool, fence, handler, succeeded).await
    }

    // ---- ops (`ops.rs`) ----

    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>> {
        ops::unknown_topics(&self.pool, known).await
    }

    async fn outbox_stats(&self) -> Result<Vec<TopicStats>> {
        ops::stats(&self.pool).await
    }

    async fn outbox_done_per_minute(
        &self,
        minutes: u32,
    ) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>> {
        ops::done_per_minute(&self.pool, minutes).await
    }

    async fn outbox_dead_list(&self, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        ops::dead_list(&self.pool, f).await
    }

    async fn outbox_message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        ops::message(&self.pool, id).await
    }

    async fn outbox_dead_retry(&self, which: &DeadSelection) -> Result<u64> {
        ops::dead_retry(&self.pool, which).await
    }

    async fn outbox_dead_discard(&self, which: &DeadSelection) -> Result<u64> {
        ops::dead_discard(&self.pool, which).await
    }

    async fn outbox_purge_done(&self, older_than: std::time::Duration, batch: i64) -> Result<u64> {
        ops::purge_done(&self.pool, older_than, batch).await
    }

    async fn outbox_purge_processed(
        &self,
        older_than: std::time::Duration,
        batch: i64,
    ) -> Result<u64> {
        ops::purge_processed(&self.pool, older_than, batch).await
    }

    // ---- breaker (`breaker.rs`) ----

    async fn breaker_list(&self, counts: bool) -> Result<Vec<crate::breaker::BreakerRow>> {
        breaker::list(&self.pool, counts).await
    }

    async fn breaker_update(
        &self,
        handler: &str,
        change: crate::breaker::Transition<'_>,
    ) -> Result<(
        Option<crate::breaker::BreakerRow>,
        Option<crate::breaker::BreakerRow>,
    )> {
        breaker::update(&self.pool, handler, change).await
    }

    async fn claim_parked(
        &self,
        handler: &str,
        p: &ClaimParams<'_>,
    ) -> Result<Option<ClaimedMessage>> {
        breaker::claim_parked(&self.pool, handler, p).await
    }

    // ---- pause (`pause.rs`) ----

    async fn pause_set(&self, p: &crate::pause::PauseWrite<'_>) -> Result<crate::pause::PauseInfo> {
        pause::set(&self.pool, p).await
    }

    async fn pause_remove(&self, target: &crate::pause::PauseTarget) -> Result<Option<u64>> {
        pause::remove(&self.pool, target).await
    }

    async fn pause_list(&self, counts: bool) -> Result<Vec<crate::pause::PauseInfo>> {
        pause::list(&self.pool, counts).await
    }

    async fn pause_expire(&self) -> Result<u64> {
        pause::expire(&self.pool).await
    }

    async fn handlers_known(&self) -> Result<Vec<(String, String)>> {
        pause::known(&self.pool).await
    }

    // ---- log (`log.rs`) ----

    async fn log_declare(
        &self,
        windows: &[(&str, std::time::Duration)],
        days_ahead: u32,
    ) -> Result<()> {
        log::declare(&self.pool, windows, days_ahead).await
    }

    async fn log_set(
        &self,
        topic: &str,
        window: Option<std::time::Duration>,
        days_ahead: u32,
    ) -> Result<bool> {
        log::set(&self.pool, topic, window, days_ahead).await
    }

    async fn log_upkeep(
        &self,
        days_ahead: u32,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<crate::retention::LogUpkeep>> {
        log::upkeep(&self.pool, days_ahead, at).await
    }

    async fn log_topics(&self, sizes: bool) -> Result<Vec<crate::retention::RetainedTopic>> {
        log::topics(&self.pool, sizes).await
    }

    async fn log_events(
        &self,
        filter: &crate::retention::EventFilter,
    ) -> Result<Vec<crate::retention::RetainedEvent>> {
        log::events(&self.pool, filter).await
    }

    // ---- replay (`replay.rs`) ----

    async fn replay_plan(
        &self,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<crate::retention::ReplayPlan> {
        replay::plan(&self.pool, request, until).await
    }

    async fn replay_create(
        &self,
        id: Uuid,
        request: &crate::retention::ReplayRequest,
        until: chrono::DateTime<chrono::Utc>,
        total: i64,
        backfill: bool,
    ) -> Result<bool> {
        replay::create(&self.pool, id, request, until, total, backfill).await
    }

    async fn replay_list(&self) -> Result<Vec<crate::retention::ReplayInfo>> {
        replay::list(&self.pool).await
    }

    async fn replay_get(&self, id: Uuid) -> Result<Option<crate::retention::ReplayInfo>> {
        replay::get(&self.pool, id).await
    }

    async fn replay_failures(&self, id: Uuid) -> Result<Vec<crate::retention::ReplayFailure>> {
        replay::failures(&self.pool, id).await
    }

    async fn replay_set_state(&self, id: Uuid, to: crate::retention::ReplayState) -> Result<bool> {
        replay::set_state(&self.pool, id, to).await
    }

    async fn replay_lease(
        &self,
        worker: Uuid,
        token: Uuid,
        handlers: &[(&str, &str)],
        lease: std::time::Duration,
    ) -> Result<Option<crate::retention::ReplayInfo>> {
        replay::lease(&self.pool, worker, token, handlers, lease).await
    }

    async fn replay_advance(
        &self,
        id: Uuid,
        token: Uuid,
        step: &crate::backend::ReplayStep,
    ) -> Result<Option<crate::retention::ReplayState>> {
        replay::advance(&self.pool, id, token, step).await
    }

    async fn handlers_seen(&self, handlers: &[(&str, &str)]) -> Result<Vec<(String, String)>> {
        replay::seen(&self.pool, handlers).await
    }

    async fn handler_known(&self, topic: &str, handler: &str) -> Result<bool> {
        replay::known(&self.pool, topic, handler).await
    }

    // ---- workers (`workers.rs`) ----

    async fn worker_heartbeat(&self, b: &Beat<'_>) -> Result<i64> {
        workers::heartbeat(&self.pool, b).await
    }

    async fn worker_list(&self) -> Result<Vec<WorkerInfo>> {
        workers::list(&self.pool).await
    }

    async fn worker_deregister(&self, id: Uuid) -> Result<()> {
        workers::deregister(&self.pool, id).await
    }

    // ---- wake (`wake.rs`) ----

    fn listens(&self) -> bool {
        true
    }

    async fn wakeup_listener(&self, worker: Uuid) -> Result<Option<Box<dyn WakeupListener>>> {
        wake::listener(&self.pool, worker).await
    }
}

impl super::sealed::Sealed for PgConnection {}

#[async_trait]
impl Connection for PgConnection {
    async fn __insert(&mut self, rows: &[NewMessage]) -> Result<()> {
        Ok(enqueue::insert(self, rows).await?)
    }

    async fn __record_processed(
        &mut self,
        handler: &str,
        message_id: Uuid,
    ) -> Result<bool, sqlx::Error> {
        enqueue::record_processed(self, handler, message_id).await
    }
}

#[cfg(test)]
mod tests {
    /// The files that hold this backend's statements.
    const FILES: [&str; 7] = [
        include_str!("migrate.rs"),
        include_str!("enqueue.rs"),
        include_str!("claim.rs"),
        include_str!("outcome.rs"),
        include_str!("ops.rs"),
        include_str!("workers.rs"),
        include_str!("wake.rs"),
    ];

    /// Every statement that notifies names the channel workers listen on, and every one that
    /// asks which workers are alive asks it the same way.
    #[test]
    fn notifications_and_liveness_agree_in_every_statement() {
        let notify = format!("pg_notify('{}', w.id::text)", super::wake::WAKEUP_CHANNEL);
        let (mut notifying, mut asking) = (0, 0);
        for file in FILES {
            for (at, _) in file.match_indices("pg_notify(") {
                assert!(file[at..].starts_with(&notify), "{}", &file[at..at + 60]);
                notifying += 1;
            }
            for (at, _) in file.match_indices("heartbeat_at > now() - interval '") {
                let live = "heartbeat_at > now() - interval '5 seconds'";
                assert!(file[at..].starts_with(live), "{}", &file[at..at + 60]);
                asking += 1;
            }
        }
        assert!(notifying > 0 && asking > 0);
    }
}
