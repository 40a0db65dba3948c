-- Processed-id records of the dedup wrapper, written in the effect's own transaction.
CREATE TABLE outbox_processed (
    handler      VARCHAR(255) NOT NULL,
    message_id   BINARY(16)   NOT NULL,
    processed_at BIGINT       NOT NULL,
    PRIMARY KEY (handler, message_id),
    INDEX outbox_processed_processed_at_idx (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
