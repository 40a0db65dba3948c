//! Statistics, dead letters and purges, for the operations tools (`outbox` and the console).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::{ms, parse_uuid, time, LIVE_MS};
use crate::backend::{selection, topic_stats, StatsRow};
use crate::clock::now_ms;
use crate::error::Result;
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

/// Pending topics with their counts, among topics not in `?1` (a JSON array).
const UNKNOWN_TOPICS: &str = "SELECT topic, count(*) FROM outbox_messages \
     WHERE topic NOT IN (SELECT value FROM json_each(?1)) \
     GROUP BY topic ORDER BY topic";

/// Per-topic counts at `?1` (now), workers counting as alive for `?2` milliseconds: ready,
/// scheduled, running, stalled, dead, done in the last 5 minutes, the oldest ready message's
/// time, the oldest stall, live workers, the ordered messages blocked behind their key (and of
/// those, behind a dead letter) with the oldest one's time, the newest version of the topic's
/// live messages if no live worker knows it, and the due messages that wait for a worker that
/// knows their version, with the oldest one's time.
///
/// A keyed row is behind when its key's head (the least `seq` of the key's live rows, one
/// `GROUP BY` over the key index) is before it, and behind a dead letter when its key's first
/// dead letter that holds the key is before it: one lookup per row in `key_heads`, materialized
/// with an automatic index, never a subquery per row. Rows are counted per topic and version
/// as they are read (nothing of them is materialized), so that only those few groups meet the
/// live workers' versions.
pub(super) const STATS: &str = "WITH served AS ( \
        SELECT j.value AS topic, count(*) AS workers, \
               max(json_extract(outbox_workers.versions, '$[' || j.key || ']')) AS known_version \
        FROM outbox_workers, json_each(outbox_workers.topics) AS j \
        WHERE heartbeat_at > ?1 - ?2 GROUP BY j.value \
     ), key_heads AS MATERIALIZED ( \
        SELECT ordering_key, min(live_seq) AS live_seq, min(dead_seq) AS dead_seq FROM ( \
            SELECT ordering_key, min(seq) AS live_seq, NULL AS dead_seq FROM outbox_messages \
            WHERE ordering_key IS NOT NULL GROUP BY ordering_key \
            UNION ALL \
            SELECT ordering_key, NULL, min(seq) FROM outbox_dead \
            WHERE ordering_key IS NOT NULL AND releases_key = 0 GROUP BY ordering_key \
        ) GROUP BY ordering_key \
     ), per_version AS ( \
        SELECT m.topic, m.version, \
               sum((m.available_at <= ?1 AND (m.locked_until IS NULL OR m.locked_until < ?1)) AND NOT (coalesce(h.dead_seq < m.seq, 0) OR coalesce(h.live_seq < m.seq, 0))) AS free, \
               sum((m.available_at <= ?1 AND (m.locked_until IS NULL OR m.locked_until < ?1)) AND (coalesce(h.dead_seq < m.seq, 0) OR coalesce(h.live_seq < m.seq, 0))) AS blocked, \
               sum((m.available_at <= ?1 AND (m.locked_until IS NULL OR m.locked_until < ?1)) AND coalesce(h.dead_seq < m.seq, 0)) AS blocked_by_dead, \
               sum(m.available_at > ?1 AND m.locked_until IS NULL) AS scheduled, \
               sum(m.locked_until >= ?1) AS in_flight, \
               sum(m.locked_until < ?1) AS stalled, \
               min(CASE WHEN (m.available_at <= ?1 AND (m.locked_until IS NULL OR m.locked_until < ?1)) AND NOT (coalesce(h.dead_seq < m.seq, 0) OR coalesce(h.live_seq < m.seq, 0)) THEN m.available_at END) AS free_at, \
               min(CASE WHEN (m.available_at <= ?1 AND (m.locked_until IS NULL OR m.locked_until < ?1)) AND (coalesce(h.dead_seq < m.seq, 0) OR coalesce(h.live_seq < m.seq, 0)) THEN m.available_at END) AS blocked_at, \
               min(CASE WHEN m.locked_until < ?1 THEN m.locked_until END) AS stalled_since \
        FROM outbox_messages m \
        LEFT JOIN key_heads h ON h.ordering_key = m.ordering_key \
        GROUP BY m.topic, m.version \
     ), live AS ( \
        SELECT p.topic, \
               sum(CASE WHEN p.version > s.known_version THEN 0 ELSE p.free END) AS ready, \
               sum(CASE WHEN p.version > s.known_version THEN p.free ELSE 0 END) AS awaiting, \
               sum(p.blocked) AS blocked, \
               sum(p.blocked_by_dead) AS blocked_by_dead, \
               sum(p.scheduled) AS scheduled, \
               sum(p.in_flight) AS in_flight, \
               sum(p.stalled) AS stalled, \
               min(CASE WHEN p.version > s.known_version THEN NULL ELSE p.free_at END) AS oldest, \
               min(CASE WHEN p.version > s.known_version THEN p.free_at END) AS oldest_awaiting, \
               min(p.blocked_at) AS oldest_blocked, \
               min(p.stalled_since) AS stalled_since, \
               max(p.version) AS newest_version \
        FROM per_version p LEFT JOIN served s ON s.topic = p.topic GROUP BY p.topic \
     ), dead AS ( \
        SELECT topic, n AS dead FROM outbox_dead_counts \
     ), done AS ( \
        SELECT topic, sum(done) AS done FROM outbox_done_counts WHERE minute > ?1 - 300000 GROUP BY topic \
     ), topics AS ( \
        SELECT topic FROM live UNION SELECT topic FROM dead UNION SELECT topic FROM done \
        UNION SELECT topic FROM served \
     ) \
     SELECT t.topic, coalesce(l.ready, 0), coalesce(l.scheduled, 0), coalesce(l.in_flight, 0), \
            coalesce(l.stalled, 0), coalesce(d.dead, 0), coalesce(o.done, 0), l.oldest, \
            l.stalled_since, coalesce(s.workers, 0), coalesce(l.blocked, 0), \
            coalesce(l.blocked_by_dead, 0), l.oldest_blocked, \
            CASE WHEN l.newest_version > s.known_version THEN l.newest_version END, \
            coalesce(l.awaiting, 0), l.oldest_awaiting \
     FROM topics t \
     LEFT JOIN live l ON l.topic = t.topic \
     LEFT JOIN dead d ON d.topic = t.topic \
     LEFT JOIN done o ON o.topic = t.topic \
     LEFT JOIN served s ON s.topic = t.topic \
     ORDER BY t.topic";

/// Messages done per minute since minute `?1`, oldest first.
const DONE_PER_MINUTE: &str =
    "SELECT minute, sum(done) FROM outbox_done_counts WHERE minute >= ?1 \
     GROUP BY minute ORDER BY minute";

/// Up to `?3` dead letters, newest first: of topic `?1` (any if NULL), dead at `?2` or before
/// (any if NULL), after the cursor (`?4` dead at, `?5` id) if there is one.
const DEAD_LIST: &str =
    "SELECT id, topic, 'dead' AS status, attempts, payload, last_error, created_at, \
            dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead \
     WHERE (?1 IS NULL OR topic = ?1) AND (?2 IS NULL OR dead_at <= ?2) \
       AND (?4 IS NULL OR (dead_at, id) < (?4, ?5)) \
     ORDER BY dead_at DESC, id DESC LIMIT ?3";

/// Message `?1`, live or dead, at `?2` (now), in the columns of [`DEAD_LIST`].
const MESSAGE: &str =
    "SELECT id, topic, CASE WHEN locked_until >= ?2 THEN 'running' ELSE 'pending' END AS status, \
            attempts, payload, last_error, created_at, \
            coalesce(locked_until, available_at) AS available_at, NULL AS processed_at, \
            idempotency_key, ordering_key \
     FROM outbox_messages WHERE id = ?1 \
     UNION ALL SELECT id, topic, 'dead' AS status, attempts, payload, last_error, created_at, \
            dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead WHERE id = ?1";

/// The handlers that succeeded for message `?1`, with when.
const HANDLERS_DONE: &str =
    "SELECT handler, completed_at FROM outbox_deliveries WHERE message_id = ?1 \
     ORDER BY completed_at, handler";

/// Copies dead letters back to pending, ready at `?3`, attempts reset: the one of id `?1` or
/// those of topic `?2` (all if both are NULL). [`DEAD_DELETE`] then deletes them. A letter
/// keeps its place in its key's order (`seq`); one that has none (0: written by a worker of
/// the previous release) takes a new one. A letter that had released its key is marked
/// `retried_release`, as on PostgreSQL.
const DEAD_RETRY: &str =
    "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, last_error, created_at, \
                                  ordering_key, releases_key, retried_release, traceparent, tracestate, \
                                  version, seq) \
     SELECT id, topic, payload, idempotency_key, ?3, last_error, created_at, ordering_key, releases_key, \
            ordering_key IS NOT NULL AND releases_key <> 0, traceparent, tracestate, version, \
            nullif(seq, 0) \
     FROM outbox_dead \
     WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2)";

/// Deletes the per-handler progress of the dead letters [`DEAD_DELETE`] is about to delete.
const DEAD_PROGRESS: &str = "DELETE FROM outbox_deliveries WHERE message_id IN ( \
         SELECT id FROM outbox_dead WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2))";

/// Deletes dead letters: the one of id `?1` or those of topic `?2` (all if both are NULL).
const DEAD_DELETE: &str =
    "DELETE FROM outbox_dead WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2)";

/// Deletes up to `?2` per-minute done counts of minutes before `?1`, oldest first.
const PURGE_DONE: &str = "DELETE FROM outbox_done_counts WHERE rowid IN ( \
        SELECT rowid FROM outbox_done_counts WHERE minute < ?1 ORDER BY minute LIMIT ?2)";

/// Deletes up to `?2` processed-id records from before `?1`, oldest first.
const PURGE_PROCESSED: &str = "DELETE FROM outbox_processed WHERE rowid IN ( \
        SELECT rowid FROM outbox_processed WHERE processed_at < ?1 ORDER BY processed_at LIMIT ?2)";

/// A row of [`DEAD_LIST`] or [`MESSAGE`].
fn message_info(r: &SqliteRow) -> Result<MessageInfo, sqlx::Error> {
    let processed: Option<i64> = r.try_get("processed_at")?;
    Ok(MessageInfo {
        id: parse_uuid(r.try_get("id")?)?,
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
        created_at: time(r.try_get("created_at")?),
        available_at: time(r.try_get("available_at")?),
        processed_at: processed.map(time),
        idempotency_key: r.try_get("idempotency_key")?,
        ordering_key: r.try_get("ordering_key")?,
        handlers_done: Vec::new(),
    })
}

pub(super) async fn unknown_topics(
    pool: &SqlitePool,
    known: &[&str],
) -> Result<Vec<(String, i64)>> {
    let known = serde_json::to_string(known).unwrap_or_else(|_| "[]".into());
    Ok(sqlx::query_as(UNKNOWN_TOPICS)
        .bind(known)
        .fetch_all(pool)
        .await?)
}

pub(super) async fn stats(pool: &SqlitePool) -> Result<Vec<TopicStats>> {
    type Row = StatsRow<i64, i64>;
    let now = now_ms();
    let rows: Vec<Row> = sqlx::query_as(STATS)
        .bind(now)
        .bind(LIVE_MS)
        .fetch_all(pool)
        .await?;
    let age =
        |t: Option<i64>| t.map(|t| Duration::from_millis(u64::try_from(now - t).unwrap_or(0)));
    Ok(rows.into_iter().map(|row| topic_stats(row, age)).collect())
}

pub(super) async fn done_per_minute(
    pool: &SqlitePool,
    minutes: u32,
) -> Result<Vec<(DateTime<Utc>, i64)>> {
    let now = now_ms();
    let since = now - now.rem_euclid(60_000) - i64::from(minutes) * 60_000;
    let rows: Vec<(i64, i64)> = sqlx::query_as(DONE_PER_MINUTE)
        .bind(since)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(|(m, n)| (time(m), n)).collect())
}

pub(super) async fn dead_list(pool: &SqlitePool, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
    let rows = sqlx::query(DEAD_LIST)
        .bind(f.topic.as_deref())
        .bind(f.older_than.map(|d| now_ms().saturating_sub(ms(d))))
        .bind(i64::from(f.limit.unwrap_or(100)))
        .bind(f.after.map(|c| c.dead_at.timestamp_millis()))
        .bind(f.after.map(|c| c.id.to_string()))
        .fetch_all(pool)
        .await?;
    Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
}

pub(super) async fn message(pool: &SqlitePool, id: Uuid) -> Result<Option<MessageInfo>> {
    let row = sqlx::query(MESSAGE)
        .bind(id.to_string())
        .bind(now_ms())
        .fetch_optional(pool)
        .await?;
    let Some(mut info) = row.as_ref().map(message_info).transpose()? else {
        return Ok(None);
    };
    let done: Vec<(String, i64)> = sqlx::query_as(HANDLERS_DONE)
        .bind(id.to_string())
        .fetch_all(pool)
        .await?;
    info.handlers_done = done.into_iter().map(|(h, at)| (h, time(at))).collect();
    Ok(Some(info))
}

/// Dead letters back to pending ([`DEAD_RETRY`], then [`DEAD_DELETE`]); returns how many.
pub(super) async fn dead_retry(pool: &SqlitePool, which: &DeadSelection) -> Result<u64> {
    let (id, topic) = selection(which);
    let id = id.map(|u| u.to_string());
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let r = sqlx::query(DEAD_RETRY)
        .bind(&id)
        .bind(topic)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    sqlx::query(DEAD_DELETE)
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(r.rows_affected())
}

/// Deletes dead letters and their progress ([`DEAD_PROGRESS`], then [`DEAD_DELETE`]); returns
/// how many.
pub(super) async fn dead_discard(pool: &SqlitePool, which: &DeadSelection) -> Result<u64> {
    let (id, topic) = selection(which);
    let id = id.map(|u| u.to_string());
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    sqlx::query(DEAD_PROGRESS)
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
    let r = sqlx::query(DEAD_DELETE)
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(r.rows_affected())
}

pub(super) async fn purge_done(pool: &SqlitePool, older_than: Duration, batch: i64) -> Result<u64> {
    let r = sqlx::query(PURGE_DONE)
        .bind(now_ms().saturating_sub(ms(older_than)))
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

pub(super) async fn purge_processed(
    pool: &SqlitePool,
    older_than: Duration,
    batch: i64,
) -> Result<u64> {
    let r = sqlx::query(PURGE_PROCESSED)
        .bind(now_ms().saturating_sub(ms(older_than)))
        .bind(batch)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}
