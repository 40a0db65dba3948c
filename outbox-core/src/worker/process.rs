//! Running the handlers of one claimed message and turning their results into an outcome.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;

use crate::backend::{ClaimedMessage, Failure, Fence};
use crate::handler::{Context, ErasedHandler, FailureKind, HandlerError};
use crate::resources::Resources;
use crate::worker::config::WorkerConfig;

/// What became of one message.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    Failed {
        retry_in: Option<Duration>,
        error: String,
        succeeded: Vec<&'static str>,
    },
}

/// Runs every handler of `msg` that has not succeeded yet, one after another.
pub(crate) async fn run_message(
    msg: &ClaimedMessage,
    handlers: &[Arc<dyn ErasedHandler>],
    completed: &HashSet<String>,
    config: &WorkerConfig,
    resources: &Arc<Resources>,
) -> Outcome {
    let attempt = u32::try_from(msg.attempts).unwrap_or(u32::MAX);
    let topic: Arc<str> = Arc::from(msg.topic.as_str());
    let mut succeeded = Vec::new();
    let mut errors = Vec::new();
    let mut retry_in: Option<Duration> = Some(Duration::ZERO);
    let mut exhausted = false;
    for h in handlers.iter().filter(|h| !completed.contains(h.name())) {
        let max_attempts = h
            .max_attempts()
            .unwrap_or(config.retry.get_max_attempts())
            .max(1);
        if attempt > max_attempts {
            // Attempts count at claim: this one is past the limit because earlier attempts
            // ended without an outcome (the worker crashed, was killed or lost its lease).
            // Running it again could crash again for ever; dead-letter it instead.
            tracing::error!(
                message_id = %msg.public_id,
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
        let ctx = Context {
            message_id: msg.public_id,
            topic: topic.clone(),
            handler: h.name(),
            attempt,
            max_attempts,
            created_at: msg.created_at,
            idempotency_key: msg
                .idempotency_key
                .clone()
                .unwrap_or_else(|| format!("{}:{}", msg.public_id, h.name())),
            resources: resources.clone(),
        };
        let span = tracing::info_span!(
            "outbox.delivery",
            message_id = %msg.public_id,
            topic = %msg.topic,
            attempt,
            handler = h.name(),
        );
        let timeout = h.timeout().unwrap_or(config.handler_timeout);
        let started = std::time::Instant::now();
        let result = call_handler(&**h, &msg.payload, &ctx, timeout)
            .instrument(span.clone())
            .await;
        metrics::histogram!(crate::metrics::HANDLER_DURATION, "topic" => msg.topic.clone(), "handler" => h.name())
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => succeeded.push(h.name()),
            Err(e) => {
                let chain = e.chain_string();
                let _enter = span.enter();
                let delay = match e.kind() {
                    FailureKind::Permanent => None,
                    _ if attempt >= max_attempts => None,
                    FailureKind::RetryAfter(d) => Some(d),
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
    if errors.is_empty() {
        Outcome::Done
    } else {
        Outcome::Failed {
            retry_in,
            error: bound_error(&errors.join("; "), config.max_error_bytes),
            succeeded,
        }
    }
}

/// Calls one handler with its timeout, turning a panic or a timeout into a failed attempt.
async fn call_handler(
    h: &dyn ErasedHandler,
    payload: &str,
    ctx: &Context,
    timeout: Duration,
) -> Result<(), HandlerError> {
    let call = AssertUnwindSafe(h.call(payload, ctx)).catch_unwind();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            Err(HandlerError::retry(format!("handler panicked: {msg}")))
        }
        Err(_) => Err(HandlerError::retry(format!(
            "handler timed out after {timeout:?}"
        ))),
    }
}

/// Cuts `error` to at most `max` bytes on a character boundary, with a marker.
pub(crate) fn bound_error(error: &str, max: usize) -> String {
    if error.len() <= max {
        return error.to_string();
    }
    let marker = format!(" ... [truncated, {} bytes in all]", error.len());
    let mut end = max.saturating_sub(marker.len());
    while end > 0 && !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &error[..end])
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
    use super::bound_error;

    #[test]
    fn errors_are_cut_on_a_char_boundary_with_a_marker() {
        assert_eq!(bound_error("short", 100), "short");
        let long = "é".repeat(5000);
        let cut = bound_error(&long, 4096);
        assert!(cut.len() <= 4096, "{}", cut.len());
        assert!(cut.ends_with("[truncated, 10000 bytes in all]"));
    }
}
