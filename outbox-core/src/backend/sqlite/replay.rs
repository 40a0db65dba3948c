//! Replays of the event log to one handler, as on PostgreSQL: made, listed, paused and resumed
//! by operators; run by one worker at a time under a lease, from a cursor that each handled
//! batch moves. And the handlers the deployment has run. A lease is taken in one `UPDATE`,
//! atomic under SQLite's write lock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::{ms, parse_uuid, time};
use crate::backend::ReplayStep;
use crate::clock::now_ms;
use crate::error::Result;
use crate::retention::{
    ReplayFailure, ReplayInfo, ReplayPlan, ReplayRequest, ReplayRequestInfo, ReplayState,
};

/// The events of topic `?1` enqueued from `?2` to before `?3` (Unix ms), of key `?4`: how
/// many, and the first and last enqueue times.
const PLAN: &str = "SELECT count(*), min(created_at), max(created_at) FROM outbox_events \
     WHERE topic = ?1 AND EXISTS (SELECT 1 FROM outbox_retention WHERE topic = ?1) \
       AND (?2 IS NULL OR created_at >= ?2) AND created_at < ?3 \
       AND (?4 IS NULL OR ordering_key = ?4)";

/// Makes replay `?1` of topic `?2` to handler `?3`, window `?4`..`?5`, key `?6`, rate `?7`,
/// fresh `?8`, backfill `?9`, of `?10` events, at `?11`. A second backfill of one handler is
/// not made.
const CREATE: &str = "INSERT INTO outbox_replays (id, topic, handler, since, until, ordering_key, \
        rate, fresh, backfill, total, created_at, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11) \
     ON CONFLICT (topic, handler) WHERE backfill DO NOTHING";

/// The columns of a replay as [`info`] reads them; `$now` is the statement's current time.
macro_rules! replay_columns {
    ($now:literal) => {
        concat!(
            "id, topic, handler, since, until, ordering_key, rate, fresh, backfill, state, cursor, \
             cursor_seq, total, delivered, failed, created_at, started_at, updated_at, finished_at, \
             coalesce(lease_until > ",
            $now,
            " AND state = 'running', 0) AS leased"
        )
    };
}

/// Every replay, newest first, `?1` being now.
const LIST: &str = concat!(
    "SELECT ",
    replay_columns!("?1"),
    " FROM outbox_replays ORDER BY id DESC"
);

/// Replay `?2`, `?1` being now.
const GET: &str = concat!(
    "SELECT ",
    replay_columns!("?1"),
    " FROM outbox_replays WHERE id = ?2"
);

/// The failures of replay `?1`, in event order.
const FAILURES: &str = "SELECT event_id, attempts, error, failed_at FROM outbox_replay_failures \
     WHERE replay_id = ?1 ORDER BY event_id";

/// Replay `?1` to state `?2` at `?3`, from a state it may leave that way.
const SET_STATE: &str = "UPDATE outbox_replays SET state = ?2, updated_at = ?3, \
        finished_at = CASE WHEN ?2 = 'cancelled' THEN ?3 END \
     WHERE id = ?1 AND ((?2 = 'paused' AND state = 'running') \
                     OR (?2 = 'running' AND state = 'paused') \
                     OR (?2 = 'cancelled' AND state IN ('running', 'paused')))";

/// Leases to worker `?1` under token `?2` until `?3` the oldest running replay, at `?4`, of a
/// (topic, handler) pair of the JSON array `?5` whose lease is free.
const LEASE: &str = concat!(
    "UPDATE outbox_replays \
     SET lease_token = ?2, leased_by = ?1, lease_until = ?3, \
         started_at = coalesce(started_at, ?4), updated_at = ?4 \
     WHERE id = ( \
         SELECT r.id FROM outbox_replays r \
         JOIN json_each(?5) AS h ON r.topic = h.value ->> 0 AND r.handler = h.value ->> 1 \
         WHERE r.state = 'running' AND (r.lease_until IS NULL OR r.lease_until < ?4) \
         ORDER BY r.id LIMIT 1) \
     RETURNING ",
    replay_columns!("?4")
);

/// Moves replay `?1` under lease token `?2` at `?9`: cursor `?3` at `seq` `?10` (both kept
/// when `?3` is NULL), `?4` more
/// handled, `?5` more failed; done when `?6`; the lease renewed until `?7`, or given up when
/// `?8`. Returns its state, or no row when the lease was taken over.
const ADVANCE: &str = "UPDATE outbox_replays \
     SET cursor = coalesce(?3, cursor), cursor_seq = CASE WHEN ?3 IS NULL THEN cursor_seq ELSE ?10 END, \
         delivered = delivered + ?4, failed = failed + ?5, \
         state = CASE WHEN ?6 AND state = 'running' THEN 'done' ELSE state END, \
         finished_at = CASE WHEN ?6 AND state = 'running' THEN ?9 ELSE finished_at END, \
         lease_until = CASE WHEN ?8 OR state <> 'running' OR ?6 THEN NULL ELSE ?7 END, \
         lease_token = CASE WHEN ?8 OR state <> 'running' OR ?6 THEN NULL ELSE lease_token END, \
         updated_at = ?9 \
     WHERE id = ?1 AND lease_token = ?2 \
     RETURNING state";

/// Records that the handler of replay `?1` failed for good on event `?2` after `?3` attempts
/// with error `?4`, at `?5`.
const FAIL: &str =
    "INSERT INTO outbox_replay_failures (replay_id, event_id, attempts, error, failed_at) \
     VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (replay_id, event_id) DO UPDATE SET attempts = excluded.attempts, \
        error = excluded.error, failed_at = excluded.failed_at";

/// Records handler `?2` of topic `?1` as run at `?3`; returns a row only when it is new.
const SEEN: &str = "INSERT INTO outbox_handlers (topic, handler, first_seen_at, last_seen_at) \
     VALUES (?1, ?2, ?3, ?3) ON CONFLICT (topic, handler) DO NOTHING RETURNING topic";

/// Marks handler `?2` of topic `?1` as seen at `?3`.
const TOUCH: &str =
    "UPDATE outbox_handlers SET last_seen_at = ?3 WHERE topic = ?1 AND handler = ?2";

/// Whether handler `?2` of topic `?1` has run.
const KNOWN: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox_handlers WHERE topic = ?1 AND handler = ?2)";

/// What a replay would deliver ([`PLAN`]), up to `until`.
pub(super) async fn plan(
    pool: &SqlitePool,
    r: &ReplayRequest,
    until: DateTime<Utc>,
) -> Result<ReplayPlan> {
    let (events, first, last): (i64, Option<i64>, Option<i64>) = sqlx::query_as(PLAN)
        .bind(&r.topic)
        .bind(r.since.map(|t| t.timestamp_millis()))
        .bind(until.timestamp_millis())
        .bind(r.key.as_deref())
        .fetch_one(pool)
        .await?;
    Ok(ReplayPlan {
        events,
        first: first.map(time),
        last: last.map(time),
    })
}

/// Makes a replay ([`CREATE`]); false when it is a backfill that exists already.
pub(super) async fn create(
    pool: &SqlitePool,
    id: Uuid,
    r: &ReplayRequest,
    until: DateTime<Utc>,
    total: i64,
    backfill: bool,
) -> Result<bool> {
    let made = sqlx::query(CREATE)
        .bind(id.to_string())
        .bind(&r.topic)
        .bind(&r.handler)
        .bind(r.since.map(|t| t.timestamp_millis()))
        .bind(until.timestamp_millis())
        .bind(r.key.as_deref())
        .bind(r.rate.map(i64::from))
        .bind(r.fresh)
        .bind(backfill)
        .bind(total)
        .bind(now_ms())
        .execute(pool)
        .await?;
    Ok(made.rows_affected() == 1)
}

fn info(r: &SqliteRow) -> Result<ReplayInfo, sqlx::Error> {
    let opt_time = |name: &str| -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        Ok(r.try_get::<Option<i64>, _>(name)?.map(time))
    };
    Ok(ReplayInfo {
        id: parse_uuid(r.try_get("id")?)?,
        request: ReplayRequestInfo {
            topic: r.try_get("topic")?,
            handler: r.try_get("handler")?,
            since: opt_time("since")?,
            until: time(r.try_get("until")?),
            key: r.try_get("ordering_key")?,
            rate: r
                .try_get::<Option<i64>, _>("rate")?
                .and_then(|n| u32::try_from(n).ok()),
            fresh: r.try_get("fresh")?,
        },
        backfill: r.try_get("backfill")?,
        state: ReplayState::parse(r.try_get("state")?),
        total: r.try_get("total")?,
        delivered: r.try_get("delivered")?,
        failed: r.try_get("failed")?,
        cursor: r
            .try_get::<Option<String>, _>("cursor")?
            .map(|c| parse_uuid(&c))
            .transpose()?,
        cursor_seq: r.try_get("cursor_seq")?,
        created_at: time(r.try_get("created_at")?),
        started_at: opt_time("started_at")?,
        updated_at: time(r.try_get("updated_at")?),
        finished_at: opt_time("finished_at")?,
        leased: r.try_get("leased")?,
    })
}

/// Every replay ([`LIST`]).
pub(super) async fn list(pool: &SqlitePool) -> Result<Vec<ReplayInfo>> {
    let rows = sqlx::query(LIST).bind(now_ms()).fetch_all(pool).await?;
    Ok(rows.iter().map(info).collect::<Result<_, _>>()?)
}

/// One replay ([`GET`]).
pub(super) async fn get(pool: &SqlitePool, id: Uuid) -> Result<Option<ReplayInfo>> {
    let row = sqlx::query(GET)
        .bind(now_ms())
        .bind(id.to_string())
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(info).transpose()?)
}

/// A replay's failures ([`FAILURES`]).
pub(super) async fn failures(pool: &SqlitePool, id: Uuid) -> Result<Vec<ReplayFailure>> {
    let rows: Vec<(String, i32, String, i64)> = sqlx::query_as(FAILURES)
        .bind(id.to_string())
        .fetch_all(pool)
        .await?;
    rows.into_iter()
        .map(|(event_id, attempts, error, failed_at)| {
            Ok(ReplayFailure {
                event_id: parse_uuid(&event_id)?,
                attempts,
                error,
                failed_at: time(failed_at),
            })
        })
        .collect()
}

/// Changes a replay's state ([`SET_STATE`]).
pub(super) async fn set_state(pool: &SqlitePool, id: Uuid, to: ReplayState) -> Result<bool> {
    let r = sqlx::query(SET_STATE)
        .bind(id.to_string())
        .bind(to.as_str())
        .bind(now_ms())
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Leases a runnable replay ([`LEASE`]).
pub(super) async fn lease(
    pool: &SqlitePool,
    worker: Uuid,
    token: Uuid,
    handlers: &[(&str, &str)],
    lease: Duration,
) -> Result<Option<ReplayInfo>> {
    let now = now_ms();
    let pairs = serde_json::to_string(handlers).unwrap_or_else(|_| "[]".into());
    let row = sqlx::query(LEASE)
        .bind(worker.to_string())
        .bind(token.to_string())
        .bind(now + ms(lease))
        .bind(now)
        .bind(pairs)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(info).transpose()?)
}

/// Moves a replay ([`ADVANCE`]) and records its failures ([`FAIL`]) in one transaction.
pub(super) async fn advance(
    pool: &SqlitePool,
    id: Uuid,
    token: Uuid,
    step: &ReplayStep,
) -> Result<Option<ReplayState>> {
    let now = now_ms();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let state: Option<String> = sqlx::query_scalar(ADVANCE)
        .bind(id.to_string())
        .bind(token.to_string())
        .bind(step.cursor.map(|c| c.to_string()))
        .bind(step.delivered)
        .bind(i64::try_from(step.failures.len()).unwrap_or(i64::MAX))
        .bind(step.finished)
        .bind(now + ms(step.lease))
        .bind(step.release)
        .bind(now)
        .bind(step.cursor_seq)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(state) = state else {
        return Ok(None);
    };
    for (event, attempts, error) in &step.failures {
        sqlx::query(FAIL)
            .bind(id.to_string())
            .bind(event.to_string())
            .bind(attempts)
            .bind(error)
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Some(ReplayState::parse(&state)))
}

/// Records handlers as run ([`SEEN`], [`TOUCH`]); returns those seen for the first time.
pub(super) async fn seen(
    pool: &SqlitePool,
    handlers: &[(&str, &str)],
) -> Result<Vec<(String, String)>> {
    let now = now_ms();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let mut new = Vec::new();
    for (topic, handler) in handlers {
        let inserted = sqlx::query(SEEN)
            .bind(topic)
            .bind(handler)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        if inserted.is_some() {
            new.push(((*topic).to_string(), (*handler).to_string()));
        } else {
            sqlx::query(TOUCH)
                .bind(topic)
                .bind(handler)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(new)
}

/// Whether a handler has run on a topic ([`KNOWN`]).
pub(super) async fn known(pool: &SqlitePool, topic: &str, handler: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(KNOWN)
        .bind(topic)
        .bind(handler)
        .fetch_one(pool)
        .await?)
}
