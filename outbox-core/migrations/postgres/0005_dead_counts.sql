-- Dead letters counted per topic, kept by a statement trigger, so statistics read one row per
-- topic instead of counting every dead letter (a scan that grows with the dead-letter table).
CREATE TABLE outbox_dead_counts (
    topic TEXT   PRIMARY KEY,
    n     BIGINT NOT NULL
);

INSERT INTO outbox_dead_counts (topic, n)
SELECT topic, count(*) FROM outbox_dead GROUP BY topic;

CREATE FUNCTION outbox_dead_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO outbox_dead_counts (topic, n)
        SELECT topic, count(*) FROM outbox_dead_added GROUP BY topic
        ON CONFLICT (topic) DO UPDATE SET n = outbox_dead_counts.n + excluded.n;
    ELSE
        UPDATE outbox_dead_counts c SET n = c.n - r.k
        FROM (SELECT topic, count(*) AS k FROM outbox_dead_removed GROUP BY topic) r
        WHERE c.topic = r.topic;
        DELETE FROM outbox_dead_counts WHERE n <= 0;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_dead_added AFTER INSERT ON outbox_dead
    REFERENCING NEW TABLE AS outbox_dead_added
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_dead_counted();
CREATE TRIGGER outbox_dead_removed AFTER DELETE ON outbox_dead
    REFERENCING OLD TABLE AS outbox_dead_removed
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_dead_counted();
