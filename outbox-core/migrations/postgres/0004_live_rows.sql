-- The hot table keeps live messages only, so each message costs one insert, one claim that
-- PostgreSQL can write as a heap-only (HOT) update, and one delete:
-- - the primary key is the message's UUID v7 (no second, bigint key and its index);
-- - a claim writes only columns that no index covers (attempts, the lease, the claim token),
--   so the claim index keeps pointing at the row: running rows stay in it and the claim skips
--   those whose lease is still running;
-- - a message whose handlers all succeeded is deleted; what stays of it is a per-minute count
--   (outbox_done_counts) for statistics;
-- - a dead message moves to outbox_dead, with its last error.
-- Done rows of the old table are dropped (their work is finished); pending, running and dead
-- ones are carried over.

DROP INDEX outbox_messages_ready_idx;
DROP INDEX outbox_messages_done_idx;
DROP INDEX outbox_messages_dead_idx;
ALTER TABLE outbox_messages RENAME TO outbox_messages_v3;
ALTER INDEX outbox_messages_pkey RENAME TO outbox_messages_v3_pkey;
ALTER INDEX outbox_messages_public_id_key RENAME TO outbox_messages_v3_public_id_key;

CREATE TABLE outbox_messages (
    id              UUID        PRIMARY KEY,                -- UUID v7: the id handlers see
    topic           TEXT        NOT NULL CHECK (length(topic) BETWEEN 1 AND 64),
    payload         JSON        NOT NULL,                   -- json, not jsonb: any string serde writes
    idempotency_key TEXT,                                   -- sent downstream; derived when NULL
    attempts        INTEGER     NOT NULL DEFAULT 0,         -- counted at claim
    available_at    TIMESTAMPTZ NOT NULL DEFAULT now(),     -- due time (creation, delay or backoff)
    locked_until    TIMESTAMPTZ,                            -- running while in the future: the lease
    claim_token     UUID,                                   -- fences outcome writes to the current claim
    claimed_by      UUID,                                   -- the worker (outbox_workers.id)
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
) WITH (fillfactor = 50);   -- room on each page for the claim's HOT update

-- The claim index: per topic in due order. Rows of other topics are never read.
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at);

INSERT INTO outbox_messages (id, topic, payload, idempotency_key, attempts, available_at,
                             locked_until, claim_token, last_error, created_at)
SELECT public_id, topic, payload::json, idempotency_key, attempts,
       CASE WHEN status = 'running' THEN coalesce(claimed_at, created_at) ELSE available_at END,
       CASE WHEN status = 'running' THEN available_at END,
       CASE WHEN status = 'running' THEN claim_token END,
       last_error, created_at
FROM outbox_messages_v3 WHERE status IN ('pending', 'running');

CREATE TABLE outbox_dead (
    id              UUID        PRIMARY KEY,
    topic           TEXT        NOT NULL,
    payload         JSON        NOT NULL,
    idempotency_key TEXT,
    attempts        INTEGER     NOT NULL,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    dead_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX outbox_dead_topic_idx ON outbox_dead (topic, dead_at);
CREATE INDEX outbox_dead_dead_at_idx ON outbox_dead (dead_at);

INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, dead_at)
SELECT public_id, topic, payload::json, idempotency_key, attempts, last_error, created_at,
       coalesce(processed_at, now())
FROM outbox_messages_v3 WHERE status = 'dead';

-- Messages done per topic, minute and worker (one row per worker, so flushes of several
-- workers never wait on each other's row lock).
CREATE TABLE outbox_done_counts (
    topic  TEXT        NOT NULL,
    minute TIMESTAMPTZ NOT NULL,
    worker UUID        NOT NULL,
    done   BIGINT      NOT NULL,
    PRIMARY KEY (topic, minute, worker)
);
CREATE INDEX outbox_done_counts_minute_idx ON outbox_done_counts (minute);

-- Per-(message, handler) progress, now keyed by the message's UUID. No foreign key: a done
-- message is deleted in batches, and the worker deletes the progress rows it knows of.
CREATE TABLE outbox_deliveries_v4 (
    message_id   UUID        NOT NULL,
    handler      TEXT        NOT NULL,
    completed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, handler)
);
INSERT INTO outbox_deliveries_v4 (message_id, handler, completed_at)
SELECT m.public_id, d.handler, d.completed_at
FROM outbox_deliveries d JOIN outbox_messages_v3 m ON m.id = d.message_id
WHERE m.status IN ('pending', 'running', 'dead');
DROP TABLE outbox_deliveries;
ALTER TABLE outbox_deliveries_v4 RENAME TO outbox_deliveries;
ALTER INDEX outbox_deliveries_v4_pkey RENAME TO outbox_deliveries_pkey;

DROP TABLE outbox_messages_v3;

-- Workers say which topics they serve: producers wake only a waiting, live worker of their
-- topic, and operations can name topics that no live worker serves.
ALTER TABLE outbox_workers ADD COLUMN topics TEXT[] NOT NULL DEFAULT '{}';
