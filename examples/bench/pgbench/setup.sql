-- The pgbench reference: an outbox-shaped table (the columns, constraints and partial claim
-- index of outbox_messages) beside a small business table. Re-running drops and recreates both.
DROP TABLE IF EXISTS pgb_outbox, pgb_orders, pgb_plain;

CREATE TABLE pgb_orders (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer   TEXT        NOT NULL,
    amount     BIGINT      NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE pgb_outbox (
    id              BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    public_id       UUID        NOT NULL UNIQUE,
    topic           TEXT        NOT NULL,
    payload         JSONB       NOT NULL,
    idempotency_key TEXT,
    status          TEXT        NOT NULL DEFAULT 'pending',
    attempts        INTEGER     NOT NULL DEFAULT 0,
    available_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    claim_token     UUID,
    claimed_by      TEXT,
    claimed_at      TIMESTAMPTZ,
    processed_at    TIMESTAMPTZ,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT pgb_outbox_status_check CHECK (status IN ('pending', 'running', 'done', 'dead')),
    CONSTRAINT pgb_outbox_topic_check CHECK (length(topic) BETWEEN 1 AND 64)
);

-- The partial index on pending (and running) rows the claim reads.
CREATE INDEX pgb_outbox_ready_idx
    ON pgb_outbox (topic, available_at, id)
    WHERE status IN ('pending', 'running');

-- The cheapest second row a transaction can write: a table with a primary key and one text
-- column, no other index. business.sql against insert_plain.sql shows what any second INSERT
-- costs a producer, whatever it writes.
CREATE TABLE pgb_plain (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload TEXT   NOT NULL
);
