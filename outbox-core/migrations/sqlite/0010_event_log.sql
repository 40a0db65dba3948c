-- The event log: the delivered events of the topics that retain them, kept for the topic's
-- window after delivery, to list and replay. As on PostgreSQL, the longest window declared
-- wins, unless an operator set the window (`pinned`). One table: the worker deletes expired events in small batches.
CREATE TABLE outbox_retention (
    topic       TEXT    PRIMARY KEY CHECK (length(topic) BETWEEN 1 AND 64),
    retain_ms   INTEGER NOT NULL CHECK (retain_ms > 0),
    pinned      INTEGER NOT NULL DEFAULT 0,
    declared_at INTEGER NOT NULL,                          -- Unix ms
    changed_at  INTEGER NOT NULL
);

-- Written by the done write that deletes the live row, in the same transaction.
CREATE TABLE outbox_events (
    id              TEXT    PRIMARY KEY,                   -- the message id, UUID v7
    topic           TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    version         INTEGER NOT NULL,
    idempotency_key TEXT,
    ordering_key    TEXT,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER NOT NULL,
    traceparent     TEXT,
    tracestate      TEXT
) WITHOUT ROWID;
CREATE INDEX outbox_events_topic_idx ON outbox_events (topic, id);
CREATE INDEX outbox_events_delivered_idx ON outbox_events (topic, delivered_at);
