//! The idle and wake-up protocol: when a worker sleeps, who wakes it, and when producers pay
//! for a NOTIFY.
//!
//! - A listening worker (PostgreSQL) that finds nothing sets its `waiting` flag and sleeps on
//!   LISTEN; producers of its topics notify only while a live worker of their topic waits, and
//!   the notification names one worker, so the others sleep on.
//! - While messages of its topics arrive fast (an estimate over the last second, times the live
//!   workers that share its topics), a worker does not wait at all: it claims every
//!   `claim_interval`, as a polling worker does, so a busy system sends no NOTIFY, however
//!   many workers serve a topic.
//! - A polling worker (SQLite, or [`Wakeup::Poll`](crate::Wakeup::Poll)) polls fast for a while
//!   after it found work, then at its poll interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::backend::{Backend, Wake};

/// A worker that cannot sleep until notified keeps polling at the claim interval (at least
/// [`HOT_POLL`]) for [`HOT_WINDOW`] after it found work, so bursts are picked up fast, then falls
/// back to the poll interval. Woken in-process by a SQLite producer, whose commit has not
/// happened yet, it polls every [`HOT_POLL`] until the message shows.
pub(super) const HOT_POLL: Duration = Duration::from_millis(1);
pub(super) const HOT_WINDOW: Duration = Duration::from_millis(50);
/// After setting its `waiting` flag, a worker looks again this long after, twice: a producer
/// that read the flag just before it was set sends no NOTIFY, and its commit may come after the
/// worker's first look. The first look catches ordinary transactions, the second slow ones.
pub(super) const SETTLE_LOOKS: [Duration; 2] = [Duration::from_millis(5), HOT_WINDOW];
/// Above this many messages a second on its topics (its own rate times the live workers that
/// share them), a worker polls at its claim interval instead of waiting to be notified: a
/// NOTIFY per transaction would cost producers more than the polls cost the database.
pub(super) const STREAM_RATE: f64 = 250.0;

/// Messages claimed over roughly the last second: an exponentially weighted rate, updated
/// every quarter of a second.
pub(super) struct Rate {
    window_start: Instant,
    count: usize,
    per_sec: f64,
}

const RATE_WINDOW: Duration = Duration::from_millis(250);

impl Rate {
    pub(super) fn new() -> Self {
        Self {
            window_start: Instant::now(),
            count: 0,
            per_sec: 0.0,
        }
    }

    /// Records `n` messages claimed now.
    pub(super) fn add(&mut self, n: usize) {
        self.roll();
        self.count += n;
    }

    fn roll(&mut self) {
        let mut elapsed = self.window_start.elapsed();
        while elapsed >= RATE_WINDOW {
            let window = self.count as f64 / RATE_WINDOW.as_secs_f64();
            self.per_sec = 0.5 * self.per_sec + 0.5 * window;
            self.count = 0;
            self.window_start += RATE_WINDOW;
            elapsed -= RATE_WINDOW;
            if self.per_sec < 0.01 && elapsed >= RATE_WINDOW {
                // Long idle: nothing left to decay.
                self.per_sec = 0.0;
                self.window_start = Instant::now();
                break;
            }
        }
    }

    /// Messages a second, including the window in progress.
    pub(super) fn per_sec(&mut self) -> f64 {
        self.roll();
        let partial = self.window_start.elapsed().as_secs_f64().max(0.05);
        self.per_sec
            .max(self.count as f64 / partial.max(RATE_WINDOW.as_secs_f64()))
    }
}

/// How the wake-up listener wakes the claim loop.
#[derive(Default)]
pub(super) struct Wakeups {
    pub(super) notify: Notify,
    /// A wake-up since the loop last woke came before its producer's commit: the loop looks
    /// again every millisecond for a little while, until the commit shows.
    pub(super) before_commit: AtomicBool,
    /// This worker's own done write released ordered messages: ends the short pause a worker
    /// takes between claims under a trickle, so the next message of a key starts at once.
    pub(super) released: Notify,
    /// The keys those writes released since the last claim, which looks at them first.
    released_keys: std::sync::Mutex<Vec<Arc<str>>>,
}

impl Wakeups {
    /// This worker's own commit made ordered messages startable (the next ones of the keys it
    /// finished): the claim loop looks again now, and keeps looking fast for a little while
    /// as after a producer's wake-up.
    pub(super) fn released(&self, keys: impl Iterator<Item = Arc<str>>) {
        super::lock(&self.released_keys).extend(keys);
        self.before_commit.store(true, Ordering::Relaxed);
        self.notify.notify_one();
        self.released.notify_one();
    }

    /// The keys released since the last call, each once.
    pub(super) fn take_released(&self) -> Vec<Arc<str>> {
        let mut keys = std::mem::take(&mut *super::lock(&self.released_keys));
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

/// How an idle worker's sleep ended.
pub(super) enum NapEnd {
    Stopped,
    /// Time to claim: the nap is over, or a wake-up came.
    Look,
    /// Woken by an insert whose transaction may not have committed yet.
    BeforeCommit,
}

/// Sleeps until `until`, or until a wake-up worth a claim.
pub(super) async fn idle_wait(
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

/// Keeps a wake-up listener connected; reconnects with jittered backoff, while polling goes on.
pub(super) async fn listen(
    backend: Arc<dyn Backend>,
    me: Uuid,
    wake: Arc<Wakeups>,
    stop: CancellationToken,
) {
    let mut failures: u32 = 0;
    while !stop.is_cancelled() {
        let listener = tokio::select! {
            () = stop.cancelled() => return,
            l = backend.wakeup_listener(me) => l,
        };
        let mut listener = match listener {
            Ok(Some(l)) => l,
            Ok(None) => return,
            Err(e) => {
                failures += 1;
                let delay = super::config::reconnect_delay(failures);
                tracing::warn!(error = %e, retry_in = ?delay, "wake-up listener could not connect; polling meanwhile");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(delay) => {}
                }
                continue;
            }
        };
        failures = 0;
        // Notifications sent while it was not listening are gone: look once.
        wake.notify.notify_one();
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
