//! The event log: retention per topic, its upkeep and its reads.
//!
//! The done write (`outcome.rs`) copies a delivered message of a retained topic into
//! `outbox_events` in the transaction that deletes it. One table holds every topic's log; the
//! upkeep deletes expired events in small batches, each its own short write transaction, so a
//! worker's writes are never held up for long. SQLite needs no partitions, so there is nothing
//! to create ahead.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqlitePool;
use sqlx::Row;

use super::{ms, parse_uuid, time};
use crate::clock::now_ms;
use crate::error::Result;
use crate::retention::{EventFilter, LogUpkeep, RetainedEvent, RetainedTopic};

/// How many expired events one delete removes.
const EXPIRE_BATCH: i64 = 1000;

/// Records the window `?2` (ms) of topic `?1` at `?3`, growing and never shortening it, and
/// leaving a window an operator set alone.
const DECLARE: &str =
    "INSERT INTO outbox_retention (topic, retain_ms, declared_at, changed_at) VALUES (?1, ?2, ?3, ?3) \
     ON CONFLICT (topic) DO UPDATE SET retain_ms = excluded.retain_ms, changed_at = ?3 \
     WHERE outbox_retention.retain_ms < excluded.retain_ms AND NOT outbox_retention.pinned";

/// Sets the window of topic `?1` to `?2` ms at `?3`, longer or shorter, pinned.
const SET: &str =
    "INSERT INTO outbox_retention (topic, retain_ms, pinned, declared_at, changed_at) \
     VALUES (?1, ?2, 1, ?3, ?3) \
     ON CONFLICT (topic) DO UPDATE SET retain_ms = excluded.retain_ms, pinned = 1, changed_at = ?3";

/// Stops retaining topic `?1`.
const FORGET: &str = "DELETE FROM outbox_retention WHERE topic = ?1";

/// Deletes the log of topic `?1`, `?2` events at a time.
const FORGET_EVENTS: &str = "DELETE FROM outbox_events WHERE id IN ( \
         SELECT id FROM outbox_events WHERE topic = ?1 LIMIT ?2)";

/// Deletes up to `?2` events delivered more than their topic's window before `?1`.
const EXPIRE: &str = "DELETE FROM outbox_events WHERE id IN ( \
         SELECT e.id FROM outbox_retention r \
         JOIN outbox_events e ON e.topic = r.topic AND e.delivered_at < ?1 - r.retain_ms \
         LIMIT ?2)";

/// The retained topics, and when `?1` their logs' counts and oldest events (else 0 and NULL).
const TOPICS: &str = "SELECT r.topic, r.retain_ms, r.declared_at, r.changed_at, \
        CASE WHEN ?1 THEN (SELECT count(*) FROM outbox_events e WHERE e.topic = r.topic) \
             ELSE 0 END AS events, \
        CASE WHEN ?1 THEN (SELECT e.created_at FROM outbox_events e WHERE e.topic = r.topic \
                           ORDER BY e.id LIMIT 1) END AS oldest \
     FROM outbox_retention r ORDER BY r.topic";

/// Events of topic `?1` enqueued from `?2` to before `?3` (Unix ms), of key `?4`, after the
/// event `?5` (each filter off when NULL), at most `?6`, in (seq, id) order: each key's events
/// in the order the database inserted their messages. The position of `?5` is `?7` when
/// given, else that event's own (0 when it is gone: a page may then repeat events, never skip
/// one).
const EVENTS: &str = "SELECT id, seq, topic, payload, version, idempotency_key, ordering_key, \
        created_at, delivered_at, traceparent \
     FROM outbox_events \
     WHERE topic = ?1 \
       AND (?2 IS NULL OR created_at >= ?2) \
       AND (?3 IS NULL OR created_at < ?3) \
       AND (?4 IS NULL OR ordering_key = ?4) \
       AND (?5 IS NULL OR (seq, id) > (coalesce(?7, (SELECT x.seq FROM outbox_events x \
                                                     WHERE x.id = ?5), 0), ?5)) \
     ORDER BY seq, id LIMIT ?6";

/// Records windows ([`DECLARE`]) in one transaction.
pub(super) async fn declare(
    pool: &SqlitePool,
    windows: &[(&str, Duration)],
    _days_ahead: u32,
) -> Result<()> {
    if windows.is_empty() {
        return Ok(());
    }
    let now = now_ms();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    for (topic, window) in windows {
        sqlx::query(DECLARE)
            .bind(topic)
            .bind(ms(*window).max(1))
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Sets a window ([`SET`]), or forgets the topic ([`FORGET`]) and deletes its log in batches
/// ([`FORGET_EVENTS`]).
pub(super) async fn set(
    pool: &SqlitePool,
    topic: &str,
    window: Option<Duration>,
    _days_ahead: u32,
) -> Result<bool> {
    let Some(window) = window else {
        let found = sqlx::query(FORGET).bind(topic).execute(pool).await?;
        loop {
            let gone = sqlx::query(FORGET_EVENTS)
                .bind(topic)
                .bind(EXPIRE_BATCH)
                .execute(pool)
                .await?;
            if gone.rows_affected() == 0 {
                break;
            }
        }
        return Ok(found.rows_affected() > 0);
    };
    sqlx::query(SET)
        .bind(topic)
        .bind(ms(window).max(1))
        .bind(now_ms())
        .execute(pool)
        .await?;
    Ok(true)
}

/// Deletes the expired events ([`EXPIRE`]), a batch per write transaction.
pub(super) async fn upkeep(
    pool: &SqlitePool,
    _days_ahead: u32,
    at: Option<DateTime<Utc>>,
) -> Result<Option<LogUpkeep>> {
    let at = at.map_or_else(now_ms, |t| t.timestamp_millis());
    let mut deleted = 0;
    loop {
        let gone = sqlx::query(EXPIRE)
            .bind(at)
            .bind(EXPIRE_BATCH)
            .execute(pool)
            .await?
            .rows_affected();
        deleted += gone;
        if gone < EXPIRE_BATCH as u64 {
            break;
        }
    }
    Ok(Some(LogUpkeep {
        deleted,
        ..LogUpkeep::default()
    }))
}

/// The retained topics ([`TOPICS`]).
pub(super) async fn topics(pool: &SqlitePool, sizes: bool) -> Result<Vec<RetainedTopic>> {
    let rows = sqlx::query(TOPICS).bind(sizes).fetch_all(pool).await?;
    rows.iter()
        .map(|r| {
            Ok(RetainedTopic {
                topic: r.try_get("topic")?,
                retain: Duration::from_millis(
                    u64::try_from(r.try_get::<i64, _>("retain_ms")?).unwrap_or(0),
                ),
                events: r.try_get("events")?,
                bytes: None,
                oldest: r.try_get::<Option<i64>, _>("oldest")?.map(time),
                partitions_until: None,
                declared_at: time(r.try_get("declared_at")?),
                changed_at: time(r.try_get("changed_at")?),
            })
        })
        .collect()
}

/// Events of the log ([`EVENTS`]).
pub(super) async fn events(pool: &SqlitePool, f: &EventFilter) -> Result<Vec<RetainedEvent>> {
    let rows = sqlx::query(EVENTS)
        .bind(&f.topic)
        .bind(f.since.map(|t| t.timestamp_millis()))
        .bind(f.until.map(|t| t.timestamp_millis()))
        .bind(f.key.as_deref())
        .bind(f.after.map(|id| id.to_string()))
        .bind(i64::from(f.limit.unwrap_or(100)))
        .bind(f.after_seq)
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(RetainedEvent {
                id: parse_uuid(&r.try_get::<String, _>("id")?)?,
                seq: r.try_get("seq")?,
                topic: r.try_get("topic")?,
                payload: r.try_get("payload")?,
                version: r.try_get("version")?,
                idempotency_key: r.try_get("idempotency_key")?,
                ordering_key: r.try_get("ordering_key")?,
                created_at: time(r.try_get("created_at")?),
                delivered_at: time(r.try_get("delivered_at")?),
                traceparent: r.try_get("traceparent")?,
            })
        })
        .collect()
}
