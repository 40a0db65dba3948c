-- A retried dead letter that had released its key, as on PostgreSQL: a claim takes it only when
-- no later message of its key holds a lease. 0 for every other row.
ALTER TABLE outbox_messages ADD COLUMN retried_release INTEGER NOT NULL DEFAULT 0;
