-- The outbox on MariaDB (>= 10.6) and MySQL (>= 8.0), InnoDB: the same states as on PostgreSQL.
-- Ids (message ids, claim tokens, workers) are UUIDs as BINARY(16); UUID v7 ids sort by time,
-- so the clustered primary key appends. Times are Unix milliseconds (UTC), read from the
-- server's clock. Text is utf8mb4; topics, keys and handler names compare byte-wise.
-- The live table holds pending and running messages only: a done message is deleted, a dead
-- one moves to outbox_dead.
CREATE TABLE outbox_messages (
    id              BINARY(16)   NOT NULL PRIMARY KEY,
    topic           VARCHAR(64)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    payload         LONGTEXT     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    idempotency_key TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    attempts        INT          NOT NULL DEFAULT 0,
    available_at    BIGINT       NOT NULL,                -- due time
    locked_until    BIGINT       NULL,                    -- running while in the future
    claim_token     BINARY(16)   NULL,
    claimed_by      BINARY(16)   NULL,
    last_error      TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at      BIGINT       NOT NULL,
    CONSTRAINT outbox_messages_topic_len CHECK (CHAR_LENGTH(topic) BETWEEN 1 AND 64),
    CONSTRAINT outbox_messages_payload_json CHECK (JSON_VALID(payload))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Per-(message, handler) progress: a handler listed here has succeeded for that message and
-- is skipped when the message is tried again.
CREATE TABLE outbox_deliveries (
    message_id   BINARY(16)   NOT NULL,
    handler      VARCHAR(255) NOT NULL,
    completed_at BIGINT       NOT NULL,
    PRIMARY KEY (message_id, handler)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
