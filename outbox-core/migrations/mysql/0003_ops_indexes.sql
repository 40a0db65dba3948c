-- The claim's index: equality on the topic and on the absent ordering key (added by
-- migration 6, which rebuilds this index), then due order. A claim reads it in the order it
-- takes rows, so it never sorts the candidates.
CREATE INDEX outbox_messages_ready_idx ON outbox_messages (topic, available_at);
