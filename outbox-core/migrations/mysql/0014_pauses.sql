-- Pauses of a handler or a topic, as on PostgreSQL; times in milliseconds since the epoch.
CREATE TABLE outbox_pauses (
    scope     VARCHAR(16)  NOT NULL,
    name      VARCHAR(255) NOT NULL,
    paused_at BIGINT       NOT NULL,
    `until`   BIGINT       NULL,            -- NULL: until resumed
    paused_by VARCHAR(255) NOT NULL,
    reason    TEXT         NULL,
    PRIMARY KEY (scope, name),
    CONSTRAINT outbox_pauses_scope CHECK (scope IN ('handler', 'topic'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The paused handler a message waits for: claims skip the row while it is set.
ALTER TABLE outbox_messages ADD COLUMN parked_by VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL;
CREATE INDEX outbox_messages_parked_idx ON outbox_messages (parked_by);
