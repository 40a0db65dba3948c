//! What a handler knows about the delivery it handles.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::resources::Resources;

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
    pub(crate) version: u32,
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

    /// The version of the event type the payload was stored with
    /// ([`Event::VERSION`](crate::Event::VERSION) of the producer's build; 1 for a message
    /// written before versions existed). A typed handler receives the event upcast to its own
    /// type whatever this says; relays pass it on to the broker.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The key to send downstream so the effect happens once, identical on every retry.
    ///
    /// The key given at enqueue time or returned by [`Event::idempotency_key`](crate::event::Event::idempotency_key) if there was one;
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
            version: 1,
            idempotency_key: super::default_idempotency_key(message_id, handler),
            resources: Arc::new(resources),
            trace: None,
        }
    }

    /// Returns the context with the time the message was enqueued.
    pub fn with_created_at(mut self, created_at: DateTime<Utc>) -> Self {
        self.created_at = created_at;
        self
    }

    /// Returns the context with the stored version of the event (see
    /// [`version`](Self::version)); 1 unless set.
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
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
