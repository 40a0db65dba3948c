//! The inbox's handlers with their event type erased ([`Route`]), and the failure a handler's
//! error becomes ([`tag`]): the handler named, its own backoff attached.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use outbox::{Connection, Context, Event, FailureKind, HandlerError, Resources};
use sqlx::{Database, Pool};

use super::InboxMessage;
use crate::dedup::{record, TxHandler};

/// A handler of the inbox on database `DB`, its event type erased.
#[async_trait]
pub(super) trait Route<DB: Database>: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn type_name(&self) -> &'static str;
    fn backoff(&self, attempt: u32) -> Option<Duration>;
    /// Runs the handler once for `message` unless recorded; true when it ran.
    async fn run(
        &self,
        payload: &[u8],
        message: &InboxMessage,
        pool: &Pool<DB>,
        resources: &Resources,
        max_attempts: u32,
    ) -> Result<bool, HandlerError>;
}

pub(super) struct Typed<H>(pub(super) H);

#[async_trait]
impl<DB, H> Route<DB> for Typed<H>
where
    DB: Database,
    DB::Connection: Connection,
    H: TxHandler<DB>,
{
    fn name(&self) -> &'static str {
        H::NAME
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<H>()
    }

    fn backoff(&self, attempt: u32) -> Option<Duration> {
        self.0.backoff(attempt)
    }

    async fn run(
        &self,
        payload: &[u8],
        message: &InboxMessage,
        pool: &Pool<DB>,
        resources: &Resources,
        max_attempts: u32,
    ) -> Result<bool, HandlerError> {
        let json = std::str::from_utf8(payload).map_err(|e| {
            HandlerError::retry(format!(
                "payload of `{}` is not UTF-8: {e}",
                std::any::type_name::<H::Event>()
            ))
        })?;
        let event = H::Event::decode_versioned(message.version, json)
            .map_err(|e| HandlerError::retry(e.to_string()))?;
        let mut tx = pool.begin().await?;
        if !record(&mut *tx, H::NAME, message.message_id).await? {
            tx.rollback().await?;
            tracing::debug!(handler = H::NAME, message_id = %message.message_id,
                "message already processed by this handler; skipped");
            return Ok(false);
        }
        let mut resources = resources.clone();
        resources.insert(message.clone());
        let trace = outbox::trace::TraceContext::current().or_else(|| message.trace.clone());
        let mut ctx = Context::for_delivery(message.message_id, &message.topic, H::NAME, resources)
            .with_attempt(message.delivered, max_attempts)
            .with_version(message.version)
            .with_trace_context(trace);
        if let Some(created_at) = message.created_at {
            ctx = ctx.with_created_at(created_at);
        }
        let call = self.0.handle(event, &ctx, &mut tx);
        let result = match self.0.timeout() {
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(HandlerError::retry(format!(
                    "handler `{}` timed out after {limit:?}",
                    H::NAME
                )))
            }),
            None => call.await,
        };
        if let Err(e) = result {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "rollback after a failed handler did not complete");
            }
            return Err(e);
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// A handler failure with the handler named and its own backoff attached.
#[derive(Debug)]
struct Failed {
    handler: &'static str,
    type_name: &'static str,
    backoff: Option<Duration>,
    message: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "handler `{}` ({}): {}",
            self.handler, self.type_name, self.message
        )
    }
}

impl std::error::Error for Failed {}

pub(super) fn tag(
    e: HandlerError,
    handler: &'static str,
    type_name: &'static str,
    backoff: Option<Duration>,
) -> HandlerError {
    let failed = Failed {
        handler,
        type_name,
        backoff,
        message: e.chain_string(),
    };
    match e.kind() {
        FailureKind::Permanent => HandlerError::permanent(failed),
        FailureKind::RetryAfter(d) => HandlerError::retry_after(d, failed),
        _ => HandlerError::retry(failed),
    }
}

pub(super) fn retry_delay(e: &HandlerError) -> Option<Duration> {
    let source: &(dyn std::error::Error + 'static) = e.source();
    source.downcast_ref::<Failed>().and_then(|f| f.backoff)
}

/// The delay the worker would use: 1 s doubling, at most 60 s.
pub(super) fn default_backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}
