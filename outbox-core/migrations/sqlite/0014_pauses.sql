-- Pauses of a handler or a topic, as on PostgreSQL; times in milliseconds since the epoch.
CREATE TABLE outbox_pauses (
    scope     TEXT    NOT NULL CHECK (scope IN ('handler', 'topic')),
    name      TEXT    NOT NULL,
    paused_at INTEGER NOT NULL,
    until     INTEGER,                      -- NULL: until resumed
    paused_by TEXT    NOT NULL,
    reason    TEXT,
    PRIMARY KEY (scope, name)
);

-- The paused handler a message waits for: claims skip the row while it is set.
ALTER TABLE outbox_messages ADD COLUMN parked_by TEXT;
CREATE INDEX outbox_messages_parked_idx ON outbox_messages (parked_by) WHERE parked_by IS NOT NULL;
