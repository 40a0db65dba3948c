//! Statistics, dead letters and purges, for the operations tools (`outbox` and the console).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;
use uuid::Uuid;

use super::secs;
use crate::backend::{selection, topic_stats, StatsRow};
use crate::error::Result;
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

/// Pending topics with their counts, among topics not in `$1`.
const UNKNOWN_TOPICS: &str = "SELECT topic, count(*) FROM outbox_messages \
     WHERE NOT (topic = ANY($1::text[])) \
     GROUP BY topic ORDER BY topic";

/// Per-topic counts: ready, scheduled, running, stalled, dead, done in the last 5 minutes,
/// the oldest ready message's age, the oldest stall, live workers, the ordered messages
/// blocked behind their key (and of those, behind a dead letter) with the oldest one's age,
/// the newest version of the topic's live messages if no live worker knows it, and the due
/// messages that wait for a worker that knows their version, with the oldest one's age.
///
/// The live table holds only pending and running rows; dead letters and the done counts have
/// tables of their own. A keyed row is behind when its key's head (the least `seq` of the key's
/// live rows, one `GROUP BY` over the key index) is before it, and behind a dead letter when
/// its key's first dead letter that holds the key is before it: two hash joins, never a
/// subquery per row (per-row subqueries make the planner's estimate large enough to
/// JIT-compile the statement, which costs more than the query).
pub(super) const STATS: &str = "WITH served AS ( \
        SELECT t.topic, count(*) AS workers, max(t.version) AS known_version \
        FROM outbox_workers, unnest(topics, versions) AS t(topic, version) \
        WHERE heartbeat_at > now() - interval '5 seconds' AND t.topic IS NOT NULL GROUP BY t.topic \
     ), heads AS ( \
        SELECT ordering_key, min(seq) AS seq FROM outbox_messages \
        WHERE ordering_key IS NOT NULL GROUP BY ordering_key \
     ), dead_heads AS ( \
        SELECT ordering_key, min(seq) AS seq FROM outbox_dead \
        WHERE ordering_key IS NOT NULL AND NOT releases_key GROUP BY ordering_key \
     ), msgs AS ( \
        SELECT m.topic, m.version, m.available_at, m.locked_until, \
               m.available_at <= now() AND (m.locked_until IS NULL OR m.locked_until < now()) AS due, \
               CASE WHEN dh.seq < m.seq THEN 2 WHEN h.seq < m.seq THEN 1 ELSE 0 END AS held, \
               coalesce(m.version > s.known_version, false) AS unknown \
        FROM outbox_messages m \
        LEFT JOIN heads h ON h.ordering_key = m.ordering_key \
        LEFT JOIN dead_heads dh ON dh.ordering_key = m.ordering_key \
        LEFT JOIN served s ON s.topic = m.topic \
     ), live AS ( \
        SELECT topic, \
               count(*) FILTER (WHERE due AND held = 0 AND NOT unknown) AS ready, \
               count(*) FILTER (WHERE due AND held > 0) AS blocked, \
               count(*) FILTER (WHERE due AND held = 2) AS blocked_by_dead, \
               count(*) FILTER (WHERE due AND held = 0 AND unknown) AS awaiting, \
               count(*) FILTER (WHERE available_at > now() AND locked_until IS NULL) AS scheduled, \
               count(*) FILTER (WHERE locked_until >= now()) AS in_flight, \
               count(*) FILTER (WHERE locked_until < now()) AS stalled, \
               min(available_at) FILTER (WHERE due AND held = 0 AND NOT unknown) AS oldest_at, \
               min(available_at) FILTER (WHERE due AND held > 0) AS blocked_at, \
               min(available_at) FILTER (WHERE due AND held = 0 AND unknown) AS awaiting_at, \
               min(locked_until) FILTER (WHERE locked_until < now()) AS stalled_since, \
               max(version) AS newest_version \
        FROM msgs GROUP BY topic \
     ), dead AS ( \
        SELECT topic, n AS dead FROM outbox_dead_counts \
     ), done AS ( \
        SELECT topic, sum(done)::bigint AS done FROM outbox_done_counts \
        WHERE minute > now() - interval '5 minutes' GROUP BY topic \
     ), topics AS ( \
        SELECT topic FROM live UNION SELECT topic FROM dead UNION SELECT topic FROM done \
        UNION SELECT topic FROM served \
     ) \
     SELECT t.topic, coalesce(l.ready, 0), coalesce(l.scheduled, 0), \
            coalesce(l.in_flight, 0), coalesce(l.stalled, 0), coalesce(d.dead, 0), coalesce(o.done, 0), \
            extract(epoch FROM now() - l.oldest_at)::float8, \
            extract(epoch FROM now() - l.stalled_since)::float8, coalesce(s.workers, 0), \
            coalesce(l.blocked, 0), coalesce(l.blocked_by_dead, 0), \
            extract(epoch FROM now() - l.blocked_at)::float8, \
            CASE WHEN l.newest_version > s.known_version THEN l.newest_version END, \
            coalesce(l.awaiting, 0), extract(epoch FROM now() - l.awaiting_at)::float8 \
     FROM topics t \
     LEFT JOIN live l ON l.topic = t.topic \
     LEFT JOIN dead d ON d.topic = t.topic \
     LEFT JOIN done o ON o.topic = t.topic \
     LEFT JOIN served s ON s.topic = t.topic \
     ORDER BY t.topic";

/// Messages done per minute over the last `$1` minutes, oldest first.
const DONE_PER_MINUTE: &str = "SELECT minute, sum(done)::bigint FROM outbox_done_counts \
     WHERE minute >= date_trunc('minute', now()) - make_interval(mins => $1) \
     GROUP BY minute ORDER BY minute";

/// Up to `$3` dead letters, newest first: of topic `$1` (any if NULL), dead for at least `$2`
/// seconds (any if NULL), after the cursor (`$4` dead at, `$5` id) if there is one.
const DEAD_LIST: &str = "SELECT id, topic, 'dead' AS status, attempts, payload::text AS payload, last_error, \
            created_at, dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead \
     WHERE ($1::text IS NULL OR topic = $1) \
       AND ($2::float8 IS NULL OR dead_at <= now() - make_interval(secs => $2)) \
       AND ($4::timestamptz IS NULL OR (dead_at, id) < ($4, $5)) \
     ORDER BY dead_at DESC, id DESC LIMIT $3";

/// Message `$1`, live or dead, in the columns of [`DEAD_LIST`].
const MESSAGE: &str = "SELECT id, topic, CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END AS status, \
            attempts, payload::text AS payload, last_error, created_at, \
            coalesce(locked_until, available_at) AS available_at, NULL::timestamptz AS processed_at, \
            idempotency_key, ordering_key \
     FROM outbox_messages WHERE id = $1 \
     UNION ALL SELECT id, topic, 'dead' AS status, attempts, payload::text AS payload, last_error, \
            created_at, dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead WHERE id = $1";

/// The handlers that succeeded for message `$1`, with when.
const HANDLERS_DONE: &str =
    "SELECT handler, completed_at FROM outbox_deliveries WHERE message_id = $1 \
     ORDER BY completed_at, handler";

/// Dead letters back to pending, attempts reset: the one of id `$1` or those of topic `$2`
/// (all if both are NULL). Returns how many.
///
/// A letter keeps its place in its key's order (`seq`); a keyed one that has none (0: written
/// by a worker of the previous release) takes a new one. A retried letter that had released its
/// key is marked `retried_release`: the claims take it only once no later message of its key
/// holds a lease (those ran on while it was dead).
///
/// Waiting workers of the retried topics are woken, as a producer would wake them: the
/// operator may run this from another process, long before their next poll.
const DEAD_RETRY: &str = "WITH del AS ( \
        DELETE FROM outbox_dead \
        WHERE ($1::uuid IS NULL OR id = $1) AND ($2::text IS NULL OR topic = $2) \
        RETURNING id, topic, payload, idempotency_key, last_error, created_at, ordering_key, releases_key, \
                  traceparent, tracestate, version, seq \
     ), ins AS ( \
        INSERT INTO outbox_messages (id, topic, payload, idempotency_key, last_error, created_at, \
                                     ordering_key, releases_key, retried_release, traceparent, \
                                     tracestate, version, seq) \
        SELECT id, topic, payload, idempotency_key, last_error, created_at, ordering_key, releases_key, \
               ordering_key IS NOT NULL AND releases_key, traceparent, tracestate, version, \
               CASE WHEN seq = 0 AND ordering_key IS NOT NULL THEN nextval('outbox_messages_seq') \
                    ELSE seq END \
        FROM del \
        RETURNING topic \
     ), woke AS ( \
        SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
        WHERE w.waiting AND w.heartbeat_at > now() - interval '5 seconds' \
          AND w.topics && ARRAY(SELECT DISTINCT topic FROM ins) \
     ) \
     SELECT count(*) + 0 * (SELECT count(*) FROM woke) FROM ins";

/// Deletes dead letters and their per-handler progress: the one of id `$1` or those of topic
/// `$2` (all if both are NULL). Returns how many.
///
/// A discarded dead letter with an ordering key unblocks the later messages of its key:
/// waiting workers are woken to take them.
const DEAD_DISCARD: &str = "WITH del AS ( \
        DELETE FROM outbox_dead \
        WHERE ($1::uuid IS NULL OR id = $1) AND ($2::text IS NULL OR topic = $2) \
        RETURNING id, ordering_key \
     ), progress AS ( \
        DELETE FROM outbox_deliveries WHERE message_id IN (SELECT id FROM del) \
     ), woke AS ( \
        SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
        WHERE w.waiting AND w.heartbeat_at > now() - interval '5 seconds' \
          AND EXISTS (SELECT 1 FROM del WHERE ordering_key IS NOT NULL) \
     ) \
     SELECT count(*) + 0 * (SELECT count(*) FROM woke) FROM del";

/// Deletes up to `$2` per-minute done counts older than `$1` seconds, oldest first.
const PURGE_DONE: &str = "DELETE FROM outbox_done_counts WHERE ctid = ANY(ARRAY( \
        SELECT ctid FROM outbox_done_counts \
        WHERE minute < now() - make_interval(secs => $1) \
        ORDER BY minute LIMIT $2))";

/// Deletes up to `$2` processed-id records older than `$1` seconds, oldest first.
const PURGE_PROCESSED: &str = "DELETE FROM outbox_processed WHERE ctid = ANY(ARRAY( \
        SELECT ctid FROM outbox_processed \
        WHERE processed_at < now() - make_interval(secs => $1) \
        ORDER BY processed_at LIMIT $2))";

/// A row of [`DEAD_LIST`] or [`MESSAGE`].
fn message_info(r: &PgRow) -> Result<MessageInfo, sqlx::Error> {
    Ok(MessageInfo {
        id: r.try_get("id")?,
        topic: r.try_get("topic")?,
        status: {
            let status: String = r.try_get("status")?;
            status
                .parse()
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?
        },
        attempts: r.try_get("attempts")?,
        payload: r.try_get("payload")?,
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
        available_at: r.try_get("available_at")?,
        processed_at: r.try_get("processed_at")?,
        idempotency_key: r.try_get("idempotency_key")?,
        ordering_key: r.try_get("ordering_key")?,
        handlers_done: Vec::new(),
    })
}

pub(super) async fn unknown_topics(pool: &PgPool, known: &[&str]) -> Result<Vec<(String, i64)>> {
    Ok(sqlx::query_as(UNKNOWN_TOPICS)
        .bind(known)
        .fetch_all(pool)
        .await?)
}

pub(super) async fn stats(pool: &PgPool) -> Result<Vec<TopicStats>> {
    type Row = StatsRow<f64, i32>;
    let rows: Vec<Row> = sqlx::query_as(STATS).fetch_all(pool).await?;
    let age = |s: Option<f64>| s.and_then(|s| Duration::try_from_secs_f64(s.max(0.0)).ok());
    Ok(rows.into_iter().map(|row| topic_stats(row, age)).collect())
}

pub(super) async fn done_per_minute(
    pool: &PgPool,
    minutes: u32,
) -> Result<Vec<(DateTime<Utc>, i64)>> {
    Ok(sqlx::query_as(DONE_PER_MINUTE)
        .bind(i32::try_from(minutes).unwrap_or(i32::MAX))
        .fetch_all(pool)
        .await?)
}

pub(super) async fn dead_list(pool: &PgPool, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
    let rows = sqlx::query(DEAD_LIST)
        .bind(f.topic.as_deref())
        .bind(f.older_than.map(secs))
        .bind(i64::from(f.limit.unwrap_or(100)))
        .bind(f.after.map(|c| c.dead_at))
        .bind(f.after.map(|c| c.id))
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
}

pub(super) async fn message(pool: &PgPool, id: Uuid) -> Result<Option<MessageInfo>> {
    let row = sqlx::query(MESSAGE).bind(id).fetch_optional(pool).await?;
    let Some(mut info) = row.as_ref().map(message_info).transpose()? else {
        return Ok(None);
    };
    info.handlers_done = sqlx::query_as(HANDLERS_DONE)
        .bind(id)
        .fetch_all(pool)
        .await?;
    Ok(Some(info))
}

pub(super) async fn dead_retry(pool: &PgPool, which: &DeadSelection) -> Result<u64> {
    let (id, topic) = selection(which);
    let n: i64 = sqlx::query_scalar(DEAD_RETRY)
        .bind(id)
        .bind(topic)
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) async fn dead_discard(pool: &PgPool, which: &DeadSelection) -> Result<u64> {
    let (id, topic) = selection(which);
    let n: i64 = sqlx::query_scalar(DEAD_DISCARD)
        .bind(id)
        .bind(topic)
        .fetch_one(pool)
        .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) async fn purge_done(pool: &PgPool, older_than: Duration, batch: i64) -> Result<u64> {
    let r = sqlx::query(PURGE_DONE)
        .bind(secs(older_than))
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

pub(super) async fn purge_processed(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<u64> {
    let r = sqlx::query(PURGE_PROCESSED)
        .bind(secs(older_than))
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}
