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
use super::super::protocol;
use super::super::{lock, Worker};
use super::{Finished, Flight, Shared, CHORE_TICK};
use crate::backend::{Backend, ClaimParams, ClaimedMessage, Done, Fence};

impl Shared {
    /// Starts one handler task per claimed message on the handlers' runtime, each holding a
    /// concurrency permit; messages wait here (leases renewed) until a permit is free. At the
    /// stop request it returns at once: the messages not started stay in the running set, not
    /// started, for the stop phase to hand back.
    pub(super) async fn start_all(self: &Arc<Self>, claimed: Vec<ClaimedMessage>) {
        self.register(&claimed);
        self.start_registered(claimed).await;
    }

    /// Enters claimed messages into the running set, not started: from now on their leases
    /// are renewed and the stop phase hands them back, however long they wait for a slot.
    pub(super) fn register(&self, claimed: &[ClaimedMessage]) {
        let inner = &self.worker.inner;
        let now = Instant::now();
        let mut flights = lock(&self.flights);
        for msg in claimed {
            let Some(handlers) = inner.topics.get(msg.topic.as_str()) else {
                continue; // never claimed: the claim only asks for our topics
            };
            flights.insert(
                msg.id,
                Flight {
                    fence: Fence {
                        id: msg.id,
                        claim_token: msg.claim_token,
                    },
                    topic: handlers[0].topic(),
                    attempt: u32::try_from(msg.attempts).unwrap_or(u32::MAX),
                    earlier: had_earlier_attempts(msg),
                    key: msg.key.clone(),
                    leased_at: now,
                    claimed_at: now,
                    budget: None,
                    watch: Arc::new(Watch::new(self.epoch)),
                    abort: None,
                    warned_blocking: false,
                    probe: None,
                },
            );
        }
    }

    /// Starts registered messages in order, each when a permit is free; returns at the stop
    /// request (see [`start_all`](Self::start_all)).
    pub(super) async fn start_registered(self: &Arc<Self>, claimed: Vec<ClaimedMessage>) {
        let inner = &self.worker.inner;
        let mut completed = self
            .worker
            .completed_handlers(&*self.backend, &claimed)
            .await;
        let paused = self.worker.inner.pauses.current();
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
            // This claim's record only: a lease that lapsed while the message waited may have
            // let this worker claim it again, and the newer claim's record is not this one's.
            let Some((watch, probe)) = lock(&self.flights)
                .get(&msg.id)
                .filter(|f| f.fence == fence)
                .map(|f| (f.watch.clone(), f.probe))
                .filter(|(w, _)| !w.withdrawn())
            else {
                continue; // handed back meanwhile (shutdown), or claimed again since
            };
            let task = {
                let worker = self.worker.clone();
                let tx = self.finished_tx.clone();
                let running = self.running_tasks.clone();
                let paused = paused.clone();
                running.fetch_add(1, Ordering::Relaxed);
                async move {
                    let _running = RunningGuard(running);
                    // Withdrawn before it got a thread (the worker is stopping): it never runs.
                    if !watch.begin() {
                        return;
                    }
                    protocol::start(worker.inner.id, fence);
                    let handlers = &worker.inner.topics[msg.topic.as_str()];
                    let outcome = run_message(
                        &msg,
                        handlers,
                        &done,
                        &worker.inner.config,
                        &worker.inner.resources,
                        &watch,
                        &paused,
                        probe,
                    )
                    .await;
                    drop(permit);
                    let _ = tx.send(Finished { fence, outcome });
                }
            };
            let abort = self.handlers_rt.spawn(task).abort_handle();
            if let Some(f) = lock(&self.flights)
                .get_mut(&fence.id)
                .filter(|f| f.fence == fence)
            {
                f.abort = Some(abort);
                // The handler's own timeout fires first when it yields; the engine's, counted
                // from the task's start, catches a handler that holds its thread.
                f.budget = Some(budget);
            }
        }
    }

    /// Waits for a free handler slot, telling health the loop is alive meanwhile: a worker
    /// whose handlers are all busy is working, not stuck. `None` at the stop request.
    pub(super) async fn permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        loop {
            tokio::select! {
                biased;
                () = self.stop.cancelled() => return None,
                p = self.permits.clone().acquire_owned() => return p.ok(),
                () = tokio::time::sleep(CHORE_TICK) => self.worker.inner.health.tick(),
            }
        }
    }

    /// Hands back every message claimed and not started (waiting for a permit or a thread):
    /// each is withdrawn first, so that it never starts, then released in one statement, ready
    /// again at once with its attempt not counted. A message whose hand-back fails stays in the
    /// running set, withdrawn, for the final hand-back at the deadline.
    pub(super) async fn hand_back_unstarted(&self) {
        let fences: Vec<Fence> = lock(&self.flights)
            .values()
            .filter(|f| f.watch.withdraw())
            .map(|f| {
                f.abort();
                f.fence
            })
            .collect();
        if fences.is_empty() {
            return;
        }
        match self.backend.outbox_hand_back(&fences).await {
            Ok(n) => {
                protocol::written(self.worker.inner.id, "hand_back", fences.iter().copied(), n);
                let mut flights = lock(&self.flights);
                for f in &fences {
                    if flights.get(&f.id).is_some_and(|x| x.fence == *f) {
                        flights.remove(&f.id);
                    }
                }
                tracing::info!(
                    count = n,
                    "stop requested: messages claimed but not started are handed back, ready again now with their attempt not counted"
                );
            }
            Err(e) => {
                protocol::error(self.worker.inner.id, "hand_back", fences.iter().copied());
                tracing::warn!(
                    error = %e,
                    count = fences.len(),
                    "stop requested and messages claimed but not started could not be handed back; trying again at the deadline"
                );
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

    /// Parks a message for its paused handler, retrying with jittered backoff while the
    /// database is away; given up, the message runs again when its lease runs out.
    pub(super) async fn write_park(
        self: Arc<Self>,
        fence: Fence,
        handler: &'static str,
        succeeded: Vec<&'static str>,
    ) {
        // To the protocol's model a park is a hand-back: the claim ends, the attempt is not
        // counted (that the message then waits for a resume is not the model's business).
        let mut tries = 0u32;
        loop {
            match self.backend.outbox_park(fence, handler, &succeeded).await {
                Ok(true) => {
                    protocol::written(self.worker.inner.id, "hand_back", [fence], 1);
                    return;
                }
                Ok(false) => {
                    protocol::written(self.worker.inner.id, "hand_back", [fence], 0);
                    tracing::warn!(message_id = %fence.id, "message not parked: the lease ran out and another claim owns it");
                    return;
                }
                Err(e) if tries < 10 => {
                    protocol::error(self.worker.inner.id, "hand_back", [fence]);
                    tries += 1;
                    let delay = reconnect_delay(tries);
                    tracing::warn!(message_id = %fence.id, error = %e, retry_in = ?delay, "could not park a message for its paused handler; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => {
                    protocol::error(self.worker.inner.id, "hand_back", [fence]);
                    tracing::error!(message_id = %fence.id, error = %e, "giving up parking a message; it runs again when its lease runs out");
                    return;
                }
            }
        }
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
            let result = self.backend.outbox_mark_failed(&f).await;
            let worker = self.worker.inner.id;
            match &result {
                Ok(written) => protocol::failed(worker, fence, retry_in.is_some(), *written),
                Err(_) => protocol::error(worker, "failed", [fence]),
            }
            match result {
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
        let outcome = shared.breaker_outcome(flight.topic, flight.attempt, flight.probe, outcome);
        match outcome {
            Outcome::Done => {
                shared.record(flight.topic, "done");
                if shared
                    .done_tx
                    .send(Done {
                        fence,
                        had_attempts: flight.earlier,
                        key: flight.key,
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
                ..
            } => {
                shared.record(
                    flight.topic,
                    if retry_in.is_some() { "retry" } else { "dead" },
                );
                tokio::spawn(
                    shared
                        .clone()
                        .write_failure(fence, retry_in, error, succeeded),
                );
            }
            Outcome::Parked { handler, succeeded } => {
                shared.record(flight.topic, "parked");
                tokio::spawn(shared.clone().write_park(fence, handler, succeeded));
            }
        }
    }
}

/// Whether a claimed message may have per-handler progress from before: it ran before
/// (attempts count at claim), or it was parked (its attempts are back where they were, and
/// the park noted itself in `last_error`).
pub(in crate::worker) fn had_earlier_attempts(m: &ClaimedMessage) -> bool {
    m.attempts > 1 || m.last_error.is_some()
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
                had_earlier_attempts(m)
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

    /// One claim statement on `backend`.
    pub(in crate::worker) async fn claim(
        &self,
        backend: &dyn Backend,
        limit: usize,
        released: &[Arc<str>],
    ) -> crate::error::Result<Vec<ClaimedMessage>> {
        // A claim fills its batch topic by topic; each claim starts one topic further on.
        // Topics paused, or all of whose handlers are paused, are not claimed at all.
        let paused = self.inner.pauses.current();
        let mut topics: Vec<&str> = self
            .inner
            .topics
            .keys()
            .copied()
            .filter(|t| paused.claims(t))
            .collect();
        if topics.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.inner.next_topic.fetch_add(1, Ordering::Relaxed);
        let len = topics.len().max(1);
        topics.rotate_left(first % len);
        let versions = self.versions_of(&topics);
        let start = Instant::now();
        let claimed = backend
            .outbox_claim_batch(&ClaimParams {
                topics: &topics,
                versions: &versions,
                limit: i64::try_from(limit).unwrap_or(i64::MAX),
                lease: self.inner.config.lease,
                claim_token: Uuid::now_v7(),
                worker: self.inner.id,
                released,
            })
            .await
            .inspect_err(|_| protocol::error(self.inner.id, "claim", []))?;
        protocol::claimed(self.inner.id, "claim", &claimed);
        metrics::histogram!(crate::metrics::CLAIM_DURATION).record(start.elapsed().as_secs_f64());
        tracing::trace!(claimed = claimed.len(), elapsed = ?start.elapsed(), "claim");
        Ok(claimed)
    }
}
