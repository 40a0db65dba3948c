-- Per-key ordering (opt-in): a message with an ordering key is not started while an earlier
-- message of its key (smaller id, i.e. enqueued before it) is live, or is dead and holds its key.
--
-- - ordering_key: NULL for unordered messages. Byte order ("C" collation), so the claim's walk
--   over keys (a loose index scan, see the claim) orders keys the same way on every server.
-- - releases_key: a dead message of this event lets the later ones of its key go on; by default
--   (false) it blocks them until an operator retries or discards it.
-- Both columns are copied to outbox_dead when a message dies and back when it is retried.
ALTER TABLE outbox_messages
    ADD COLUMN ordering_key TEXT COLLATE "C" CHECK (length(ordering_key) BETWEEN 1 AND 255),
    ADD COLUMN releases_key BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE outbox_dead
    ADD COLUMN ordering_key TEXT COLLATE "C",
    ADD COLUMN releases_key BOOLEAN NOT NULL DEFAULT false;

-- The claim index of unordered messages leaves keyed rows out, so unordered claims never read
-- them; keyed rows are claimed through their key's head instead.
DROP INDEX outbox_messages_ready_idx;
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at)
    WHERE ordering_key IS NULL;

-- A key's live messages in enqueue order: the first entry of each key is its head.
CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, id)
    WHERE ordering_key IS NOT NULL;

-- Dead letters that hold their key.
CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND NOT releases_key;
