-- One business INSERT plus one outbox INSERT per transaction (what `enqueue` adds to a
-- producer's transaction).
\set amount random(1, 100000)
BEGIN;
INSERT INTO pgb_orders (customer, amount) VALUES ('customer@example.com', :amount);
INSERT INTO pgb_outbox (public_id, topic, payload)
VALUES (gen_random_uuid(), 'bench.message',
        '{"seq": 1, "order_id": "ord-000000000001", "customer": "customer-1@example.com", "amount_cents": 4200, "currency": "EUR", "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}');
COMMIT;
