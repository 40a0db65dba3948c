-- A dead letter that released its key (`releases_key`), retried by an operator, is again the
-- earliest live message of its key while later messages of the key may already be claimed or
-- running. `retried_release` marks such a row: a claim takes it only when no later message of
-- its key holds a lease, so it runs after those and before the key's still pending ones, and a
-- key never runs two messages at once. False for every other row, so adding it rewrites none.
ALTER TABLE outbox_messages
    ADD COLUMN retried_release BOOLEAN NOT NULL DEFAULT false;
