-- Trace context (W3C Trace Context) of the span that enqueued a message, as on PostgreSQL:
-- NULL unless the producer ran with the `opentelemetry` feature inside a traced span. Dead
-- letters keep them for a retry in the original trace.
ALTER TABLE outbox_messages ADD COLUMN traceparent TEXT NULL, ADD COLUMN tracestate TEXT NULL;
ALTER TABLE outbox_dead ADD COLUMN traceparent TEXT NULL, ADD COLUMN tracestate TEXT NULL;
