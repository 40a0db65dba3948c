-- A key's order is the order in which the database inserted its messages, not the order of
-- their ids (UUID v7, from each producer's clock), as on PostgreSQL. Here `seq` is an
-- AUTO_INCREMENT column: InnoDB hands its numbers out at insert time, so writes that the
-- application serialises (a row lock on the aggregate) are ordered as they committed, and the
-- rows of one multi-row insert (`enqueue_many`) are numbered in their order. Every message
-- takes a number, keyed or not (AUTO_INCREMENT cannot skip a row).
--
-- Rows already here keep their order: live messages and keyed dead letters are numbered in
-- id order (the order they had), before any new message; the counter starts after them.
-- Dead letters of the previous release's workers, and retained events logged before this
-- migration, have 0 (see the PostgreSQL migration).

ALTER TABLE outbox_messages ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox_dead ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE outbox_events ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;

CREATE TEMPORARY TABLE outbox_seq_upgrade AS
SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS seq
FROM (SELECT id FROM outbox_messages
      UNION ALL
      SELECT id FROM outbox_dead WHERE ordering_key IS NOT NULL) keyed;
UPDATE outbox_messages m JOIN outbox_seq_upgrade u ON u.id = m.id SET m.seq = u.seq;
UPDATE outbox_dead d JOIN outbox_seq_upgrade u ON u.id = d.id SET d.seq = u.seq;

-- AUTO_INCREMENT needs an index that starts with the column; the claim of heads reads it too.
-- Rows inserted by a producer of the previous release while this migration ran (0) are
-- numbered by this statement, after the others.
ALTER TABLE outbox_messages MODIFY seq BIGINT NOT NULL AUTO_INCREMENT,
    ADD UNIQUE INDEX outbox_messages_seq_idx (seq);

-- No number is handed out again, a dead letter's included.
SET @outbox_next_seq = (SELECT GREATEST(COALESCE((SELECT MAX(seq) FROM outbox_seq_upgrade), 0),
                                        COALESCE((SELECT MAX(seq) FROM outbox_messages), 0)) + 1);
SET @outbox_sql = CONCAT('ALTER TABLE outbox_messages AUTO_INCREMENT = ', @outbox_next_seq);
PREPARE outbox_seq_stmt FROM @outbox_sql;
EXECUTE outbox_seq_stmt;
DEALLOCATE PREPARE outbox_seq_stmt;
DROP TEMPORARY TABLE outbox_seq_upgrade;

-- A key's live messages in insert order: the first entry of each key is its head.
DROP INDEX outbox_messages_key_idx ON outbox_messages;
CREATE INDEX outbox_messages_key_idx ON outbox_messages (ordering_key, seq);
DROP INDEX outbox_dead_key_idx ON outbox_dead;
CREATE INDEX outbox_dead_key_idx ON outbox_dead (ordering_key, releases_key, seq);

-- The log is read in (seq, id) order: a key's events in insert order.
DROP INDEX outbox_events_topic_idx ON outbox_events;
CREATE INDEX outbox_events_topic_idx ON outbox_events (topic, seq, id);

-- A replay's cursor is the (seq, id) of the last event it handled.
ALTER TABLE outbox_replays ADD COLUMN cursor_seq BIGINT NULL;
