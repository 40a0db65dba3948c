//! The [`Handler`] trait and what a delivery looks like to a handler.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::event::Event;
mod context;
pub use context::Context;

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

    /// Where the handler starts when a worker first runs it: with the messages delivered
    /// from then on ([`Start::Present`](crate::Start::Present), the default), or also with the retained events of
    /// its topic ([`Start::Beginning`](crate::Start::Beginning), or [`Start::Since`](crate::Start::Since) a time before): the first worker
    /// that runs a handler of this name makes one backfill replay for the whole deployment,
    /// however many start at once. Only a topic that retains its events
    /// (`#[outbox_event(retain = "...")]`) has a past to start from.
    const START: crate::retention::Start = crate::retention::Start::Present;

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

    /// This handler's circuit breaker, overriding the worker's
    /// ([`WorkerConfig::breaker`](crate::WorkerConfig::breaker)); return
    /// [`Breaker::disabled`](crate::Breaker::disabled) for none. `None` uses the worker's.
    fn breaker(&self) -> Option<crate::breaker::Breaker> {
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

    /// As [`Handler::breaker`].
    fn breaker(&self) -> Option<crate::breaker::Breaker> {
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
    /// Set by the worker for a payload that does not decode and for a panic: the message's
    /// fault (or the code's), not the dependency's, so it never counts towards a breaker.
    not_dependency: bool,
}

impl HandlerError {
    /// A failure to retry with the usual backoff.
    pub fn retry(source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::Retry,
            source: source.into(),
            not_dependency: false,
        }
    }

    /// A failure to retry after `delay`, for example a provider's `Retry-After`.
    pub fn retry_after(delay: Duration, source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::RetryAfter(delay),
            source: source.into(),
            not_dependency: false,
        }
    }

    /// A failure no retry can fix: the message is dead-lettered now.
    pub fn permanent(source: impl Into<BoxError>) -> Self {
        Self {
            kind: FailureKind::Permanent,
            source: source.into(),
            not_dependency: false,
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

    /// Marks a failure that is not the dependency's: a payload that does not decode, a panic.
    pub(crate) fn not_dependency(mut self) -> Self {
        self.not_dependency = true;
        self
    }

    /// Whether this failure says the handler's dependency is failing, so that it counts
    /// towards the handler's breaker: a retryable error, a timeout or a `retry_after`, but
    /// never a permanent error, a payload that does not decode or a panic.
    pub(crate) fn counts_towards_breaker(&self) -> bool {
        !self.not_dependency && !matches!(self.kind, FailureKind::Permanent)
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
    fn breaker(&self) -> Option<crate::breaker::Breaker>;
    /// The highest version of its topic this handler decodes; `None` for a raw handler,
    /// which takes the payload of any version as it is.
    fn version(&self) -> Option<u32>;
    /// `(version, type name)` of the handler's event type and of its previous versions.
    fn event_versions(&self) -> Vec<(u32, &'static str)>;
    /// How long delivered events of its topic stay in the event log ([`Event::RETAIN`]);
    /// `None` for a raw handler, which knows no event type.
    fn retain(&self) -> Option<Duration>;
    /// Where it starts when first deployed ([`Handler::START`]).
    fn start(&self) -> crate::retention::Start;
    /// Whether `payload` of `version` decodes into its event type; the error when it does not.
    fn decodes(&self, payload: &str, version: u32) -> Result<(), String>;
    /// Calls the handler with `payload`, stored with version `version` of its event type.
    async fn call(&self, payload: &str, version: u32, ctx: &Context) -> Result<(), HandlerError>;
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
    fn breaker(&self) -> Option<crate::breaker::Breaker> {
        self.0.breaker()
    }
    fn version(&self) -> Option<u32> {
        Some(<H::Event as Event>::VERSION)
    }
    fn event_versions(&self) -> Vec<(u32, &'static str)> {
        let mut out = Vec::new();
        <H::Event as Event>::__versions(&mut out);
        out
    }
    fn retain(&self) -> Option<Duration> {
        <H::Event as Event>::RETAIN
    }
    fn start(&self) -> crate::retention::Start {
        H::START
    }
    fn decodes(&self, payload: &str, version: u32) -> Result<(), String> {
        // An upcast (`From`) may panic: that is a failure to decode, not the caller's crash.
        std::panic::catch_unwind(|| <H::Event as Event>::decode_versioned(version, payload))
            .map_err(|panic| {
                format!(
                    "the upcast panicked: {}",
                    crate::diagnostics::panic_message(&*panic)
                )
            })?
            .map(drop)
            .map_err(|e| e.to_string())
    }
    async fn call(&self, payload: &str, version: u32, ctx: &Context) -> Result<(), HandlerError> {
        let event = <H::Event as Event>::decode_versioned(version, payload)
            .map_err(|e| HandlerError::retry(e).not_dependency())?;
        self.0.handle(event, ctx).await
    }
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
    fn breaker(&self) -> Option<crate::breaker::Breaker> {
        self.handler.breaker()
    }
    fn version(&self) -> Option<u32> {
        None
    }
    fn event_versions(&self) -> Vec<(u32, &'static str)> {
        Vec::new()
    }
    fn retain(&self) -> Option<Duration> {
        None
    }
    fn start(&self) -> crate::retention::Start {
        crate::retention::Start::Present
    }
    fn decodes(&self, _payload: &str, _version: u32) -> Result<(), String> {
        Ok(())
    }
    async fn call(&self, payload: &str, _version: u32, ctx: &Context) -> Result<(), HandlerError> {
        self.handler.handle_raw(payload, ctx).await
    }
}

pub(crate) fn erase_raw<H: RawHandler>(topic: &'static str, h: Arc<H>) -> Arc<dyn ErasedHandler> {
    Arc::new(Raw { topic, handler: h })
}

#[allow(dead_code)]
fn _obj_safe(_: &dyn ErasedHandler) {}
