-- A retried dead letter that had released its key, as on PostgreSQL: a claim takes it only
-- when no later message of its key holds a lease.
ALTER TABLE outbox_messages ADD COLUMN retried_release BOOLEAN NOT NULL DEFAULT FALSE;
