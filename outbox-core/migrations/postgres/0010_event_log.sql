-- The event log: the delivered events of the topics that retain them, kept for the topic's
-- window after delivery, to list and replay.
--
-- Retention per topic, as the workers declared it at start (the longest window any of them
-- declares wins, so a worker of an older build never shortens it) or as an operator set it
-- (`pinned`: then declarations leave it alone).
-- `id` names the topic's partitions: table names hold only numbers and dates, never a topic.
CREATE TABLE outbox_retention (
    topic       TEXT        PRIMARY KEY CHECK (length(topic) BETWEEN 1 AND 64),
    id          INTEGER     GENERATED ALWAYS AS IDENTITY UNIQUE,
    retain_secs BIGINT      NOT NULL CHECK (retain_secs > 0),
    pinned      BOOLEAN     NOT NULL DEFAULT false,
    declared_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    changed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Append-only: written by the done write that deletes the live row, in the same statement,
-- and removed only by dropping a whole day's partition. Partitioned by topic, then by day of
-- delivery, so each topic's window drops its own days. No DEFAULT partition: the workers
-- create each retained topic's days ahead (see outbox_event_partitions), and the statistics
-- and the health check warn when the days ahead run short.
CREATE TABLE outbox_events (
    topic_id        INTEGER     NOT NULL,
    delivered_at    TIMESTAMPTZ NOT NULL,
    id              UUID        NOT NULL,
    topic           TEXT        NOT NULL,
    payload         JSON        NOT NULL,
    version         INTEGER     NOT NULL,
    idempotency_key TEXT,
    ordering_key    TEXT COLLATE "C",
    created_at      TIMESTAMPTZ NOT NULL,
    traceparent     TEXT,
    tracestate      TEXT
) PARTITION BY LIST (topic_id);

-- Reads go in message-id order (enqueue order), per key when one is given.
CREATE INDEX outbox_events_id_idx ON outbox_events (id);
CREATE INDEX outbox_events_key_idx ON outbox_events (ordering_key, id)
    WHERE ordering_key IS NOT NULL;

-- Creates, for every retained topic, its partition and its day partitions from the day of `at`
-- to `days_ahead` days later (UTC days), where missing. Returns how many day partitions it
-- created. The names are built here, from numbers and dates only.
CREATE FUNCTION outbox_event_partitions(at TIMESTAMPTZ, days_ahead INTEGER) RETURNS INTEGER
LANGUAGE plpgsql AS $$
DECLARE
    topic_id INTEGER;
    parent TEXT;
    day DATE;
    made INTEGER := 0;
BEGIN
    FOR topic_id IN SELECT id FROM outbox_retention ORDER BY id LOOP
        parent := 'outbox_events_t' || topic_id;
        IF to_regclass(parent) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF outbox_events FOR VALUES IN (%s) '
                           'PARTITION BY RANGE (delivered_at)', parent, topic_id);
        END IF;
        FOR d IN 0..days_ahead LOOP
            day := (at AT TIME ZONE 'UTC')::date + d;
            IF to_regclass(parent || '_' || to_char(day, 'YYYYMMDD')) IS NULL THEN
                EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                               parent || '_' || to_char(day, 'YYYYMMDD'), parent,
                               day::timestamp AT TIME ZONE 'UTC',
                               (day + 1)::timestamp AT TIME ZONE 'UTC');
                made := made + 1;
            END IF;
        END LOOP;
    END LOOP;
    RETURN made;
END $$;

-- The day partitions of a retained topic (`topic_id`), with the day each holds.
CREATE FUNCTION outbox_event_days(topic_id INTEGER)
RETURNS TABLE (partition REGCLASS, day DATE)
LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass, to_date(right(c.relname, 8), 'YYYYMMDD')
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = to_regclass('outbox_events_t' || topic_id)
$$;

-- Drops the day partitions whose every event was delivered more than its topic's window
-- before `at`. Returns how many it dropped.
CREATE FUNCTION outbox_event_partitions_expire(at TIMESTAMPTZ) RETURNS INTEGER
LANGUAGE plpgsql AS $$
DECLARE
    p REGCLASS;
    dropped INTEGER := 0;
BEGIN
    FOR p IN
        SELECT d.partition FROM outbox_retention r CROSS JOIN LATERAL outbox_event_days(r.id) d
        WHERE ((d.day + 1)::timestamp AT TIME ZONE 'UTC') <= at - make_interval(secs => r.retain_secs)
        ORDER BY d.day
    LOOP
        EXECUTE format('DROP TABLE %s', p);
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END $$;

-- Stops retaining topic `name` and drops its event log. Returns false when it retained nothing.
CREATE FUNCTION outbox_event_log_forget(name TEXT) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    topic_id INTEGER;
BEGIN
    DELETE FROM outbox_retention WHERE topic = name RETURNING id INTO topic_id;
    IF topic_id IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('DROP TABLE IF EXISTS %I', 'outbox_events_t' || topic_id);
    RETURN true;
END $$;
