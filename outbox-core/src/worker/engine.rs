//! The engine of a running worker: its own thread, runtime and connection pool.
//!
//! Handlers run on the runtime that called [`Worker::run_until`]; everything the worker must
//! keep doing whatever a handler does runs here:
//! - the claim loop (here) and the idle/wake-up protocol ([`super::wake`]);
//! - handler tasks and outcome writes ([`dispatch`]): successes in batches
//!   ([`super::flush`]), failures one by one;
//! - the pauses in force, read every [`PAUSE_POLL`](super::pauses::PAUSE_POLL) ([`chores`]);
//! - chores ([`chores`]) every [`CHORE_TICK`]: handlers past their deadline are failed as timed out even if
//!   they never yield, handlers that hold their thread are named, and every
//!   [`WorkerConfig::lease`](crate::WorkerConfig::lease) / 5 the worker's heartbeat and the
//!   leases of its running messages are renewed;
//! - at shutdown ([`run`]), two phases, each bounded as a whole: from the stop request to the
//!   deadline, messages claimed but not started are handed back at once and never start, while
//!   running handlers may finish; from the deadline, the messages still running are handed back
//!   and the engine ends within [`FINAL_WRITES`], whatever the database does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod breakers;
mod chores;
mod claims;
mod dispatch;
pub(super) mod replays;
#[cfg(all(test, any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
mod tests;

use claims::{claim_loop, start_claimed};
pub(super) use dispatch::had_earlier_attempts;

use super::config::{reconnect_delay, Wakeup};
use super::process::{Outcome, Watch};
use super::protocol;
use super::wake::{listen, Wakeups};
use super::{lock, Worker};
use crate::backend::{Backend, Beat, Done, Fence};

/// The longest claim interval that sharing it among a topic's workers makes.
const MAX_SHARED_INTERVAL: Duration = Duration::from_millis(50);
/// How often the chores run: deadlines and the blocking watch.
const CHORE_TICK: Duration = Duration::from_millis(100);
/// A handler whose poll has not returned for this long holds its thread: it is named in the
/// log and counted in [`BLOCKING`](crate::metrics::BLOCKING).
const BLOCKING_AFTER: Duration = Duration::from_millis(500);
/// Connections of the engine's own pool: claims, two done writes in flight, failed outcomes
/// and chores, and one spare.
const ENGINE_CONNECTIONS: u32 = 5;
/// The most time the final writes of a shutdown (hand-back, last successes, deregistration,
/// closing the pool) may take after the deadline, all together.
const FINAL_WRITES: Duration = Duration::from_millis(500);
/// How often the stop phase looks for messages to hand back and for running ones that ended.
const STOP_TICK: Duration = Duration::from_millis(5);

/// One claimed message of this worker: waiting for a handler slot or a thread, or running.
struct Flight {
    fence: Fence,
    topic: &'static str,
    /// The attempt this claim counted.
    attempt: u32,
    /// It may have per-handler progress from an earlier attempt or a park, to delete with it.
    earlier: bool,
    /// Its ordering key, if it has one.
    key: Option<Arc<str>>,
    /// When the lease was last taken or renewed.
    leased_at: Instant,
    /// When it was claimed: until its task starts it waits for a free handler or a thread.
    claimed_at: Instant,
    /// The time its handlers may take together, counted from the moment its task starts; a
    /// handler still holding its thread past that (plus two chore ticks) is failed as timed
    /// out by the engine. Set when the task is spawned.
    budget: Option<Duration>,
    watch: Arc<Watch>,
    /// The handler task, once spawned (a claimed message may wait for a permit).
    abort: Option<tokio::task::AbortHandle>,
    warned_blocking: bool,
    /// The handler whose breaker this delivery probes: it runs although the breaker is open.
    probe: Option<&'static str>,
}

impl Flight {
    fn abort(&self) {
        if let Some(a) = &self.abort {
            a.abort();
        }
    }

    /// The instant past which a handler of this message that still holds its thread is failed
    /// as timed out; none until its task started.
    fn deadline(&self) -> Option<Instant> {
        let budget = self.budget?;
        Some(self.watch.started_at()? + budget.saturating_add(CHORE_TICK * 2))
    }
}

/// What a handler task reports when its message's handlers are through.
struct Finished {
    fence: Fence,
    outcome: Outcome,
}

/// State shared by the engine's tasks.
struct Shared {
    worker: Worker,
    backend: Arc<dyn Backend>,
    handlers_rt: tokio::runtime::Handle,
    flights: Mutex<HashMap<Uuid, Flight>>,
    /// The stop request: from then on no message starts.
    stop: CancellationToken,
    finished_tx: mpsc::UnboundedSender<Finished>,
    done_tx: mpsc::UnboundedSender<Done>,
    permits: Arc<Semaphore>,
    waiting: AtomicBool,
    /// Live workers (this one included) that share a topic with this one.
    peers: AtomicI64,
    /// The host this process runs on, for the workers table.
    host: String,
    /// Handler tasks started and not yet ended, abandoned ones included.
    running_tasks: Arc<AtomicU64>,
    epoch: Instant,
    /// The claim loop's wake-ups: a breaker that closed makes messages claimable.
    wake: Arc<Wakeups>,
    /// Handlers whose breaker this worker probes now.
    probing: Mutex<std::collections::BTreeSet<&'static str>>,
    /// Handlers whose breaker's failure count this worker reset since the last read.
    reset_sent: Mutex<std::collections::BTreeSet<&'static str>>,
    /// Per handler with a breaker: when it last succeeded here, in Unix microseconds (0:
    /// not since this worker started), which its failures tell the breaker
    /// (`breaker::Failure::last_success`).
    last_success: HashMap<&'static str, AtomicI64>,
}

/// Runs the worker until `stop`, on the calling (engine) runtime; handlers go to
/// `handlers_rt`. Returns how many handler tasks were still running when it gave up on them.
///
/// # Errors
///
/// [`Error::Database`](crate::error::Error::Database) of kind
/// [`MissingSchema`](crate::error::DatabaseErrorKind::MissingSchema) when the outbox tables are missing
/// at start: the worker refuses to run on a database `migrate` never ran on, instead of
/// retrying for ever. A database that goes away later is retried.
pub(super) async fn run(
    worker: Worker,
    handlers_rt: tokio::runtime::Handle,
    stop: CancellationToken,
) -> crate::error::Result<u64> {
    let cfg = worker.inner.config.clone();
    // The engine's own pool, opened on this runtime, all connections at once.
    let mut failures = 0u32;
    let backend = loop {
        match worker
            .inner
            .store
            .backend()
            .detached(ENGINE_CONNECTIONS)
            .await
        {
            Ok(b) => break b,
            Err(e) => {
                failures += 1;
                let delay = reconnect_delay(failures);
                tracing::warn!(error = %e, retry_in = ?delay, "worker could not connect to the database; retrying");
                tokio::select! {
                    () = stop.cancelled() => return Ok(0),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    };

    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let wake = Arc::new(Wakeups::default());
    let shared = Arc::new(Shared {
        worker: worker.clone(),
        backend: backend.clone(),
        handlers_rt,
        flights: Mutex::new(HashMap::new()),
        stop: stop.clone(),
        finished_tx,
        done_tx,
        permits: Arc::new(Semaphore::new(cfg.concurrency)),
        waiting: AtomicBool::new(false),
        peers: AtomicI64::new(1),
        host: crate::host::host(),
        running_tasks: Arc::new(AtomicU64::new(0)),
        epoch: Instant::now(),
        wake: wake.clone(),
        probing: Mutex::new(std::collections::BTreeSet::new()),
        reset_sent: Mutex::new(std::collections::BTreeSet::new()),
        last_success: worker.success_clocks(),
    });
    shared.heartbeat().await;
    // Before the first claim: a worker that starts during a pause honours it at once.
    worker.refresh_pauses(&*backend).await;
    // Before the first claim, so that the first deliveries of a newly retained topic are
    // logged.
    worker.declare_retention(&*backend).await;
    replays::record_handlers(&worker, &*backend).await;

    let tasks = CancellationToken::new();
    // The next messages of keys that the flusher's done writes claim start here.
    let (start_tx, start_rx) = mpsc::unbounded_channel();
    let flusher = tokio::spawn(super::flush::run_flusher(
        backend.clone(),
        worker.inner.id,
        done_rx,
        cfg.flush_interval,
        cfg.batch_size.max(super::flush::FLUSH_MAX),
        wake.clone(),
        super::flush::NextClaim {
            topics: worker.inner.topics.keys().copied().collect(),
            versions: worker.versions_of(&worker.inner.topics.keys().copied().collect::<Vec<_>>()),
            lease: cfg.lease,
            start: start_tx,
            stop: stop.clone(),
            pauses: worker.inner.pauses.clone(),
        },
    ));
    tokio::spawn(start_claimed(
        worker.inner.id,
        Arc::downgrade(&shared),
        backend.clone(),
        start_rx,
        stop.clone(),
    ));
    if cfg.wakeup == Wakeup::Listen {
        tokio::spawn(listen(
            backend.clone(),
            worker.inner.id,
            wake.clone(),
            tasks.clone(),
        ));
    }
    let collector = tokio::spawn(dispatch::collect(shared.clone(), finished_rx));
    tokio::spawn(chores::chores(shared.clone(), tasks.clone()));
    tokio::spawn(chores::periodic(shared.clone(), tasks.clone()));
    tokio::spawn(chores::pauses(shared.clone(), wake.clone(), tasks.clone()));
    tokio::spawn(replays::run(shared.clone(), stop.clone()));

    // Until the stop request. The claim loop is polled on after it, within the deadline: a
    // statement it has in flight then may still land, and what it claimed is handed back.
    let mut claiming = Box::pin(claim_loop(shared.clone(), wake, stop.clone()));
    let mut fatal = None;
    let mut claim_loop_ended = tokio::select! {
        f = &mut claiming => {
            fatal = f;
            true
        }
        () = stop.cancelled() => false,
    };
    if fatal.is_some() {
        // Nothing was claimed: stop at once.
        stop.cancel();
    }
    protocol::lifecycle(worker.inner.id, "stop", true);

    // From the stop request to the deadline, as one bounded unit: whatever is claimed and not
    // started goes back at once (again each tick, for what the claim loop's last statement or a
    // done write in flight claimed); running handlers may finish.
    let deadline = Instant::now() + cfg.shutdown_timeout;
    let stopping = async {
        loop {
            shared.hand_back_unstarted().await;
            if claim_loop_ended {
                if lock(&shared.flights).is_empty() {
                    break;
                }
                tokio::time::sleep(STOP_TICK).await;
            } else {
                tokio::select! {
                    f = &mut claiming => {
                        if fatal.is_none() {
                            fatal = f;
                        }
                        claim_loop_ended = true;
                    }
                    () = tokio::time::sleep(STOP_TICK) => {}
                }
            }
        }
    };
    let _ = tokio::time::timeout_at(deadline.into(), stopping).await;

    // From the deadline, as one bounded unit: the messages still running (and any that could
    // not be handed back before) are handed back, the last successes written, the worker's
    // row removed and the pool closed. What does not fit is left to the leases.
    tasks.cancel();
    // A claim loop still in a statement: what that claims is left to its lease.
    drop(claiming);
    let left: Vec<Flight> = lock(&shared.flights).drain().map(|(_, f)| f).collect();
    let still_running = shared.running_tasks.clone();
    let worker_id = worker.inner.id;
    let final_writes = async {
        if !left.is_empty() {
            for f in &left {
                f.abort();
            }
            let fences: Vec<Fence> = left.iter().map(|f| f.fence).collect();
            let ids: Vec<String> = fences.iter().map(|f| f.id.to_string()).collect();
            let handed_back = backend.outbox_hand_back(&fences).await;
            match &handed_back {
                Ok(n) => protocol::written(worker_id, "hand_back", fences.iter().copied(), *n),
                Err(_) => protocol::error(worker_id, "hand_back", fences.iter().copied()),
            }
            match handed_back {
                Ok(n) => tracing::warn!(
                    count = n,
                    ids = %ids.join(","),
                    "shutdown deadline reached: these messages were still running and are handed back, \
                     ready again now with this attempt not counted"
                ),
                Err(e) => tracing::error!(
                    error = %e,
                    ids = %ids.join(","),
                    "shutdown deadline reached and these running messages could not be handed back; \
                     they run again when their lease runs out"
                ),
            }
        }
        collector.abort();
        drop(shared);
        // The flusher ends once every sender is gone: the collector's and ours are.
        let _ = flusher.await;
        if let Err(e) = backend.worker_deregister(worker_id).await {
            tracing::debug!(error = %e, "could not deregister the worker row");
        }
        // The engine's own pool: closed now, not whenever its last handle is dropped.
        backend.close().await;
    };
    let complete = tokio::time::timeout_at((deadline + FINAL_WRITES).into(), final_writes)
        .await
        .is_ok();
    protocol::lifecycle(worker_id, "stopped", complete);
    if !complete {
        tracing::warn!(
            "the final writes of the shutdown did not finish in time (is the database reachable?); \
             messages not handed back run again when their lease runs out"
        );
    }
    tracing::info!(worker = %cfg.name, "worker stopped");
    match fatal {
        Some(e) => Err(e),
        None => Ok(still_running.load(Ordering::Relaxed)),
    }
}

impl Shared {
    /// Whether a message with an ordering key is claimed by this worker and not yet finished.
    fn ordered_in_flight(&self) -> bool {
        lock(&self.flights).values().any(|f| f.key.is_some())
    }

    async fn set_waiting(&self, waiting: bool, wake_peer: bool) {
        self.waiting.store(waiting, Ordering::Relaxed);
        self.beat(wake_peer).await;
    }

    /// Writes the worker's row (topics, waiting flag, heartbeat) and learns how many live
    /// workers share its topics.
    async fn heartbeat(&self) {
        self.beat(false).await;
    }

    async fn beat(&self, wake_peer: bool) {
        let inner = &self.worker.inner;
        let topics: Vec<&str> = inner.topics.keys().copied().collect();
        let versions = self.worker.versions_of(&topics);
        let handlers: Vec<Vec<&str>> = inner
            .topics
            .values()
            .map(|hs| hs.iter().map(|h| h.name()).collect())
            .collect();
        let beat = Beat {
            id: inner.id,
            name: &inner.config.name,
            topics: &topics,
            versions: &versions,
            host: &self.host,
            pid: std::process::id(),
            handlers: &handlers,
            waiting: self.waiting.load(Ordering::Relaxed),
            wake_peer,
        };
        match self.backend.worker_heartbeat(&beat).await {
            Ok(peers) => self.peers.store(peers.max(1), Ordering::Relaxed),
            Err(e) => tracing::debug!(error = %e, "could not write the worker's heartbeat"),
        }
    }
}
