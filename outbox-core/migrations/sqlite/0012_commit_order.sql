-- A key's order is the order in which the database inserted its messages, not the order of
-- their ids (UUID v7, from each producer's clock), as on PostgreSQL. Here `seq` is the table's
-- rowid, declared AUTOINCREMENT so that a number is never handed out twice: a dead letter
-- keeps its number, and a message inserted after every live row was deleted must still come
-- after it. SQLite serialises writers, so the insert order is the commit order; the rows of
-- one `enqueue_many` are inserted in slice order.
--
-- The live table is rebuilt around the new rowid. Rows already here keep their order: live
-- messages and keyed dead letters are numbered in id order (the order they had), before any new
-- message. Dead letters of the previous release's workers, and retained events logged before
-- this migration, have 0 (see the PostgreSQL migration).

CREATE TEMPORARY TABLE outbox_seq_upgrade AS
SELECT id, row_number() OVER (ORDER BY id) AS seq
FROM (SELECT id FROM outbox_messages
      UNION ALL
      SELECT id FROM outbox_dead WHERE ordering_key IS NOT NULL);

DROP INDEX outbox_messages_ready_idx;
DROP INDEX outbox_messages_key_idx;
ALTER TABLE outbox_messages RENAME TO outbox_messages_v11;

CREATE TABLE outbox_messages (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,    -- the key's order: insert order
    id              TEXT    NOT NULL UNIQUE,              -- UUID v7, hyphenated
    topic           TEXT    NOT NULL CHECK (length(topic) BETWEEN 1 AND 64),
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    idempotency_key TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    available_at    INTEGER NOT NULL,                     -- due time, Unix ms
    locked_until    INTEGER,                              -- running while in the future
    claim_token     TEXT,
    claimed_by      TEXT,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    ordering_key    TEXT
        CHECK (ordering_key IS NULL OR length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255),
    releases_key    INTEGER NOT NULL DEFAULT 0,
    traceparent     TEXT,
    tracestate      TEXT,
    retried_release INTEGER NOT NULL DEFAULT 0,
    version         INTEGER NOT NULL DEFAULT 1
);

INSERT INTO outbox_messages (seq, id, topic, payload, idempotency_key, attempts, available_at,
                             locked_until, claim_token, claimed_by, last_error, created_at,
                             ordering_key, releases_key, traceparent, tracestate,
                             retried_release, version)
SELECT u.seq, m.id, m.topic, m.payload, m.idempotency_key, m.attempts, m.available_at,
       m.locked_until, m.claim_token, m.claimed_by, m.last_error, m.created_at,
       m.ordering_key, m.releases_key, m.traceparent, m.tracestate, m.retried_release, m.version
FROM outbox_messages_v11 m JOIN outbox_seq_upgrade u ON u.id = m.id
ORDER BY u.seq;
DROP TABLE outbox_messages_v11;

CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at)
    WHERE ordering_key IS NULL;
-- A key's live messages in insert order: the first entry of each key is its head.
CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL;

ALTER TABLE outbox_dead ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
UPDATE outbox_dead SET seq = (SELECT u.seq FROM outbox_seq_upgrade u WHERE u.id = outbox_dead.id)
WHERE ordering_key IS NOT NULL;
DROP INDEX outbox_dead_key_idx;
CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND releases_key = 0;

-- No number is handed out again, a dead letter's included.
DELETE FROM sqlite_sequence WHERE name = 'outbox_messages';
INSERT INTO sqlite_sequence (name, seq)
SELECT 'outbox_messages', max(seq) FROM outbox_seq_upgrade HAVING max(seq) IS NOT NULL;
DROP TABLE outbox_seq_upgrade;

-- The log is read in (seq, id) order: a key's events in insert order.
ALTER TABLE outbox_events ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
DROP INDEX outbox_events_topic_idx;
CREATE INDEX outbox_events_topic_idx ON outbox_events (topic, seq, id);

-- A replay's cursor is the (seq, id) of the last event it handled.
ALTER TABLE outbox_replays ADD COLUMN cursor_seq INTEGER;
