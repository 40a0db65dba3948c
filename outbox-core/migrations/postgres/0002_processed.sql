-- Processed-id records of the dedup wrapper: (handler, message) pairs whose effect committed.
CREATE TABLE outbox_processed (
    handler      TEXT        NOT NULL,
    message_id   UUID        NOT NULL,
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (handler, message_id)
);

-- Purge deletes by age.
CREATE INDEX outbox_processed_processed_at_idx ON outbox_processed (processed_at);
