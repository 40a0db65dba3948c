//! The event log: retention per topic, its upkeep and its reads.
//!
//! The done write (`outcome.rs`) copies a delivered message of a retained topic into
//! `outbox_events` in the transaction that deletes it. One table holds every topic's log, as
//! on SQLite; the upkeep deletes expired events in batches of 1,000, oldest first on the
//! `(topic, delivered_at)` index, each batch its own short READ COMMITTED transaction, so a
//! done write is never held up for long. There are no partitions, so there is nothing to
//! create ahead.
//!
//! One process at a time keeps the log up: the upkeep holds the named lock of this database's
//! log (`GET_LOCK`, taken without waiting, on the connection that then runs the deletes) and
//! returns `None` when another session holds it. Named locks are server-wide, so the name
//! carries a digest of the database's name: two outboxes on one server do not hold up each
//! other's upkeep.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::MySql;
use sqlx::pool::PoolConnection;
use sqlx::{MySqlConnection, Row};
use uuid::Uuid;

use super::{ms, now_ms, retrying, time, MySqlBackend};
use crate::error::Result;
use crate::retention::{EventFilter, LogUpkeep, RetainedEvent, RetainedTopic};

/// How many expired events one delete removes.
const EXPIRE_BATCH: i64 = 1000;

/// The name of the upkeep's lock, as SQL: `outbox_log_upkeep.` and the MD5 of the database's
/// name (50 characters: named locks take at most 64).
macro_rules! lock_name {
    () => {
        "CONCAT('outbox_log_upkeep.', MD5(DATABASE()))"
    };
}

/// Records the window `?` (ms, second) of topic `?` (first), growing and never shortening
/// it, and leaving a window an operator set alone. MySQL assigns left to right, each
/// assignment seeing the ones before: `changed_at` is set first, while `retain_ms` still
/// holds the recorded window.
const DECLARE: &str = concat!(
    "INSERT INTO outbox_retention (topic, retain_ms, declared_at, changed_at) VALUES (?, ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") ON DUPLICATE KEY UPDATE \
       changed_at = IF(NOT pinned AND retain_ms < VALUES(retain_ms), VALUES(changed_at), \
                       changed_at), \
       retain_ms = IF(NOT pinned AND retain_ms < VALUES(retain_ms), VALUES(retain_ms), \
                      retain_ms)"
);

/// Sets the window of topic `?` to `?` ms, longer or shorter, pinned.
const SET: &str = concat!(
    "INSERT INTO outbox_retention (topic, retain_ms, pinned, declared_at, changed_at) \
     VALUES (?, ?, TRUE, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") ON DUPLICATE KEY UPDATE retain_ms = VALUES(retain_ms), pinned = TRUE, \
                               changed_at = VALUES(changed_at)"
);

/// Stops retaining topic `?`.
const FORGET: &str = "DELETE FROM outbox_retention WHERE topic = ?";

/// Deletes the log of topic `?`, `?` events at a time, in no order: an order would sort the
/// whole log again for each batch.
const FORGET_EVENTS: &str = "DELETE FROM outbox_events WHERE topic = ? LIMIT ?";

/// Takes the upkeep's lock without waiting: 1 when taken, 0 when another session holds it.
const TRY_LOCK: &str = concat!("SELECT GET_LOCK(", lock_name!(), ", 0)");

/// Gives the upkeep's lock back.
const UNLOCK: &str = concat!("SELECT RELEASE_LOCK(", lock_name!(), ")");

/// Each retained topic with the end of its window at `?` (Unix ms; the server's clock when
/// NULL): its events delivered before that have expired.
const CUTOFFS: &str = concat!(
    "SELECT topic, COALESCE(?, ",
    now_ms!(),
    ") - retain_ms FROM outbox_retention ORDER BY topic"
);

/// The next transaction on the upkeep's connection at READ COMMITTED (on a pool whose
/// sessions are not): no gap lock holds up a done write's insert.
const READ_COMMITTED: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Deletes up to `?` (third) events of topic `?` delivered before `?` (Unix ms), oldest
/// first, reading `(topic, delivered_at)` in order.
const EXPIRE: &str = "DELETE FROM outbox_events WHERE topic = ? AND delivered_at < ? \
     ORDER BY delivered_at, id LIMIT ?";

/// The retained topics, and when `?` (both) their logs' counts and oldest events (else 0 and
/// NULL).
const TOPICS: &str = "SELECT r.topic, r.retain_ms, r.declared_at, r.changed_at, \
        CASE WHEN ? THEN (SELECT count(*) FROM outbox_events e WHERE e.topic = r.topic) \
             ELSE 0 END AS events, \
        CASE WHEN ? THEN (SELECT e.created_at FROM outbox_events e WHERE e.topic = r.topic \
                          ORDER BY e.id LIMIT 1) END AS oldest \
     FROM outbox_retention r ORDER BY r.topic";

/// Events of topic `?` enqueued from `?` to before `?` (Unix ms), of key `?`, after the event
/// `?` at `seq` `?` (each filter off when NULL, and each bound twice or more), at most `?`, in
/// (seq, id) order: each key's events in the order the database inserted their messages. The
/// cursor is spelt out as two ranges of `outbox_events_topic_idx (topic, seq, id)`.
const EVENTS: &str = "SELECT id, seq, topic, payload, version, idempotency_key, ordering_key, \
        created_at, delivered_at, traceparent \
     FROM outbox_events \
     WHERE topic = ? \
       AND (? IS NULL OR created_at >= ?) \
       AND (? IS NULL OR created_at < ?) \
       AND (? IS NULL OR ordering_key = ?) \
       AND (? IS NULL OR seq > ? OR (seq = ? AND id > ?)) \
     ORDER BY seq, id LIMIT ?";

/// The `seq` of event `?`, where the caller of [`EVENTS`] knows only its id.
const EVENT_SEQ: &str = "SELECT seq FROM outbox_events WHERE id = ?";

/// Records windows ([`DECLARE`]) in one transaction, in topic order.
pub(super) async fn declare(
    b: &MySqlBackend,
    windows: &[(&str, Duration)],
    _days_ahead: u32,
) -> Result<()> {
    if windows.is_empty() {
        return Ok(());
    }
    // One order for every worker's locks: two workers declaring never wait on each other in a
    // ring.
    let mut windows = windows.to_vec();
    windows.sort_unstable_by(|a, b| a.0.cmp(b.0));
    retrying("declare retention", || async {
        let mut tx = b.begin().await?;
        for (topic, window) in &windows {
            sqlx::query(DECLARE)
                .bind(*topic)
                .bind(ms(*window).max(1))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    })
    .await
}

/// Sets a window ([`SET`]), or forgets the topic ([`FORGET`]) and deletes its log in batches
/// ([`FORGET_EVENTS`]).
pub(super) async fn set(
    b: &MySqlBackend,
    topic: &str,
    window: Option<Duration>,
    _days_ahead: u32,
) -> Result<bool> {
    let Some(window) = window else {
        let found = sqlx::query(FORGET).bind(topic).execute(&b.pool).await?;
        loop {
            let gone = sqlx::query(FORGET_EVENTS)
                .bind(topic)
                .bind(EXPIRE_BATCH)
                .execute(&b.pool)
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
        .execute(&b.pool)
        .await?;
    Ok(true)
}

/// The connection that holds the upkeep's lock. Dropped without [`release`](Self::release)
/// (an error, or the upkeep's future dropped part-way), it closes the connection instead of
/// handing it back to the pool: the server then frees the lock with the session, where a
/// pooled session would keep it and stop every later upkeep.
struct Held {
    conn: PoolConnection<MySql>,
    released: bool,
}

impl Held {
    /// Gives the lock back ([`UNLOCK`]) and the connection to the pool.
    async fn release(mut self) -> Result<()> {
        sqlx::query(UNLOCK).execute(&mut *self.conn).await?;
        self.released = true;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            self.conn.close_on_drop();
        }
    }
}

/// Under the upkeep's lock ([`TRY_LOCK`]), reads where each topic's window ends
/// ([`CUTOFFS`]) and deletes the expired events ([`EXPIRE`]), a batch per transaction
/// ([`READ_COMMITTED`]). A batch that fails ends the upkeep; the next one goes on from there.
pub(super) async fn upkeep(
    b: &MySqlBackend,
    _days_ahead: u32,
    at: Option<DateTime<Utc>>,
) -> Result<Option<LogUpkeep>> {
    let mut conn = b.pool.acquire().await?;
    let mine: Option<i64> = sqlx::query_scalar(TRY_LOCK).fetch_one(&mut *conn).await?;
    if mine != Some(1) {
        return Ok(None);
    }
    let mut held = Held {
        conn,
        released: false,
    };
    let cutoffs: Vec<(String, i64)> = sqlx::query_as(CUTOFFS)
        .bind(at.map(|t| t.timestamp_millis()))
        .fetch_all(&mut *held.conn)
        .await?;
    let mut deleted = 0;
    for (topic, before) in &cutoffs {
        loop {
            let conn: &mut MySqlConnection = &mut held.conn;
            if !b.read_committed {
                sqlx::query(READ_COMMITTED).execute(&mut *conn).await?;
            }
            let mut tx = sqlx::Connection::begin(conn).await?;
            let gone = sqlx::query(EXPIRE)
                .bind(topic)
                .bind(*before)
                .bind(EXPIRE_BATCH)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            deleted += gone;
            if gone < EXPIRE_BATCH as u64 {
                break;
            }
        }
    }
    held.release().await?;
    Ok(Some(LogUpkeep {
        deleted,
        ..LogUpkeep::default()
    }))
}

/// The retained topics ([`TOPICS`]).
pub(super) async fn topics(b: &MySqlBackend, sizes: bool) -> Result<Vec<RetainedTopic>> {
    let rows = sqlx::query(TOPICS)
        .bind(sizes)
        .bind(sizes)
        .fetch_all(&b.pool)
        .await?;
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
pub(super) async fn events(b: &MySqlBackend, f: &EventFilter) -> Result<Vec<RetainedEvent>> {
    let since = f.since.map(|t| t.timestamp_millis());
    let until = f.until.map(|t| t.timestamp_millis());
    let key = f.key.as_deref();
    // An event that is gone counts as 0: a page may then repeat events, never skip one.
    let after_seq = match (f.after, f.after_seq) {
        (Some(id), None) => Some(
            sqlx::query_scalar::<_, i64>(EVENT_SEQ)
                .bind(id)
                .fetch_optional(&b.pool)
                .await?
                .unwrap_or(0),
        ),
        (_, seq) => seq,
    };
    let rows = sqlx::query(EVENTS)
        .bind(&f.topic)
        .bind(since)
        .bind(since)
        .bind(until)
        .bind(until)
        .bind(key)
        .bind(key)
        .bind(f.after)
        .bind(after_seq)
        .bind(after_seq)
        .bind(f.after)
        .bind(i64::from(f.limit.unwrap_or(100)))
        .fetch_all(&b.pool)
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
                created_at: time(r.try_get("created_at")?),
                delivered_at: time(r.try_get("delivered_at")?),
                traceparent: r.try_get("traceparent")?,
            })
        })
        .collect()
}
