-- The version of the event type a message was written with (`Event::VERSION`): a worker
-- claims only the versions it can decode, and decodes an older one as the type of that
-- version before converting it to the current type. Rows written before this column existed
-- are version 1. A constant default, so adding it rewrites no row. Dead letters keep it, so a
-- retried dead letter is decoded as it was written.
ALTER TABLE outbox_messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE outbox_dead ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
-- Per topic of `topics`, at the same position, the highest version the worker decodes:
-- operations name versions that no live worker knows.
ALTER TABLE outbox_workers ADD COLUMN versions INTEGER[] NOT NULL DEFAULT '{}';
