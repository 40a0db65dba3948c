-- The outbox: one row per message, with its delivery state.
CREATE TABLE outbox_messages (
    id              BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id       UUID        NOT NULL UNIQUE,          -- UUID v7, the id handlers see
    topic           TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    idempotency_key TEXT,                                 -- sent downstream; derived when NULL
    status          TEXT        NOT NULL DEFAULT 'pending',
    attempts        INTEGER     NOT NULL DEFAULT 0,       -- counted at claim
    available_at    TIMESTAMPTZ NOT NULL DEFAULT now(),   -- pending: ready time; running: lease deadline
    claim_token     UUID,                                 -- fences outcome writes to the current claim
    claimed_by      TEXT,
    claimed_at      TIMESTAMPTZ,
    processed_at    TIMESTAMPTZ,                          -- when it became done or dead
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT outbox_messages_status_check
        CHECK (status IN ('pending', 'running', 'done', 'dead')),
    CONSTRAINT outbox_messages_topic_check
        CHECK (length(topic) BETWEEN 1 AND 64)
);

-- The claim index: only rows that may still be claimed, per topic in due order. A running row
-- whose lease (available_at) has passed is claimable again, so both states are in it.
CREATE INDEX outbox_messages_ready_idx
    ON outbox_messages (topic, available_at, id)
    WHERE status IN ('pending', 'running');

-- Per-(message, handler) progress: a handler listed here has succeeded for that message and is
-- not run again when the message is retried for another handler.
CREATE TABLE outbox_deliveries (
    message_id   BIGINT      NOT NULL REFERENCES outbox_messages (id) ON DELETE CASCADE,
    handler      TEXT        NOT NULL,
    completed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, handler)
);

-- Live workers. `waiting` is true while a worker sleeps on LISTEN; only then do producers
-- send a NOTIFY, so busy systems never pay for it.
CREATE TABLE outbox_workers (
    id           UUID        PRIMARY KEY,
    name         TEXT        NOT NULL,
    waiting      BOOLEAN     NOT NULL DEFAULT false,
    started_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
