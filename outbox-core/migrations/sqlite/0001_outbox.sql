-- The outbox on SQLite: the same states as on PostgreSQL. Times are Unix milliseconds (UTC);
-- ids (public_id, claim_token) are hyphenated UUID text.
CREATE TABLE outbox_messages (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    public_id       TEXT    NOT NULL UNIQUE,
    topic           TEXT    NOT NULL CHECK (length(topic) BETWEEN 1 AND 64),
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    idempotency_key TEXT,
    status          TEXT    NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'running', 'done', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    available_at    INTEGER NOT NULL,     -- pending: ready time; running: lease deadline
    claim_token     TEXT,
    claimed_by      TEXT,
    claimed_at      INTEGER,
    processed_at    INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL
);

CREATE INDEX outbox_messages_ready_idx
    ON outbox_messages (topic, available_at, id)
    WHERE status IN ('pending', 'running');

CREATE TABLE outbox_deliveries (
    message_id   INTEGER NOT NULL REFERENCES outbox_messages (id) ON DELETE CASCADE,
    handler      TEXT    NOT NULL,
    completed_at INTEGER NOT NULL,
    PRIMARY KEY (message_id, handler)
);
