-- The same layout as on PostgreSQL: the hot table keeps live messages only, keyed by the
-- message's UUID; a done message is deleted (a per-minute count stays for statistics), a dead
-- one moves to outbox_dead. Done rows of the old table are dropped (their work is finished);
-- pending, running and dead ones are carried over. Workers register here too.

DROP INDEX outbox_messages_ready_idx;
DROP INDEX IF EXISTS outbox_messages_done_idx;
DROP INDEX IF EXISTS outbox_messages_dead_idx;
ALTER TABLE outbox_messages RENAME TO outbox_messages_v3;

CREATE TABLE outbox_messages (
    id              TEXT    PRIMARY KEY,                  -- UUID v7, hyphenated
    topic           TEXT    NOT NULL CHECK (length(topic) BETWEEN 1 AND 64),
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    idempotency_key TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    available_at    INTEGER NOT NULL,                     -- due time, Unix ms
    locked_until    INTEGER,                              -- running while in the future
    claim_token     TEXT,
    claimed_by      TEXT,
    last_error      TEXT,
    created_at      INTEGER NOT NULL
);
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at);

INSERT INTO outbox_messages (id, topic, payload, idempotency_key, attempts, available_at,
                             locked_until, claim_token, last_error, created_at)
SELECT public_id, topic, payload, idempotency_key, attempts,
       CASE WHEN status = 'running' THEN coalesce(claimed_at, created_at) ELSE available_at END,
       CASE WHEN status = 'running' THEN available_at END,
       CASE WHEN status = 'running' THEN claim_token END,
       last_error, created_at
FROM outbox_messages_v3 WHERE status IN ('pending', 'running');

CREATE TABLE outbox_dead (
    id              TEXT    PRIMARY KEY,
    topic           TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    idempotency_key TEXT,
    attempts        INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    dead_at         INTEGER NOT NULL
);
CREATE INDEX outbox_dead_topic_idx ON outbox_dead (topic, dead_at);
CREATE INDEX outbox_dead_dead_at_idx ON outbox_dead (dead_at);

INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, dead_at)
SELECT public_id, topic, payload, idempotency_key, attempts, last_error, created_at,
       coalesce(processed_at, created_at)
FROM outbox_messages_v3 WHERE status = 'dead';

CREATE TABLE outbox_done_counts (
    topic  TEXT    NOT NULL,
    minute INTEGER NOT NULL,      -- Unix ms of the minute's start
    worker TEXT    NOT NULL,
    done   INTEGER NOT NULL,
    PRIMARY KEY (topic, minute, worker)
);
CREATE INDEX outbox_done_counts_minute_idx ON outbox_done_counts (minute);

CREATE TABLE outbox_deliveries_v4 (
    message_id   TEXT    NOT NULL,
    handler      TEXT    NOT NULL,
    completed_at INTEGER NOT NULL,
    PRIMARY KEY (message_id, handler)
);
INSERT INTO outbox_deliveries_v4 (message_id, handler, completed_at)
SELECT m.public_id, d.handler, d.completed_at
FROM outbox_deliveries d JOIN outbox_messages_v3 m ON m.id = d.message_id
WHERE m.status IN ('pending', 'running', 'dead');
DROP TABLE outbox_deliveries;
ALTER TABLE outbox_deliveries_v4 RENAME TO outbox_deliveries;

DROP TABLE outbox_messages_v3;

CREATE TABLE outbox_workers (
    id           TEXT    PRIMARY KEY,
    name         TEXT    NOT NULL,
    topics       TEXT    NOT NULL DEFAULT '[]',       -- JSON array of the topics it serves
    waiting      INTEGER NOT NULL DEFAULT 0,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL
);
