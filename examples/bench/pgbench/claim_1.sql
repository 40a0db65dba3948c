-- One message per transaction: claim one due row and commit it as done in the same statement
-- (the design that commits every success on its own). rows/s = tps.
UPDATE pgb_outbox
SET status = 'done', attempts = attempts + 1, processed_at = now()
WHERE id = (
    SELECT id FROM pgb_outbox
    WHERE topic = 'bench.message' AND status IN ('pending', 'running') AND available_at <= now()
    ORDER BY available_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED)
RETURNING id, payload;
