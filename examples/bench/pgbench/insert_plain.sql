-- The business INSERT plus the cheapest second INSERT there is (a text row, one primary key):
-- the floor under what writing any second row, an outbox message or not, costs a producer.
\set amount random(1, 100000)
BEGIN;
INSERT INTO pgb_orders (customer, amount) VALUES ('customer@example.com', :amount);
INSERT INTO pgb_plain (payload)
VALUES ('{"seq": 1, "order_id": "ord-000000000001", "customer": "customer-1@example.com", "amount_cents": 4200, "currency": "EUR", "note": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}');
COMMIT;
