-- Per-key ordering (opt-in), as on PostgreSQL: a message with an ordering key is not started
-- while an earlier message of its key (smaller id) is live, or is dead and holds its key.
-- Keys compare byte-wise (utf8mb4_bin).
ALTER TABLE outbox_messages
    ADD COLUMN ordering_key VARCHAR(255) NULL,
    ADD COLUMN releases_key BOOLEAN NOT NULL DEFAULT FALSE,
    ADD CONSTRAINT outbox_messages_key_len
        CHECK (ordering_key IS NULL OR OCTET_LENGTH(ordering_key) BETWEEN 1 AND 255);
ALTER TABLE outbox_dead
    ADD COLUMN ordering_key VARCHAR(255) NULL,
    ADD COLUMN releases_key BOOLEAN NOT NULL DEFAULT FALSE;

-- Unordered claims read the rows whose key IS NULL, in due order: an equality on (topic,
-- ordering_key) followed by the order column, so the claim reads the index in the order it
-- takes rows. Keyed rows are claimed through their key's head, found on the key index with a
-- loose index scan (one probe per key).
DROP INDEX outbox_messages_ready_idx ON outbox_messages;
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, ordering_key, available_at);
CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, id);
CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, releases_key, id);
