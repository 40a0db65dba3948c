//! The two ways messages reach the engine: its claim loop, and the batches that the
//! flusher's done writes claim for the next steps of their keys.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::super::config::{reconnect_delay, Wakeup};
use super::super::protocol;
use super::super::wake::{
    idle_wait, NapEnd, Rate, Wakeups, HOT_POLL, HOT_WINDOW, SETTLE_LOOKS, STREAM_RATE,
};
use super::{Shared, MAX_SHARED_INTERVAL};
use crate::backend::{Backend, Fence};

/// Starts the messages that the flusher claimed with its done writes, until the stop request;
/// what comes after that is handed back, ready again at once. It holds the engine's state only
/// while it starts a batch, so the flusher still ends when the worker stops.
pub(super) async fn start_claimed(
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
pub(super) async fn claim_loop(
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
    // A polling worker past its hot window: how long its last empty look slept.
    let mut cold_nap = Duration::ZERO;
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
            cold_nap = Duration::ZERO;
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
            // Polling, with nothing found since the hot window: back off from the claim
            // interval, doubling at each empty look, to the poll interval. Messages that keep
            // coming from other processes, which cannot wake it, are then picked up within
            // about twice the gap between them (the README's MariaDB pickup figure), and an
            // idle worker still settles at the poll interval within a few seconds.
            woken = false;
            cold_nap = (cold_nap.max(cfg.claim_interval.max(HOT_POLL)) * 2).min(cfg.poll_interval);
            cold_nap
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
