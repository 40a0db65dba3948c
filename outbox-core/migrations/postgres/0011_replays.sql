-- Replays: the retained events of a window of one topic, delivered again to one handler. One
-- worker at a time runs a replay, under a lease; its cursor (the last event handled) moves
-- only once a batch is handled, so a replay survives crashes and restarts, and delivers an
-- event twice only after a kill.
CREATE TABLE outbox_replays (
    id           UUID        PRIMARY KEY,                 -- UUID v7
    topic        TEXT        NOT NULL,
    handler      TEXT        NOT NULL,
    since        TIMESTAMPTZ,                             -- events enqueued from, if set
    until        TIMESTAMPTZ NOT NULL,                    -- to before (the creation time unless set)
    ordering_key TEXT,                                    -- only this key's events, if set
    rate         INTEGER     CHECK (rate > 0),            -- events per second at most, if set
    fresh        BOOLEAN     NOT NULL DEFAULT false,      -- new message ids and idempotency keys
    backfill     BOOLEAN     NOT NULL DEFAULT false,      -- made for a handler's `Handler::START`
    state        TEXT        NOT NULL DEFAULT 'running'
                 CHECK (state IN ('running', 'paused', 'cancelled', 'done')),
    cursor       UUID,                                    -- the last event handled
    total        BIGINT      NOT NULL,                    -- events in the window at creation
    delivered    BIGINT      NOT NULL DEFAULT 0,
    failed       BIGINT      NOT NULL DEFAULT 0,
    lease_token  UUID,
    leased_by    UUID,
    lease_until  TIMESTAMPTZ,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at   TIMESTAMPTZ,
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at  TIMESTAMPTZ
);
-- A handler's backfill is made once for the whole deployment.
CREATE UNIQUE INDEX outbox_replays_backfill_idx ON outbox_replays (topic, handler) WHERE backfill;

-- The events of a replay whose handler failed for good, with the error: the replay went on.
CREATE TABLE outbox_replay_failures (
    replay_id UUID        NOT NULL REFERENCES outbox_replays (id) ON DELETE CASCADE,
    event_id  UUID        NOT NULL,
    attempts  INTEGER     NOT NULL,
    error     TEXT        NOT NULL,
    failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (replay_id, event_id)
);

-- The handlers the deployment has run, per topic: a replay names one of them, and a handler
-- seen for the first time gets the backfill its `Handler::START` asks for.
CREATE TABLE outbox_handlers (
    topic         TEXT        NOT NULL,
    handler       TEXT        NOT NULL,
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, handler)
);
