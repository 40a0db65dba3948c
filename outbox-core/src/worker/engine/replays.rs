//! The replays this worker runs: at start it records its handlers (and makes the backfill a
//! new handler's [`Start`] asks for); then, while it runs, it takes up a replay of one of its
//! handlers, one at a time under a lease, and delivers its events batch by batch.
//!
//! A batch's events go to the handler concurrently across ordering keys and one after another
//! within a key, each with the handler's retries; one that still fails is recorded as the
//! replay's failure and the replay goes on. The cursor moves, in a write that also renews the
//! lease, to the end of the batch's longest handled prefix every [`CHECKPOINT_EVENTS`] events
//! of it or every [`CHECKPOINT_EVERY`], whichever comes first, and at the batch's end: a worker
//! killed mid-batch leaves the events after its last checkpoint (about that many, plus those
//! running) to be handled again by the next worker that takes the replay up, once the lease
//! (the worker's message lease, [`WorkerConfig::lease`](crate::WorkerConfig::lease)) of the
//! killed one has run out. Replays never starve live messages: they use at most a quarter of
//! the worker's handler slots, and take those slots as live messages do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::future::join_all;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use super::super::process::call_handler;
use super::Shared;
use crate::backend::{Backend, ReplayStep};
use crate::handler::{Context, ErasedHandler, FailureKind};
use crate::retention::{EventFilter, ReplayInfo, ReplayRequest, ReplayState, RetainedEvent, Start};
use crate::worker::Worker;

/// How often a worker without a replay looks for one to take up: a replay starts within this
/// (one small statement per look; W13 measured 311 ms to take a replay up at 500 ms).
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// Events read per batch: each costs a read of the log and a write of the cursor.
const BATCH: u32 = 1000;
/// The longest pause between two attempts of one event.
const MAX_PAUSE: Duration = Duration::from_secs(5);
/// Handled events after which the cursor moves within a batch.
const CHECKPOINT_EVENTS: usize = 100;
/// The longest the cursor stays behind handled events within a batch.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// Records this worker's handlers as run, and makes the backfill of each one seen for the first
/// time whose [`Start`] reaches into the past of a retained topic. Failures are logged: a
/// worker runs without them.
pub(in crate::worker) async fn record_handlers(worker: &Worker, backend: &dyn Backend) {
    let pairs: Vec<(&str, &str)> = worker
        .inner
        .topics
        .iter()
        .flat_map(|(topic, hs)| hs.iter().map(move |h| (*topic, h.name())))
        .collect();
    let new = match backend.handlers_seen(&pairs).await {
        Ok(new) => new,
        Err(e) => {
            tracing::warn!(error = %e, "could not record this worker's handlers; backfills of new handlers wait for the next start");
            return;
        }
    };
    for (topic, name) in new {
        let Some(h) = worker
            .inner
            .topics
            .get(topic.as_str())
            .and_then(|hs| hs.iter().find(|h| h.name() == name))
        else {
            continue;
        };
        let since = match h.start() {
            Start::Present => continue,
            Start::Beginning => None,
            Start::Since(ago) => {
                Some(Utc::now() - chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::MAX))
            }
        };
        let mut request = ReplayRequest::new(topic.clone(), name.clone());
        request.since = since;
        if let Err(e) = backfill(backend, &request).await {
            tracing::warn!(topic = %topic, handler = %name, error = %e, "could not make the backfill of a new handler");
        }
    }
}

/// Makes the backfill replay of `request`'s handler, once for the deployment.
async fn backfill(backend: &dyn Backend, request: &ReplayRequest) -> crate::error::Result<()> {
    let retained = backend.log_topics(false).await?;
    if !retained.iter().any(|t| t.topic == request.topic) {
        tracing::warn!(topic = %request.topic, handler = %request.handler, "the handler starts in the past, but its topic retains no events: nothing to backfill");
        return Ok(());
    }
    match crate::replay::make(backend, request, Utc::now(), true).await? {
        (plan, _) if plan.events == 0 => {
            tracing::info!(topic = %request.topic, handler = %request.handler, "new handler: no retained events to backfill");
        }
        (plan, Some(id)) => {
            tracing::info!(replay = %id, topic = %request.topic, handler = %request.handler, events = plan.events, "new handler: backfill of the retained events made");
        }
        (_, None) => {}
    }
    Ok(())
}

/// Takes up replays of this worker's handlers until `stop`.
pub(super) async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let worker = &shared.worker;
    let pairs: Vec<(&str, &str)> = worker
        .inner
        .topics
        .iter()
        .flat_map(|(topic, hs)| hs.iter().map(move |h| (*topic, h.name())))
        .collect();
    let slots = Arc::new(Semaphore::new((worker.inner.config.concurrency / 4).max(1)));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        let token = Uuid::now_v7();
        match shared
            .backend
            .replay_lease(worker.inner.id, token, &pairs, worker.inner.config.lease)
            .await
        {
            Ok(Some(replay)) => {
                let span = tracing::info_span!("replay", replay = %replay.id, topic = %replay.request.topic, handler = %replay.request.handler);
                run_one(&shared, &replay, token, &slots, &stop)
                    .instrument(span)
                    .await;
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not look for replays to run"),
        }
    }
}

/// Runs one leased replay until it is done, paused, cancelled or taken over, or the worker
/// stops (which gives it up for another worker to resume).
async fn run_one(
    shared: &Shared,
    replay: &ReplayInfo,
    token: Uuid,
    slots: &Arc<Semaphore>,
    stop: &CancellationToken,
) {
    let r = &replay.request;
    let Some(handler) = shared
        .worker
        .inner
        .topics
        .get(r.topic.as_str())
        .and_then(|hs| hs.iter().find(|h| h.name() == r.handler))
        .cloned()
    else {
        return;
    };
    tracing::info!(replay = %replay.id, topic = %r.topic, handler = %r.handler, delivered = replay.delivered, total = replay.total, "taking up a replay");
    let mut cursor = replay.cursor;
    let mut cursor_seq = replay.cursor_seq;
    let mut delivered = replay.delivered;
    // A paced replay reads a twentieth of a second's worth at a time: short bursts, evenly
    // spread, rather than a second's worth at once.
    let batch = r.rate.map_or(BATCH, |rate| (rate / 20).clamp(1, BATCH));
    loop {
        let mut step = ReplayStep::renewal(shared.worker.inner.config.lease);
        if stop.is_cancelled() {
            step.release = true;
            let _ = shared.backend.replay_advance(replay.id, token, &step).await;
            return;
        }
        let filter = EventFilter {
            topic: r.topic.clone(),
            since: r.since,
            until: Some(r.until),
            key: r.key.clone(),
            after: cursor,
            after_seq: cursor_seq,
            limit: Some(batch),
        };
        let events = match shared.backend.log_events(&filter).await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(replay = %replay.id, error = %e, "could not read the replay's events; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let started = Instant::now();
        // What the checkpoints within the batch recorded already: events, failures.
        let (mut recorded, mut recorded_failed) = (0, 0);
        if events.is_empty() {
            step.finished = true;
        } else {
            step.cursor = events.last().map(|e| e.id);
            step.cursor_seq = events.last().map(|e| e.seq);
            let total = events.len();
            let rest;
            (recorded, recorded_failed, rest) =
                deliver(shared, replay, &handler, events, slots, token).await;
            step.delivered = i64::try_from(total - recorded).unwrap_or(i64::MAX);
            step.failures = rest;
        }
        let state = loop {
            match shared.backend.replay_advance(replay.id, token, &step).await {
                Ok(state) => break state,
                Err(e) => {
                    tracing::warn!(replay = %replay.id, error = %e, "could not record the replay's progress; trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let topic = r.topic.clone();
        let name = r.handler.clone();
        let failed = (step.failures.len() + recorded_failed) as u64;
        let done = u64::try_from(step.delivered)
            .unwrap_or(0)
            .saturating_add(recorded as u64)
            .saturating_sub(failed);
        delivered += i64::try_from(recorded).unwrap_or(i64::MAX);
        metrics::counter!(crate::metrics::REPLAYED, "topic" => topic.clone(), "handler" => name.clone(), "outcome" => "done").increment(done);
        metrics::counter!(crate::metrics::REPLAYED, "topic" => topic.clone(), "handler" => name.clone(), "outcome" => "failed").increment(failed);
        delivered += step.delivered;
        metrics::gauge!(crate::metrics::REPLAY_LEFT, "topic" => topic, "handler" => name)
            .set((replay.total - delivered).max(0) as f64);
        match state {
            None => {
                tracing::warn!(replay = %replay.id, "another worker took the replay over");
                return;
            }
            Some(ReplayState::Running) if !step.finished => {}
            Some(state) => {
                tracing::info!(replay = %replay.id, state = %state, delivered, total = replay.total, "replay left");
                return;
            }
        }
        if step.cursor.is_some() {
            cursor = step.cursor;
            cursor_seq = step.cursor_seq;
        }
        // At most `rate` events a second: a batch of `rate / 20` events takes 50 ms at least.
        if let Some(rate) = r.rate {
            let least = Duration::from_secs_f64(step.delivered as f64 / f64::from(rate.max(1)));
            if let Some(rest) = least.checked_sub(started.elapsed()) {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(rest) => {}
                }
            }
        }
    }
}

/// Delivers one batch: keys concurrently, each key's events in order; the lease renewed
/// meanwhile, and the cursor moved to the end of the longest handled prefix of the batch every
/// [`CHECKPOINT_EVENTS`] events or [`CHECKPOINT_EVERY`]. Returns how many events (from the
/// batch's start) those checkpoints recorded and how many of them failed for good, and the
/// events after them that failed for good.
async fn deliver(
    shared: &Shared,
    replay: &ReplayInfo,
    handler: &Arc<dyn ErasedHandler>,
    events: Vec<RetainedEvent>,
    slots: &Arc<Semaphore>,
    token: Uuid,
) -> (usize, usize, Vec<(Uuid, i32, String)>) {
    let places: Vec<(Uuid, i64)> = events.iter().map(|e| (e.id, e.seq)).collect();
    let (handled_tx, mut handled_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut chains: BTreeMap<Option<String>, Vec<(usize, RetainedEvent)>> = BTreeMap::new();
    let mut unordered = Vec::new();
    for (i, e) in events.into_iter().enumerate() {
        match e.ordering_key.clone() {
            Some(k) => chains.entry(Some(k)).or_default().push((i, e)),
            None => unordered.push(vec![(i, e)]),
        }
    }
    let all: Vec<_> = chains
        .into_values()
        .chain(unordered)
        .map(|chain| {
            let handled_tx = handled_tx.clone();
            async move {
                for (i, e) in chain {
                    let failure = deliver_one(shared, replay, handler, &e, slots).await;
                    let _ = handled_tx.send((i, failure));
                }
            }
        })
        .collect();
    // The chains hold the only senders: the channel closes once every event was counted.
    drop(handled_tx);
    let work = join_all(all);
    tokio::pin!(work);
    let mut progress = Progress::new(places.len());
    let mut checkpointed = Instant::now();
    let mut finished = false;
    loop {
        tokio::select! {
            _ = &mut work, if !finished => finished = true,
            handled = handled_rx.recv() => match handled {
                Some((i, failure)) => {
                    progress.handled(i, failure);
                    if progress.unrecorded() >= CHECKPOINT_EVENTS {
                        checkpoint(shared, replay, token, &places, &mut progress).await;
                        checkpointed = Instant::now();
                    }
                }
                // Every chain ended and its events were counted: the caller records the rest.
                None => {
                    let rest: Vec<_> = progress.take_failures(places.len()).into_values().collect();
                    return (progress.recorded, progress.failed, rest);
                }
            },
            () = tokio::time::sleep(shared.worker.inner.config.renew_interval()) => {
                if progress.unrecorded() > 0 && checkpointed.elapsed() >= CHECKPOINT_EVERY {
                    checkpoint(shared, replay, token, &places, &mut progress).await;
                    checkpointed = Instant::now();
                    continue;
                }
                let renew = ReplayStep::renewal(shared.worker.inner.config.lease);
                if let Err(e) = shared.backend.replay_advance(replay.id, token, &renew).await {
                    tracing::warn!(replay = %replay.id, error = %e, "could not renew the replay's lease");
                }
            }
        }
    }
}

/// Which events of a batch were handled, and how far the cursor was moved within it.
struct Progress {
    /// Per event of the batch, whether it was handled (succeeded or failed for good).
    handled: Vec<bool>,
    /// The events failed for good, by place in the batch.
    failures: BTreeMap<usize, (Uuid, i32, String)>,
    /// The batch's first events, all handled: the longest handled prefix.
    prefix: usize,
    /// The prefix the cursor was moved to.
    recorded: usize,
    /// The failures recorded with it.
    failed: usize,
}

impl Progress {
    fn new(len: usize) -> Self {
        Progress {
            handled: vec![false; len],
            failures: BTreeMap::new(),
            prefix: 0,
            recorded: 0,
            failed: 0,
        }
    }

    fn handled(&mut self, i: usize, failure: Option<(Uuid, i32, String)>) {
        self.handled[i] = true;
        if let Some(f) = failure {
            self.failures.insert(i, f);
        }
        while self.handled.get(self.prefix).copied().unwrap_or(false) {
            self.prefix += 1;
        }
    }

    /// Handled events of the prefix the cursor has not been moved past yet.
    fn unrecorded(&self) -> usize {
        self.prefix - self.recorded
    }

    /// The failures among the events before `upto`, taken out, by place.
    fn take_failures(&mut self, upto: usize) -> BTreeMap<usize, (Uuid, i32, String)> {
        let later = self.failures.split_off(&upto);
        std::mem::replace(&mut self.failures, later)
    }
}

/// Moves the cursor to the end of the handled prefix (renewing the lease), recording the
/// events and failures since the last checkpoint. A failed write is only logged: the next
/// checkpoint, or the batch's end, records them.
async fn checkpoint(
    shared: &Shared,
    replay: &ReplayInfo,
    token: Uuid,
    places: &[(Uuid, i64)],
    progress: &mut Progress,
) {
    let upto = progress.prefix;
    let Some(&(id, seq)) = upto.checked_sub(1).and_then(|last| places.get(last)) else {
        return;
    };
    let mut step = ReplayStep::renewal(shared.worker.inner.config.lease);
    step.cursor = Some(id);
    step.cursor_seq = Some(seq);
    step.delivered = i64::try_from(upto - progress.recorded).unwrap_or(i64::MAX);
    let failures = progress.take_failures(upto);
    step.failures = failures.values().cloned().collect();
    match shared.backend.replay_advance(replay.id, token, &step).await {
        Ok(_) => {
            progress.recorded = upto;
            progress.failed += failures.len();
        }
        Err(e) => {
            // Kept for the next write.
            progress.failures.extend(failures);
            tracing::warn!(replay = %replay.id, error = %e, "could not move the replay's cursor; the next write does");
        }
    }
}

/// Delivers one event to the handler, with its retries; the failure when it still fails.
async fn deliver_one(
    shared: &Shared,
    replay: &ReplayInfo,
    handler: &Arc<dyn ErasedHandler>,
    e: &RetainedEvent,
    slots: &Arc<Semaphore>,
) -> Option<(Uuid, i32, String)> {
    let config = &shared.worker.inner.config;
    let max_attempts = handler
        .max_attempts()
        .unwrap_or(config.retry.attempt_limit())
        .max(1);
    let timeout = handler.timeout().unwrap_or(config.handler_timeout);
    let message_id = if replay.request.fresh {
        crate::message_id::new_message_id()
    } else {
        e.id
    };
    let idempotency_key = match (&e.idempotency_key, replay.request.fresh) {
        (Some(k), false) => k.clone(),
        _ => crate::handler::default_idempotency_key(message_id, handler.name()),
    };
    let version = u32::try_from(e.version).unwrap_or(1);
    // An event that no longer decodes into today's type fails for good at once: no retry
    // changes what was stored.
    if let Err(decode) = handler.decodes(&e.payload, version) {
        tracing::error!(replay = %replay.id, message_id = %e.id, topic = %e.topic, handler = handler.name(), error = %decode, "replayed event does not decode; recorded, and the replay goes on");
        return Some((e.id, 1, format!("the event does not decode: {decode}")));
    }
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let ctx = Context {
            message_id,
            topic: Arc::from(e.topic.as_str()),
            handler: handler.name(),
            attempt,
            max_attempts,
            created_at: e.created_at,
            version,
            idempotency_key: idempotency_key.clone(),
            resources: shared.worker.inner.resources.clone(),
            trace: e
                .traceparent
                .clone()
                .map(|p| crate::trace::TraceContext::new(p, None)),
        };
        let result = {
            let (Ok(_slot), Ok(_permit)) = (
                slots.clone().acquire_owned().await,
                shared.permits.clone().acquire_owned().await,
            ) else {
                return Some((e.id, attempt as i32, "the worker stopped".into()));
            };
            let h = handler.clone();
            let payload = e.payload.clone();
            let call = shared
                .handlers_rt
                .spawn(async move { call_handler(&*h, &payload, version, &ctx, timeout).await });
            match call.await {
                Ok(result) => result,
                Err(join) => Err(crate::handler::HandlerError::retry(format!(
                    "the handler's task ended: {join}"
                ))),
            }
        };
        match result {
            Ok(()) => return None,
            Err(err) => {
                let chain = err.chain_string();
                let pause = match err.kind() {
                    FailureKind::Permanent => None,
                    _ if attempt >= max_attempts => None,
                    FailureKind::RetryAfter(d) => Some(d.min(MAX_PAUSE)),
                    _ => Some(
                        handler
                            .backoff(attempt)
                            .unwrap_or_else(|| config.retry.backoff(attempt))
                            .min(MAX_PAUSE),
                    ),
                };
                match pause {
                    Some(pause) => {
                        tracing::warn!(replay = %replay.id, message_id = %e.id, topic = %e.topic, handler = handler.name(), error = %chain, retry_in = ?pause, "replayed event failed; will retry");
                        tokio::time::sleep(pause).await;
                    }
                    None => {
                        tracing::error!(replay = %replay.id, message_id = %e.id, topic = %e.topic, handler = handler.name(), error = %chain, "replayed event failed for good; recorded, and the replay goes on");
                        let error = crate::diagnostics::bound_error(&chain, config.max_error_bytes);
                        return Some((e.id, i32::try_from(attempt).unwrap_or(i32::MAX), error));
                    }
                }
            }
        }
    }
}
