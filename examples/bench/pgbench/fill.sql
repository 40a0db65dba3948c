-- Empties the tables and loads 500,000 pending messages (~200-byte JSON payloads) for the claim
-- scripts. Run it before each claim_*.sql run: claimed rows are done and not claimed again.
TRUNCATE pgb_outbox, pgb_orders, pgb_plain RESTART IDENTITY;

INSERT INTO pgb_outbox (public_id, topic, payload)
SELECT gen_random_uuid(), 'bench.message',
       jsonb_build_object(
           'seq', g,
           'order_id', 'ord-' || lpad(g::text, 12, '0'),
           'customer', 'customer-' || (g % 1000) || '@example.com',
           'amount_cents', g % 100000,
           'currency', 'EUR',
           'note', repeat('x', 64))
FROM generate_series(1, 500000) AS g;

VACUUM ANALYZE pgb_outbox;
