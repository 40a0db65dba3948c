-- Replays, as on PostgreSQL: a window of a retained topic's events delivered again to one
-- handler, by one worker at a time under a lease, from a cursor. Times are Unix ms.
CREATE TABLE outbox_replays (
    id           TEXT    PRIMARY KEY,
    topic        TEXT    NOT NULL,
    handler      TEXT    NOT NULL,
    since        INTEGER,
    until        INTEGER NOT NULL,
    ordering_key TEXT,
    rate         INTEGER CHECK (rate > 0),
    fresh        INTEGER NOT NULL DEFAULT 0,
    backfill     INTEGER NOT NULL DEFAULT 0,
    state        TEXT    NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'paused', 'cancelled', 'done')),
    cursor       TEXT,
    total        INTEGER NOT NULL,
    delivered    INTEGER NOT NULL DEFAULT 0,
    failed       INTEGER NOT NULL DEFAULT 0,
    lease_token  TEXT,
    leased_by    TEXT,
    lease_until  INTEGER,
    created_at   INTEGER NOT NULL,
    started_at   INTEGER,
    updated_at   INTEGER NOT NULL,
    finished_at  INTEGER
);
CREATE UNIQUE INDEX outbox_replays_backfill_idx ON outbox_replays (topic, handler) WHERE backfill;

CREATE TABLE outbox_replay_failures (
    replay_id TEXT    NOT NULL REFERENCES outbox_replays (id) ON DELETE CASCADE,
    event_id  TEXT    NOT NULL,
    attempts  INTEGER NOT NULL,
    error     TEXT    NOT NULL,
    failed_at INTEGER NOT NULL,
    PRIMARY KEY (replay_id, event_id)
);

CREATE TABLE outbox_handlers (
    topic         TEXT    NOT NULL,
    handler       TEXT    NOT NULL,
    first_seen_at INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL,
    PRIMARY KEY (topic, handler)
);
