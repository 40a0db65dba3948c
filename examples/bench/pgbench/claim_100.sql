-- The lease shape: claim up to 100 due rows in one transaction (marking them running under a
-- claim token, payloads sent to the client), then mark them done in a second transaction.
-- Each transaction counts as one pgbench "transaction" step; rows/s = 100 x tps.
\set tok random(1, 1000000000000000)
WITH picked AS (
    SELECT id FROM pgb_outbox
    WHERE topic = 'bench.message' AND status IN ('pending', 'running') AND available_at <= now()
    ORDER BY available_at, id
    LIMIT 100
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE pgb_outbox m
    SET status = 'running', attempts = m.attempts + 1, claim_token = md5(:tok::text)::uuid,
        claimed_by = 'pgbench', claimed_at = now(), available_at = now() + interval '5 minutes'
    FROM picked WHERE m.id = picked.id
    RETURNING m.id, m.payload
)
SELECT string_agg(id::text, ',') AS ids, string_agg(payload::text, ',') AS payloads
FROM claimed \gset
UPDATE pgb_outbox
SET status = 'done', processed_at = now(), claim_token = NULL
WHERE id IN (:ids) AND claim_token = md5(:tok::text)::uuid AND status = 'running';
