-- The version of the event type a message was written with, as on PostgreSQL; dead letters
-- keep it. Per topic a worker serves, the highest version it decodes (a JSON array in the
-- order of `topics`).
ALTER TABLE outbox_messages ADD COLUMN version INT NOT NULL DEFAULT 1;
ALTER TABLE outbox_dead ADD COLUMN version INT NOT NULL DEFAULT 1;
ALTER TABLE outbox_workers ADD COLUMN versions LONGTEXT NULL;
