-- Replays, as on PostgreSQL: a window of a retained topic's events delivered again to one
-- handler, by one worker at a time under a lease, from a cursor. A backfill is made once per
-- (topic, handler): `backfill_of` holds the pair for backfills and NULL otherwise, and its
-- unique index stands in for PostgreSQL's partial one.
CREATE TABLE outbox_replays (
    id           BINARY(16)   NOT NULL PRIMARY KEY,
    topic        VARCHAR(64)  NOT NULL,
    handler      VARCHAR(255) NOT NULL,
    since        BIGINT       NULL,
    `until`      BIGINT       NOT NULL,
    ordering_key VARCHAR(255) NULL,
    rate         BIGINT       NULL,
    fresh        BOOLEAN      NOT NULL DEFAULT FALSE,
    backfill     BOOLEAN      NOT NULL DEFAULT FALSE,
    backfill_of  VARCHAR(320) NULL,
    state        VARCHAR(16)  NOT NULL DEFAULT 'running',
    cursor_id    BINARY(16)   NULL,
    total        BIGINT       NOT NULL,
    delivered    BIGINT       NOT NULL DEFAULT 0,
    failed       BIGINT       NOT NULL DEFAULT 0,
    lease_token  BINARY(16)   NULL,
    leased_by    BINARY(16)   NULL,
    lease_until  BIGINT       NULL,
    created_at   BIGINT       NOT NULL,
    started_at   BIGINT       NULL,
    updated_at   BIGINT       NOT NULL,
    finished_at  BIGINT       NULL,
    UNIQUE INDEX outbox_replays_backfill_idx (backfill_of),
    CONSTRAINT outbox_replays_rate CHECK (rate IS NULL OR rate > 0),
    CONSTRAINT outbox_replays_state CHECK (state IN ('running', 'paused', 'cancelled', 'done'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_replay_failures (
    replay_id BINARY(16) NOT NULL,
    event_id  BINARY(16) NOT NULL,
    attempts  INT        NOT NULL,
    error     TEXT       NOT NULL,
    failed_at BIGINT     NOT NULL,
    PRIMARY KEY (replay_id, event_id),
    CONSTRAINT outbox_replay_failures_replay FOREIGN KEY (replay_id)
        REFERENCES outbox_replays (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_handlers (
    topic         VARCHAR(64)  NOT NULL,
    handler       VARCHAR(255) NOT NULL,
    first_seen_at BIGINT       NOT NULL,
    last_seen_at  BIGINT       NOT NULL,
    PRIMARY KEY (topic, handler)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
