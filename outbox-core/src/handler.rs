//! The [`Handler`] trait and what a delivery looks like to a handler.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::event::Event;
use crate::resources::Resources;

/// A boxed error, the source of a [`HandlerError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Code that reacts to one event type.
///
/// A handler has one required method, [`handle`](Handler::handle), and a stable
/// [`NAME`](Handler::NAME): the key of its delivery record, so that a retry of a message with
/// several handlers runs only those that have not yet succeeded. Renaming a handler makes
/// in-flight messages run it again; keep names stable.
///
/// Delivery is at least once: a handler may see the same message again after a crash or a lost
/// outcome. Make the effect idempotent, for example by sending [`Context::idempotency_key`]
/// downstream.
///
/// The optional methods override the worker's retry policy for this handler.
///
/// # About type parameter `Event`
///
/// `Event` is the payload type, a type with `#[outbox_event]`. Its topic decides which messages
/// reach this handler.
///
/// # Example
///
/// ```
/// use outbox::{outbox_event, register_handler, Context, FromResources, Handler, HandlerError};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct BookingCreated { booking_id: i64 }
///
/// #[derive(Default)]
/// struct SendConfirmation;
///
/// #[outbox::async_trait]
/// impl Handler for SendConfirmation {
///     type Event = BookingCreated;
///     const NAME: &'static str = "send-confirmation";
///
///     async fn handle(&self, event: BookingCreated, ctx: &Context) -> Result<(), HandlerError> {
///         println!("booking {} (key {})", event.booking_id, ctx.idempotency_key());
///         Ok(())
///     }
/// }
///
/// impl FromResources for SendConfirmation {
///     fn from_resources(_: &outbox::Resources) -> Result<Self, outbox::ResourceError> {
///         Ok(SendConfirmation)
///     }
/// }
///
/// register_handler!(SendConfirmation);
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// The event type this handler reacts to.
    type Event: Event;

    /// The handler's stable name, unique among the handlers of its topic.
    const NAME: &'static str;

    /// Handles one delivery. Return `Ok(())` when the effect is done.
    ///
    /// `?` on any error gives a retryable failure; use [`HandlerError::permanent`] for failures
    /// no retry can fix and [`HandlerError::retry_after`] to ask for a specific delay.
    async fn handle(&self, event: Self::Event, ctx: &Context) -> Result<(), HandlerError>;

    /// The most attempts for messages of this handler, overriding the worker's retry policy.
    fn max_attempts(&self) -> Option<u32> {
        None
    }

    /// How long one call may run before it counts as a failed attempt, overriding the worker's
    /// handler timeout.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// The delay before the next attempt after attempt number `attempt` (1-based) failed,
    /// overriding the worker's backoff. Return `None` to use the worker's.
    fn backoff(&self, attempt: u32) -> Option<Duration> {
        let _ = attempt;
        None
    }
}

/// A handler of a topic's payload as stored, the JSON written at enqueue, without decoding it
/// into an event type: for handlers that pass messages on unchanged (a relay to a broker, an
/// archive), so that one handler can serve topics whose types it does not know.
///
/// Added to a worker per topic with [`WorkerBuilder::raw_handler`](crate::WorkerBuilder::raw_handler),
/// or for every event declared in the binary with
/// [`WorkerBuilder::raw_handler_for_declared_events`](crate::WorkerBuilder::raw_handler_for_declared_events).
/// Retries, timeouts, dead letters and per-handler progress are those of any handler.
///
/// # Example
///
/// ```
/// use outbox::{async_trait, Context, HandlerError, RawHandler};
///
/// /// Appends every message to a log, whatever its type.
/// struct Archive;
///
/// #[async_trait]
/// impl RawHandler for Archive {
///     const NAME: &'static str = "archive";
///
///     async fn handle_raw(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError> {
///         println!("{} {}: {payload}", ctx.topic(), ctx.message_id());
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait RawHandler: Send + Sync + 'static {
    /// The handler's stable name, unique among the handlers of each topic it serves.
    const NAME: &'static str;

    /// Handles one delivery of a message whose stored payload (JSON) is `payload`.
    async fn handle_raw(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError>;

    /// As [`Handler::max_attempts`].
    fn max_attempts(&self) -> Option<u32> {
        None
    }

    /// As [`Handler::timeout`].
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// As [`Handler::backoff`].
    fn backoff(&self, attempt: u32) -> Option<Duration> {
        let _ = attempt;
        None
    }
}

/// What a failed handler call asks the worker to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Retry with the usual backoff, or dead-letter if this was the last attempt.
    Retry,
    /// Retry after this delay instead of the backoff (still bounded by the attempt limit).
    RetryAfter(Duration),
    /// No retry can fix this: dead-letter the message now.
    Permanent,
}

/// A failed handler call, and what the worker should do about it.
///
/// Any error converts into a retryable `HandlerError` through `?`.
///
/// # Example
///
/// ```
/// use outbox::{FailureKind, HandlerError};
/// use std::time::Duration;
///
/// let e = HandlerError::permanent("recipient address is malformed");
/// assert_eq!(e.kind(), FailureKind::Permanent);
///
/// let e = HandlerError::retry_after(Duration::from_secs(30), "rate limited");
/// assert_eq!(e.kind(), FailureKind::RetryAfter(Duration::from_secs(30)));
///
/// fn parse(s: &str) -> Result<i32, HandlerError> {
///     Ok(s.parse::<i32>()?) // a retryable failure
/// }
/// assert_eq!(parse("x").unwrap_err().kind(), FailureKind::Retry);
/// ```
pub struct HandlerError {
    kind: FailureKind,
    source: BoxError,
}

impl HandlerError {
    /// A failure to retry with the usual backoff.
    pub fn retry(source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::Retry,
            source: source.into(),
        }
    }

    /// A failure to retry after `delay`, for example a provider's `Retry-After`.
    pub fn retry_after(delay: Duration, source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::RetryAfter(delay),
            source: source.into(),
        }
    }

    /// A failure no retry can fix: the message is dead-lettered now.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::Permanent,
            source: source.into(),
        }
    }

    /// What the worker will do about this failure.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The error and its chain of sources as one line, `outer: inner: ...`.
    pub fn chain_string(&self) -> String {
        crate::diagnostics::error_chain(&*self.source)
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(e: E) -> Self {
        HandlerError::retry(e)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.chain_string())
    }
}

/// What a handler knows about the delivery it is handling.
///
/// ```
/// use outbox::{outbox_event, Context, Handler, HandlerError, Resources};
///
/// #[outbox_event]
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct InvoiceDue { invoice_id: i64 }
///
/// struct Remind;
///
/// #[outbox::async_trait]
/// impl Handler for Remind {
///     type Event = InvoiceDue;
///     const NAME: &'static str = "remind";
///     async fn handle(&self, e: InvoiceDue, ctx: &Context) -> Result<(), HandlerError> {
///         // The same key on every retry: the mail provider sends once.
///         let key = ctx.idempotency_key();
///         if ctx.is_last_attempt() {
///             eprintln!("last try for invoice {} (attempt {})", e.invoice_id, ctx.attempt());
///         }
///         assert!(key.ends_with(":remind"));
///         Ok(())
///     }
/// }
///
/// // A handler can be called directly in a unit test with a made-up context.
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let ctx = Context::for_test("invoice.due", Remind::NAME, Resources::new()).with_attempt(8, 8);
/// Remind.handle(InvoiceDue { invoice_id: 7 }, &ctx).await.unwrap();
/// # });
/// ```
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) message_id: Uuid,
    pub(crate) topic: Arc<str>,
    pub(crate) handler: &'static str,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) idempotency_key: String,
    pub(crate) resources: Arc<Resources>,
    pub(crate) trace: Option<crate::trace::TraceContext>,
}

impl Context {
    /// The message's public id (a UUID v7), stable across retries.
    pub fn message_id(&self) -> Uuid {
        self.message_id
    }

    /// The topic of the message.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The name of the handler being called.
    pub fn handler_name(&self) -> &'static str {
        self.handler
    }

    /// This attempt's number, starting at 1. Counted at claim, so a crash counts too.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The attempt after which a failure dead-letters the message.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// True when a retryable failure of this attempt will dead-letter the message.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// When the message was enqueued.
    pub fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    /// The key to send downstream so the effect happens once, identical on every retry.
    ///
    /// The key given at enqueue time or returned by [`Event::idempotency_key`] if there was one;
    /// otherwise `"{message_id}:{handler_name}"`.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// The worker's resources.
    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// The W3C trace context to send downstream with this delivery's effect, as the
    /// `traceparent` and `tracestate` headers: the context of the handler's span when the
    /// `opentelemetry` feature is on and a `tracing-opentelemetry` layer records it, otherwise
    /// the context stored with the message at enqueue, if any. The broker relays of
    /// `outbox-handlers` put it in their message headers.
    ///
    /// ```
    /// use outbox::{trace::TraceContext, Context, Resources};
    ///
    /// let ctx = Context::for_test("booking.created", "relay", Resources::new());
    /// assert!(ctx.trace_context().is_none());
    /// let cx = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
    /// let ctx = ctx.with_trace_context(Some(cx.clone()));
    /// assert_eq!(ctx.trace_context(), Some(&cx));
    /// ```
    pub fn trace_context(&self) -> Option<&crate::trace::TraceContext> {
        self.trace.as_ref()
    }

    /// A context for calling a handler directly, in a unit test of the handler.
    ///
    /// ```
    /// use outbox::{Context, Resources};
    /// let ctx = Context::for_test("booking.created", "send-confirmation", Resources::new());
    /// assert_eq!(ctx.attempt(), 1);
    /// ```
    pub fn for_test(topic: &str, handler: &'static str, resources: Resources) -> Self {
        Self::for_delivery(
            crate::message_id::new_message_id(),
            topic,
            handler,
            resources,
        )
    }

    /// A context for a delivery of message `message_id` that does not come from this outbox's
    /// worker: a message another service's outbox relayed through a broker and an inbox runs
    /// handlers for, or a handler your own code calls. Attempt 1 of 1, enqueued now and keyed
    /// `"{message_id}:{handler}"` unless the `with_` methods say otherwise.
    ///
    /// ```
    /// use outbox::{Context, Resources};
    /// let id = outbox::new_message_id();
    /// let ctx = Context::for_delivery(id, "booking.created", "count-booking", Resources::new())
    ///     .with_attempt(2, 8);
    /// assert_eq!(ctx.message_id(), id);
    /// assert_eq!(ctx.idempotency_key(), format!("{id}:count-booking"));
    /// ```
    pub fn for_delivery(
        message_id: Uuid,
        topic: &str,
        handler: &'static str,
        resources: Resources,
    ) -> Self {
        Self {
            message_id,
            topic: Arc::from(topic),
            handler,
            attempt: 1,
            max_attempts: 1,
            created_at: Utc::now(),
            idempotency_key: default_idempotency_key(message_id, handler),
            resources: Arc::new(resources),
            trace: None,
        }
    }

    /// Returns the context with the time the message was enqueued.
    pub fn with_created_at(mut self, created_at: DateTime<Utc>) -> Self {
        self.created_at = created_at;
        self
    }

    /// Returns the context with another idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = key.into();
        self
    }

    /// Returns the context with the trace context to hand downstream (see
    /// [`trace_context`](Self::trace_context)).
    pub fn with_trace_context(mut self, trace: Option<crate::trace::TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// Returns the context with another attempt number, for tests of retry behaviour.
    pub fn with_attempt(mut self, attempt: u32, max_attempts: u32) -> Self {
        self.attempt = attempt;
        self.max_attempts = max_attempts;
        self
    }
}

/// The type-erased form of a handler that the worker stores: decodes JSON, calls the typed
/// handler.
#[async_trait]
pub(crate) trait ErasedHandler: Send + Sync + 'static {
    fn topic(&self) -> &'static str;
    fn name(&self) -> &'static str;
    fn type_name(&self) -> &'static str;
    fn max_attempts(&self) -> Option<u32>;
    fn timeout(&self) -> Option<Duration>;
    fn backoff(&self, attempt: u32) -> Option<Duration>;
    async fn call(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError>;
}

pub(crate) struct Typed<H>(pub(crate) H);

#[async_trait]
impl<H: Handler> ErasedHandler for Typed<H> {
    fn topic(&self) -> &'static str {
        <H::Event as Event>::TOPIC
    }
    fn name(&self) -> &'static str {
        H::NAME
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<H>()
    }
    fn max_attempts(&self) -> Option<u32> {
        self.0.max_attempts()
    }
    fn timeout(&self) -> Option<Duration> {
        self.0.timeout()
    }
    fn backoff(&self, attempt: u32) -> Option<Duration> {
        self.0.backoff(attempt)
    }
    async fn call(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError> {
        let event: H::Event = serde_json::from_str(payload).map_err(|e| {
            HandlerError::retry(PayloadError {
                type_name: std::any::type_name::<H::Event>(),
                source: e,
            })
        })?;
        self.0.handle(event, ctx).await
    }
}

/// A stored payload does not deserialize into the handler's event type.
#[derive(Debug, thiserror::Error)]
#[error("payload does not deserialize into `{type_name}`: {source}; fix the payload or make the type accept it (e.g. #[serde(default)] on new fields)")]
pub struct PayloadError {
    type_name: &'static str,
    #[source]
    source: serde_json::Error,
}

pub(crate) fn erase<H: Handler>(h: H) -> Arc<dyn ErasedHandler> {
    Arc::new(Typed(h))
}

/// The idempotency key of a delivery when the event and the enqueue gave none:
/// `"{message_id}:{handler}"`, the same on every retry and distinct per handler.
pub(crate) fn default_idempotency_key(message_id: Uuid, handler: &str) -> String {
    format!("{message_id}:{handler}")
}

/// A [`RawHandler`] serving one topic.
struct Raw<H> {
    topic: &'static str,
    handler: Arc<H>,
}

#[async_trait]
impl<H: RawHandler> ErasedHandler for Raw<H> {
    fn topic(&self) -> &'static str {
        self.topic
    }
    fn name(&self) -> &'static str {
        H::NAME
    }
    fn type_name(&self) -> &'static str {
        std::any::type_name::<H>()
    }
    fn max_attempts(&self) -> Option<u32> {
        self.handler.max_attempts()
    }
    fn timeout(&self) -> Option<Duration> {
        self.handler.timeout()
    }
    fn backoff(&self, attempt: u32) -> Option<Duration> {
        self.handler.backoff(attempt)
    }
    async fn call(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError> {
        self.handler.handle_raw(payload, ctx).await
    }
}

pub(crate) fn erase_raw<H: RawHandler>(topic: &'static str, h: Arc<H>) -> Arc<dyn ErasedHandler> {
    Arc::new(Raw { topic, handler: h })
}

#[allow(dead_code)]
fn _obj_safe(_: &dyn ErasedHandler) {}
