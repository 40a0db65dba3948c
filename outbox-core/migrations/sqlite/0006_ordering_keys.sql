-- Per-key ordering (opt-in), as on PostgreSQL: a message with an ordering key is not started
-- while an earlier message of its key (smaller id) is live, or is dead and holds its key.
-- Keys compare byte-wise (SQLite's default collation).
ALTER TABLE outbox_messages ADD COLUMN ordering_key TEXT
    CHECK (ordering_key IS NULL OR length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255);
ALTER TABLE outbox_messages ADD COLUMN releases_key INTEGER NOT NULL DEFAULT 0;
ALTER TABLE outbox_dead ADD COLUMN ordering_key TEXT;
ALTER TABLE outbox_dead ADD COLUMN releases_key INTEGER NOT NULL DEFAULT 0;

-- Unordered claims read unordered rows only; keyed rows are claimed through their key's head.
DROP INDEX outbox_messages_ready_idx;
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at)
    WHERE ordering_key IS NULL;

CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, id)
    WHERE ordering_key IS NOT NULL;

CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND releases_key = 0;
