//! The engine of a running worker: its own thread, runtime and connection pool.
//!
//! Handlers run on the runtime that called [`Worker::run_until`]; everything the worker must
//! keep doing whatever a handler does runs here:
//! - the claim loop (here) and the idle/wake-up protocol ([`super::wake`]);
//! - handler tasks and outcome writes ([`dispatch`]): successes in batches
//!   ([`super::flush`]), failures one by one;
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

mod chores;
mod dispatch;

use super::config::{reconnect_delay, Wakeup};
use super::process::{Outcome, Watch};
use super::protocol;
use super::wake::{
    idle_wait, listen, NapEnd, Rate, Wakeups, HOT_POLL, HOT_WINDOW, SETTLE_LOOKS, STREAM_RATE,
};
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
    /// Handler tasks started and not yet ended, abandoned ones included.
    running_tasks: Arc<AtomicU64>,
    epoch: Instant,
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
        running_tasks: Arc::new(AtomicU64::new(0)),
        epoch: Instant::now(),
    });
    shared.heartbeat().await;

    let wake = Arc::new(Wakeups::default());
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
            lease: cfg.lease,
            start: start_tx,
            stop: stop.clone(),
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

/// Starts the messages that the flusher claimed with its done writes, until the stop request;
/// what comes after that is handed back, ready again at once. It holds the engine's state only
/// while it starts a batch, so the flusher still ends when the worker stops.
async fn start_claimed(
    worker: Uuid,
    shared: std::sync::Weak<Shared>,
    backend: Arc<dyn Backend>,
    mut rx: mpsc::UnboundedReceiver<Vec<crate::backend::ClaimedMessage>>,
    stop: CancellationToken,
) {
    // Each batch enters the running set the moment it arrives, so that its leases are renewed
    // while it waits behind earlier batches for handler slots; a second task starts them in
    // order.
    let (queue_tx, mut queue_rx) = mpsc::unbounded_channel::<Vec<crate::backend::ClaimedMessage>>();
    let starter = {
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    claimed = queue_rx.recv() => {
                        let Some(claimed) = claimed else { return };
                        let Some(shared) = shared.upgrade() else { return };
                        shared.start_registered(claimed).await;
                    }
                }
            }
        })
    };
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => break,
            claimed = rx.recv() => {
                let Some(claimed) = claimed else { break };
                let Some(shared) = shared.upgrade() else { break };
                shared.register(&claimed);
                let _ = queue_tx.send(claimed);
            }
        }
    }
    drop(queue_tx);
    let _ = starter.await;
    // A done write in flight at the stop request may still claim: until the flusher ends.
    while let Some(claimed) = rx.recv().await {
        let fences: Vec<Fence> = claimed
            .iter()
            .map(|m| Fence {
                id: m.id,
                claim_token: m.claim_token,
            })
            .collect();
        match backend.outbox_hand_back(&fences).await {
            Ok(n) => protocol::written(worker, "hand_back", fences.iter().copied(), n),
            Err(e) => {
                protocol::error(worker, "hand_back", fences.iter().copied());
                tracing::warn!(error = %e, count = fences.len(), "could not hand back messages claimed while the worker stopped; they run again when their lease runs out");
            }
        }
    }
}

/// Claims and starts messages until the stop request. Returns the error that keeps the worker
/// from running at all: the outbox tables missing before any claim succeeded.
async fn claim_loop(
    shared: Arc<Shared>,
    wake: Arc<Wakeups>,
    stop: CancellationToken,
) -> Option<crate::error::Error> {
    let (shared, wake, stop) = (&shared, &wake, &stop);
    let mut claimed_once = false;
    let worker = &shared.worker;
    let cfg = &worker.inner.config;
    let mut db_failures: u32 = 0;
    let mut hot_until = Instant::now();
    // Since when this worker's `waiting` flag is set, if it is.
    let mut waiting: Option<Instant> = None;
    // When the flag was last set from clear: the SETTLE_LOOKS count from there.
    let mut settled_from = Instant::now();
    // Woken by a wake-up that may come before the producer's commit, and not found it yet.
    let mut woken = false;
    let mut rate = Rate::new();
    let listening = cfg.wakeup == Wakeup::Listen && shared.backend.listens();
    while !stop.is_cancelled() {
        worker.inner.health.tick();
        // Wait for room: never claim more than can start now.
        let free = shared.permits.available_permits();
        if free == 0 {
            tokio::select! {
                () = stop.cancelled() => break,
                p = shared.permit() => drop(p),
            }
            continue;
        }
        // A full batch, even when fewer handlers can start now: the rest waits for permits in
        // this worker (its leases renewed), so handlers never wait for a claim round trip.
        let want = cfg.batch_size;
        let released = wake.take_released();
        let claimed = match worker.claim(&*shared.backend, want, &released).await {
            Ok(c) => {
                db_failures = 0;
                claimed_once = true;
                c
            }
            Err(e) => {
                let kind = e.database_kind();
                if !claimed_once && kind == Some(crate::error::DatabaseErrorKind::MissingSchema) {
                    tracing::error!(error = %crate::diagnostics::error_chain(&e), "the worker cannot start: the outbox tables are missing; run `outbox migrate` (or outbox::migrate) on this database");
                    return Some(e);
                }
                db_failures += 1;
                let delay = reconnect_delay(db_failures);
                let error = crate::diagnostics::error_chain(&e);
                if kind == Some(crate::error::DatabaseErrorKind::Connection) {
                    tracing::warn!(error, retry_in = ?delay, "claim failed: the database may be down; retrying");
                } else {
                    tracing::warn!(error, retry_in = ?delay, "claim failed; retrying");
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
                continue;
            }
        };
        let got = claimed.len();
        rate.add(got);
        let peers = shared.peers.load(Ordering::Relaxed).max(1);
        // Messages of this worker's topics arrive fast: poll, never ask producers to notify.
        let fast = rate.per_sec() * peers as f64 >= STREAM_RATE;
        // The live workers of a topic share one claim interval between them: each claims that
        // many times less often, so the topic is still looked at every interval, and the
        // database sees as many claims with eight workers as with one.
        let shared_interval = cfg
            .claim_interval
            .saturating_mul(u32::try_from(peers).unwrap_or(u32::MAX))
            .min(MAX_SHARED_INTERVAL);
        if got > 0 {
            woken = false;
            // Handlers first: the flag write below must not delay them.
            shared.start_all(claimed).await;
            hot_until = Instant::now() + HOT_WINDOW;
            // A worker that found work clears its waiting flag: while the flag is set every
            // producer transaction notifies it, and at the start of a stream, when several
            // workers of the topic wake one after another, a flag kept through the claim
            // interval cost producers one NOTIFY per transaction (2.5% of them with 8
            // workers). It then looks again at once rather than after the claim interval, so
            // under a trickle the flag is back within two round trips (a message committed in
            // between is found by the look that follows the flag), and a stream that is
            // starting is found still flowing, the flag left clear.
            // A worker woken into a full batch wakes one waiting peer of its topic on the way
            // (which does the same if it too finds a full batch): one producer transaction
            // notifies one worker, and a burst still spreads over all of them.
            if waiting.is_some() {
                waiting = None;
                shared.set_waiting(false, got == want).await;
                continue;
            }
            if got == want {
                continue; // a full batch: there is probably more
            }
            // A trickle: let a few more messages arrive, so the next claim takes several; but
            // look at once when this worker's done write released the next messages of keys.
            if !cfg.claim_interval.is_zero() {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(shared_interval) => {}
                    () = wake.released.notified() => {}
                }
            }
            continue;
        }
        // Nothing due. A fast stream just had a gap: look again at the claim interval, as a
        // polling worker does. Otherwise a listening worker says it waits and looks once more,
        // then sleeps until a producer notifies it; a producer that checked the flag just
        // before it was set but commits after that look is caught by the SETTLE_LOOKS a little
        // later. A polling worker keeps polling fast for a while after activity, then at the
        // poll interval.
        let now = Instant::now();
        let nap = if listening && fast {
            shared_interval.max(HOT_POLL)
        } else if listening && waiting.is_none() && shared.ordered_in_flight() {
            // Ordered messages of this worker are running: when they are done, its own write
            // wakes it for the next of their keys. Setting and clearing the waiting flag around
            // each of those steps would cost two writes per message of a key; it looks at the
            // claim interval instead, as under a fast stream.
            shared_interval.max(HOT_POLL)
        } else if listening {
            if waiting.is_none() {
                waiting = Some(now);
                settled_from = now;
                shared.set_waiting(true, false).await;
                continue;
            }
            // The next settle look still ahead, else the poll interval.
            SETTLE_LOOKS
                .iter()
                .map(|&after| settled_from + after)
                .find(|&at| at > now)
                .map_or(cfg.poll_interval, |at| at - now)
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
        match idle_wait(wake, stop, now + nap, listening, hot_until).await {
            NapEnd::Stopped => break,
            NapEnd::BeforeCommit => {
                woken = true;
                hot_until = Instant::now() + HOT_WINDOW;
            }
            NapEnd::Look => {}
        }
    }
    if waiting.is_some() {
        shared.set_waiting(false, false).await;
    }
    None
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
        let beat = Beat {
            id: inner.id,
            name: &inner.config.name,
            topics: &topics,
            waiting: self.waiting.load(Ordering::Relaxed),
            wake_peer,
        };
        match self.backend.worker_heartbeat(&beat).await {
            Ok(peers) => self.peers.store(peers.max(1), Ordering::Relaxed),
            Err(e) => tracing::debug!(error = %e, "could not write the worker's heartbeat"),
        }
    }
}
