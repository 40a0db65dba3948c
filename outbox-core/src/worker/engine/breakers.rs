//! The engine's side of the circuit breakers ([`crate::breaker`]): what outcomes tell them,
//! and the probes a worker runs once a breaker's cool-down has passed.
//!
//! Every change is one `Backend::breaker_update` (a row read under its lock and written in
//! one transaction), made only when something happened that matters to a breaker: a
//! retryable failure, the first success of a handler whose breaker counts failures (once per
//! read of the breakers), a probe. A worker whose handlers all succeed writes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use uuid::Uuid;

use super::super::process::Outcome;
use super::super::protocol;
use super::super::{lock, Worker};
use super::Shared;
use crate::backend::ClaimParams;
use crate::breaker::{self, Breaker};

/// A change of a breaker row, owned: what [`Shared::change_breaker`] writes in the background.
type BoxedChange = Box<
    dyn Fn(
            Option<&breaker::BreakerRow>,
            chrono::DateTime<chrono::Utc>,
        ) -> Option<breaker::BreakerRow>
        + Send
        + Sync,
>;

impl Worker {
    /// The breaker of the handler named `name`: its own, else the worker's.
    pub(in crate::worker) fn breaker_of(&self, name: &str) -> Breaker {
        self.inner
            .topics
            .values()
            .flatten()
            .find(|h| h.name() == name)
            .and_then(|h| h.breaker())
            .unwrap_or(self.inner.config.breaker)
    }

    /// Per handler whose breaker is on, when it last succeeded here (`Shared::last_success`):
    /// Unix microseconds, 0 for never.
    pub(in crate::worker) fn success_clocks(&self) -> HashMap<&'static str, AtomicI64> {
        self.inner
            .topics
            .values()
            .flatten()
            .map(|h| h.name())
            .filter(|n| self.breaker_of(n).is_enabled())
            .map(|n| (n, AtomicI64::new(0)))
            .collect()
    }

    /// The handler named `name` of this worker, as the static name its handlers carry.
    fn handler_name(&self, name: &str) -> Option<&'static str> {
        self.inner
            .topics
            .values()
            .flatten()
            .map(|h| h.name())
            .find(|n| *n == name)
    }
}

impl Shared {
    /// What the outcome of a message of `topic` tells the breakers; returns the outcome to
    /// write: a probe that failed parks its message again, its attempt not counted.
    pub(super) fn breaker_outcome(
        self: &Arc<Self>,
        topic: &'static str,
        attempt: u32,
        probe: Option<&'static str>,
        outcome: Outcome,
    ) -> Outcome {
        if self.last_success.is_empty() {
            // No handler of this worker has a breaker on.
            return outcome;
        }
        let current = self.worker.inner.pauses.current();
        let now = std::cell::OnceCell::new();
        let succeeded = |h: &'static str| {
            // Seen by this worker's next failure write of the handler at once...
            if let Some(at) = self.last_success.get(h) {
                let now = *now.get_or_init(|| chrono::Utc::now().timestamp_micros());
                at.store(now, Ordering::Relaxed);
            }
            // ...and by the other workers' once this reset reaches the row (once per read
            // of the breakers).
            if current.counting.contains(h) && lock(&self.reset_sent).insert(h) {
                self.change_breaker(h, "reset", Box::new(|row, _| breaker::succeeded(row)));
            }
        };
        match &outcome {
            Outcome::Done => {
                for h in self.worker.inner.topics.get(topic).into_iter().flatten() {
                    succeeded(h.name());
                }
            }
            Outcome::Failed { succeeded: ok, .. } | Outcome::Parked { succeeded: ok, .. } => {
                ok.iter().copied().for_each(succeeded);
            }
        }
        if let Outcome::Failed { breaker, error, .. } = &outcome {
            for &(h, retry_after) in breaker {
                if Some(h) == probe || current.open.contains_key(h) {
                    continue;
                }
                let Some(at) = self.last_success.get(h) else {
                    continue; // its breaker is off
                };
                let cfg = self.worker.breaker_of(h);
                let last_success = match at.load(Ordering::Relaxed) {
                    0 => None,
                    micros => chrono::DateTime::from_timestamp_micros(micros),
                };
                let failed_at = chrono::Utc::now();
                let settle = self.worker.inner.config.control_poll;
                let error = error.clone();
                self.change_breaker(
                    h,
                    "failure",
                    Box::new(move |row, now| {
                        let seen = breaker::Failure {
                            attempt,
                            retry_after,
                            error: &error,
                            at: failed_at,
                            last_success,
                            settle,
                        };
                        breaker::failed(row, now, h, &cfg, &seen)
                    }),
                );
            }
        }
        let Some(h) = probe else {
            return outcome;
        };
        lock(&self.probing).remove(h);
        let me = self.worker.inner.id;
        let cfg = self.worker.breaker_of(h);
        match outcome {
            Outcome::Done => {
                self.change_breaker(
                    h,
                    "probe",
                    Box::new(move |row, _| breaker::probe_succeeded(row, me)),
                );
                Outcome::Done
            }
            Outcome::Failed {
                retry_in,
                error,
                succeeded,
                breaker,
            } => {
                let failed_here = breaker.iter().find(|(n, _)| *n == h).copied();
                if succeeded.contains(&h) {
                    self.change_breaker(
                        h,
                        "probe",
                        Box::new(move |row, _| breaker::probe_succeeded(row, me)),
                    );
                } else {
                    let (ra, e) = match failed_here {
                        Some((_, ra)) => (ra, Some(error.clone())),
                        None => (None, None),
                    };
                    self.change_breaker(
                        h,
                        "probe",
                        Box::new(move |row, now| {
                            breaker::probe_failed(row, now, me, &cfg, ra, e.as_deref())
                        }),
                    );
                }
                match (failed_here, retry_in) {
                    // The dependency is still down: the message waits again, as it did.
                    (Some(_), Some(_)) => Outcome::Parked {
                        handler: h,
                        succeeded,
                    },
                    _ => Outcome::Failed {
                        retry_in,
                        error,
                        succeeded,
                        breaker,
                    },
                }
            }
            Outcome::Parked { handler, succeeded } => {
                if succeeded.contains(&h) {
                    self.change_breaker(
                        h,
                        "probe",
                        Box::new(move |row, _| breaker::probe_succeeded(row, me)),
                    );
                } else {
                    self.change_breaker(
                        h,
                        "probe",
                        Box::new(move |row, now| {
                            breaker::probe_failed(row, now, me, &cfg, None, None)
                        }),
                    );
                }
                Outcome::Parked { handler, succeeded }
            }
        }
    }

    /// Writes a change of `handler`'s breaker in the background; when it opened or closed the
    /// breaker, reads the breakers again at once, so this worker acts on it now.
    fn change_breaker(
        self: &Arc<Self>,
        handler: &'static str,
        what: &'static str,
        change: BoxedChange,
    ) {
        let shared = self.clone();
        tokio::spawn(async move {
            match shared.backend.breaker_update(handler, &*change).await {
                Ok((before, after)) => {
                    let was = before.as_ref().is_some_and(|b| b.open);
                    let is = after.as_ref().is_some_and(|a| a.open);
                    if was != is {
                        shared.worker.refresh_pauses(&*shared.backend).await;
                        shared.wake.notify.notify_one();
                    }
                }
                Err(e) => tracing::warn!(
                    handler,
                    error = %e,
                    "could not record a {what} of the handler's breaker"
                ),
            }
        });
    }

    /// Starts the probes this worker may run: of each open breaker of its handlers whose
    /// cool-down has passed, unless it probes that one already. Called at each read of the
    /// breakers.
    pub(super) fn start_probes(self: &Arc<Self>) {
        lock(&self.reset_sent).clear();
        if self.stop.is_cancelled() {
            return;
        }
        let current = self.worker.inner.pauses.current();
        let now = chrono::Utc::now();
        for (name, row) in &current.open {
            let Some(h) = self.worker.handler_name(name) else {
                continue;
            };
            if current.handler_paused(h) || row.probe_at.is_none_or(|t| t > now) {
                continue;
            }
            if !lock(&self.probing).insert(h) {
                continue;
            }
            tokio::spawn(self.clone().probe(h));
        }
    }

    /// Takes `h`'s probe right and runs the handler on one of its parked messages; with no
    /// message parked, gives the right back for another cool-down.
    async fn probe(self: Arc<Self>, h: &'static str) {
        let me = self.worker.inner.id;
        let cfg = self.worker.inner.config.clone();
        let lease = cfg.lease.saturating_add(
            self.worker
                .breaker_timeout(h)
                .unwrap_or(cfg.handler_timeout),
        );
        let taken = self
            .backend
            .breaker_update(h, &move |row, now| {
                breaker::probe_taken(row, now, me, lease)
            })
            .await;
        match taken {
            Ok((_, after)) if breaker::holds_probe(after.as_ref(), me) => {}
            Ok(_) => {
                lock(&self.probing).remove(h);
                return;
            }
            Err(e) => {
                tracing::warn!(handler = h, error = %e, "could not take the breaker's probe; trying at the next read");
                lock(&self.probing).remove(h);
                return;
            }
        }
        let topics: Vec<&'static str> = self
            .worker
            .inner
            .topics
            .iter()
            .filter(|(_, hs)| hs.iter().any(|x| x.name() == h))
            .map(|(t, _)| *t)
            .collect();
        let versions = self.worker.versions_of(&topics);
        let claimed = self
            .backend
            .claim_parked(
                h,
                &ClaimParams {
                    topics: &topics,
                    versions: &versions,
                    limit: 1,
                    lease: cfg.lease,
                    claim_token: Uuid::now_v7(),
                    worker: me,
                    released: &[],
                },
            )
            .await;
        match claimed {
            Ok(Some(msg)) => {
                tracing::info!(handler = h, message_id = %msg.id, topic = %msg.topic, "breaker probe: running the handler on one parked message");
                protocol::claimed(me, "claim", std::slice::from_ref(&msg));
                self.register(std::slice::from_ref(&msg));
                if let Some(f) = lock(&self.flights).get_mut(&msg.id) {
                    f.probe = Some(h);
                }
                self.start_registered(vec![msg]).await;
            }
            Ok(None) => {
                // Nothing waits for the handler: try again after a cool-down, no longer.
                let b = self.worker.breaker_of(h);
                let r = self
                    .backend
                    .breaker_update(h, &move |row, now| {
                        breaker::probe_failed(row, now, me, &b, None, None)
                    })
                    .await;
                if let Err(e) = r {
                    tracing::warn!(handler = h, error = %e, "could not give the breaker's probe back; it lapses by itself");
                }
                lock(&self.probing).remove(h);
            }
            Err(e) => {
                tracing::warn!(handler = h, error = %e, "could not claim a message for the breaker's probe; its right lapses by itself");
                lock(&self.probing).remove(h);
            }
        }
    }
}

impl Worker {
    /// The timeout of the handler named `name`, if it sets one.
    fn breaker_timeout(&self, name: &str) -> Option<std::time::Duration> {
        self.inner
            .topics
            .values()
            .flatten()
            .find(|h| h.name() == name)
            .and_then(|h| h.timeout())
    }
}
