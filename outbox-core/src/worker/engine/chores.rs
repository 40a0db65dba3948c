//! The engine's periodic chores: deadlines, the blocking watch, lease renewal and the
//! heartbeat every [`CHORE_TICK`]; statistics, the unhandled-topics report, the event log's
//! upkeep and the purge on their own intervals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::super::lock;
use super::super::process::timed_out;
use super::super::protocol;
use super::super::wake::Wakeups;
use super::{Flight, Shared, BLOCKING_AFTER, CHORE_TICK};

/// How often a worker runs the event log's upkeep: days ahead, expired days.
const LOG_UPKEEP: Duration = Duration::from_secs(600);

/// How long after its start a worker first counts its queue (statistics, unhandled topics).
const STARTUP_QUIET: Duration = Duration::from_secs(1);

/// Deadlines and the blocking watch, every [`CHORE_TICK`].
pub(super) async fn chores(shared: Arc<Shared>, stop: CancellationToken) {
    let renew_every = shared.worker.inner.config.renew_interval();
    let mut last_beat = Instant::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(CHORE_TICK) => {}
        }
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut renew = Vec::new();
        {
            let mut flights = lock(&shared.flights);
            let queued = flights
                .values()
                .filter(|f| f.watch.started_at().is_none())
                .map(|f| now.duration_since(f.claimed_at))
                .max();
            shared.worker.inner.health.set_oldest_queued(queued);
            for f in flights.values_mut() {
                if let Some(held) = f.watch.holding(now) {
                    if held >= BLOCKING_AFTER && !f.warned_blocking {
                        f.warned_blocking = true;
                        let handler = f.watch.handler();
                        metrics::counter!(crate::metrics::BLOCKING, "topic" => f.topic, "handler" => handler).increment(1);
                        tracing::warn!(
                            message_id = %f.fence.id,
                            topic = f.topic,
                            handler,
                            held_ms = held.as_millis() as u64,
                            "handler has held its thread without yielding; move blocking work into \
                             tokio::task::spawn_blocking, or it stalls other handlers on that thread"
                        );
                    }
                }
                // Only a handler that started and holds its thread past its deadline is failed
                // here: one that yields meets its own timeout, and a message still waiting for
                // a thread or a permit is never charged for a neighbour that holds it.
                let held = f.watch.holding(now);
                if let (Some(deadline), Some(held)) = (f.deadline(), held) {
                    if now >= deadline {
                        expired.push((f.fence.id, held));
                        continue;
                    }
                }
                if now.duration_since(f.leased_at) >= renew_every {
                    f.leased_at = now;
                    renew.push(f.fence);
                }
            }
            let expired: Vec<(Flight, Duration)> = expired
                .iter()
                .filter_map(|(id, held)| flights.remove(id).map(|f| (f, *held)))
                .collect();
            drop(flights);
            for (f, held) in expired {
                let (retry_in, error) = timed_out(
                    &shared.worker.inner.topics[f.topic],
                    f.watch.handler(),
                    f.attempt,
                    held,
                    &shared.worker.inner.config,
                );
                tracing::error!(message_id = %f.fence.id, topic = f.topic, handler = f.watch.handler(), error = %error, "handler did not finish by its deadline");
                f.watch.fail_spans(&error);
                shared.record(f.topic, if retry_in.is_some() { "retry" } else { "dead" });
                f.abort();
                tokio::spawn(
                    shared
                        .clone()
                        .write_failure(f.fence, retry_in, error, Vec::new()),
                );
            }
        }
        if !renew.is_empty() {
            let lease = shared.worker.inner.config.lease;
            let worker = shared.worker.inner.id;
            match shared.backend.outbox_renew(&renew, lease).await {
                Ok(n) => protocol::written(worker, "renew", renew.iter().copied(), n),
                Err(e) => {
                    protocol::error(worker, "renew", renew.iter().copied());
                    tracing::warn!(error = %e, count = renew.len(), "could not renew leases; retrying next round");
                    let mut flights = lock(&shared.flights);
                    for f in &renew {
                        if let Some(fl) = flights.get_mut(&f.id) {
                            fl.leased_at = now - renew_every;
                        }
                    }
                }
            }
        }
        if now.duration_since(last_beat) >= renew_every {
            last_beat = now;
            shared.heartbeat().await;
        }
    }
}

/// Statistics, the unhandled-topics report, the event log's upkeep and the purge, each on its
/// own interval.
pub(super) async fn periodic(shared: Arc<Shared>, stop: CancellationToken) {
    let w = &shared.worker;
    let cfg = &w.inner.config;
    let backend = &*shared.backend;
    // The first statistics and the report of topics nobody here handles each read the whole
    // live table: they wait a moment after the start, so a worker that starts on a backlog
    // spends its first claims' time on the backlog, not on counting it.
    let mut next_stats = Instant::now() + STARTUP_QUIET;
    let mut next_report = Instant::now() + STARTUP_QUIET;
    let mut next_purge = Instant::now() + cfg.purge_interval;
    // The event log's upkeep at start and every LOG_UPKEEP; the windows were recorded before
    // the first claim, and are again each time (which changes nothing unless a declaration
    // failed or an operator shortened a window since).
    let mut next_upkeep = Instant::now();
    let mut first = true;
    loop {
        let now = Instant::now();
        if now >= next_upkeep {
            next_upkeep = now + LOG_UPKEEP;
            if !first {
                w.declare_retention(backend).await;
            }
            first = false;
            w.log_upkeep(backend).await;
        }
        if now >= next_stats {
            next_stats = now + cfg.stats_interval;
            w.refresh_stats(backend).await;
        }
        if now >= next_report {
            next_report = now + cfg.report_interval;
            w.report_unhandled(backend).await;
        }
        if let Some(retention) = cfg.purge_retention {
            if now >= next_purge {
                next_purge = now + cfg.purge_interval;
                w.purge(backend, retention).await;
            }
        }
        let next = [
            Some(next_upkeep),
            Some(next_stats),
            Some(next_report),
            cfg.purge_retention.map(|_| next_purge),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(next_stats);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
}

/// Reads the pauses in force and the breakers every [`WorkerConfig::control_poll`](crate::WorkerConfig::control_poll), starting the
/// breakers' probes that are due, so a pause or a resume reaches this
/// worker within a second; wakes the claim loop when one ended, and tells health what is
/// paused.
pub(super) async fn pauses(shared: Arc<Shared>, wake: Arc<Wakeups>, stop: CancellationToken) {
    let backend = &*shared.backend;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(shared.worker.inner.config.control_poll) => {}
        }
        if shared.worker.refresh_pauses(backend).await {
            wake.notify.notify_one();
        }
        shared.start_probes();
        let now = chrono::Utc::now();
        let current = shared.worker.inner.pauses.current();
        // Open breakers are reported beside the pauses: held work, not ill health.
        let paused = current
            .active
            .iter()
            .map(|(t, since)| (t.to_string(), (now - *since).to_std().unwrap_or_default()))
            .chain(current.open.values().map(|b| {
                let since = b.opened_at.unwrap_or(b.window_start);
                (
                    format!("breaker open: handler {}", b.handler),
                    (now - since).to_std().unwrap_or_default(),
                )
            }))
            .collect();
        shared.worker.inner.health.set_pauses(paused);
    }
}
