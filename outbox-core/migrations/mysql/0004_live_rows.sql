-- Dead letters apart from the live table, per-minute done counts for statistics, and the
-- workers that register themselves.
CREATE TABLE outbox_dead (
    id              BINARY(16)   NOT NULL PRIMARY KEY,
    topic           VARCHAR(64)  NOT NULL,
    payload         LONGTEXT     NOT NULL,
    idempotency_key TEXT         NULL,
    attempts        INT          NOT NULL,
    last_error      TEXT         NULL,
    created_at      BIGINT       NOT NULL,
    dead_at         BIGINT       NOT NULL,
    INDEX outbox_dead_topic_idx (topic, dead_at),
    INDEX outbox_dead_dead_at_idx (dead_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_done_counts (
    topic  VARCHAR(64) NOT NULL,
    minute BIGINT      NOT NULL,     -- Unix ms of the minute's start
    worker BINARY(16)  NOT NULL,
    done   BIGINT      NOT NULL,
    PRIMARY KEY (topic, minute, worker),
    INDEX outbox_done_counts_minute_idx (minute)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE outbox_workers (
    id           BINARY(16)   NOT NULL PRIMARY KEY,
    name         VARCHAR(255) NOT NULL,
    topics       LONGTEXT     NOT NULL,      -- JSON array of the topics it serves
    waiting      BOOLEAN      NOT NULL DEFAULT FALSE,
    started_at   BIGINT       NOT NULL,
    heartbeat_at BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
