//! The [`Worker`]: claims messages, runs handlers, writes outcomes.
//!
//! - The claim is one short statement (`FOR UPDATE SKIP LOCKED` on PostgreSQL) that marks up to
//!   a batch of due messages of this worker's topics as running, counts the attempt, and sets a
//!   lease deadline and a fresh claim token. No transaction or connection is held while handlers
//!   run.
//! - Every outcome write is fenced by that claim token: a worker whose lease ran out cannot
//!   overwrite the outcome of a newer claim.
//! - Successes are written in batches by a flusher; each failure is written on its own.

mod config;
mod flush;
mod process;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

pub use config::{RetryPolicy, Wakeup, WorkerConfig};

use crate::backend::{ClaimParams, ClaimedMessage, Fence, Wake};
use crate::error::{Error, Result};
use crate::handler::{erase, ErasedHandler, Handler};
use crate::health::Health;
use crate::registry::{duplicate_names, Registry, RegistryError};
use crate::resources::Resources;
use crate::store::Store;
use process::{failure, run_message, Outcome};

/// A worker that cannot sleep until notified (SQLite, or [`Wakeup::Poll`]) keeps polling at the
/// claim interval (at least [`HOT_POLL`]) for [`HOT_WINDOW`] after it found work, so bursts are
/// picked up fast, then falls back to the poll interval. Woken in-process by a SQLite producer,
/// whose commit has not happened yet, it polls every [`HOT_POLL`] until the message shows.
const HOT_POLL: Duration = Duration::from_millis(1);
const HOT_WINDOW: Duration = Duration::from_millis(50);
/// After setting its `waiting` flag, a worker looks again this long after, twice: a producer
/// that read the flag just before it was set sends no NOTIFY, and its commit may come after the
/// worker's first look. The first look catches ordinary transactions, the second slow ones.
const SETTLE_LOOKS: [Duration; 2] = [Duration::from_millis(5), HOT_WINDOW];
/// How often a worker asleep on LISTEN rewrites its `waiting` flag: rows not written for a
/// minute are taken for workers that died, and producers stop notifying them.
const WAITING_REFRESH: Duration = Duration::from_secs(20);

/// Builds a [`Worker`]: a store, handlers from the registry and added explicitly, resources,
/// and a config.
///
/// ```no_run
/// use outbox::{Registry, Worker, WorkerConfig};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let worker = Worker::builder(&pool)
///     .registry(Registry::linked())
///     .resource(reqwest_client_or_any_shared_value())
///     .config(WorkerConfig::default().concurrency(16))
///     .build()?;
/// worker.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// # fn reqwest_client_or_any_shared_value() -> u8 { 0 }
/// ```
pub struct WorkerBuilder {
    store: Store,
    registry: Registry,
    explicit: Vec<Arc<dyn ErasedHandler>>,
    resources: Resources,
    config: WorkerConfig,
}

impl WorkerBuilder {
    /// Uses the handlers of `registry` (default: none; pass [`Registry::linked`] for all linked
    /// ones, or a filtered registry).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Adds a handler instance, beside those of the registry.
    pub fn handler<H: Handler>(mut self, handler: H) -> Self {
        self.explicit.push(erase(handler));
        self
    }

    /// Adds a shared value handlers can use (an HTTP client, an API key, a pool).
    pub fn resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.resources.insert(value);
        self
    }

    /// Replaces the resources.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Sets the config.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the registered handlers from the resources and checks everything.
    ///
    /// # Errors
    ///
    /// [`Error::Resource`] when a handler cannot be built, [`Error::Registry`] when there are no
    /// handlers or two handlers of a topic share a name, [`Error::Config`] for bad settings.
    pub fn build(self) -> Result<Worker> {
        let mut handlers: Vec<Arc<dyn ErasedHandler>> = Vec::new();
        for reg in self.registry.handlers() {
            handlers.push(reg.build(&self.resources)?);
        }
        handlers.extend(self.explicit);
        if handlers.is_empty() {
            return Err(RegistryError::from_problems(vec![
                "the worker has no handlers: pass Registry::linked() and make sure the handler crates are linked \
                 (`use my_handlers as _;`), or add handlers with WorkerBuilder::handler"
                    .into(),
            ])
            .into());
        }
        let dups = duplicate_names(
            handlers
                .iter()
                .map(|h| (h.topic(), h.name(), h.type_name())),
        );
        if !dups.is_empty() {
            return Err(RegistryError::from_problems(dups).into());
        }
        let longest = handlers
            .iter()
            .map(|h| h.timeout().unwrap_or(self.config.handler_timeout))
            .max()
            .unwrap_or(self.config.handler_timeout);
        self.config.validate(longest)?;
        let mut topics: BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>> = BTreeMap::new();
        for h in handlers {
            topics.entry(h.topic()).or_default().push(h);
        }
        // Declared events none of this worker's handlers serve, registered or explicit.
        let unhandled_events = self
            .registry
            .unhandled_events()
            .iter()
            .filter(|e| !topics.contains_key(e.topic()))
            .map(|e| (e.topic(), e.type_name()))
            .collect();
        Ok(Worker {
            inner: Arc::new(Inner {
                store: self.store,
                topics,
                unhandled_events,
                resources: Arc::new(self.resources),
                health: Health::new(
                    self.config.max_tick_age(),
                    self.config.health_max_oldest_ready,
                ),
                config: self.config,
                id: Uuid::now_v7(),
                next_topic: std::sync::atomic::AtomicUsize::new(0),
            }),
        })
    }
}

struct Inner {
    store: Store,
    topics: BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>>,
    unhandled_events: Vec<(&'static str, &'static str)>,
    resources: Arc<Resources>,
    config: WorkerConfig,
    id: Uuid,
    health: Health,
    /// Which topic the next claim asks for first, so that a backlog of one topic cannot
    /// starve the topics after it.
    next_topic: std::sync::atomic::AtomicUsize,
}

/// A worker: turns committed messages into handler calls until stopped.
///
/// Build it with [`Worker::builder`]; run it with [`run_until`](Worker::run_until) (a task in
/// your service, or the `cli` module's binary), or [`run_once`](Worker::run_once) for one batch.
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
pub struct BatchReport {
    /// Messages claimed.
    pub claimed: usize,
    /// Messages whose handlers all succeeded.
    pub done: usize,
    /// Messages sent back to wait for a retry.
    pub retried: usize,
    /// Messages dead-lettered.
    pub dead: usize,
}

/// State shared by the claim loop and the message tasks.
struct Run {
    done_tx: mpsc::UnboundedSender<Fence>,
    in_flight: Mutex<HashSet<Uuid>>,
    report: Mutex<BatchReport>,
}

impl Worker {
    /// Starts building a worker on `store` (a `sqlx::PgPool`, or a [`Store`]).
    pub fn builder(store: impl Into<Store>) -> WorkerBuilder {
        WorkerBuilder {
            store: store.into(),
            registry: Registry::empty(),
            explicit: Vec::new(),
            resources: Resources::new(),
            config: WorkerConfig::default(),
        }
    }

    /// Topic -> handler names of this worker.
    pub fn topics(&self) -> BTreeMap<&'static str, Vec<&'static str>> {
        self.inner
            .topics
            .iter()
            .map(|(t, hs)| (*t, hs.iter().map(|h| h.name()).collect()))
            .collect()
    }

    /// The store this worker runs on.
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// The worker's health, for an endpoint of your own or [`observe::serve`](crate::observe).
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
    /// # Errors
    ///
    /// [`Error::Database`] when the claim fails. Outcome-write failures are retried and then
    /// left to lease expiry.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: dropping the future leaves claimed messages to lease expiry.
    pub async fn run_once(&self) -> Result<BatchReport> {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(flush::run_flusher(
            self.inner.store.clone(),
            done_rx,
            self.inner.config.flush_interval,
            self.inner.config.batch_size.max(1),
        ));
        let run = Arc::new(Run {
            done_tx,
            in_flight: Mutex::new(HashSet::new()),
            report: Mutex::new(BatchReport::default()),
        });
        let tracker = TaskTracker::new();
        let claimed = self.claim(self.inner.config.batch_size).await;
        let claimed = match claimed {
            Ok(c) => c,
            Err(e) => {
                drop(run);
                let _ = flusher.await;
                return Err(e);
            }
        };
        let n = claimed.len();
        self.spawn_all(
            claimed,
            &tracker,
            &run,
            &Arc::new(Semaphore::new(self.inner.config.concurrency)),
        )
        .await;
        tracker.close();
        tracker.wait().await;
        let report = lock(&run.report).to_owned();
        drop(run);
        let _ = flusher.await;
        Ok(BatchReport {
            claimed: n,
            ..report
        })
    }

    /// Runs until `signal` completes, then stops claiming, lets handlers in flight finish
    /// within the shutdown timeout, writes their outcomes and returns.
    ///
    /// Messages still running at the deadline are logged by id and left to lease expiry.
    /// Database errors are logged and retried with backoff; they never end the loop.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for start-up checks.
    ///
    /// # Cancellation safety
    ///
    /// Not cancellation safe: complete `signal` instead of dropping the future, or messages in
    /// flight wait for their lease.
    pub async fn run_until(&self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        let stop = CancellationToken::new();
        let worker = self.clone();
        let loop_stop = stop.clone();
        let main = tokio::spawn(async move { worker.main_loop(loop_stop).await });
        signal.await;
        tracing::info!(worker = %self.inner.config.name, "stop requested: no new claims, finishing handlers in flight");
        stop.cancel();
        match main.await {
            Ok(r) => r,
            Err(e) => Err(Error::Config(format!("the worker loop failed: {e}"))),
        }
    }

    async fn main_loop(&self, stop: CancellationToken) -> Result<()> {
        let cfg = &self.inner.config;
        self.report_unhandled().await;
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let flusher = tokio::spawn(flush::run_flusher(
            self.inner.store.clone(),
            done_rx,
            cfg.flush_interval,
            cfg.batch_size.max(1),
        ));
        let run = Arc::new(Run {
            done_tx,
            in_flight: Mutex::new(HashSet::new()),
            report: Mutex::new(BatchReport::default()),
        });
        let tracker = TaskTracker::new();
        let permits = Arc::new(Semaphore::new(cfg.concurrency));
        let wake = Arc::new(Wakeups::default());
        let listener_stop = stop.child_token();
        if cfg.wakeup == Wakeup::Listen {
            tokio::spawn(listen(
                self.inner.store.clone(),
                wake.clone(),
                listener_stop.clone(),
            ));
        }
        let reporter = {
            let w = self.clone();
            let s = stop.child_token();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = s.cancelled() => return,
                        () = tokio::time::sleep(w.inner.config.report_interval) => w.report_unhandled().await,
                    }
                }
            })
        };

        let stats = {
            let w = self.clone();
            let s = stop.child_token();
            tokio::spawn(async move {
                loop {
                    w.refresh_stats().await;
                    tokio::select! {
                        () = s.cancelled() => return,
                        () = tokio::time::sleep(w.inner.config.stats_interval) => {}
                    }
                }
            })
        };
        let purger = cfg.purge_retention.map(|retention| {
            let w = self.clone();
            let s = stop.child_token();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = s.cancelled() => return,
                        () = tokio::time::sleep(w.inner.config.purge_interval) => w.purge(retention).await,
                    }
                }
            })
        });

        let mut db_failures: u32 = 0;
        let mut hot_until = Instant::now();
        // Since when this worker's `waiting` flag is set, if it is.
        let mut waiting: Option<Instant> = None;
        // When the flag was last set from clear: the SETTLE_LOOKS count from there.
        let mut settled_from = Instant::now();
        // The last claim found work.
        let mut streaming = false;
        // Woken by a wake-up that may come before the producer's commit, and not found it yet.
        let mut woken = false;
        let listening = cfg.wakeup == Wakeup::Listen && self.inner.store.backend().listens();
        while !stop.is_cancelled() {
            self.inner.health.tick();
            // Wait for room: never claim more than can start now.
            let free = permits.available_permits();
            if free == 0 {
                tokio::select! {
                    () = stop.cancelled() => break,
                    p = permits.clone().acquire_owned() => drop(p),
                }
                continue;
            }
            let want = free.min(cfg.batch_size);
            let claimed = match self.claim(want).await {
                Ok(c) => {
                    db_failures = 0;
                    c
                }
                Err(e) => {
                    db_failures += 1;
                    let delay = Duration::from_millis(100u64 << db_failures.min(6))
                        .min(Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?delay, "claim failed; the database may be down, retrying");
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
            };
            let got = claimed.len();
            if got > 0 {
                woken = false;
                // Handlers first: the flag write below must not delay them.
                self.spawn_all(claimed, &tracker, &run, &permits).await;
                hot_until = Instant::now() + HOT_WINDOW;
                // A waiting worker keeps its flag while single messages come, so producers go on
                // waking it; a full batch or a second claim in a row with work means a stream,
                // and producers stop paying for NOTIFY.
                if waiting.is_some() && (got == want || streaming) {
                    waiting = None;
                    self.set_waiting(false).await;
                }
                streaming = true;
                if got == want {
                    continue; // a full batch: there is probably more
                }
                // A trickle: let a few more messages arrive, so the next claim takes several.
                if !cfg.claim_interval.is_zero() {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(cfg.claim_interval) => {}
                    }
                }
                continue;
            }
            streaming = false;
            // Nothing due. A listening worker says it waits and looks once more, then sleeps
            // until a producer notifies it. A producer that checked the flag just before it was
            // set but commits after that look is caught by the SETTLE_LOOKS a little later. A
            // polling worker keeps polling fast for a while after activity, then at the poll
            // interval.
            let now = Instant::now();
            let nap = if listening {
                match waiting {
                    None => {
                        waiting = Some(now);
                        settled_from = now;
                        self.set_waiting(true).await;
                        continue;
                    }
                    Some(since) if since.elapsed() >= WAITING_REFRESH => {
                        // Keep the flag fresh: rows not written for a minute count as gone.
                        waiting = Some(now);
                        self.set_waiting(true).await;
                    }
                    Some(_) => {}
                }
                // The next settle look still ahead, else the poll interval, but never past the
                // next refresh of the flag (a poll interval may be longer than a minute).
                SETTLE_LOOKS
                    .iter()
                    .map(|&after| settled_from + after)
                    .find(|&at| at > now)
                    .map_or(cfg.poll_interval.min(WAITING_REFRESH), |at| at - now)
            } else if now < hot_until {
                // Woken before the producer's commit (SQLite): look every millisecond until it
                // shows; otherwise keep to the claim interval.
                if woken {
                    HOT_POLL
                } else {
                    cfg.claim_interval.max(HOT_POLL)
                }
            } else {
                woken = false;
                cfg.poll_interval
            };
            match idle_wait(&wake, &stop, now + nap, listening, hot_until).await {
                NapEnd::Stopped => break,
                NapEnd::BeforeCommit => {
                    woken = true;
                    hot_until = Instant::now() + HOT_WINDOW;
                }
                NapEnd::Look => {}
            }
        }

        listener_stop.cancel();
        reporter.abort();
        stats.abort();
        if let Some(p) = purger {
            p.abort();
        }
        tracker.close();
        if tokio::time::timeout(cfg.shutdown_timeout, tracker.wait())
            .await
            .is_err()
        {
            let ids: Vec<String> = lock(&run.in_flight).iter().map(Uuid::to_string).collect();
            tracing::warn!(
                count = ids.len(),
                ids = %ids.join(","),
                "shutdown timeout reached; these messages are left to lease expiry"
            );
        }
        drop(run);
        let _ = flusher.await;
        if let Err(e) = self
            .inner
            .store
            .backend()
            .worker_deregister(self.inner.id)
            .await
        {
            tracing::debug!(error = %e, "could not deregister the worker row");
        }
        tracing::info!(worker = %cfg.name, "worker stopped");
        Ok(())
    }

    async fn set_waiting(&self, waiting: bool) {
        if let Err(e) = self
            .inner
            .store
            .backend()
            .worker_set_waiting(self.inner.id, &self.inner.config.name, waiting)
            .await
        {
            tracing::debug!(error = %e, "could not update the worker's waiting flag");
        }
    }

    async fn claim(&self, limit: usize) -> Result<Vec<ClaimedMessage>> {
        // A claim fills its batch topic by topic; each claim starts one topic further on.
        let mut topics: Vec<&str> = self.inner.topics.keys().copied().collect();
        let first = self
            .inner
            .next_topic
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let len = topics.len().max(1);
        topics.rotate_left(first % len);
        let token = Uuid::now_v7();
        let start = Instant::now();
        let claimed = self
            .inner
            .store
            .backend()
            .outbox_claim_batch(&ClaimParams {
                topics: &topics,
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                lease: self.inner.config.lease,
                claim_token: token,
                worker: &self.inner.config.name,
            })
            .await?;
        metrics::histogram!(crate::metrics::CLAIM_DURATION).record(start.elapsed().as_secs_f64());
        tracing::trace!(claimed = claimed.len(), elapsed = ?start.elapsed(), "claim");
        Ok(claimed)
    }

    /// Starts one task per claimed message, each holding a concurrency permit.
    async fn spawn_all(
        &self,
        claimed: Vec<ClaimedMessage>,
        tracker: &TaskTracker,
        run: &Arc<Run>,
        permits: &Arc<Semaphore>,
    ) {
        let multi: Vec<i64> = claimed
            .iter()
            .filter(|m| {
                m.attempts > 1
                    && self
                        .inner
                        .topics
                        .get(m.topic.as_str())
                        .is_some_and(|h| h.len() > 1)
            })
            .map(|m| m.id)
            .collect();
        let mut completed: HashMap<i64, HashSet<String>> = HashMap::new();
        if !multi.is_empty() {
            match self.inner.store.backend().delivery_completed(&multi).await {
                Ok(rows) => {
                    for (id, handler) in rows {
                        completed.entry(id).or_default().insert(handler);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read per-handler progress; every handler of those messages runs again")
                }
            }
        }
        for msg in claimed {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let done = completed.remove(&msg.id).unwrap_or_default();
            let worker = self.clone();
            let run = run.clone();
            lock(&run.in_flight).insert(msg.public_id);
            tracker.spawn(async move {
                worker.process(msg, done, &run).await;
                drop(permit);
            });
        }
    }

    async fn process(&self, msg: ClaimedMessage, completed: HashSet<String>, run: &Run) {
        let Some(handlers) = self.inner.topics.get(msg.topic.as_str()) else {
            return; // never claimed: the claim only asks for our topics
        };
        let outcome = run_message(
            &msg,
            handlers,
            &completed,
            &self.inner.config,
            &self.inner.resources,
        )
        .await;
        let fence = Fence {
            id: msg.id,
            claim_token: msg.claim_token,
        };
        match outcome {
            Outcome::Done => {
                metrics::counter!(crate::metrics::PROCESSED, "topic" => msg.topic.clone(), "outcome" => "done").increment(1);
                lock(&run.report).done += 1;
                if run.done_tx.send(fence).is_err() {
                    tracing::warn!(message_id = %msg.public_id, "outcome writer stopped; the message will be redelivered");
                }
            }
            Outcome::Failed {
                retry_in,
                error,
                succeeded,
            } => {
                let outcome = if retry_in.is_some() { "retry" } else { "dead" };
                metrics::counter!(crate::metrics::PROCESSED, "topic" => msg.topic.clone(), "outcome" => outcome).increment(1);
                {
                    let mut r = lock(&run.report);
                    if retry_in.is_some() {
                        r.retried += 1;
                    } else {
                        r.dead += 1;
                    }
                }
                let f = failure(fence, retry_in, &error, &succeeded);
                let mut tries = 0u32;
                loop {
                    match self.inner.store.backend().outbox_mark_failed(&f).await {
                        Ok(true) => break,
                        Ok(false) => {
                            tracing::warn!(message_id = %msg.public_id, "outcome not written: the lease ran out and another claim owns the message");
                            break;
                        }
                        Err(e) if tries < 10 => {
                            tries += 1;
                            tracing::warn!(message_id = %msg.public_id, error = %e, "could not write a failed outcome; retrying");
                            tokio::time::sleep(Duration::from_millis(100 * u64::from(tries))).await;
                        }
                        Err(e) => {
                            tracing::error!(message_id = %msg.public_id, error = %e, "giving up writing a failed outcome; the message is retried after its lease");
                            break;
                        }
                    }
                }
            }
        }
        lock(&run.in_flight).remove(&msg.public_id);
    }

    async fn refresh_stats(&self) {
        match self.inner.store.stats().await {
            Ok(stats) => {
                let topics = &self.inner.topics;
                crate::metrics::record_stats(&stats, &|t| topics.contains_key(t));
                let oldest = stats
                    .topics
                    .iter()
                    .filter(|t| topics.contains_key(t.topic.as_str()))
                    .filter_map(|t| t.oldest_ready_age)
                    .max();
                self.inner.health.set_oldest_ready(oldest);
            }
            Err(e) => tracing::warn!(error = %e, "could not read queue statistics"),
        }
    }

    async fn purge(&self, retention: Duration) {
        let store = &self.inner.store;
        match store
            .purge_done(retention, crate::ops::DEFAULT_PURGE_BATCH)
            .await
        {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "purged done messages"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "purge of done messages failed"),
        }
        match store
            .purge_processed(retention, crate::ops::DEFAULT_PURGE_BATCH)
            .await
        {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "purged processed-id records"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "purge of processed-id records failed"),
        }
    }

    async fn report_unhandled(&self) {
        for (topic, type_name) in &self.inner.unhandled_events {
            tracing::warn!(
                topic,
                event = type_name,
                "declared event has no handler in this worker"
            );
        }
        match self.unhandled_pending_topics().await {
            Ok(topics) => {
                for (topic, count) in topics {
                    tracing::warn!(topic = %topic, pending = count, "pending messages of a topic this worker has no handler for; they stay pending");
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not list pending topics"),
        }
    }
}

/// How the wake-up listener wakes the claim loop.
#[derive(Default)]
struct Wakeups {
    notify: Notify,
    /// A wake-up since the loop last woke came before its producer's commit: the loop looks
    /// again every millisecond for a little while, until the commit shows.
    before_commit: AtomicBool,
}

/// How an idle worker's sleep ended.
enum NapEnd {
    Stopped,
    /// Time to claim: the nap is over, or a wake-up came.
    Look,
    /// Woken by an insert whose transaction may not have committed yet.
    BeforeCommit,
}

/// Sleeps until `until`, or until a wake-up worth a claim.
async fn idle_wait(
    wake: &Wakeups,
    stop: &CancellationToken,
    until: Instant,
    listening: bool,
    hot_until: Instant,
) -> NapEnd {
    loop {
        tokio::select! {
            () = stop.cancelled() => return NapEnd::Stopped,
            () = wake.notify.notified() => {
                if listening {
                    return NapEnd::Look;
                }
                if wake.before_commit.swap(false, Ordering::Relaxed) {
                    return NapEnd::BeforeCommit;
                }
                // A commit seen in the SQLite file: news only to a worker that polls at its
                // poll interval. One that polls at its claim interval looks soon anyway, and
                // the change is most often its own write.
                if Instant::now() >= hot_until {
                    return NapEnd::Look;
                }
            }
            () = tokio::time::sleep_until(until.into()) => return NapEnd::Look,
        }
    }
}

/// Keeps a wake-up listener connected; reconnects with backoff, while polling goes on.
async fn listen(store: Store, wake: Arc<Wakeups>, stop: CancellationToken) {
    let mut failures: u32 = 0;
    while !stop.is_cancelled() {
        let listener = tokio::select! {
            () = stop.cancelled() => return,
            l = store.backend().wakeup_listener() => l,
        };
        let mut listener = match listener {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "wake-up listener could not connect; polling meanwhile");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(200u64 << failures.min(5))) => {}
                }
                continue;
            }
        };
        failures = 0;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                r = listener.recv() => match r {
                    Ok(kind) => {
                        if kind == Wake::BeforeCommit {
                            wake.before_commit.store(true, Ordering::Relaxed);
                        }
                        wake.notify.notify_one();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "wake-up listener lost its connection; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
