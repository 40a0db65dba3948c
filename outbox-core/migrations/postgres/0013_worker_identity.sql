-- Who each worker is, for `outbox workers`, `Store::workers` and the console: the host it runs
-- on, its process id, and per topic of `topics` (at the same position) the names of the
-- handlers it runs for that topic, as a JSON array of arrays of names. Rows of workers that
-- started before this column existed have no host or pid until they restart.
ALTER TABLE outbox_workers ADD COLUMN host TEXT;
ALTER TABLE outbox_workers ADD COLUMN pid BIGINT;
ALTER TABLE outbox_workers ADD COLUMN handlers TEXT NOT NULL DEFAULT '[]';
