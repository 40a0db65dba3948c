-- Processed-id records of the dedup wrapper.
CREATE TABLE outbox_processed (
    handler      TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (handler, message_id)
);

CREATE INDEX outbox_processed_processed_at_idx ON outbox_processed (processed_at);
