//! Circuit breakers per handler: when a handler's dependency is down, its messages wait
//! (parked, no attempt counted) instead of spending their attempts against it.
//!
//! A breaker is a row of `outbox_breakers`, shared by every worker, which reads it with the
//! pauses (every [`WorkerConfig::control_poll`](crate::WorkerConfig::control_poll), half a
//! second by default):
//! - **Closed** (the usual state, no row or a row counting failures): deliveries run. Each
//!   retryable failure of the handler (an error, a timeout, a
//!   [`HandlerError::retry_after`](crate::HandlerError::retry_after)) is counted in the row,
//!   by whichever worker saw it; a success resets the count. A
//!   [permanent](crate::HandlerError::permanent) error, a payload that does not decode (or
//!   whose upcast panics) and a panicking handler are the message's or the code's fault, not
//!   the dependency's, and are never counted.
//! - **Open**, once [`Breaker::failures`] failures were counted within [`Breaker::window`]
//!   with no success in between, the count having lasted one read of the shared state, or
//!   at once for a `retry_after` (open for that long): no
//!   worker runs the handler. Its messages still run the topic's other handlers, and are then
//!   parked for it, their attempt given back, as for a [pause](crate::Store::pause).
//! - **Probing**: once the cool-down ([`Breaker::cooldown`]) has passed, one worker takes the
//!   probe right and runs the handler on one parked message. A success closes the breaker and
//!   makes every message parked for it claimable; a failure parks the message again (its
//!   attempt not counted) and opens the breaker for twice the cool-down, up to
//!   [`Breaker::max_cooldown`] (or for the `retry_after` it asked for).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The longest window or cool-down accepted (a week, as for the worker's other durations).
const MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// The circuit breaker of a handler: when it opens, and how long it stays open.
///
/// Every handler has one, [`Breaker::default()`] unless set: for all handlers of a worker with
/// [`WorkerConfig::breaker`](crate::WorkerConfig::breaker), or for one handler with
/// [`Handler::breaker`](crate::Handler::breaker).
///
/// ```
/// use outbox::{Breaker, WorkerConfig};
/// use std::time::Duration;
///
/// let config = WorkerConfig::default().breaker(
///     Breaker::default()
///         .failures(10)
///         .window(Duration::from_secs(30))
///         .cooldown(Duration::from_secs(5))
///         .max_cooldown(Duration::from_secs(120)),
/// );
/// let off = WorkerConfig::default().breaker(Breaker::disabled());
/// assert!(!Breaker::disabled().is_enabled());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Breaker {
    pub(crate) enabled: bool,
    pub(crate) failures: u32,
    pub(crate) window: Duration,
    pub(crate) cooldown: Duration,
    pub(crate) max_cooldown: Duration,
}

impl Default for Breaker {
    /// Opens after 5 failures within 60 s with no success between them; probes after 10 s,
    /// then after twice as long after each failed probe, up to 60 s. A dependency that comes
    /// back is thus found within a minute, and one that stays down sees about one call a
    /// minute from the whole deployment.
    fn default() -> Self {
        Self {
            enabled: true,
            failures: 5,
            window: Duration::from_secs(60),
            cooldown: Duration::from_secs(10),
            max_cooldown: Duration::from_secs(60),
        }
    }
}

impl Breaker {
    /// A breaker that never opens: every message spends its attempts on its own schedule.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// Whether this breaker can open.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// How many messages failing, counted across all workers within [`window`](Self::window)
    /// with no success between them, open the breaker (5 by default; at least 1), once the
    /// count has lasted one read of the shared state
    /// ([`WorkerConfig::control_poll`](crate::WorkerConfig::control_poll)), so that every
    /// worker's successes had their chance to reset it.
    /// It also opens when a message fails again while another message failed too, so an
    /// outage charges no message more than two attempts (unless the worker that saw it has
    /// seen no success of the handler since it started: a fresh worker's first outcomes are
    /// mostly its failures, which return sooner); one message failing on its own (a poison
    /// message) never opens it.
    pub fn failures(mut self, n: u32) -> Self {
        self.failures = n;
        self
    }

    /// How far back failures count (60 s by default): a failure older than this starts the
    /// count again.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// How long the breaker stays open before its first probe (10 s by default).
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The longest cool-down, which doubling after failed probes stops at (60 s by default).
    pub fn max_cooldown(mut self, max: Duration) -> Self {
        self.max_cooldown = max;
        self
    }

    /// The cool-down after `failed_probes` probes failed in a row.
    pub(crate) fn cooldown_after(&self, failed_probes: u32) -> Duration {
        let factor = 1u32.checked_shl(failed_probes.min(30)).unwrap_or(u32::MAX);
        self.cooldown
            .saturating_mul(factor)
            .min(self.max_cooldown.max(self.cooldown))
    }

    /// Refuses settings that cannot work, saying which (the worker's builder makes it a
    /// configuration error).
    pub(crate) fn validate(&self, handler: &str) -> Result<(), String> {
        if !self.enabled {
            return Ok(());
        }
        let what = if handler.is_empty() {
            "the worker's breaker".to_string()
        } else {
            format!("the breaker of handler `{handler}`")
        };
        if self.failures == 0 {
            return Err(format!(
                "{what}: failures must be at least 1 (use Breaker::disabled() for none)"
            ));
        }
        if self.window.is_zero() || self.cooldown.is_zero() {
            return Err(format!("{what}: window and cooldown must be above zero"));
        }
        if self.window > MAX || self.cooldown > MAX || self.max_cooldown > MAX {
            return Err(format!(
                "{what}: window, cooldown and max_cooldown are at most {MAX:?}"
            ));
        }
        Ok(())
    }
}

/// One handler's breaker, as [`Store::breakers`](crate::Store::breakers) and
/// [`Store::stats`](crate::Store::stats) list it: only open breakers are listed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BreakerInfo {
    /// The handler's name ([`Handler::NAME`](crate::Handler::NAME)).
    pub handler: String,
    /// When it opened.
    pub opened_at: DateTime<Utc>,
    /// When the next probe may start (one may be running now if this has passed).
    pub next_probe_at: DateTime<Utc>,
    /// Probes that failed since it opened.
    pub failed_probes: u32,
    /// The error that opened it, or the last failed probe's.
    pub last_error: Option<String>,
    /// Messages parked for the handler, waiting for it to close; 0 where a listing does not
    /// count them.
    pub waiting: i64,
}

/// A breaker's row as stored: what the workers share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BreakerRow {
    pub(crate) handler: String,
    /// Open; when false the row only counts failures.
    pub(crate) open: bool,
    /// Messages whose first attempt failed since `window_start` (closed).
    pub(crate) failures: u32,
    /// Failures of later attempts since `window_start` (closed).
    pub(crate) repeats: u32,
    /// When the count began: the time of its first failure by the clock of the worker that
    /// saw it (see [`Failure::at`]).
    pub(crate) window_start: DateTime<Utc>,
    /// Open: since when.
    pub(crate) opened_at: Option<DateTime<Utc>>,
    /// Open: when the next probe may start.
    pub(crate) probe_at: Option<DateTime<Utc>>,
    /// Open: probes failed since it opened.
    pub(crate) failed_probes: u32,
    /// The worker holding the probe right, while a probe runs.
    pub(crate) probe_by: Option<Uuid>,
    pub(crate) last_error: Option<String>,
    /// Messages parked for the handler (counted by listings that ask).
    pub(crate) waiting: i64,
}

impl BreakerRow {
    pub(crate) fn info(&self) -> Option<BreakerInfo> {
        if !self.open {
            return None;
        }
        Some(BreakerInfo {
            handler: self.handler.clone(),
            opened_at: self.opened_at.unwrap_or(self.window_start),
            next_probe_at: self
                .probe_at
                .or(self.opened_at)
                .unwrap_or(self.window_start),
            failed_probes: self.failed_probes,
            last_error: self.last_error.clone(),
            waiting: self.waiting,
        })
    }
}

/// A change of a breaker row, decided from the row as read under its lock and the database's
/// clock: the backends run it inside a transaction (`Backend::breaker_update`).
pub(crate) type Transition<'a> =
    &'a (dyn Fn(Option<&BreakerRow>, DateTime<Utc>) -> Option<BreakerRow> + Send + Sync);

fn add(at: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    at + chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX / 4)
}

/// A retryable failure of a handler, as the worker that saw it reports it to the breaker.
pub(crate) struct Failure<'a> {
    /// The attempt of the message that failed.
    pub(crate) attempt: u32,
    /// What the handler asked for with `HandlerError::retry_after`.
    pub(crate) retry_after: Option<Duration>,
    pub(crate) error: &'a str,
    /// When the failure happened, by the reporting worker's clock. The count's window is
    /// kept in the workers' clocks, the times of the failures and successes themselves, not
    /// of their writes: under load a write lands well after what it reports.
    pub(crate) at: DateTime<Utc>,
    /// When the reporting worker last saw the handler succeed (its own clock), `None` if it
    /// has not since it started. A success after the row's count began means the failures
    /// counted were not in a row: the count starts again. (Other workers' successes also reset
    /// the row at their next read of the breakers; this makes the failing worker's own count
    /// at once, so that scattered failures of a busy handler never add up, while a success
    /// from before the count began, as every worker has when an outage starts, resets nothing.)
    /// A worker with no success yet does not trigger the rule for a message failing again:
    /// the first outcomes of a fresh worker's first claim are mostly failures, which return
    /// sooner than successes, a poison message's retry among them.
    pub(crate) last_success: Option<DateTime<Utc>>,
    /// How long a count must have lasted before it opens the breaker (but for a
    /// `retry_after`): two reads of the shared state, so that every worker has read the row
    /// and, if it sees the handler succeed, reset it. A busy handler's few failures from
    /// several workers can land within milliseconds of each other while each worker's last
    /// success came just before; only the reset from a success after them tells them from the
    /// start of an outage.
    pub(crate) settle: Duration,
}

/// The row after a retryable failure of `handler`, written at `now` (the database's clock):
/// counted, and opened when
/// [`Breaker::failures`] messages failed with no success between them, or when a message
/// failed again while another one failed too (so that no message is charged a third attempt
/// by an outage), or at once for a `retry_after`.
pub(crate) fn failed(
    row: Option<&BreakerRow>,
    now: DateTime<Utc>,
    handler: &str,
    cfg: &Breaker,
    f: &Failure<'_>,
) -> Option<BreakerRow> {
    if let Some(r) = row.filter(|r| r.open) {
        // Already open: a failure of a delivery that started before it opened changes nothing.
        return Some(r.clone());
    }
    let mut r = row.cloned().unwrap_or_else(|| BreakerRow {
        handler: handler.to_string(),
        open: false,
        failures: 0,
        repeats: 0,
        window_start: f.at,
        opened_at: None,
        probe_at: None,
        failed_probes: 0,
        probe_by: None,
        last_error: None,
        waiting: 0,
    });
    let window = chrono::Duration::from_std(cfg.window).unwrap_or(chrono::Duration::MAX / 4);
    let success_since = row.is_some() && f.last_success.is_some_and(|s| s >= r.window_start);
    if (r.failures == 0 && r.repeats == 0) || success_since || f.at - r.window_start > window {
        r.failures = 0;
        r.repeats = 0;
        r.window_start = f.at;
    }
    if f.attempt <= 1 {
        r.failures = r.failures.saturating_add(1);
    } else {
        r.repeats = r.repeats.saturating_add(1);
    }
    r.last_error = Some(f.error.to_string());
    // Not on the word of a worker that has seen no success of the handler yet (see
    // `Failure::last_success`).
    let spreading = f.last_success.is_some() && r.failures >= 2.min(cfg.failures) && r.repeats >= 1;
    let settled = f.at - r.window_start
        >= chrono::Duration::from_std(f.settle).unwrap_or(chrono::Duration::MAX / 4);
    if ((r.failures >= cfg.failures || spreading) && settled) || f.retry_after.is_some() {
        r.open = true;
        r.opened_at = Some(now);
        r.probe_at = Some(add(now, f.retry_after.unwrap_or(cfg.cooldown)));
        r.failed_probes = 0;
        r.probe_by = None;
    }
    Some(r)
}

/// The row after a success of its handler: a counting row is gone; an open one stays (only a
/// probe closes it).
pub(crate) fn succeeded(row: Option<&BreakerRow>) -> Option<BreakerRow> {
    row.filter(|r| r.open).cloned()
}

/// The row when `worker` asks for the probe right at `now`: taken (the probe may run until
/// `now + lease`) if the cool-down has passed and no other probe holds it.
pub(crate) fn probe_taken(
    row: Option<&BreakerRow>,
    now: DateTime<Utc>,
    worker: Uuid,
    lease: Duration,
) -> Option<BreakerRow> {
    let r = row?;
    let mut r = r.clone();
    if r.open && r.probe_at.is_some_and(|at| at <= now) {
        r.probe_by = Some(worker);
        r.probe_at = Some(add(now, lease));
    }
    Some(r)
}

/// Whether `row` holds the probe right for `worker` (what [`probe_taken`] wrote).
pub(crate) fn holds_probe(row: Option<&BreakerRow>, worker: Uuid) -> bool {
    row.is_some_and(|r| r.open && r.probe_by == Some(worker))
}

/// The row after `worker`'s probe failed at `now` (or found no message to probe: `error`
/// `None`, the cool-down not lengthened): open again, for longer.
pub(crate) fn probe_failed(
    row: Option<&BreakerRow>,
    now: DateTime<Utc>,
    worker: Uuid,
    cfg: &Breaker,
    retry_after: Option<Duration>,
    error: Option<&str>,
) -> Option<BreakerRow> {
    let r = row?;
    let mut r = r.clone();
    if !r.open || r.probe_by != Some(worker) {
        return Some(r);
    }
    if let Some(e) = error {
        r.failed_probes = r.failed_probes.saturating_add(1);
        r.last_error = Some(e.to_string());
    }
    let wait = retry_after.unwrap_or_else(|| cfg.cooldown_after(r.failed_probes));
    r.probe_at = Some(add(now, wait));
    r.probe_by = None;
    Some(r)
}

/// The row after `worker`'s probe succeeded: gone (the backend then makes the handler's
/// parked messages claimable).
pub(crate) fn probe_succeeded(row: Option<&BreakerRow>, worker: Uuid) -> Option<BreakerRow> {
    match row {
        Some(r) if r.open && r.probe_by != Some(worker) => Some(r.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    /// `failed` for a failure of attempt `attempt` (`retry_after`: what it asked for), with no
    /// success seen in between.
    fn fail(
        row: Option<&BreakerRow>,
        now: DateTime<Utc>,
        cfg: &Breaker,
        retry_after: Option<Duration>,
        attempt: u32,
    ) -> Option<BreakerRow> {
        let f = Failure {
            attempt,
            retry_after,
            error: "503",
            at: now,
            last_success: Some(at(-100)),
            settle: Duration::ZERO,
        };
        failed(row, now, "h", cfg, &f)
    }

    #[test]
    fn opens_after_the_threshold_within_the_window() {
        let cfg = Breaker::default()
            .failures(3)
            .window(Duration::from_secs(10));
        let mut row = None;
        for s in [0, 1, 2] {
            row = fail(row.as_ref(), at(s), &cfg, None, 1);
        }
        let r = row.clone().unwrap();
        assert!(r.open);
        assert_eq!(r.opened_at, Some(at(2)));
        assert_eq!(r.probe_at, Some(at(12)));
        // Failures spread wider than the window start the count again.
        let mut row = None;
        for s in [0, 5, 20, 25] {
            row = fail(row.as_ref(), at(s), &cfg, None, 1);
        }
        assert!(!row.as_ref().unwrap().open);
        assert_eq!(row.as_ref().unwrap().failures, 2);
        // A success resets the count.
        assert_eq!(succeeded(row.as_ref()), None);
    }

    #[test]
    fn a_message_failing_again_while_another_fails_opens_it() {
        let cfg = Breaker::default();
        // One message failing on its own (a poison message) never opens it.
        let mut row = None;
        for attempt in 1..=8 {
            row = fail(row.as_ref(), at(i64::from(attempt)), &cfg, None, attempt);
        }
        assert!(!row.as_ref().unwrap().open, "{row:?}");
        // A second message failing while the first failed again does: the first is charged
        // two attempts, not three.
        let row = fail(None, at(0), &cfg, None, 1);
        let row = fail(row.as_ref(), at(1), &cfg, None, 2);
        assert!(!row.as_ref().unwrap().open);
        let before = row.clone();
        let row = fail(row.as_ref(), at(2), &cfg, None, 1);
        assert!(row.as_ref().unwrap().open, "{row:?}");
        // Not on the word of a worker that has seen no success yet.
        let f = Failure {
            attempt: 1,
            retry_after: None,
            error: "503",
            at: at(2),
            last_success: None,
            settle: Duration::ZERO,
        };
        let row = failed(before.as_ref(), at(2), "h", &cfg, &f);
        assert!(!row.as_ref().unwrap().open, "{row:?}");
    }

    #[test]
    fn failures_with_successes_between_them_never_add_up() {
        let cfg = Breaker::default();
        // A busy handler failing now and then: each failure comes after a success seen by
        // the worker that reports it, so the count starts again each time.
        let mut row = None;
        for s in 0..50 {
            let f = Failure {
                attempt: if s % 3 == 0 { 2 } else { 1 },
                retry_after: None,
                error: "503",
                at: at(s),
                last_success: Some(at(s)),
                settle: Duration::ZERO,
            };
            row = failed(row.as_ref(), at(s), "h", &cfg, &f);
            let r = row.as_ref().unwrap();
            assert!(!r.open, "{r:?}");
            assert_eq!(r.failures + r.repeats, 1);
        }
        // The same failures in a row open it, successes from before they began included.
        let mut row = None;
        for s in 0..3 {
            row = fail(row.as_ref(), at(s), &cfg, None, if s == 0 { 2 } else { 1 });
        }
        assert!(row.unwrap().open);
    }

    #[test]
    fn a_count_opens_only_once_it_has_lasted_two_reads() {
        let cfg = Breaker::default().failures(3);
        let f = |at: DateTime<Utc>| Failure {
            attempt: 1,
            retry_after: None,
            error: "503",
            at,
            last_success: Some(DateTime::from_timestamp(0, 0).unwrap()),
            settle: Duration::from_secs(1),
        };
        let ms = |n: i64| at(0) + chrono::Duration::milliseconds(n);
        let mut row = None;
        for n in [0, 10, 20, 30, 40] {
            row = failed(row.as_ref(), ms(n), "h", &cfg, &f(ms(n)));
        }
        assert!(!row.as_ref().unwrap().open, "too soon: {row:?}");
        let row = failed(row.as_ref(), ms(1000), "h", &cfg, &f(ms(1000)));
        assert!(row.unwrap().open);
    }

    #[test]
    fn retry_after_opens_for_that_long() {
        let cfg = Breaker::default();
        let r = fail(None, at(0), &cfg, Some(Duration::from_secs(90)), 1).unwrap();
        assert!(r.open);
        assert_eq!(r.probe_at, Some(at(90)));
        // A success does not close an open breaker: only a probe does.
        assert_eq!(succeeded(Some(&r)), Some(r));
    }

    #[test]
    fn probes_take_turns_and_lengthen_the_cooldown_up_to_the_cap() {
        let cfg = Breaker::default()
            .failures(1)
            .cooldown(Duration::from_secs(10))
            .max_cooldown(Duration::from_secs(35));
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let r = fail(None, at(0), &cfg, None, 1);
        // Not due yet: nobody takes it.
        let r = probe_taken(r.as_ref(), at(5), a, Duration::from_secs(30));
        assert!(!holds_probe(r.as_ref(), a));
        let r = probe_taken(r.as_ref(), at(10), a, Duration::from_secs(30));
        assert!(holds_probe(r.as_ref(), a));
        // Taken: another worker does not get it while the probe runs.
        let r = probe_taken(r.as_ref(), at(11), b, Duration::from_secs(30));
        assert!(holds_probe(r.as_ref(), a) && !holds_probe(r.as_ref(), b));
        let mut r = probe_failed(r.as_ref(), at(12), a, &cfg, None, Some("503"));
        let mut waits = Vec::new();
        let mut now = 12;
        for _ in 0..4 {
            let due = r.as_ref().unwrap().probe_at.unwrap();
            waits.push((due - at(now)).num_seconds());
            now = (due - at(0)).num_seconds();
            r = probe_taken(r.as_ref(), due, a, Duration::from_secs(30));
            r = probe_failed(r.as_ref(), due, a, &cfg, None, Some("503"));
        }
        assert_eq!(waits, vec![20, 35, 35, 35]);
        assert_eq!(r.as_ref().unwrap().failed_probes, 5);
        // A probe that found nothing to run waits the same cool-down again.
        let before = r.as_ref().unwrap().failed_probes;
        let due = r.as_ref().unwrap().probe_at.unwrap();
        let r = probe_taken(r.as_ref(), due, b, Duration::from_secs(30));
        let r = probe_failed(r.as_ref(), due, b, &cfg, None, None);
        assert_eq!(r.as_ref().unwrap().failed_probes, before);
        // Only the holder's success closes it.
        let r = probe_taken(r.as_ref(), at(10_000), b, Duration::from_secs(30));
        assert!(probe_succeeded(r.as_ref(), a).is_some());
        assert!(probe_succeeded(r.as_ref(), b).is_none());
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        assert!(Breaker::default().validate("h").is_ok());
        assert!(Breaker::default().failures(0).validate("h").is_err());
        assert!(Breaker::default()
            .cooldown(Duration::ZERO)
            .validate("")
            .is_err());
        assert!(Breaker::disabled().failures(0).validate("h").is_ok());
        assert_eq!(
            Breaker::default().cooldown_after(40),
            Duration::from_secs(60)
        );
    }
}
