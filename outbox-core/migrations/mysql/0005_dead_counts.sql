-- Dead letters counted per topic, kept by triggers, so statistics read one row per topic
-- instead of counting every dead letter.
CREATE TABLE outbox_dead_counts (
    topic VARCHAR(64) NOT NULL PRIMARY KEY,
    n     BIGINT      NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TRIGGER outbox_dead_added AFTER INSERT ON outbox_dead FOR EACH ROW
    INSERT INTO outbox_dead_counts (topic, n) VALUES (NEW.topic, 1)
    ON DUPLICATE KEY UPDATE n = n + 1;

CREATE TRIGGER outbox_dead_removed AFTER DELETE ON outbox_dead FOR EACH ROW
    UPDATE outbox_dead_counts SET n = n - 1 WHERE topic = OLD.topic;
