-- The event log: the delivered events of the topics that retain them, kept for the topic's
-- window after delivery, to list and replay. As on PostgreSQL, the longest window declared
-- wins, unless an operator set the window (`pinned`). One table (as on SQLite): the upkeep
-- deletes expired events in batches of 1,000, oldest first, on the (topic, delivered_at) index.
CREATE TABLE outbox_retention (
    topic       VARCHAR(64) NOT NULL PRIMARY KEY,
    retain_ms   BIGINT      NOT NULL,
    pinned      BOOLEAN     NOT NULL DEFAULT FALSE,
    declared_at BIGINT      NOT NULL,
    changed_at  BIGINT      NOT NULL,
    CONSTRAINT outbox_retention_positive CHECK (retain_ms > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Written by the done write that deletes the live row, in the same transaction.
CREATE TABLE outbox_events (
    id              BINARY(16)   NOT NULL PRIMARY KEY,   -- the message id, UUID v7
    topic           VARCHAR(64)  NOT NULL,
    payload         LONGTEXT     NOT NULL,
    version         INT          NOT NULL,
    idempotency_key TEXT         NULL,
    ordering_key    VARCHAR(255) NULL,
    created_at      BIGINT       NOT NULL,
    delivered_at    BIGINT       NOT NULL,
    traceparent     TEXT         NULL,
    tracestate      TEXT         NULL,
    INDEX outbox_events_topic_idx (topic, id),
    INDEX outbox_events_delivered_idx (topic, delivered_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
