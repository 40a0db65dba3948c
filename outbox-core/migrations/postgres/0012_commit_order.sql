-- A key's order is the order in which the database inserted its messages, not the order of
-- their ids (UUID v7, from each producer's clock). `seq` is drawn from one sequence at insert
-- time, so writes that the application serialises (a row lock on the aggregate) are ordered as
-- they committed, whatever the producers' clocks say.
--
-- - The sequence has no cache (CACHE 1): a cache hands each session a range of its own, and a
--   session's later insert could then draw a smaller number than another's earlier one.
-- - Producers draw a number for keyed messages only; unkeyed ones are written with 0 (they have
--   no order to keep). The column's default draws one too, so an insert that does not name
--   `seq` (a producer of the previous release) is still ordered by the database.
-- - Dead letters and retained events keep the number of their message: a dead letter holds its
--   key against the key's later messages, a retried one takes its place back, and a replay
--   delivers a key's events in the same order.
-- - Rows already here keep their order: keyed live messages and dead letters are numbered in id
--   order (the order they had), before any new message. Every other row gets 0.
-- - A dead letter written by a worker of the previous release has 0: it holds every live
--   message of its key, which are all later than it (only a key's head is ever claimed).
--   Retained events of the previous release have 0 too, and replay before the newer ones, in id
--   order among themselves.

CREATE SEQUENCE outbox_messages_seq AS BIGINT;

-- A constant default: adding the columns rewrites no row.
ALTER TABLE outbox_messages ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox_dead ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox_events ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;

CREATE TEMPORARY TABLE outbox_seq_upgrade ON COMMIT DROP AS
SELECT id, row_number() OVER (ORDER BY id) AS seq
FROM (SELECT id FROM outbox_messages WHERE ordering_key IS NOT NULL
      UNION ALL
      SELECT id FROM outbox_dead WHERE ordering_key IS NOT NULL) keyed;
UPDATE outbox_messages m SET seq = u.seq FROM outbox_seq_upgrade u WHERE m.id = u.id;
UPDATE outbox_dead d SET seq = u.seq FROM outbox_seq_upgrade u WHERE d.id = u.id;
SELECT setval('outbox_messages_seq', coalesce(max(seq), 0) + 1, false) FROM outbox_seq_upgrade;

ALTER TABLE outbox_messages ALTER COLUMN seq SET DEFAULT nextval('outbox_messages_seq');
ALTER SEQUENCE outbox_messages_seq OWNED BY outbox_messages.seq;

-- A key's live messages in insert order: the first entry of each key is its head.
DROP INDEX outbox_messages_key_idx;
CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, seq)
    WHERE ordering_key IS NOT NULL;

-- Dead letters that hold their key, in the same order.
DROP INDEX outbox_dead_key_idx;
CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND NOT releases_key;

-- The log is read in (seq, id) order: a key's events in insert order, and the events of the
-- previous release (0) first, in id order.
DROP INDEX outbox_events_key_idx;
CREATE INDEX outbox_events_key_idx ON outbox_events (ordering_key, seq, id)
    WHERE ordering_key IS NOT NULL;
CREATE INDEX outbox_events_seq_idx ON outbox_events (seq, id);

-- A replay's cursor is the (seq, id) of the last event it handled.
ALTER TABLE outbox_replays ADD COLUMN cursor_seq BIGINT;
