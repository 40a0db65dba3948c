//! Replays of the event log to one handler: made, listed, paused and resumed by operators; run
//! by one worker at a time under a lease, from a cursor that each handled batch moves. And the
//! handlers the deployment has run, which replays name and backfills start from.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;
use uuid::Uuid;

use super::secs;
use crate::backend::ReplayStep;
use crate::error::Result;
use crate::retention::{
    ReplayFailure, ReplayInfo, ReplayPlan, ReplayRequest, ReplayRequestInfo, ReplayState,
};

/// The events of topic `$1` enqueued from `$2` to before `$3`, of key `$4`: how many, and
/// the first and last enqueue times.
const PLAN: &str = "SELECT count(*), min(e.created_at), max(e.created_at) \
     FROM outbox_events e \
     WHERE e.topic_id = (SELECT id FROM outbox_retention WHERE topic = $1) \
       AND ($2::timestamptz IS NULL OR e.created_at >= $2) \
       AND e.created_at < $3 \
       AND ($4::text IS NULL OR e.ordering_key = $4)";

/// Makes replay `$1` of topic `$2` to handler `$3`, window `$4`..`$5`, key `$6`, rate `$7`,
/// fresh `$8`, backfill `$9`, of `$10` events. A second backfill of one handler is not made.
const CREATE: &str = "INSERT INTO outbox_replays (id, topic, handler, since, until, ordering_key, \
        rate, fresh, backfill, total) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
     ON CONFLICT (topic, handler) WHERE backfill DO NOTHING";

/// The columns of a replay as [`info`] reads them; `$now` is the statement's current time.
macro_rules! replay_columns {
    ($now:literal) => {
        concat!(
            "id, topic, handler, since, until, ordering_key, rate, fresh, backfill, state, cursor, \
             cursor_seq, total, delivered, failed, created_at, started_at, updated_at, finished_at, \
             coalesce(lease_until > ",
            $now,
            " AND state = 'running', false) AS leased"
        )
    };
}

/// Every replay, newest first.
const LIST: &str = concat!(
    "SELECT ",
    replay_columns!("now()"),
    " FROM outbox_replays ORDER BY id DESC"
);

/// Replay `$1`.
const GET: &str = concat!(
    "SELECT ",
    replay_columns!("now()"),
    " FROM outbox_replays WHERE id = $1"
);

/// The failures of replay `$1`, in event order.
const FAILURES: &str = "SELECT event_id, attempts, error, failed_at FROM outbox_replay_failures \
     WHERE replay_id = $1 ORDER BY event_id";

/// Replay `$1` to state `$2`, from a state it may leave that way: running and paused into
/// each other, either into cancelled. Cancelling ends the lease; the runner sees it at its
/// next step.
const SET_STATE: &str = "UPDATE outbox_replays SET state = $2, updated_at = now(), \
        finished_at = CASE WHEN $2 = 'cancelled' THEN now() END \
     WHERE id = $1 AND (($2 = 'paused' AND state = 'running') \
                     OR ($2 = 'running' AND state = 'paused') \
                     OR ($2 = 'cancelled' AND state IN ('running', 'paused')))";

/// Leases to worker `$1` under token `$2` for `$3` seconds the oldest running replay of a
/// (topic, handler) pair of `$4`/`$5` whose lease is free.
const LEASE: &str = concat!(
    "UPDATE outbox_replays r \
     SET lease_token = $2, leased_by = $1, lease_until = now() + make_interval(secs => $3), \
         started_at = coalesce(r.started_at, now()), updated_at = now() \
     WHERE r.id = ( \
         SELECT id FROM outbox_replays \
         WHERE state = 'running' AND (lease_until IS NULL OR lease_until < now()) \
           AND (topic, handler) IN (SELECT * FROM UNNEST($4::text[], $5::text[])) \
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) \
     RETURNING ",
    replay_columns!("now()")
);

/// Moves replay `$1` under lease token `$2`: cursor `$3` at `seq` `$9` (both kept when `$3` is
/// NULL), `$4` more events handled, `$5` more failed; done when `$6`; the lease renewed for
/// `$7` seconds, or given up when `$8`. Returns its state, or no row when the lease was taken
/// over.
const ADVANCE: &str = "UPDATE outbox_replays \
     SET cursor = coalesce($3, cursor), \
         cursor_seq = CASE WHEN $3::uuid IS NULL THEN cursor_seq ELSE $9 END, \
         delivered = delivered + $4, failed = failed + $5, \
         state = CASE WHEN $6 AND state = 'running' THEN 'done' ELSE state END, \
         finished_at = CASE WHEN $6 AND state = 'running' THEN now() ELSE finished_at END, \
         lease_until = CASE WHEN $8 OR state <> 'running' OR $6 THEN NULL \
                            ELSE now() + make_interval(secs => $7) END, \
         lease_token = CASE WHEN $8 OR state <> 'running' OR $6 THEN NULL ELSE lease_token END, \
         updated_at = now() \
     WHERE id = $1 AND lease_token = $2 \
     RETURNING state";

/// Records that the handler of replay `$1` failed for good on events `$2` after `$3` attempts
/// with errors `$4`.
const FAIL: &str = "INSERT INTO outbox_replay_failures (replay_id, event_id, attempts, error) \
     SELECT $1, * FROM UNNEST($2::uuid[], $3::int4[], $4::text[]) \
     ON CONFLICT (replay_id, event_id) DO UPDATE SET attempts = excluded.attempts, \
        error = excluded.error, failed_at = now()";

/// Records the (topic, handler) pairs `$1`/`$2` as run; returns those seen for the first time.
const SEEN: &str = "INSERT INTO outbox_handlers (topic, handler) \
     SELECT * FROM UNNEST($1::text[], $2::text[]) \
     ON CONFLICT (topic, handler) DO UPDATE SET last_seen_at = now() \
     RETURNING topic, handler, (xmax = 0) AS new";

/// Whether handler `$2` of topic `$1` has run.
const KNOWN: &str =
    "SELECT EXISTS (SELECT 1 FROM outbox_handlers WHERE topic = $1 AND handler = $2)";

/// What a replay would deliver ([`PLAN`]), up to `until`.
pub(super) async fn plan(
    pool: &PgPool,
    r: &ReplayRequest,
    until: DateTime<Utc>,
) -> Result<ReplayPlan> {
    let (events, first, last): (i64, Option<DateTime<Utc>>, Option<DateTime<Utc>>) =
        sqlx::query_as(PLAN)
            .bind(&r.topic)
            .bind(r.since)
            .bind(until)
            .bind(r.key.as_deref())
            .fetch_one(pool)
            .await?;
    Ok(ReplayPlan {
        events,
        first,
        last,
    })
}

/// Makes a replay ([`CREATE`]); false when it is a backfill that exists already.
pub(super) async fn create(
    pool: &PgPool,
    id: Uuid,
    r: &ReplayRequest,
    until: DateTime<Utc>,
    total: i64,
    backfill: bool,
) -> Result<bool> {
    let made = sqlx::query(CREATE)
        .bind(id)
        .bind(&r.topic)
        .bind(&r.handler)
        .bind(r.since)
        .bind(until)
        .bind(r.key.as_deref())
        .bind(r.rate.map(|n| i32::try_from(n).unwrap_or(i32::MAX)))
        .bind(r.fresh)
        .bind(backfill)
        .bind(total)
        .execute(pool)
        .await?;
    Ok(made.rows_affected() == 1)
}

fn info(r: &PgRow) -> Result<ReplayInfo, sqlx::Error> {
    Ok(ReplayInfo {
        id: r.try_get("id")?,
        request: ReplayRequestInfo {
            topic: r.try_get("topic")?,
            handler: r.try_get("handler")?,
            since: r.try_get("since")?,
            until: r.try_get("until")?,
            key: r.try_get("ordering_key")?,
            rate: r
                .try_get::<Option<i32>, _>("rate")?
                .and_then(|n| u32::try_from(n).ok()),
            fresh: r.try_get("fresh")?,
        },
        backfill: r.try_get("backfill")?,
        state: ReplayState::parse(r.try_get("state")?),
        total: r.try_get("total")?,
        delivered: r.try_get("delivered")?,
        failed: r.try_get("failed")?,
        cursor: r.try_get("cursor")?,
        cursor_seq: r.try_get("cursor_seq")?,
        created_at: r.try_get("created_at")?,
        started_at: r.try_get("started_at")?,
        updated_at: r.try_get("updated_at")?,
        finished_at: r.try_get("finished_at")?,
        leased: r.try_get("leased")?,
    })
}

/// Every replay ([`LIST`]).
pub(super) async fn list(pool: &PgPool) -> Result<Vec<ReplayInfo>> {
    let rows = sqlx::query(LIST).fetch_all(pool).await?;
    Ok(rows.iter().map(info).collect::<Result<_, _>>()?)
}

/// One replay ([`GET`]).
pub(super) async fn get(pool: &PgPool, id: Uuid) -> Result<Option<ReplayInfo>> {
    let row = sqlx::query(GET).bind(id).fetch_optional(pool).await?;
    Ok(row.as_ref().map(info).transpose()?)
}

/// A replay's failures ([`FAILURES`]).
pub(super) async fn failures(pool: &PgPool, id: Uuid) -> Result<Vec<ReplayFailure>> {
    let rows: Vec<(Uuid, i32, String, DateTime<Utc>)> =
        sqlx::query_as(FAILURES).bind(id).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(event_id, attempts, error, failed_at)| ReplayFailure {
            event_id,
            attempts,
            error,
            failed_at,
        })
        .collect())
}

/// Changes a replay's state ([`SET_STATE`]); false when it was not in a state to.
pub(super) async fn set_state(pool: &PgPool, id: Uuid, to: ReplayState) -> Result<bool> {
    let r = sqlx::query(SET_STATE)
        .bind(id)
        .bind(to.as_str())
        .execute(pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Leases a runnable replay ([`LEASE`]).
pub(super) async fn lease(
    pool: &PgPool,
    worker: Uuid,
    token: Uuid,
    handlers: &[(&str, &str)],
    lease: Duration,
) -> Result<Option<ReplayInfo>> {
    let (topics, names): (Vec<&str>, Vec<&str>) = handlers.iter().copied().unzip();
    let row = sqlx::query(LEASE)
        .bind(worker)
        .bind(token)
        .bind(secs(lease))
        .bind(topics)
        .bind(names)
        .fetch_optional(pool)
        .await?;
    Ok(row.as_ref().map(info).transpose()?)
}

/// Moves a replay ([`ADVANCE`]) and records its failures ([`FAIL`]) in one transaction;
/// `None` when its lease was taken over (nothing is written then).
pub(super) async fn advance(
    pool: &PgPool,
    id: Uuid,
    token: Uuid,
    step: &ReplayStep,
) -> Result<Option<ReplayState>> {
    let mut tx = pool.begin().await?;
    let state: Option<String> = sqlx::query_scalar(ADVANCE)
        .bind(id)
        .bind(token)
        .bind(step.cursor)
        .bind(step.delivered)
        .bind(i64::try_from(step.failures.len()).unwrap_or(i64::MAX))
        .bind(step.finished)
        .bind(secs(step.lease))
        .bind(step.release)
        .bind(step.cursor_seq)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(state) = state else {
        return Ok(None);
    };
    if !step.failures.is_empty() {
        let mut ids = Vec::new();
        let mut attempts = Vec::new();
        let mut errors = Vec::new();
        for (event, n, error) in &step.failures {
            ids.push(*event);
            attempts.push(*n);
            errors.push(error.as_str());
        }
        sqlx::query(FAIL)
            .bind(id)
            .bind(ids)
            .bind(attempts)
            .bind(errors)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(Some(ReplayState::parse(&state)))
}

/// Records handlers as run ([`SEEN`]); returns those seen for the first time.
pub(super) async fn seen(
    pool: &PgPool,
    handlers: &[(&str, &str)],
) -> Result<Vec<(String, String)>> {
    let (topics, names): (Vec<&str>, Vec<&str>) = handlers.iter().copied().unzip();
    let rows: Vec<(String, String, bool)> = sqlx::query_as(SEEN)
        .bind(topics)
        .bind(names)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(_, _, new)| *new)
        .map(|(t, h, _)| (t, h))
        .collect())
}

/// Whether a handler has run on a topic ([`KNOWN`]).
pub(super) async fn known(pool: &PgPool, topic: &str, handler: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(KNOWN)
        .bind(topic)
        .bind(handler)
        .fetch_one(pool)
        .await?)
}
