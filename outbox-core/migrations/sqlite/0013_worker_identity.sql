-- Who each worker is, as on PostgreSQL: its host, its process id, and per topic of `topics`
-- the names of its handlers (a JSON array of arrays, in the order of `topics`).
ALTER TABLE outbox_workers ADD COLUMN host TEXT;
ALTER TABLE outbox_workers ADD COLUMN pid INTEGER;
ALTER TABLE outbox_workers ADD COLUMN handlers TEXT NOT NULL DEFAULT '[]';
