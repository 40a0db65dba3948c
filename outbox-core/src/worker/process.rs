//! Running the handlers of one claimed message and turning their results into an outcome.

use std::collections::HashSet;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tracing::Instrument;

use crate::backend::{ClaimedMessage, Failure, Fence};
use crate::handler::{Context, ErasedHandler, FailureKind, HandlerError};
use crate::resources::Resources;
use crate::worker::config::WorkerConfig;
use crate::worker::pauses::PauseSet;

/// What became of one message.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    Failed {
        retry_in: Option<Duration>,
        error: String,
        succeeded: Vec<&'static str>,
        /// The handlers whose failure counts towards their breaker (a retryable failure of a
        /// payload that decodes), with the delay a `retry_after` asked for.
        breaker: Vec<(&'static str, Option<Duration>)>,
    },
    /// Every handler that ran succeeded, and `handler` (the first of them) is paused and did
    /// not run: the message waits for it, parked, its attempt not counted.
    Parked {
        handler: &'static str,
        succeeded: Vec<&'static str>,
    },
}

/// What the engine sees of a claimed message from its own thread: whether its handlers have
/// started (or were withdrawn before they could), which handler runs, and since when its
/// current poll has not returned (a handler that holds its thread).
pub(crate) struct Watch {
    epoch: Instant,
    /// [`WAITING`] until the task first runs, then microseconds since `epoch` at that moment
    /// plus one; [`WITHDRAWN`] when the engine took the message back before it started. Moving
    /// away from [`WAITING`] is a compare-and-swap, so a message either starts or is withdrawn,
    /// never both.
    start: AtomicU64,
    handler: Mutex<&'static str>,
    /// Microseconds since `epoch` when the current poll began, plus one; 0 between polls.
    poll_since: AtomicU64,
    /// The spans of the attempt running now: its delivery's, and the running handler's.
    #[cfg(feature = "opentelemetry")]
    spans: Mutex<(Option<tracing::Span>, Option<tracing::Span>)>,
}

/// [`Watch::start`]: the message's task has not run yet.
const WAITING: u64 = 0;
/// [`Watch::start`]: the message was withdrawn before its task ran; it never will.
const WITHDRAWN: u64 = u64::MAX;

impl Watch {
    pub(crate) fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            start: AtomicU64::new(WAITING),
            handler: Mutex::new(""),
            poll_since: AtomicU64::new(0),
            #[cfg(feature = "opentelemetry")]
            spans: Mutex::new((None, None)),
        }
    }

    /// Notes the span of the delivery starting now, so that [`fail_spans`](Self::fail_spans)
    /// reaches it; `None` once the delivery ended, so that the span ends then, not with the
    /// watch.
    fn delivery_span(&self, span: Option<&tracing::Span>) {
        #[cfg(feature = "opentelemetry")]
        {
            *self.spans() = (span.cloned(), None);
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = span;
    }

    /// The same for the span of the handler starting now within the delivery.
    fn handler_span(&self, span: Option<&tracing::Span>) {
        #[cfg(feature = "opentelemetry")]
        {
            self.spans().1 = span.cloned();
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = span;
    }

    #[cfg(feature = "opentelemetry")]
    fn spans(&self) -> std::sync::MutexGuard<'_, (Option<tracing::Span>, Option<tracing::Span>)> {
        self.spans
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks the running attempt's delivery span and its running handler's span as failed
    /// with `error`: the engine calls it when it ends an attempt whose handler never returned
    /// (a handler past its deadline), which the attempt's own code cannot.
    pub(crate) fn fail_spans(&self, error: &str) {
        #[cfg(feature = "opentelemetry")]
        {
            let spans = std::mem::take(&mut *self.spans());
            for span in [spans.0, spans.1].iter().flatten() {
                crate::trace::set_error(span, error);
            }
        }
        #[cfg(not(feature = "opentelemetry"))]
        let _ = error;
    }

    /// Called by the message's task when it first runs: true if its handlers may run now,
    /// false if the engine withdrew the message first (the task must then do nothing).
    pub(crate) fn begin(&self) -> bool {
        self.start
            .compare_exchange(WAITING, self.micros(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Called by the engine to take back a message whose task has not run: true if it did
    /// (the task will never run a handler), false if the task started first.
    pub(crate) fn withdraw(&self) -> bool {
        self.start
            .compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the message was withdrawn before it started.
    pub(crate) fn withdrawn(&self) -> bool {
        self.start.load(Ordering::Acquire) == WITHDRAWN
    }

    /// When the message's task started, if it has.
    pub(crate) fn started_at(&self) -> Option<Instant> {
        match self.start.load(Ordering::Acquire) {
            WAITING | WITHDRAWN => None,
            since => Some(self.epoch + Duration::from_micros(since - 1)),
        }
    }

    /// The handler running now (or last).
    pub(crate) fn handler(&self) -> &'static str {
        *self
            .handler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How long the current poll has been running, if one is.
    pub(crate) fn holding(&self, now: Instant) -> Option<Duration> {
        match self.poll_since.load(Ordering::Relaxed) {
            0 => None,
            since => {
                let started = self.epoch + Duration::from_micros(since - 1);
                Some(now.saturating_duration_since(started))
            }
        }
    }

    /// Microseconds since `epoch`, plus one: never 0 ([`WAITING`]) nor [`WITHDRAWN`].
    fn micros(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .min(u64::MAX - 2)
            + 1
    }
}

/// A future whose polls are timed into a [`Watch`].
struct Watched<'a, F> {
    inner: Pin<Box<F>>,
    watch: &'a Watch,
}

impl<F: Future> Future for Watched<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<F::Output> {
        let watch = self.watch;
        watch.poll_since.store(watch.micros(), Ordering::Relaxed);
        let r = self.inner.as_mut().poll(cx);
        watch.poll_since.store(0, Ordering::Relaxed);
        r
    }
}

/// The outcome of a message whose handler `handler` held its thread past its deadline: the
/// engine writes it, since a handler that never yields never reaches its own timeout. Only a
/// handler that started and holds its thread gets here; a message waiting for a thread or a
/// permit is never timed out.
pub(crate) fn timed_out(
    handlers: &[Arc<dyn ErasedHandler>],
    handler: &str,
    attempt: u32,
    held: Duration,
    config: &WorkerConfig,
) -> (Option<Duration>, String) {
    let h = handlers
        .iter()
        .find(|h| h.name() == handler)
        .or(handlers.first());
    let timeout = h
        .and_then(|h| h.timeout())
        .unwrap_or(config.handler_timeout);
    let max_attempts = h
        .and_then(|h| h.max_attempts())
        .unwrap_or(config.retry.attempt_limit())
        .max(1);
    let retry_in = (attempt < max_attempts).then(|| {
        h.and_then(|h| h.backoff(attempt))
            .unwrap_or_else(|| config.retry.backoff(attempt))
    });
    (
        retry_in,
        format!(
            "handler `{handler}`: timed out after {timeout:?}: it held its thread past its deadline \
             (its current poll has not returned for {held:?}); move blocking work into \
             tokio::task::spawn_blocking"
        ),
    )
}

/// Runs every handler of `msg` that has not succeeded yet, one after another, in the span of
/// this delivery (which continues the trace stored with the message, see [`crate::trace`]);
/// that span and each failed handler's span get an error status when the attempt fails.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_message(
    msg: &ClaimedMessage,
    handlers: &[Arc<dyn ErasedHandler>],
    completed: &HashSet<String>,
    config: &WorkerConfig,
    resources: &Arc<Resources>,
    watch: &Watch,
    paused: &PauseSet,
    probe: Option<&str>,
) -> Outcome {
    let attempt = u32::try_from(msg.attempts).unwrap_or(u32::MAX);
    let delivery = crate::trace::delivery_span(msg.id, &msg.topic, attempt, msg.trace.as_ref());
    watch.delivery_span(Some(&delivery));
    let outcome = run_handlers(
        msg, handlers, completed, config, resources, watch, paused, probe, attempt, &delivery,
    )
    .instrument(delivery.clone())
    .await;
    // A failed attempt is an error in the trace, whichever way it failed (a handler's error or
    // attempts exhausted); a successful one keeps the status unset.
    if let Outcome::Failed { error, .. } = &outcome {
        crate::trace::set_error(&delivery, error);
    }
    watch.delivery_span(None);
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn run_handlers(
    msg: &ClaimedMessage,
    handlers: &[Arc<dyn ErasedHandler>],
    completed: &HashSet<String>,
    config: &WorkerConfig,
    resources: &Arc<Resources>,
    watch: &Watch,
    paused: &PauseSet,
    probe: Option<&str>,
    attempt: u32,
    delivery: &tracing::Span,
) -> Outcome {
    let topic: Arc<str> = Arc::from(msg.topic.as_str());
    let mut succeeded = Vec::new();
    let mut errors = Vec::new();
    let mut retry_in: Option<Duration> = Some(Duration::ZERO);
    let mut exhausted = false;
    // The first paused handler that has not succeeded: the message waits for it.
    let mut parked: Option<&'static str> = None;
    let mut breaker = Vec::new();
    for h in handlers.iter().filter(|h| !completed.contains(h.name())) {
        if paused.handler_held(h.name(), probe) {
            parked = parked.or(Some(h.name()));
            continue;
        }
        let max_attempts = h
            .max_attempts()
            .unwrap_or(config.retry.attempt_limit())
            .max(1);
        if attempt > max_attempts {
            // Attempts count at claim: this one is past the limit because earlier attempts
            // ended without an outcome (the worker crashed, was killed or lost its lease).
            // Running it again could crash again for ever; dead-letter it instead.
            tracing::error!(
                message_id = %msg.id,
                topic = %msg.topic,
                handler = h.name(),
                attempt,
                "attempts exhausted by attempts that never finished; the message is dead-lettered"
            );
            retry_in = None;
            exhausted = true;
            errors.push(format!(
                "handler `{}`: attempt {attempt} is past the limit of {max_attempts}; the earlier attempts \
                 ended without an outcome (the worker crashed, was killed or lost its lease)",
                h.name()
            ));
            continue;
        }
        let span = crate::trace::handler_span(delivery, h.name());
        watch.handler_span(Some(&span));
        let ctx = Context {
            message_id: msg.id,
            topic: topic.clone(),
            handler: h.name(),
            attempt,
            max_attempts,
            created_at: msg.created_at,
            version: msg.version,
            idempotency_key: msg
                .idempotency_key
                .clone()
                .unwrap_or_else(|| crate::handler::default_idempotency_key(msg.id, h.name())),
            resources: resources.clone(),
            // The handler's own span when it is traced, so that downstream work is its child;
            // else what the producer stored, passed on as it is.
            trace: crate::trace::TraceContext::of_span(&span).or_else(|| msg.trace.clone()),
        };
        let timeout = h.timeout().unwrap_or(config.handler_timeout);
        let started = std::time::Instant::now();
        *watch
            .handler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = h.name();
        let result = Watched {
            inner: Box::pin(
                call_handler(&**h, &msg.payload, msg.version, &ctx, timeout)
                    .instrument(span.clone()),
            ),
            watch,
        }
        .await;
        watch.handler_span(None);
        metrics::histogram!(crate::metrics::HANDLER_DURATION, "topic" => h.topic(), "handler" => h.name())
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => succeeded.push(h.name()),
            Err(e) => {
                let chain = e.chain_string();
                crate::trace::set_error(&span, &chain);
                let _enter = span.enter();
                // The dependency's fault, not the message's: counted towards the breaker.
                if e.counts_towards_breaker() {
                    let retry_after = match e.kind() {
                        FailureKind::RetryAfter(d) => Some(d),
                        _ => None,
                    };
                    breaker.push((h.name(), retry_after));
                }
                let delay = match e.kind() {
                    FailureKind::Permanent => None,
                    _ if attempt >= max_attempts => None,
                    FailureKind::RetryAfter(d) => Some(d.min(MAX_RETRY_AFTER)),
                    _ => Some(
                        h.backoff(attempt)
                            .unwrap_or_else(|| config.retry.backoff(attempt)),
                    ),
                };
                match delay {
                    None => {
                        tracing::error!(error = %chain, "handler failed; the message is dead-lettered")
                    }
                    Some(d) => {
                        tracing::warn!(error = %chain, retry_in = ?d, "handler failed; will retry")
                    }
                }
                // The message goes dead if any handler must stop; otherwise it waits for the
                // longest delay any failing handler asked for.
                retry_in = match (retry_in, delay) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                errors.push(format!("handler `{}`: {chain}", h.name()));
            }
        }
    }
    if exhausted {
        // The dead letter keeps what a finished attempt said: most often what the operator
        // needs (the crash itself left no error behind).
        if let Some(before) = msg.last_error.as_deref() {
            errors.push(format!("the last error recorded before: {before}"));
        }
    }
    if let (true, Some(handler)) = (errors.is_empty(), parked) {
        Outcome::Parked { handler, succeeded }
    } else if errors.is_empty() {
        Outcome::Done
    } else {
        Outcome::Failed {
            retry_in,
            error: crate::diagnostics::bound_error(&errors.join("; "), config.max_error_bytes),
            succeeded,
            breaker,
        }
    }
}

/// The longest delay a handler may ask for with `HandlerError::retry_after`: longer ones are cut
/// to this (a week), so that the due time stays a valid timestamp in every database.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// Calls one handler with its timeout, turning a panic or a timeout into a failed attempt.
pub(super) async fn call_handler(
    h: &dyn ErasedHandler,
    payload: &str,
    version: u32,
    ctx: &Context,
    timeout: Duration,
) -> Result<(), HandlerError> {
    // The payload is decoded (and upcast) inside the call: a panicking `From` is caught here
    // as a handler's panic is.
    let call = AssertUnwindSafe(h.call(payload, version, ctx)).catch_unwind();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => Err(HandlerError::retry(format!(
            "handler panicked: {}",
            crate::diagnostics::panic_message(&*panic)
        ))
        .not_dependency()),
        Err(_) => Err(HandlerError::retry(format!(
            "handler timed out after {timeout:?}"
        ))),
    }
}

/// The failure to write for a message.
pub(crate) fn failure<'a>(
    fence: Fence,
    retry_in: Option<Duration>,
    error: &'a str,
    succeeded: &'a [&'a str],
) -> Failure<'a> {
    Failure {
        fence,
        retry_in,
        error,
        succeeded,
    }
}

#[cfg(test)]
mod tests {
    use crate::diagnostics::bound_error;

    #[test]
    fn errors_are_cut_on_a_char_boundary_with_a_marker() {
        assert_eq!(bound_error("short", 100), "short");
        let long = "é".repeat(5000);
        let cut = bound_error(&long, 4096);
        assert!(cut.len() <= 4096, "{}", cut.len());
        assert!(cut.ends_with("[truncated, 10000 bytes in all]"));
    }
}
