//! From claim to outcome: claimed messages become handler tasks, each holding a concurrency
//! permit, and finished tasks become outcome writes (successes to the batched flusher,
//! failures one by one, retried while the database is away).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use uuid::Uuid;

use super::super::config::reconnect_delay;
use super::super::process::{failure, run_message, Outcome, Watch};
use super::super::{lock, Worker};
use super::{Finished, Flight, Shared, CHORE_TICK};
use crate::backend::{Backend, ClaimParams, ClaimedMessage, Done, Fence};

impl Shared {
    /// Starts one handler task per claimed message on the handlers' runtime, each holding a
    /// concurrency permit; messages wait here (leases renewed) until a permit is free. Of the
    /// messages of one key (a claim takes a key's run), the first starts and the rest are
    /// parked in the key's line, each to start once its predecessor's done write commits.
    pub(super) async fn start_all(self: &Arc<Self>, claimed: Vec<ClaimedMessage>) {
        let (run, back) = self.park(claimed);
        if !back.is_empty() {
            self.hand_back(back, "the worker is stopping").await;
        }
        self.start(run).await;
    }

    /// Splits a claim into the messages to start now and those parked behind the first
    /// message of their key (registered as parked flights); once the worker is stopping,
    /// those are returned to hand back instead.
    fn park(&self, claimed: Vec<ClaimedMessage>) -> (Vec<ClaimedMessage>, Vec<Fence>) {
        let mut run = Vec::with_capacity(claimed.len());
        let mut runs: HashMap<Arc<str>, Vec<ClaimedMessage>> = HashMap::new();
        for msg in claimed {
            match &msg.key {
                Some(k) => runs.entry(k.clone()).or_default().push(msg),
                None => run.push(msg),
            }
        }
        let mut back = Vec::new();
        if runs.is_empty() {
            return (run, back);
        }
        let now = Instant::now();
        let mut lines = lock(&self.lines);
        let stopping = self.stopping.load(Ordering::Relaxed);
        let mut flights = lock(&self.flights);
        for (key, mut msgs) in runs {
            msgs.sort_by_key(|m| m.id);
            let mut msgs = msgs.into_iter();
            // A key with a line has its running message here: all of these wait behind it.
            // (A claim finds no head of such a key, so this is only a guard.)
            if !lines.contains_key(&key) {
                run.extend(msgs.next());
            }
            let rest: Vec<ClaimedMessage> = msgs.collect();
            if rest.is_empty() {
                continue;
            }
            if stopping {
                back.extend(rest.iter().map(|m| Fence {
                    id: m.id,
                    claim_token: m.claim_token,
                }));
                continue;
            }
            for m in &rest {
                if let Some(f) = self.flight(m, now) {
                    flights.insert(m.id, Flight { parked: true, ..f });
                }
            }
            let line = lines.entry(key).or_default();
            line.extend(rest);
            line.make_contiguous().sort_by_key(|m| m.id);
        }
        (run, back)
    }

    /// A claimed message's flight, not yet started; `None` for a topic this worker does not
    /// handle (never claimed: the claim only asks for its topics).
    fn flight(&self, msg: &ClaimedMessage, now: Instant) -> Option<Flight> {
        let handlers = self.worker.inner.topics.get(msg.topic.as_str())?;
        Some(Flight {
            fence: Fence {
                id: msg.id,
                claim_token: msg.claim_token,
            },
            topic: handlers[0].topic(),
            had_attempts: msg.attempts > 1,
            key: msg.key.clone(),
            leased_at: now,
            claimed_at: now,
            deadline: now + super::super::config::MAX_DURATION,
            watch: Arc::new(Watch::new(self.epoch)),
            abort: None,
            warned_blocking: false,
            parked: false,
        })
    }

    /// Starts the next parked message of each of `keys`: the done write of the message before
    /// it has committed.
    pub(super) async fn advance(self: &Arc<Self>, keys: &[Arc<str>]) {
        let mut run = Vec::new();
        {
            let mut lines = lock(&self.lines);
            if self.stopping.load(Ordering::Relaxed) {
                return;
            }
            let flights = lock(&self.flights);
            for key in keys {
                let Some(line) = lines.get_mut(key) else {
                    continue; // handed back meanwhile
                };
                let next = line.pop_front();
                if line.is_empty() {
                    lines.remove(key);
                }
                // Its flight is gone only if it was handed back.
                if let Some(m) = next.filter(|m| flights.contains_key(&m.id)) {
                    run.push(m);
                }
            }
        }
        self.start(run).await;
    }

    /// Hands back the parked messages of `keys`, ready again at once: the message before them
    /// failed, timed out or was not written done, or the worker stops.
    pub(super) async fn drop_lines(&self, keys: &[Arc<str>]) {
        let fences = self.take_lines(keys);
        if !fences.is_empty() {
            self.hand_back(
                fences,
                "the message before them in their key did not complete here",
            )
            .await;
        }
    }

    /// As [`drop_lines`](Self::drop_lines) for one key, with the hand-back on a task of its
    /// own: the caller (the collector, the chores) does not wait for it.
    pub(super) fn shed_line(self: &Arc<Self>, key: &Arc<str>) {
        let fences = self.take_lines(std::slice::from_ref(key));
        if !fences.is_empty() {
            let shared = self.clone();
            tokio::spawn(async move {
                shared
                    .hand_back(
                        fences,
                        "the message before them in their key failed or timed out",
                    )
                    .await;
            });
        }
    }

    /// Takes the lines of `keys` out, their parked flights with them.
    fn take_lines(&self, keys: &[Arc<str>]) -> Vec<Fence> {
        let mut fences = Vec::new();
        let mut lines = lock(&self.lines);
        let mut flights = lock(&self.flights);
        for key in keys {
            for m in lines.remove(key).into_iter().flatten() {
                if let Some(f) = flights.remove(&m.id) {
                    fences.push(f.fence);
                }
            }
        }
        fences
    }

    /// Hands back messages that never started, ready again at once with this claim's attempt
    /// not counted.
    async fn hand_back(&self, fences: Vec<Fence>, why: &'static str) {
        match self.backend.outbox_hand_back(&fences).await {
            Ok(n) => tracing::debug!(
                count = n,
                reason = why,
                "handed back messages parked behind their key"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                count = fences.len(),
                reason = why,
                "could not hand back parked messages; they run again when their lease runs out"
            ),
        }
    }

    /// Starts `run`, claimed messages not yet started (parked ones among them, taken off
    /// their line), as [`start_all`](Self::start_all) does.
    async fn start(self: &Arc<Self>, run: Vec<ClaimedMessage>) {
        if run.is_empty() {
            return;
        }
        let inner = &self.worker.inner;
        let claimed = run;
        let mut completed = self
            .worker
            .completed_handlers(&*self.backend, &claimed)
            .await;
        let now = Instant::now();
        {
            let mut flights = lock(&self.flights);
            for msg in &claimed {
                match flights.get_mut(&msg.id) {
                    // A parked message: it waits for a handler from now on.
                    Some(f) if f.fence.claim_token == msg.claim_token => {
                        f.parked = false;
                        f.claimed_at = now;
                    }
                    _ => {
                        if let Some(f) = self.flight(msg, now) {
                            flights.insert(msg.id, f);
                        }
                    }
                }
            }
        }
        for msg in claimed {
            let Some(handlers) = inner.topics.get(msg.topic.as_str()) else {
                continue;
            };
            let Some(permit) = self.permit().await else {
                return;
            };
            let done = completed.remove(&msg.id).unwrap_or_default();
            let budget: Duration = handlers
                .iter()
                .filter(|h| !done.contains(h.name()))
                .map(|h| h.timeout().unwrap_or(inner.config.handler_timeout))
                .fold(Duration::ZERO, Duration::saturating_add);
            let fence = Fence {
                id: msg.id,
                claim_token: msg.claim_token,
            };
            let Some(watch) = lock(&self.flights).get(&msg.id).map(|f| f.watch.clone()) else {
                continue; // handed back meanwhile (shutdown)
            };
            let task = {
                let worker = self.worker.clone();
                let tx = self.finished_tx.clone();
                let running = self.running_tasks.clone();
                running.fetch_add(1, Ordering::Relaxed);
                async move {
                    let _running = RunningGuard(running);
                    let handlers = &worker.inner.topics[msg.topic.as_str()];
                    let outcome = run_message(
                        &msg,
                        handlers,
                        &done,
                        &worker.inner.config,
                        &worker.inner.resources,
                        &watch,
                    )
                    .await;
                    drop(permit);
                    let _ = tx.send(Finished { fence, outcome });
                }
            };
            let abort = self.handlers_rt.spawn(task).abort_handle();
            let now = Instant::now();
            if let Some(f) = lock(&self.flights).get_mut(&fence.id) {
                f.abort = Some(abort);
                // The handler's own timeout fires first when it yields; this one catches a
                // handler that does not.
                f.deadline = now + budget.saturating_add(CHORE_TICK * 2);
            }
        }
    }

    /// Waits for a free handler slot, telling health the loop is alive meanwhile: a worker
    /// whose handlers are all busy is working, not stuck.
    pub(super) async fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        loop {
            tokio::select! {
                p = self.permits.clone().acquire_owned() => return p.ok(),
                () = tokio::time::sleep(CHORE_TICK) => self.worker.inner.health.tick(),
            }
        }
    }

    /// Takes a message out of the running set if this claim still runs it.
    pub(super) fn land(&self, fence: &Fence) -> Option<Flight> {
        let mut flights = lock(&self.flights);
        match flights.get(&fence.id) {
            Some(f) if f.fence.claim_token == fence.claim_token => flights.remove(&fence.id),
            _ => None,
        }
    }

    pub(super) fn record(&self, topic: &'static str, outcome: &'static str) {
        metrics::counter!(crate::metrics::PROCESSED, "topic" => topic, "outcome" => outcome)
            .increment(1);
    }

    /// Writes a failed attempt, retrying with jittered backoff while the database is away.
    pub(super) async fn write_failure(
        self: Arc<Self>,
        fence: Fence,
        retry_in: Option<Duration>,
        error: String,
        succeeded: Vec<&'static str>,
    ) {
        let f = failure(fence, retry_in, &error, &succeeded);
        let mut tries = 0u32;
        loop {
            match self.backend.outbox_mark_failed(&f).await {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!(message_id = %fence.id, "outcome not written: the lease ran out and another claim owns the message");
                    return;
                }
                Err(e) if tries < 10 => {
                    tries += 1;
                    let delay = reconnect_delay(tries);
                    tracing::warn!(message_id = %fence.id, error = %e, retry_in = ?delay, "could not write a failed outcome; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => {
                    tracing::error!(message_id = %fence.id, error = %e, "giving up writing a failed outcome; the message runs again when its lease runs out");
                    return;
                }
            }
        }
    }
}

/// Counts a handler task as running until it ends (or is dropped, when aborted).
struct RunningGuard(Arc<AtomicU64>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Turns finished handler tasks into outcome writes.
pub(super) async fn collect(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Finished>) {
    while let Some(Finished { fence, outcome }) = rx.recv().await {
        let Some(flight) = shared.land(&fence) else {
            // Already failed as timed out, or handed back: this late outcome is not written.
            tracing::debug!(message_id = %fence.id, "a handler finished after its message was failed or handed back");
            continue;
        };
        match outcome {
            Outcome::Done => {
                shared.record(flight.topic, "done");
                // The next message of its key is parked here: the write passes the key on to
                // it instead of claiming a successor.
                let next_parked = flight
                    .key
                    .as_ref()
                    .is_some_and(|k| lock(&shared.lines).contains_key(k));
                if shared
                    .done_tx
                    .send(Done {
                        fence,
                        had_attempts: flight.had_attempts,
                        key: flight.key,
                        next_parked,
                    })
                    .is_err()
                {
                    tracing::warn!(message_id = %fence.id, "outcome writer stopped; the message will be redelivered");
                }
            }
            Outcome::Failed {
                retry_in,
                error,
                succeeded,
            } => {
                shared.record(
                    flight.topic,
                    if retry_in.is_some() { "retry" } else { "dead" },
                );
                // The messages parked behind it may not start before it: they go back.
                if let Some(key) = &flight.key {
                    shared.shed_line(key);
                }
                tokio::spawn(
                    shared
                        .clone()
                        .write_failure(fence, retry_in, error, succeeded),
                );
            }
        }
    }
}

impl Worker {
    /// Per-handler progress of claimed messages that ran before and have several handlers.
    pub(in crate::worker) async fn completed_handlers(
        &self,
        backend: &dyn Backend,
        claimed: &[ClaimedMessage],
    ) -> HashMap<Uuid, HashSet<String>> {
        let multi: Vec<Uuid> = claimed
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
        let mut completed: HashMap<Uuid, HashSet<String>> = HashMap::new();
        if !multi.is_empty() {
            match backend.delivery_completed(&multi).await {
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
        completed
    }

    /// One claim statement on `backend`; `tails` as in [`ClaimParams`], `held` the number of
    /// keys whose runs the worker holds.
    pub(in crate::worker) async fn claim(
        &self,
        backend: &dyn Backend,
        limit: usize,
        released: &[Arc<str>],
        tails: i64,
        held: usize,
    ) -> crate::Result<Vec<ClaimedMessage>> {
        // A claim fills its batch topic by topic; each claim starts one topic further on.
        let mut topics: Vec<&str> = self.inner.topics.keys().copied().collect();
        let first = self.inner.next_topic.fetch_add(1, Ordering::Relaxed);
        let len = topics.len().max(1);
        topics.rotate_left(first % len);
        let start = Instant::now();
        let claimed = backend
            .outbox_claim_batch(&ClaimParams {
                topics: &topics,
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                lease: self.inner.config.lease,
                claim_token: Uuid::now_v7(),
                worker: self.inner.id,
                released,
                tails,
                holding: held > 0,
                busy: held > 0 && held * 2 >= self.inner.config.concurrency,
            })
            .await?;
        metrics::histogram!(crate::metrics::CLAIM_DURATION).record(start.elapsed().as_secs_f64());
        tracing::trace!(claimed = claimed.len(), elapsed = ?start.elapsed(), "claim");
        Ok(claimed)
    }
}
