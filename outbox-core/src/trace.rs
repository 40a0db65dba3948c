//! Trace context: one trace from the request that enqueued a message to every handler of it.
//!
//! With the `opentelemetry` feature, [`enqueue`](crate::enqueue) stores the W3C trace context
//! (`traceparent` and `tracestate`) of the current [`tracing`] span with the message, when that
//! span is recorded by a `tracing-opentelemetry` layer.
//! The worker's delivery span (`outbox.delivery`, an OpenTelemetry consumer span) is then a
//! child of that span, each handler runs in a child span of the delivery (`outbox.handler`),
//! and a retry is a new delivery span in the same trace. A failed attempt shows as one: its
//! delivery span, and the span of each handler that failed in it, end with the OpenTelemetry
//! status `Error` and the error as its description (also when the worker ends an attempt whose
//! handler held its thread past the deadline); a successful one leaves the status unset.
//! [`Context::trace_context`] hands the handler's own context on, for example to a broker (the
//! relays of `outbox-handlers` put it in their message headers, and the inbox continues the
//! trace).
//!
//! Without the feature, or outside a traced span, nothing is captured and the message's trace
//! columns stay NULL; a context stored by another process is still handed to handlers as is.
//!
//! [`Context::trace_context`]: crate::Context::trace_context

/// The W3C trace context of a span: its `traceparent` header value and, when it has one, its
/// `tracestate`.
///
/// ```
/// use outbox::trace::TraceContext;
///
/// let cx = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None);
/// assert_eq!(cx.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
/// assert_eq!(cx.tracestate(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A context from the values of the `traceparent` and `tracestate` headers. An empty
    /// `tracestate` counts as none. The values are not checked here:
    /// [`set_parent_of`](Self::set_parent_of) ignores a malformed one.
    pub fn new(traceparent: impl Into<String>, tracestate: Option<String>) -> Self {
        Self {
            traceparent: traceparent.into(),
            tracestate: tracestate.filter(|s| !s.is_empty()),
        }
    }

    /// The `traceparent` value: `00-{trace id}-{parent span id}-{flags}`.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` value (vendor data), if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace id, 32 lowercase hex digits, or `None` if the `traceparent` is malformed: the
    /// id to look the trace up by in a tracing backend.
    pub fn trace_id(&self) -> Option<&str> {
        let mut parts = self.traceparent.split('-');
        let _version = parts.next()?;
        let id = parts.next()?;
        (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
    }

    /// The context of the current [`tracing`] span; see [`of_span`](Self::of_span).
    ///
    /// ```
    /// // No OpenTelemetry layer is installed here, so there is no context to take.
    /// let span = tracing::info_span!("checkout");
    /// let _entered = span.enter();
    /// assert_eq!(outbox::trace::TraceContext::current(), None);
    /// ```
    pub fn current() -> Option<Self> {
        Self::of_span(&tracing::Span::current())
    }

    /// The context of `span`, when the `opentelemetry` feature is on and `span` is recorded by
    /// a `tracing-opentelemetry` layer with a valid span context; `None` otherwise.
    pub fn of_span(span: &tracing::Span) -> Option<Self> {
        #[cfg(feature = "opentelemetry")]
        {
            otel::of_span(span)
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            let _ = span;
            None
        }
    }

    /// Makes `span` continue this trace, as a child of the span this context names. Call it
    /// before the span is first entered. Returns whether it did: false without the
    /// `opentelemetry` feature, without a `tracing-opentelemetry` layer, for a disabled or
    /// already started span, and for a malformed `traceparent`.
    pub fn set_parent_of(&self, span: &tracing::Span) -> bool {
        #[cfg(feature = "opentelemetry")]
        {
            otel::set_parent(self, span)
        }
        #[cfg(not(feature = "opentelemetry"))]
        {
            let _ = span;
            false
        }
    }
}

/// The span of one delivery of a message (an attempt): an OpenTelemetry consumer span named
/// after the messaging conventions, continuing the trace stored with the message.
pub(crate) fn delivery_span(
    id: uuid::Uuid,
    topic: &str,
    attempt: u32,
    stored: Option<&TraceContext>,
) -> tracing::Span {
    #[cfg(feature = "opentelemetry")]
    let span = {
        let name = format!("process {topic}");
        tracing::info_span!(
            "outbox.delivery",
            message_id = %id,
            topic = %topic,
            attempt,
            otel.name = name.as_str(),
            otel.kind = "consumer",
            messaging.system = "outbox",
            messaging.operation.type = "process",
            messaging.destination.name = %topic,
            messaging.message.id = %id,
        )
    };
    #[cfg(not(feature = "opentelemetry"))]
    let span = tracing::info_span!("outbox.delivery", message_id = %id, topic = %topic, attempt);
    if let Some(stored) = stored {
        stored.set_parent_of(&span);
    }
    span
}

/// The span of one handler's call within a delivery.
pub(crate) fn handler_span(delivery: &tracing::Span, handler: &'static str) -> tracing::Span {
    tracing::info_span!(parent: delivery, "outbox.handler", handler)
}

/// The most bytes of a description a span's error status carries: a handler's error chain can
/// be long, and a tracing backend wants a line, not a page.
#[cfg(feature = "opentelemetry")]
const MAX_STATUS_BYTES: usize = 1024;

/// Marks `span` failed, after OpenTelemetry's span status rules: its status becomes `Error` with
/// `description`, cut to `MAX_STATUS_BYTES` on a character boundary. Without the
/// `opentelemetry` feature, or for a span no `tracing-opentelemetry` layer records, it does
/// nothing.
pub(crate) fn set_error(span: &tracing::Span, description: &str) {
    #[cfg(feature = "opentelemetry")]
    otel::set_error(span, description);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, description);
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
    use opentelemetry::trace::{Status, TraceContextExt};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    const TRACEPARENT: &str = "traceparent";
    const TRACESTATE: &str = "tracestate";

    /// Where the propagator writes the two headers.
    #[derive(Default)]
    struct Carrier {
        traceparent: Option<String>,
        tracestate: Option<String>,
    }

    impl Injector for Carrier {
        fn set(&mut self, key: &str, value: String) {
            match key {
                TRACEPARENT => self.traceparent = Some(value),
                TRACESTATE => self.tracestate = Some(value),
                _ => {}
            }
        }
    }

    impl Extractor for &TraceContext {
        fn get(&self, key: &str) -> Option<&str> {
            match key {
                TRACEPARENT => Some(self.traceparent()),
                TRACESTATE => self.tracestate(),
                _ => None,
            }
        }

        fn keys(&self) -> Vec<&str> {
            vec![TRACEPARENT, TRACESTATE]
        }
    }

    pub(super) fn of_span(span: &tracing::Span) -> Option<TraceContext> {
        if span.is_disabled() {
            return None;
        }
        let cx = span.context();
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut carrier = Carrier::default();
        TraceContextPropagator::new().inject_context(&cx, &mut carrier);
        Some(TraceContext::new(carrier.traceparent?, carrier.tracestate))
    }

    pub(super) fn set_parent(cx: &TraceContext, span: &tracing::Span) -> bool {
        let parent =
            TraceContextPropagator::new().extract_with_context(&opentelemetry::Context::new(), &cx);
        if !parent.span().span_context().is_valid() {
            return false;
        }
        span.set_parent(parent).is_ok()
    }

    pub(super) fn set_error(span: &tracing::Span, description: &str) {
        if span.is_disabled() {
            return;
        }
        let description = crate::diagnostics::bound_error(description, super::MAX_STATUS_BYTES);
        span.set_status(Status::error(description));
    }
}

#[cfg(test)]
mod tests {
    use super::TraceContext;

    #[test]
    fn the_trace_id_is_read_from_the_traceparent() {
        let cx = TraceContext::new(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some(String::new()),
        );
        assert_eq!(cx.trace_id(), Some("0af7651916cd43dd8448eb211c80319c"));
        assert_eq!(cx.tracestate(), None);
        assert_eq!(TraceContext::new("garbage", None).trace_id(), None);
        assert_eq!(TraceContext::new("00-abc-def-01", None).trace_id(), None);
    }

    /// Records the fields each new span is created with, as text.
    #[derive(Clone, Default)]
    struct Fields(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .lock()
                .unwrap()
                .push((field.name().to_string(), format!("{value:?}")));
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Fields {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            attrs.record(&mut self.clone());
        }
    }

    #[test]
    fn the_delivery_span_carries_the_message_fields_with_or_without_the_feature() {
        use tracing_subscriber::layer::SubscriberExt;
        let fields = Fields::default();
        let subscriber = tracing_subscriber::registry().with(fields.clone());
        let id = uuid::Uuid::now_v7();
        tracing::subscriber::with_default(subscriber, || {
            let span = super::delivery_span(id, "booking.created", 3, None);
            let _handler = super::handler_span(&span, "send-email");
        });
        let got = fields.0.lock().unwrap().clone();
        let has = |name: &str, value: &str| {
            assert!(
                got.iter().any(|(n, v)| n == name && v == value),
                "no {name} = {value} in {got:?}"
            );
        };
        has("message_id", &id.to_string());
        has("topic", "booking.created");
        has("attempt", "3");
        has("handler", "\"send-email\"");
        #[cfg(feature = "opentelemetry")]
        {
            has("otel.kind", "\"consumer\"");
            has("messaging.system", "\"outbox\"");
            has("messaging.destination.name", "booking.created");
            has("messaging.message.id", &id.to_string());
        }
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn a_malformed_traceparent_parents_nothing() {
        let span = tracing::info_span!("x");
        assert!(!TraceContext::new("nonsense", None).set_parent_of(&span));
    }
}
