//! The event log: retention per topic, the day partitions of the retained events, and reads.
//!
//! The done write (`outcome.rs`) copies a delivered message of a retained topic into
//! `outbox_events` in the statement that deletes it. Each retained topic has a partition of its
//! own, split by day of delivery; the functions of migration 10 create the days ahead and drop
//! the days whose window ended. Every change to the partitions runs under one advisory lock,
//! so one process at a time makes it, and with a short lock timeout, so a long transaction on
//! the log makes the upkeep wait for its next round instead of queueing the done writes
//! behind it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use crate::error::Result;
use crate::retention::{EventFilter, LogUpkeep, RetainedEvent, RetainedTopic};

/// The advisory lock key of changes to the event log's partitions ("outlog" in ASCII).
const LOG_LOCK: i64 = 0x6f75_746c_6f67;

/// Waits for the log's lock `$1` (declarations wait: a worker's start needs its days).
const LOCK: &str = "SELECT pg_advisory_xact_lock($1)";

/// Takes the log's lock `$1` if free: true when taken.
const TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1)";

/// How long a change to the partitions waits for a table lock before giving up until later.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// Records the windows `$2` (seconds) of topics `$1`, growing and never shortening them, and
/// leaving the windows an operator set alone.
const DECLARE: &str = "INSERT INTO outbox_retention (topic, retain_secs) \
     SELECT * FROM UNNEST($1::text[], $2::int8[]) \
     ON CONFLICT (topic) DO UPDATE SET retain_secs = excluded.retain_secs, changed_at = now() \
     WHERE outbox_retention.retain_secs < excluded.retain_secs AND NOT outbox_retention.pinned";

/// Sets the window of topic `$1` to `$2` seconds, longer or shorter, pinned.
const SET: &str =
    "INSERT INTO outbox_retention (topic, retain_secs, pinned) VALUES ($1, $2, true) \
     ON CONFLICT (topic) DO UPDATE SET retain_secs = excluded.retain_secs, pinned = true, \
                                       changed_at = now()";

/// Stops retaining topic `$1` and drops its log.
const FORGET: &str = "SELECT outbox_event_log_forget($1)";

/// Creates the partitions of every retained topic from the day of `$1` (now when NULL) to
/// `$2` days later; returns how many day partitions it created.
const PARTITIONS: &str = "SELECT outbox_event_partitions(coalesce($1, now()), $2)";

/// Drops the day partitions whose window ended at `$1` (now when NULL); returns how many.
const EXPIRE: &str = "SELECT outbox_event_partitions_expire(coalesce($1, now()))";

/// The retained topics, with the end of their last day partition, and when `$1` their logs'
/// exact counts and sizes and their oldest event (else 0, 0 and NULL: the catalog only).
const TOPICS: &str = "SELECT r.topic, r.retain_secs, r.declared_at, r.changed_at, \
        CASE WHEN $1 THEN (SELECT count(*) FROM outbox_events e WHERE e.topic_id = r.id) \
             ELSE 0 END AS events, \
        CASE WHEN $1 THEN (SELECT coalesce(sum(pg_total_relation_size(d.partition)), 0)::int8 \
                           FROM outbox_event_days(r.id) d) \
             ELSE 0 END AS bytes, \
        CASE WHEN $1 THEN (SELECT e.created_at FROM outbox_events e WHERE e.topic_id = r.id \
                           ORDER BY e.id LIMIT 1) END AS oldest, \
        (SELECT (max(d.day) + 1)::timestamp AT TIME ZONE 'UTC' \
         FROM outbox_event_days(r.id) d) AS partitions_until \
     FROM outbox_retention r ORDER BY r.topic";

/// Events of topic `$1` enqueued from `$2` to before `$3`, of key `$4`, after the event `$5`
/// (each filter off when NULL), at most `$6`, in (seq, id) order: each key's events in the
/// order the database inserted their messages. The position of `$5` is `$7` when given, else
/// that event's own (0 when it is gone: a page may then repeat events, never skip one). An
/// unknown topic has no events.
const EVENTS: &str = "SELECT e.id, e.seq, e.topic, e.payload::text AS payload, e.version, \
        e.idempotency_key, e.ordering_key, e.created_at, e.delivered_at, e.traceparent \
     FROM outbox_events e \
     WHERE e.topic_id = (SELECT id FROM outbox_retention WHERE topic = $1) \
       AND ($2::timestamptz IS NULL OR e.created_at >= $2) \
       AND ($3::timestamptz IS NULL OR e.created_at < $3) \
       AND ($4::text IS NULL OR e.ordering_key = $4) \
       AND ($5::uuid IS NULL OR (e.seq, e.id) > ( \
            coalesce($7::int8, (SELECT x.seq FROM outbox_events x \
                                WHERE x.topic_id = (SELECT id FROM outbox_retention WHERE topic = $1) \
                                  AND x.id = $5 LIMIT 1), 0), $5)) \
     ORDER BY e.seq, e.id LIMIT $6";

/// A window in whole seconds, at least one.
fn seconds(window: Duration) -> i64 {
    i64::try_from(window.as_secs()).unwrap_or(i64::MAX).max(1)
}

/// Creates the days ahead ([`PARTITIONS`]) on `conn`, in its transaction.
async fn partitions(
    conn: &mut PgConnection,
    at: Option<DateTime<Utc>>,
    days_ahead: u32,
) -> Result<u32> {
    let made: i32 = sqlx::query_scalar(PARTITIONS)
        .bind(at)
        .bind(i32::try_from(days_ahead).unwrap_or(i32::MAX))
        .fetch_one(&mut *conn)
        .await?;
    Ok(u32::try_from(made).unwrap_or(0))
}

/// Records windows ([`DECLARE`]) and creates their days ahead, under the log's lock.
pub(super) async fn declare(
    pool: &PgPool,
    windows: &[(&str, Duration)],
    days_ahead: u32,
) -> Result<()> {
    if windows.is_empty() {
        return Ok(());
    }
    let (topics, secs): (Vec<&str>, Vec<i64>) =
        windows.iter().map(|(t, w)| (*t, seconds(*w))).unzip();
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK).bind(LOG_LOCK).execute(&mut *tx).await?;
    sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
    sqlx::query(DECLARE)
        .bind(topics)
        .bind(secs)
        .execute(&mut *tx)
        .await?;
    partitions(&mut tx, None, days_ahead).await?;
    tx.commit().await?;
    Ok(())
}

/// Sets a window ([`SET`]) with its days ahead, or forgets the topic ([`FORGET`]).
pub(super) async fn set(
    pool: &PgPool,
    topic: &str,
    window: Option<Duration>,
    days_ahead: u32,
) -> Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query(LOCK).bind(LOG_LOCK).execute(&mut *tx).await?;
    sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
    let found = match window {
        Some(window) => {
            sqlx::query(SET)
                .bind(topic)
                .bind(seconds(window))
                .execute(&mut *tx)
                .await?;
            partitions(&mut tx, None, days_ahead).await?;
            true
        }
        None => {
            sqlx::query_scalar(FORGET)
                .bind(topic)
                .fetch_one(&mut *tx)
                .await?
        }
    };
    tx.commit().await?;
    Ok(found)
}

/// Creates the days ahead and drops the expired ones, if no other process holds the log's
/// lock.
pub(super) async fn upkeep(
    pool: &PgPool,
    days_ahead: u32,
    at: Option<DateTime<Utc>>,
) -> Result<Option<LogUpkeep>> {
    let mut tx = pool.begin().await?;
    let mine: bool = sqlx::query_scalar(TRY_LOCK)
        .bind(LOG_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !mine {
        return Ok(None);
    }
    sqlx::query(LOCK_TIMEOUT).execute(&mut *tx).await?;
    let created = partitions(&mut tx, at, days_ahead).await?;
    let dropped: i32 = sqlx::query_scalar(EXPIRE)
        .bind(at)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Some(LogUpkeep {
        created,
        dropped: u32::try_from(dropped).unwrap_or(0),
        deleted: 0,
    }))
}

/// The retained topics ([`TOPICS`]).
pub(super) async fn topics(pool: &PgPool, sizes: bool) -> Result<Vec<RetainedTopic>> {
    let rows = sqlx::query(TOPICS).bind(sizes).fetch_all(pool).await?;
    rows.iter()
        .map(|r| {
            Ok(RetainedTopic {
                topic: r.try_get("topic")?,
                retain: Duration::from_secs(
                    u64::try_from(r.try_get::<i64, _>("retain_secs")?).unwrap_or(0),
                ),
                events: r.try_get("events")?,
                bytes: Some(r.try_get("bytes")?),
                oldest: r.try_get("oldest")?,
                partitions_until: r.try_get("partitions_until")?,
                declared_at: r.try_get("declared_at")?,
                changed_at: r.try_get("changed_at")?,
            })
        })
        .collect()
}

/// Events of the log ([`EVENTS`]).
pub(super) async fn events(pool: &PgPool, f: &EventFilter) -> Result<Vec<RetainedEvent>> {
    let rows = sqlx::query(EVENTS)
        .bind(&f.topic)
        .bind(f.since)
        .bind(f.until)
        .bind(f.key.as_deref())
        .bind(f.after)
        .bind(i64::from(f.limit.unwrap_or(100)))
        .bind(f.after_seq)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(RetainedEvent {
                id: r.try_get::<Uuid, _>("id")?,
                seq: r.try_get("seq")?,
                topic: r.try_get("topic")?,
                payload: r.try_get("payload")?,
                version: r.try_get("version")?,
                idempotency_key: r.try_get("idempotency_key")?,
                ordering_key: r.try_get("ordering_key")?,
                created_at: r.try_get("created_at")?,
                delivered_at: r.try_get("delivered_at")?,
                traceparent: r.try_get("traceparent")?,
            })
        })
        .collect()
}
