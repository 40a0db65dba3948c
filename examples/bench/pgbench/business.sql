-- The business transaction alone (W2 without `enqueue`): one INSERT into the business table.
\set amount random(1, 100000)
BEGIN;
INSERT INTO pgb_orders (customer, amount) VALUES ('customer@example.com', :amount);
COMMIT;
