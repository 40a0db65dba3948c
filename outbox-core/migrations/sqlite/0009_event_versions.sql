-- The version of the event type a message was written with, as on PostgreSQL: rows written
-- before this column existed are version 1, and dead letters keep it.
ALTER TABLE outbox_messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE outbox_dead ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
-- Per topic the worker serves, the highest version it decodes (a JSON array in the order of
-- `topics`).
ALTER TABLE outbox_workers ADD COLUMN versions TEXT NOT NULL DEFAULT '[]';
