-- Circuit breakers per handler, as on PostgreSQL; times in milliseconds since the epoch.
CREATE TABLE outbox_breakers (
    handler       TEXT    PRIMARY KEY,
    open          INTEGER NOT NULL,
    failures      INTEGER NOT NULL,
    repeats       INTEGER NOT NULL DEFAULT 0,
    window_start  INTEGER NOT NULL,
    opened_at     INTEGER,
    probe_at      INTEGER,
    failed_probes INTEGER NOT NULL DEFAULT 0,
    probe_by      TEXT,
    last_error    TEXT
);

-- A probe takes the message parked longest ago (a park moves `available_at` to its time), so
-- that a message whose probe failed goes last.
CREATE INDEX outbox_messages_probe_idx ON outbox_messages (parked_by, available_at)
    WHERE parked_by IS NOT NULL;
