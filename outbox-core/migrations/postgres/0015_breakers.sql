-- Circuit breakers per handler, shared by every worker (see the crate's `breaker` module). A
-- row either counts the handler's recent failures (open = false) or says the breaker is open:
-- no worker runs the handler, its messages are parked for it (`parked_by`), and from
-- `probe_at` on one worker (`probe_by`) may run it on one parked message to see whether its
-- dependency is back. A closed breaker that counts nothing has no row. `failures` counts the
-- messages that failed a first attempt within the window, `repeats` the failures of later
-- attempts.
CREATE TABLE outbox_breakers (
    handler       TEXT        PRIMARY KEY,
    open          BOOLEAN     NOT NULL,
    failures      INT         NOT NULL,
    repeats       INT         NOT NULL DEFAULT 0,
    window_start  TIMESTAMPTZ NOT NULL,
    opened_at     TIMESTAMPTZ,
    probe_at      TIMESTAMPTZ,
    failed_probes INT         NOT NULL DEFAULT 0,
    probe_by      UUID,
    last_error    TEXT
);

-- A probe takes the message parked longest ago (a park moves `available_at` to its time), so
-- that a message whose probe failed goes last.
CREATE INDEX outbox_messages_probe_idx ON outbox_messages (parked_by, available_at)
    WHERE parked_by IS NOT NULL;
