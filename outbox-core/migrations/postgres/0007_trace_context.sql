-- Trace context (W3C Trace Context) of the span that enqueued a message: its `traceparent` and
-- `tracestate` header values, written by producers built with the `opentelemetry` feature from
-- inside a traced span, NULL otherwise. The worker's delivery span continues that trace.
-- Nullable without a default, so adding them rewrites no row. Dead letters keep them, so a
-- retried dead letter is delivered in its original trace.
ALTER TABLE outbox_messages
    ADD COLUMN traceparent TEXT,
    ADD COLUMN tracestate TEXT;
ALTER TABLE outbox_dead
    ADD COLUMN traceparent TEXT,
    ADD COLUMN tracestate TEXT;
