-- Dead letters counted per topic, kept by triggers, so statistics read one row per topic
-- instead of counting every dead letter.
CREATE TABLE outbox_dead_counts (
    topic TEXT    PRIMARY KEY,
    n     INTEGER NOT NULL
);

INSERT INTO outbox_dead_counts (topic, n)
SELECT topic, count(*) FROM outbox_dead GROUP BY topic;

CREATE TRIGGER outbox_dead_added AFTER INSERT ON outbox_dead
BEGIN
    INSERT INTO outbox_dead_counts (topic, n) VALUES (NEW.topic, 1)
    ON CONFLICT (topic) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER outbox_dead_removed AFTER DELETE ON outbox_dead
BEGIN
    UPDATE outbox_dead_counts SET n = n - 1 WHERE topic = OLD.topic;
    DELETE FROM outbox_dead_counts WHERE topic = OLD.topic AND n <= 0;
END;
