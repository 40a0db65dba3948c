//! The [`Worker`]: claims messages, runs handlers, writes outcomes.
//!
//! - The claim is one short statement (`FOR UPDATE SKIP LOCKED` on PostgreSQL) that takes up to
//!   a batch of due messages of this worker's topics, counts the attempt, and sets a short lease
//!   and a fresh claim token. No transaction or connection is held while handlers run.
//! - Every outcome write is fenced by that claim token: a worker whose lease ran out cannot
//!   overwrite the outcome of a newer claim.
//! - The worker's own loop (claims, outcome writes, lease renewals, heartbeats, wake-ups) runs on
//!   a thread and a connection pool of its own ([`engine`]); handlers run on the runtime that
//!   called [`Worker::run_until`]. A handler that blocks its thread cannot delay any of it.

mod builder;
mod config;
mod engine;
mod flush;
mod pauses;
mod process;
mod protocol;
mod retry;
mod versions;
mod wake;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use builder::WorkerBuilder;

pub use config::{RetryPolicy, Wakeup, WorkerConfig};

use crate::backend::{Backend, Done, Fence};
use crate::error::{Error, Result};
use crate::handler::ErasedHandler;
use crate::health::Health;
use crate::resources::Resources;
use crate::store::Store;
use process::{failure, run_message, Outcome, Watch};

pub(super) struct Inner {
    store: Store,
    topics: BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>>,
    /// Per topic, the highest version its handlers decode: newer messages are not claimed.
    versions: BTreeMap<&'static str, i32>,
    /// The event log's window of each retained topic this worker declares.
    retention: BTreeMap<&'static str, std::time::Duration>,
    /// [`Worker::run_once`] has recorded the windows and the handlers.
    recorded: std::sync::atomic::AtomicBool,
    unhandled_events: Vec<(&'static str, &'static str)>,
    resources: Arc<Resources>,
    config: WorkerConfig,
    id: Uuid,
    health: Health,
    /// Which topic the next claim asks for first, so that a backlog of one topic cannot
    /// starve the topics after it.
    next_topic: std::sync::atomic::AtomicUsize,
    /// Handler tasks left running by the last `run_until`.
    abandoned: std::sync::atomic::AtomicU64,
    /// The pauses in force, as last read (shared with the done writes' claims).
    pauses: Arc<pauses::Pauses>,
}

/// A worker: turns committed messages into handler calls until stopped.
///
/// Build it with [`Worker::builder`]; run it with [`run_until`](Worker::run_until) (a task in
/// your service, or the `cli` module's binary), or [`run_once`](Worker::run_once) for one batch.
///
/// ```no_run
/// use outbox::{outbox_event, Context, Handler, HandlerError, Worker, WorkerConfig};
/// use std::time::Duration;
///
/// #[outbox_event]
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct BookingCreated { booking_id: i64 }
///
/// struct Log;
///
/// #[outbox::async_trait]
/// impl Handler for Log {
///     type Event = BookingCreated;
///     const NAME: &'static str = "log";
///     async fn handle(&self, e: BookingCreated, _: &Context) -> Result<(), HandlerError> {
///         println!("booking {}", e.booking_id);
///         Ok(())
///     }
/// }
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let worker = Worker::builder(&pool)
///     .handler(Log)
///     .config(WorkerConfig::default().shutdown_timeout(Duration::from_secs(20)))
///     .build()?;
///
/// // In a test: one batch, and what became of it.
/// let report = worker.run_once().await?;
/// println!("{} claimed, {} done", report.claimed, report.done);
///
/// // In a service: until Ctrl-C, then hand back what is still running.
/// worker.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Worker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.inner.config.name)
            .field("topics", &self.topics())
            .finish()
    }
}

/// Counts of what one [`Worker::run_once`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchReport {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages whose handlers all succeeded.
    pub done: usize,
    /// Messages sent back to wait for a retry.
    pub retried: usize,
    /// Messages dead-lettered.
    pub dead: usize,
    /// Messages parked for a paused handler (its other handlers ran), their attempt not
    /// counted: they wait for `outbox resume`.
    pub parked: usize,
}

impl Worker {
    /// Starts building a worker on `store` (a `sqlx::PgPool`, or a [`Store`]).
    pub fn builder(store: impl Into<Store>) -> WorkerBuilder {
        WorkerBuilder::new(store.into())
    }

    /// Topic -> handler names of this worker.
    pub fn topics(&self) -> BTreeMap<&'static str, Vec<&'static str>> {
        self.inner
            .topics
            .iter()
            .map(|(t, hs)| (*t, hs.iter().map(|h| h.name()).collect()))
            .collect()
    }

    /// Topic -> the highest version of its event type this worker decodes (and claims).
    ///
    /// Messages of a newer version wait, pending and unclaimed, for a worker built with the
    /// newer type. A topic served only by raw handlers takes every version (`i32::MAX`).
    pub fn versions(&self) -> BTreeMap<&'static str, i32> {
        self.inner.versions.clone()
    }

    /// The versions of `topics`, in their order.
    pub(crate) fn versions_of(&self, topics: &[&str]) -> Vec<i32> {
        topics
            .iter()
            .map(|t| self.inner.versions.get(t).copied().unwrap_or(1))
            .collect()
    }

    /// The store this worker runs on.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The worker's health, for an endpoint of your own or `outbox::observe::serve` (feature
    /// `prometheus`).
    pub fn health(&self) -> Health {
        self.inner.health.clone()
    }

    /// Pending topics in the database that this worker has no handler for, with their counts.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the query fails.
    pub async fn unhandled_pending_topics(&self) -> Result<Vec<(String, i64)>> {
        let known: Vec<&str> = self.inner.topics.keys().copied().collect();
        self.inner
            .store
            .backend()
            .outbox_unknown_topics(&known)
            .await
    }

    /// Claims one batch, runs it to the end, writes every outcome and returns what happened.
    ///
    /// Runs on the calling task and the store's own pool: for tests, scripts and `--once`.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the claim or an outcome write fails.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: dropping the future leaves claimed messages to lease expiry.
    pub async fn run_once(&self) -> Result<BatchReport> {
        let backend = self.inner.store.backend();
        // As a running worker does at start: once per `Worker`.
        if !self
            .inner
            .recorded
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.declare_retention(backend).await;
            engine::replays::record_handlers(self, backend).await;
        }
        // The pauses in force now: a paused topic is not claimed, a paused handler not run.
        self.refresh_pauses(backend).await;
        let paused = self.inner.pauses.current();
        let claimed = self
            .claim(backend, self.inner.config.batch_size, &[])
            .await?;
        let mut completed = self.completed_handlers(backend, &claimed).await;
        let report = Mutex::new(BatchReport {
            claimed: claimed.len(),
            ..BatchReport::default()
        });
        let done = Mutex::new(Vec::new());
        let permits = tokio::sync::Semaphore::new(self.inner.config.concurrency);
        let runs = claimed.into_iter().map(|msg| {
            let finished = completed.remove(&msg.id).unwrap_or_default();
            let (report, done, permits, paused) = (&report, &done, &permits, &paused);
            async move {
                let Ok(_permit) = permits.acquire().await else {
                    return Ok(());
                };
                let Some(handlers) = self.inner.topics.get(msg.topic.as_str()) else {
                    return Ok(());
                };
                let watch = Watch::new(std::time::Instant::now());
                let outcome = run_message(
                    &msg,
                    handlers,
                    &finished,
                    &self.inner.config,
                    &self.inner.resources,
                    &watch,
                    paused,
                    None,
                )
                .await;
                let fence = Fence {
                    id: msg.id,
                    claim_token: msg.claim_token,
                };
                match outcome {
                    Outcome::Done => {
                        lock(report).done += 1;
                        lock(done).push(Done {
                            fence,
                            had_attempts: engine::had_earlier_attempts(&msg),
                            key: msg.key.clone(),
                        });
                        Ok(())
                    }
                    Outcome::Parked { handler, succeeded } => {
                        lock(report).parked += 1;
                        backend
                            .outbox_park(fence, handler, &succeeded)
                            .await
                            .map(drop)
                    }
                    Outcome::Failed {
                        retry_in,
                        error,
                        succeeded,
                        ..
                    } => {
                        {
                            let mut r = lock(report);
                            if retry_in.is_some() {
                                r.retried += 1;
                            } else {
                                r.dead += 1;
                            }
                        }
                        backend
                            .outbox_mark_failed(&failure(fence, retry_in, &error, &succeeded))
                            .await
                            .map(drop)
                    }
                }
            }
        });
        for r in futures_util::future::join_all(runs).await {
            r?;
        }
        let done = done
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !done.is_empty() {
            backend.outbox_mark_done(self.inner.id, &done).await?;
        }
        Ok(report
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Runs until `signal` completes, then stops claiming, lets handlers in flight finish
    /// within [`WorkerConfig::shutdown_timeout`], writes their outcomes and returns.
    ///
    /// The worker's own loop runs on a thread and a small connection pool of its own (opened
    /// at start, with the connect options of the store's pool): claims, outcome writes, lease
    /// renewals and wake-ups never wait on a handler. Handlers run as tasks of the runtime
    /// that calls this. At the stop request, messages claimed but not started yet (waiting for
    /// a handler slot or a thread) are handed back at once (ready again, their attempt not
    /// counted) and never start. At the deadline, messages still running are handed back the
    /// same way and their tasks cancelled; a handler that blocks its thread cannot be cancelled
    /// and is left running (see [`Worker::running_handlers`]). The final writes get at most
    /// half a second after the deadline, so this returns in time even when the database does
    /// not answer; what could not be handed back then runs again when its lease runs out.
    /// Database errors are logged and retried with backoff; they never end the loop.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] of kind [`MissingSchema`](crate::error::DatabaseErrorKind::MissingSchema)
    /// when the outbox tables are missing at start (run [`migrate`](crate::migrate) first):
    /// the worker refuses to run instead of retrying for ever, while a database that cannot be
    /// reached at start, or goes away later, is retried.
    /// [`Error::Worker`] when the worker's thread cannot be started;
    /// [`Error::WorkerPanicked`] when the worker's own loop panicked (a bug in outbox, not in
    /// your configuration or handlers: a handler's panic is a failed attempt).
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: complete `signal` instead of dropping the future, or messages in
    /// flight wait for their lease.
    pub async fn run_until(&self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        let stop = CancellationToken::new();
        let handlers_rt = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let worker = self.clone();
        let engine_stop = stop.clone();
        std::thread::Builder::new()
            .name("outbox-worker".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(Error::Worker(format!(
                            "could not start the worker's runtime: {e}"
                        ))));
                        return;
                    }
                };
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    rt.block_on(engine::run(worker, handlers_rt, engine_stop))
                }));
                rt.shutdown_timeout(Duration::from_millis(100));
                let _ = tx.send(
                    ran.map_err(|panic| {
                        Error::WorkerPanicked(crate::diagnostics::panic_message(&*panic))
                    })
                    .and_then(|r| r),
                );
            })
            .map_err(|e| Error::Worker(format!("could not start the worker's thread: {e}")))?;
        tokio::pin!(signal);
        let mut rx = rx;
        let ended = tokio::select! {
            () = &mut signal => None,
            r = &mut rx => Some(r),
        };
        let result = match ended {
            Some(r) => r,
            None => {
                tracing::info!(worker = %self.inner.config.name, "stop requested: no new claims, finishing handlers in flight");
                stop.cancel();
                rx.await
            }
        };
        match result {
            Ok(Ok(left)) => {
                self.inner
                    .abandoned
                    .store(left, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            // The thread ended without a word: a panic that even catch_unwind did not see
            // (a panic while panicking aborts; this is the unwinding that escaped it).
            Err(_) => Err(Error::WorkerPanicked(
                "the worker's thread ended without reporting; see the log".into(),
            )),
        }
    }

    /// Handler tasks that were still running when [`run_until`](Worker::run_until) returned:
    /// they blocked their thread past the shutdown deadline and could not be cancelled. A
    /// worker binary should exit without waiting for them (the runtime would wait on drop);
    /// `outbox::cli::run_worker` (feature `cli`) does.
    pub fn running_handlers(&self) -> u64 {
        self.inner
            .abandoned
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Reads the pauses in force into this worker's pause set, logging those that began or
    /// ended since the last read; true when one ended. A database error keeps the set as it
    /// was (logged).
    pub(super) async fn refresh_pauses(&self, backend: &dyn Backend) -> bool {
        match self.inner.pauses.refresh(backend, &self.inner.topics).await {
            Ok(change) => change.log(&self.inner.config.name),
            Err(e) => {
                tracing::warn!(error = %e, "could not read the pauses; keeping the ones read before");
                false
            }
        }
    }

    async fn refresh_stats(&self, backend: &dyn Backend) {
        match backend.outbox_stats().await {
            Ok(topics) => {
                let stats = crate::model::Stats::from_topics(topics);
                let served = &self.inner.topics;
                crate::metrics::record_stats(&stats, &|t| served.contains_key(t));
                let mine = || {
                    stats
                        .topics
                        .iter()
                        .filter(|t| served.contains_key(t.topic.as_str()))
                };
                self.inner
                    .health
                    .set_oldest_ready(mine().filter_map(|t| t.oldest_ready_age).max());
                self.inner
                    .health
                    .set_oldest_stalled(mine().filter_map(|t| t.oldest_stalled_age).max());
                // Ready messages that no live worker anywhere serves: a forgotten handler crate
                // or a worker pool that is down. Every worker reports them.
                let unserved: Vec<(String, Duration)> = stats
                    .topics
                    .iter()
                    .filter(|t| t.unserved())
                    .map(|t| (t.topic.clone(), t.oldest_ready_age.unwrap_or_default()))
                    .collect();
                for (topic, age) in &unserved {
                    tracing::warn!(topic = %topic, oldest_ready_secs = age.as_secs(), "ready messages of a topic that no live worker serves");
                }
                self.inner.health.set_unserved(unserved);
                // Messages of a version no live worker decodes wait for newer workers.
                let unknown: Vec<(String, i32, Duration)> = stats
                    .topics
                    .iter()
                    .filter_map(|t| {
                        let version = t.unknown_version?;
                        tracing::warn!(topic = %t.topic, version, "version {version} of topic {}: no live worker knows it", t.topic);
                        Some((
                            t.topic.clone(),
                            version,
                            t.oldest_awaiting_version_age.unwrap_or_default(),
                        ))
                    })
                    .collect();
                self.inner.health.set_unknown_versions(unknown);
                // Ordered messages behind a dead letter of their key wait for an operator.
                let blocked: Vec<(String, i64)> = stats
                    .topics
                    .iter()
                    .filter(|t| t.blocked_by_dead > 0)
                    .map(|t| (t.topic.clone(), t.blocked_by_dead))
                    .collect();
                for (topic, n) in &blocked {
                    tracing::warn!(topic = %topic, blocked = n, "ordered messages wait behind a dead letter of their key: retry or discard it");
                }
                self.inner.health.set_blocked_by_dead(blocked);
            }
            Err(e) => tracing::warn!(error = %e, "could not read queue statistics"),
        }
    }

    /// Records the event log's windows of the events this worker links, at its start. A
    /// failure (the database away, a lock wait) is logged; the next upkeep tries again.
    pub(super) async fn declare_retention(&self, backend: &dyn Backend) -> bool {
        if self.inner.retention.is_empty() {
            return true;
        }
        let windows: Vec<(&str, Duration)> = self
            .inner
            .retention
            .iter()
            .map(|(topic, window)| (*topic, *window))
            .collect();
        match backend
            .log_declare(&windows, crate::retention::DAYS_AHEAD)
            .await
        {
            Ok(()) => {
                for (topic, window) in &windows {
                    tracing::debug!(
                        topic,
                        retain_secs = window.as_secs(),
                        "event log retains the topic"
                    );
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not record the event log's retention; retrying at the next upkeep");
                false
            }
        }
    }

    /// The event log's upkeep (days ahead, expired days) and its runway for the health check.
    pub(super) async fn log_upkeep(&self, backend: &dyn Backend) {
        match backend.log_upkeep(crate::retention::DAYS_AHEAD, None).await {
            Ok(Some(done)) => {
                if done.created > 0 || done.dropped > 0 || done.deleted > 0 {
                    tracing::info!(
                        created = done.created,
                        dropped = done.dropped,
                        deleted = done.deleted,
                        "event log upkeep: days ahead created, expired events removed"
                    );
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "event log upkeep failed; retrying at the next one")
            }
        }
        match backend.log_topics(false).await {
            Ok(topics) => {
                let now = chrono::Utc::now();
                let short: Vec<(String, Duration)> = topics
                    .iter()
                    .filter_map(|t| {
                        let note = t.runway_note(now)?;
                        tracing::warn!(topic = %t.topic, "{note}");
                        Some((t.topic.clone(), t.runway(now)?))
                    })
                    .collect();
                self.inner.health.set_log_runway(short);
            }
            Err(e) => tracing::warn!(error = %e, "could not read the event log's topics"),
        }
    }

    async fn purge(&self, backend: &dyn Backend, retention: Duration) {
        let batch = i64::try_from(crate::ops::DEFAULT_PURGE_BATCH).unwrap_or(1000);
        match backend.outbox_purge_done(retention, batch).await {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "purged old done counts"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "purge of done counts failed"),
        }
        match backend.outbox_purge_processed(retention, batch).await {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "purged processed-id records"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "purge of processed-id records failed"),
        }
    }

    async fn report_unhandled(&self, backend: &dyn Backend) {
        for (topic, type_name) in &self.inner.unhandled_events {
            tracing::warn!(
                topic,
                event = type_name,
                "declared event has no handler in this worker"
            );
        }
        let known: Vec<&str> = self.inner.topics.keys().copied().collect();
        match backend.outbox_unknown_topics(&known).await {
            Ok(topics) => {
                for (topic, count) in topics {
                    tracing::warn!(topic = %topic, pending = count, "pending messages of a topic this worker has no handler for; they stay pending");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not list pending topics"),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
