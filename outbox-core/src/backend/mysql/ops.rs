//! Statistics, dead letters and purges, for the operations tools (`outbox` and the console).
//!
//! Every time here is the server's clock ([`now_ms!`]), as the workers write it. Lists of
//! topics are bound as one JSON array and read with `JSON_CONTAINS` and `JSON_TABLE`, which
//! MariaDB has from 10.6 and MySQL from 8.0 (not `JSON_OVERLAPS`, which MariaDB has only from
//! 10.9); `JSON_TABLE` columns name their collation, `utf8mb4_bin`, as the tables do.
//!
//! A retry or a discard of dead letters first locks the ones it is about (`FOR UPDATE`), then
//! works on their ids only: at READ COMMITTED, each statement sees what committed before it,
//! so a letter that dies meanwhile would otherwise be deleted by a retry that never copied it
//! back. Such a letter stays dead.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlRow;
use sqlx::Row;
use uuid::Uuid;

use super::{ms, now_ms, retrying, time, with_list, MySqlBackend, LIVE_MS};
use crate::backend::{selection, topic_stats, StatsRow};
use crate::error::Result;
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

/// Dead letters retried or discarded per statement: the ids of one statement's `{list}`.
const DEAD_CHUNK: usize = 1_000;

/// `d` in milliseconds, as subtracted from the server's clock: at most `i64::MAX / 2`, so
/// the subtraction never overflows a `BIGINT` (SQLite's saturates in Rust).
fn ago(d: Duration) -> i64 {
    ms(d).min(i64::MAX / 2)
}

/// Pending topics with their counts, among topics not in `?` (a JSON array).
const UNKNOWN_TOPICS: &str = "SELECT topic, count(*) FROM outbox_messages GROUP BY topic \
     HAVING NOT JSON_CONTAINS(?, JSON_QUOTE(topic)) ORDER BY topic";

/// Per-topic counts, now, workers counting as alive for `?` milliseconds: ready, scheduled,
/// running, stalled, dead, done in the last 5 minutes, the oldest ready message's age, the
/// oldest stall's age, live workers, the ordered messages blocked behind their key (and of
/// those, behind a dead letter) with the oldest one's age, the newest version of the topic's
/// live messages if no live worker knows it, and the due messages that wait for a worker that
/// knows their version, with the oldest one's age. Ages are in milliseconds.
///
/// A keyed row is behind when its key's head (the least `seq` of the key's live rows, by a
/// loose scan of the key index: one probe per key) is before it, and behind a dead letter when
/// its key's first dead letter that holds the key is before it. Both come from one derived
/// table, `key_heads`, that the server materializes with a key of its own on the MD5 of the
/// ordering key (an ordering key of up to 255 characters is longer than a temporary table's
/// key may be, and without a key the join was a scan of the heads per row): each row then
/// costs one lookup in memory, never a probe of the table's index (which made this statement
/// take seconds over 50,000 keyed messages). Rows are first counted per topic and version, so
/// that only those few groups meet the live workers' versions.
///
/// The server computes a common table expression once per reference: `per_version`, the one
/// that reads every live row, is referenced once (the list of topics reads the topic index
/// instead).
///
/// `SUM` is a `DECIMAL` on MySQL: each is cast back to an integer.
pub(super) const STATS: &str = concat!(
    "WITH clock AS ( \
        SELECT ",
    now_ms!(),
    " AS now \
     ), served AS ( \
        SELECT j.topic, count(*) AS workers, \
               MAX(CAST(JSON_EXTRACT(w.versions, CONCAT('$[', j.i - 1, ']')) AS SIGNED)) AS known_version \
        FROM clock c, outbox_workers w, \
             JSON_TABLE(w.topics, '$[*]' COLUMNS (i FOR ORDINALITY, \
                 topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS j \
        WHERE w.heartbeat_at > c.now - ? AND j.topic IS NOT NULL GROUP BY j.topic \
     ), key_heads AS ( \
        SELECT u.k, MIN(u.live_seq) AS live_seq, MIN(u.dead_seq) AS dead_seq FROM ( \
            SELECT LEFT(CAST(ordering_key AS BINARY), 255) AS k, MIN(seq) AS live_seq, \
                   NULL AS dead_seq \
            FROM outbox_messages WHERE ordering_key IS NOT NULL GROUP BY ordering_key \
            UNION ALL \
            SELECT LEFT(CAST(ordering_key AS BINARY), 255), NULL, MIN(seq) \
            FROM outbox_dead WHERE ordering_key IS NOT NULL AND releases_key = FALSE \
            GROUP BY ordering_key \
        ) AS u GROUP BY u.k \
     ), per_version AS ( \
        SELECT m.topic, m.version, \
               CAST(SUM(m.available_at <= c.now AND (m.locked_until IS NULL OR m.locked_until < c.now) \
                        AND NOT (h.dead_seq < m.seq OR h.live_seq < m.seq) <=> TRUE) AS SIGNED) AS free, \
               CAST(SUM(m.available_at <= c.now AND (m.locked_until IS NULL OR m.locked_until < c.now) \
                        AND (h.dead_seq < m.seq OR h.live_seq < m.seq)) AS SIGNED) AS blocked, \
               CAST(SUM(m.available_at <= c.now AND (m.locked_until IS NULL OR m.locked_until < c.now) \
                        AND h.dead_seq < m.seq) AS SIGNED) AS blocked_by_dead, \
               CAST(SUM(m.available_at > c.now AND m.locked_until IS NULL) AS SIGNED) AS scheduled, \
               CAST(SUM(m.locked_until >= c.now) AS SIGNED) AS in_flight, \
               CAST(SUM(m.locked_until < c.now) AS SIGNED) AS stalled, \
               MIN(CASE WHEN m.available_at <= c.now AND (m.locked_until IS NULL OR m.locked_until < c.now) \
                        AND NOT (h.dead_seq < m.seq OR h.live_seq < m.seq) <=> TRUE THEN m.available_at END) AS free_at, \
               MIN(CASE WHEN m.available_at <= c.now AND (m.locked_until IS NULL OR m.locked_until < c.now) \
                        AND (h.dead_seq < m.seq OR h.live_seq < m.seq) THEN m.available_at END) AS blocked_at, \
               MIN(CASE WHEN m.locked_until < c.now THEN m.locked_until END) AS stalled_since \
        FROM outbox_messages m CROSS JOIN clock c \
        LEFT JOIN key_heads h ON h.k = LEFT(CAST(m.ordering_key AS BINARY), 255) \
        GROUP BY m.topic, m.version \
     ), live AS ( \
        SELECT p.topic, \
               CAST(SUM(CASE WHEN p.version > s.known_version THEN 0 ELSE p.free END) AS SIGNED) AS ready, \
               CAST(SUM(CASE WHEN p.version > s.known_version THEN p.free ELSE 0 END) AS SIGNED) AS awaiting, \
               CAST(SUM(p.blocked) AS SIGNED) AS blocked, \
               CAST(SUM(p.blocked_by_dead) AS SIGNED) AS blocked_by_dead, \
               CAST(SUM(p.scheduled) AS SIGNED) AS scheduled, \
               CAST(SUM(p.in_flight) AS SIGNED) AS in_flight, \
               CAST(SUM(p.stalled) AS SIGNED) AS stalled, \
               MIN(CASE WHEN p.version > s.known_version THEN NULL ELSE p.free_at END) AS oldest, \
               MIN(CASE WHEN p.version > s.known_version THEN p.free_at END) AS oldest_awaiting, \
               MIN(p.blocked_at) AS oldest_blocked, \
               MIN(p.stalled_since) AS stalled_since, \
               MAX(p.version) AS newest_version \
        FROM per_version p LEFT JOIN served s ON s.topic = p.topic GROUP BY p.topic \
     ), dead AS ( \
        SELECT topic, n AS dead FROM outbox_dead_counts WHERE n > 0 \
     ), done AS ( \
        SELECT o.topic, CAST(SUM(o.done) AS SIGNED) AS done \
        FROM outbox_done_counts o CROSS JOIN clock c WHERE o.minute > c.now - 300000 GROUP BY o.topic \
     ), topics AS ( \
        SELECT DISTINCT topic FROM outbox_messages UNION SELECT topic FROM dead \
        UNION SELECT topic FROM done UNION SELECT topic FROM served \
     ) \
     SELECT t.topic, COALESCE(l.ready, 0), COALESCE(l.scheduled, 0), COALESCE(l.in_flight, 0), \
            COALESCE(l.stalled, 0), COALESCE(d.dead, 0), COALESCE(o.done, 0), c.now - l.oldest, \
            c.now - l.stalled_since, COALESCE(s.workers, 0), COALESCE(l.blocked, 0), \
            COALESCE(l.blocked_by_dead, 0), c.now - l.oldest_blocked, \
            CASE WHEN l.newest_version > s.known_version THEN l.newest_version END, \
            COALESCE(l.awaiting, 0), c.now - l.oldest_awaiting \
     FROM topics t \
     CROSS JOIN clock c \
     LEFT JOIN live l ON l.topic = t.topic \
     LEFT JOIN dead d ON d.topic = t.topic \
     LEFT JOIN done o ON o.topic = t.topic \
     LEFT JOIN served s ON s.topic = t.topic \
     ORDER BY t.topic"
);

/// Messages done per minute since `?` milliseconds before this minute's start, oldest first.
const DONE_PER_MINUTE: &str = concat!(
    "SELECT minute, CAST(SUM(done) AS SIGNED) FROM outbox_done_counts \
     WHERE minute >= (",
    now_ms!(),
    " DIV 60000) * 60000 - ? \
     GROUP BY minute ORDER BY minute"
);

/// Up to `?` (last) dead letters, newest first: of topic `?` (the first two; any if NULL),
/// dead for at least `?` ms (the next two; any if NULL), after the cursor (`?` dead at, twice,
/// then `?` id) if there is one.
const DEAD_LIST: &str = concat!(
    "SELECT id, topic, 'dead' AS status, attempts, payload, last_error, created_at, \
            dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead \
     WHERE (? IS NULL OR topic = ?) AND (? IS NULL OR dead_at <= ",
    now_ms!(),
    " - ?) \
       AND (? IS NULL OR (dead_at, id) < (?, ?)) \
     ORDER BY dead_at DESC, id DESC LIMIT ?"
);

/// Message `?` (bound twice), live or dead, now, in the columns of [`DEAD_LIST`].
const MESSAGE: &str = concat!(
    "SELECT id, topic, CASE WHEN locked_until >= ",
    now_ms!(),
    " THEN 'running' ELSE 'pending' END AS status, \
            attempts, payload, last_error, created_at, \
            COALESCE(locked_until, available_at) AS available_at, NULL AS processed_at, \
            idempotency_key, ordering_key \
     FROM outbox_messages WHERE id = ? \
     UNION ALL SELECT id, topic, 'dead' AS status, attempts, payload, last_error, created_at, \
            dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key \
     FROM outbox_dead WHERE id = ?"
);

/// The handlers that succeeded for message `?`, with when.
const HANDLERS_DONE: &str =
    "SELECT handler, completed_at FROM outbox_deliveries WHERE message_id = ? \
     ORDER BY completed_at, handler";

/// Locks the dead letters a retry or a discard is about and returns their ids: the one of id
/// `?` (the first two) or those of topic `?` (the last two); all if both are NULL.
const DEAD_LOCK: &str = "SELECT id FROM outbox_dead \
     WHERE (? IS NULL OR id = ?) AND (? IS NULL OR topic = ?) FOR UPDATE";

/// Copies the dead letters `{list}` back to pending, ready now, attempts reset.
/// [`DEAD_DELETE`] then deletes them. A letter keeps its place in its key's order (`seq`);
/// one that has none (0: written by a worker of the previous release) takes a new one. A
/// letter that had released its key is marked `retried_release`, as on PostgreSQL.
const DEAD_RETRY: &str = concat!(
    "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, last_error, \
                                  created_at, ordering_key, releases_key, retried_release, \
                                  traceparent, tracestate, version, seq) \
     SELECT id, topic, payload, idempotency_key, ",
    now_ms!(),
    ", last_error, created_at, ordering_key, releases_key, \
            ordering_key IS NOT NULL AND releases_key <> 0, traceparent, tracestate, version, \
            NULLIF(seq, 0) \
     FROM outbox_dead WHERE id IN ({list})"
);

/// Deletes the per-handler progress of the dead letters `{list}`, which [`DEAD_DELETE`] is
/// about to delete.
const DEAD_PROGRESS: &str = "DELETE FROM outbox_deliveries WHERE message_id IN ({list})";

/// Deletes the dead letters `{list}`.
const DEAD_DELETE: &str = "DELETE FROM outbox_dead WHERE id IN ({list})";

/// Deletes the per-topic dead counts that reached zero: MySQL's trigger only decrements them
/// (SQLite's deletes them itself).
const DEAD_COUNTS_EMPTY: &str = "DELETE FROM outbox_dead_counts WHERE n <= 0";

/// Deletes up to `?` (second) per-minute done counts of minutes more than `?` ms old, oldest
/// first.
const PURGE_DONE: &str = concat!(
    "DELETE FROM outbox_done_counts WHERE minute < ",
    now_ms!(),
    " - ? ORDER BY minute LIMIT ?"
);

/// Deletes up to `?` (second) processed-id records more than `?` ms old, oldest first.
const PURGE_PROCESSED: &str = concat!(
    "DELETE FROM outbox_processed WHERE processed_at < ",
    now_ms!(),
    " - ? ORDER BY processed_at LIMIT ?"
);

/// A row of [`DEAD_LIST`] or [`MESSAGE`].
fn message_info(r: &MySqlRow) -> Result<MessageInfo, sqlx::Error> {
    let processed: Option<i64> = r.try_get("processed_at")?;
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
        created_at: time(r.try_get("created_at")?),
        available_at: time(r.try_get("available_at")?),
        processed_at: processed.map(time),
        idempotency_key: r.try_get("idempotency_key")?,
        ordering_key: r.try_get("ordering_key")?,
        handlers_done: Vec::new(),
    })
}

pub(super) async fn unknown_topics(b: &MySqlBackend, known: &[&str]) -> Result<Vec<(String, i64)>> {
    let known = serde_json::to_string(known).unwrap_or_else(|_| "[]".into());
    Ok(sqlx::query_as(UNKNOWN_TOPICS)
        .bind(known)
        .fetch_all(&b.pool)
        .await?)
}

pub(super) async fn stats(b: &MySqlBackend) -> Result<Vec<TopicStats>> {
    type Row = StatsRow<i64, i32>;
    let rows: Vec<Row> = sqlx::query_as(STATS)
        .bind(LIVE_MS)
        .fetch_all(&b.pool)
        .await?;
    let age = |ms: Option<i64>| ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    Ok(rows.into_iter().map(|row| topic_stats(row, age)).collect())
}

pub(super) async fn done_per_minute(
    b: &MySqlBackend,
    minutes: u32,
) -> Result<Vec<(DateTime<Utc>, i64)>> {
    let rows: Vec<(i64, i64)> = sqlx::query_as(DONE_PER_MINUTE)
        .bind(i64::from(minutes) * 60_000)
        .fetch_all(&b.pool)
        .await?;
    Ok(rows.into_iter().map(|(m, n)| (time(m), n)).collect())
}

pub(super) async fn dead_list(b: &MySqlBackend, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
    let topic = f.topic.as_deref();
    let older = f.older_than.map(ago);
    let after_at = f.after.map(|c| c.dead_at.timestamp_millis());
    let rows = sqlx::query(DEAD_LIST)
        .bind(topic)
        .bind(topic)
        .bind(older)
        .bind(older)
        .bind(after_at)
        .bind(after_at)
        .bind(f.after.map(|c| c.id))
        .bind(i64::from(f.limit.unwrap_or(100)))
        .fetch_all(&b.pool)
        .await?;
    Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
}

pub(super) async fn message(b: &MySqlBackend, id: Uuid) -> Result<Option<MessageInfo>> {
    let row = sqlx::query(MESSAGE)
        .bind(id)
        .bind(id)
        .fetch_optional(&b.pool)
        .await?;
    let Some(mut info) = row.as_ref().map(message_info).transpose()? else {
        return Ok(None);
    };
    let done: Vec<(String, i64)> = sqlx::query_as(HANDLERS_DONE)
        .bind(id)
        .fetch_all(&b.pool)
        .await?;
    info.handlers_done = done.into_iter().map(|(h, at)| (h, time(at))).collect();
    Ok(Some(info))
}

/// Runs `sql` (a statement on `{list}`) for `ids`, [`DEAD_CHUNK`] at a time; returns the rows
/// it changed.
async fn per_chunk(
    tx: &mut sqlx::MySqlConnection,
    sql: &str,
    ids: &[Uuid],
) -> Result<u64, sqlx::Error> {
    let mut n = 0;
    for chunk in ids.chunks(DEAD_CHUNK) {
        let mut q = sqlx::query(with_list(sql, chunk.len()));
        for id in chunk {
            q = q.bind(*id);
        }
        n += q.execute(&mut *tx).await?.rows_affected();
    }
    Ok(n)
}

/// Locks the dead letters of a selection ([`DEAD_LOCK`]); returns their ids.
async fn lock_dead(
    tx: &mut sqlx::MySqlConnection,
    which: &DeadSelection,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let (id, topic) = selection(which);
    sqlx::query_scalar(DEAD_LOCK)
        .bind(id)
        .bind(id)
        .bind(topic)
        .bind(topic)
        .fetch_all(&mut *tx)
        .await
}

/// Dead letters back to pending ([`DEAD_LOCK`], [`DEAD_RETRY`], [`DEAD_DELETE`], then
/// [`DEAD_COUNTS_EMPTY`], in one transaction); returns how many.
pub(super) async fn dead_retry(b: &MySqlBackend, which: &DeadSelection) -> Result<u64> {
    retrying("dead retry", || async {
        let mut tx = b.begin().await?;
        let ids = lock_dead(&mut tx, which).await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let n = per_chunk(&mut tx, DEAD_RETRY, &ids).await?;
        per_chunk(&mut tx, DEAD_DELETE, &ids).await?;
        sqlx::query(DEAD_COUNTS_EMPTY).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(n)
    })
    .await
}

/// Deletes dead letters and their progress ([`DEAD_LOCK`], [`DEAD_PROGRESS`],
/// [`DEAD_DELETE`], then [`DEAD_COUNTS_EMPTY`], in one transaction); returns how many.
pub(super) async fn dead_discard(b: &MySqlBackend, which: &DeadSelection) -> Result<u64> {
    retrying("dead discard", || async {
        let mut tx = b.begin().await?;
        let ids = lock_dead(&mut tx, which).await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        per_chunk(&mut tx, DEAD_PROGRESS, &ids).await?;
        let n = per_chunk(&mut tx, DEAD_DELETE, &ids).await?;
        sqlx::query(DEAD_COUNTS_EMPTY).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(n)
    })
    .await
}

pub(super) async fn purge_done(b: &MySqlBackend, older_than: Duration, batch: i64) -> Result<u64> {
    retrying("purge done counts", || async {
        let r = sqlx::query(PURGE_DONE)
            .bind(ago(older_than))
            .bind(batch)
            .execute(&b.pool)
            .await?;
        Ok(r.rows_affected())
    })
    .await
}

pub(super) async fn purge_processed(
    b: &MySqlBackend,
    older_than: Duration,
    batch: i64,
) -> Result<u64> {
    retrying("purge processed", || async {
        let r = sqlx::query(PURGE_PROCESSED)
            .bind(ago(older_than))
            .bind(batch)
            .execute(&b.pool)
            .await?;
        Ok(r.rows_affected())
    })
    .await
}
