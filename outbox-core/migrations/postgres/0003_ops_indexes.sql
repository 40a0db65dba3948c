-- Operations read and purge DONE and DEAD rows through these partial indexes only, so their
-- cost follows the rows they touch, not the size of the table.
CREATE INDEX outbox_messages_done_idx
    ON outbox_messages (processed_at, topic)
    WHERE status = 'done';

CREATE INDEX outbox_messages_dead_idx
    ON outbox_messages (topic, processed_at)
    WHERE status = 'dead';
