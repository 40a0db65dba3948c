//! Replays of the event log to one handler, as on PostgreSQL: made, listed, paused and resumed
//! by operators; run by one worker at a time under a lease, from a cursor that each handled
//! batch moves. And the handlers the deployment has run.
//!
//! Without `RETURNING`, a lease is three statements in one READ COMMITTED transaction: the
//! replay picked and locked (`FOR UPDATE SKIP LOCKED`, so two workers never wait on each
//! other's pick), updated by id, and read back. A (topic, handler) pair travels as one string,
//! the topic, a NUL and the handler: the same string `backfill_of` holds for a backfill, whose
//! unique index makes it once per pair (MySQL has no partial index). Every time is the
//! server's clock, in Unix milliseconds.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlDatabaseError, MySqlRow};
use sqlx::Row;
use uuid::Uuid;

use super::{ms, now_ms, retrying, time, with_list, MySqlBackend};
use crate::backend::ReplayStep;
use crate::error::Result;
use crate::retention::{
    ReplayFailure, ReplayInfo, ReplayPlan, ReplayRequest, ReplayRequestInfo, ReplayState,
};

/// The events of topic `?` (first two) enqueued from `?` (next two; all when NULL) to before
/// `?` (Unix ms), of key `?` (last two; any when NULL): how many, and the first and last
/// enqueue times. A topic that retains nothing has none.
const PLAN: &str = "SELECT count(*), min(created_at), max(created_at) FROM outbox_events \
     WHERE topic = ? AND EXISTS (SELECT 1 FROM outbox_retention WHERE topic = ?) \
       AND (? IS NULL OR created_at >= ?) AND created_at < ? \
       AND (? IS NULL OR ordering_key = ?)";

/// Makes replay `?` of topic `?` to handler `?`, window `?`..`?`, key `?`, rate `?`, fresh
/// `?`, backfill `?` (its pair in `backfill_of`, `?`, else NULL), of `?` events. A second
/// backfill of one handler fails on `outbox_replays_backfill_idx`.
const CREATE: &str = concat!(
    "INSERT INTO outbox_replays (id, topic, handler, since, `until`, ordering_key, rate, fresh, \
         backfill, backfill_of, total, created_at, updated_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ")"
);

/// The columns of a replay as [`info`] reads them; `$now` is the statement's current time.
macro_rules! replay_columns {
    ($now:expr) => {
        concat!(
            "id, topic, handler, since, `until`, ordering_key, rate, fresh, backfill, state, \
             cursor_id, cursor_seq, total, delivered, failed, created_at, started_at, updated_at, \
             finished_at, COALESCE(lease_until > ",
            $now,
            " AND state = 'running', FALSE) AS leased"
        )
    };
}

/// Every replay, newest first.
const LIST: &str = concat!(
    "SELECT ",
    replay_columns!(now_ms!()),
    " FROM outbox_replays ORDER BY id DESC"
);

/// Replay `?`.
const GET: &str = concat!(
    "SELECT ",
    replay_columns!(now_ms!()),
    " FROM outbox_replays WHERE id = ?"
);

/// The failures of replay `?`, in event order.
const FAILURES: &str = "SELECT event_id, attempts, error, failed_at FROM outbox_replay_failures \
     WHERE replay_id = ? ORDER BY event_id";

/// Replay `?` (third) to state `?` (the other four), from a state it may leave that way:
/// running and paused into each other, either into cancelled. Cancelling ends the lease; the
/// runner sees it at its next step.
const SET_STATE: &str = concat!(
    "UPDATE outbox_replays SET finished_at = CASE WHEN ? = 'cancelled' THEN ",
    now_ms!(),
    " END, state = ?, updated_at = ",
    now_ms!(),
    " WHERE id = ? AND ((state = 'running' AND ? IN ('paused', 'cancelled')) \
                     OR (state = 'paused' AND ? IN ('running', 'cancelled')))"
);

/// Picks and locks the oldest running replay with a free lease of a (topic, handler) pair of
/// `{list}` (each the topic, a NUL and the handler); replays another lease locks are skipped.
const LEASE_PICK: &str = concat!(
    "SELECT id FROM outbox_replays \
     WHERE state = 'running' AND (lease_until IS NULL OR lease_until < ",
    now_ms!(),
    ") AND CONCAT(topic, CHAR(0 USING utf8mb4), handler) IN ({list}) \
     ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
);

/// Leases the picked replay `?` (last) to worker `?` under token `?` (the token first) for
/// `?` ms.
const LEASE: &str = concat!(
    "UPDATE outbox_replays SET lease_token = ?, leased_by = ?, lease_until = ",
    now_ms!(),
    " + ?, started_at = COALESCE(started_at, ",
    now_ms!(),
    "), updated_at = ",
    now_ms!(),
    " WHERE id = ?"
);

/// The replay `?` just leased, read back in the lease's transaction.
const LEASED: &str = concat!(
    "SELECT ",
    replay_columns!(now_ms!()),
    " FROM outbox_replays WHERE id = ?"
);

/// Locks replay `?` if its lease token is still `?`: its state, or no row when the lease was
/// taken over.
const ADVANCE_LOCK: &str =
    "SELECT state FROM outbox_replays WHERE id = ? AND lease_token = ? FOR UPDATE";

/// Moves the locked replay `?` (last): cursor `?` at `seq` `?` (both kept when the first is
/// NULL, which is bound twice), `?` more handled, `?`
/// more failed; done when `?` (bound four times); the lease renewed for `?` ms, or given up
/// when `?` (bound twice). `state` is assigned last (MySQL assigns left to right), so every
/// condition reads the state the replay had.
const ADVANCE: &str = concat!(
    "UPDATE outbox_replays \
     SET cursor_seq = IF(? IS NULL, cursor_seq, ?), cursor_id = COALESCE(?, cursor_id), \
         delivered = delivered + ?, failed = failed + ?, \
         finished_at = CASE WHEN ? AND state = 'running' THEN ",
    now_ms!(),
    " ELSE finished_at END, \
         lease_until = CASE WHEN ? OR state <> 'running' OR ? THEN NULL ELSE ",
    now_ms!(),
    " + ? END, \
         lease_token = CASE WHEN ? OR state <> 'running' OR ? THEN NULL ELSE lease_token END, \
         updated_at = ",
    now_ms!(),
    ", state = CASE WHEN ? AND state = 'running' THEN 'done' ELSE state END \
     WHERE id = ?"
);

/// The state of replay `?` after [`ADVANCE`], in its transaction.
const ADVANCED: &str = "SELECT state FROM outbox_replays WHERE id = ?";

/// Records that the handler of replay `?` failed for good on event `?` after `?` attempts
/// with error `?`.
const FAIL: &str = concat!(
    "INSERT INTO outbox_replay_failures (replay_id, event_id, attempts, error, failed_at) \
     VALUES (?, ?, ?, ?, ",
    now_ms!(),
    ") ON DUPLICATE KEY UPDATE attempts = VALUES(attempts), error = VALUES(error), \
                               failed_at = VALUES(failed_at)"
);

/// Marks handler `?` (second) of topic `?` (first) as seen now; matches no row when it never
/// ran.
const TOUCH: &str = concat!(
    "UPDATE outbox_handlers SET last_seen_at = ",
    now_ms!(),
    " WHERE topic = ? AND handler = ?"
);

/// Records handler `?` (second) of topic `?` (first) as run, now; a duplicate key when
/// another worker recorded it first.
const SEEN: &str = concat!(
    "INSERT INTO outbox_handlers (topic, handler, first_seen_at, last_seen_at) VALUES (?, ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ")"
);

/// Whether handler `?` (second) of topic `?` (first) has run.
const KNOWN: &str = "SELECT EXISTS (SELECT 1 FROM outbox_handlers WHERE topic = ? AND handler = ?)";

/// A (topic, handler) pair as one string: the topic, a NUL and the handler (two pairs share
/// one only if a name holds a NUL).
fn pair(topic: &str, handler: &str) -> String {
    format!("{topic}\0{handler}")
}

/// Whether `e` is a duplicate key (1062) on the index `key` (`PRIMARY` for the primary key).
fn is_duplicate(e: &sqlx::Error, key: &str) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .is_some_and(|d| d.number() == 1062 && d.message().contains(key))
}

/// What a replay would deliver ([`PLAN`]), up to `until`.
pub(super) async fn plan(
    b: &MySqlBackend,
    r: &ReplayRequest,
    until: DateTime<Utc>,
) -> Result<ReplayPlan> {
    let since = r.since.map(|t| t.timestamp_millis());
    let key = r.key.as_deref();
    let (events, first, last): (i64, Option<i64>, Option<i64>) = sqlx::query_as(PLAN)
        .bind(&r.topic)
        .bind(&r.topic)
        .bind(since)
        .bind(since)
        .bind(until.timestamp_millis())
        .bind(key)
        .bind(key)
        .fetch_one(&b.pool)
        .await?;
    Ok(ReplayPlan {
        events,
        first: first.map(time),
        last: last.map(time),
    })
}

/// Makes a replay ([`CREATE`]); false when it is a backfill that exists already.
pub(super) async fn create(
    b: &MySqlBackend,
    id: Uuid,
    r: &ReplayRequest,
    until: DateTime<Utc>,
    total: i64,
    backfill: bool,
) -> Result<bool> {
    let backfill_of = backfill.then(|| pair(&r.topic, &r.handler));
    let made = sqlx::query(CREATE)
        .bind(id)
        .bind(&r.topic)
        .bind(&r.handler)
        .bind(r.since.map(|t| t.timestamp_millis()))
        .bind(until.timestamp_millis())
        .bind(r.key.as_deref())
        .bind(r.rate.map(i64::from))
        .bind(r.fresh)
        .bind(backfill)
        .bind(backfill_of)
        .bind(total)
        .execute(&b.pool)
        .await;
    match made {
        Ok(made) => Ok(made.rows_affected() == 1),
        Err(e) if backfill && is_duplicate(&e, "outbox_replays_backfill_idx") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn info(r: &MySqlRow) -> Result<ReplayInfo, sqlx::Error> {
    let opt_time = |name: &str| -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        Ok(r.try_get::<Option<i64>, _>(name)?.map(time))
    };
    Ok(ReplayInfo {
        id: r.try_get("id")?,
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
        cursor: r.try_get("cursor_id")?,
        cursor_seq: r.try_get("cursor_seq")?,
        created_at: time(r.try_get("created_at")?),
        started_at: opt_time("started_at")?,
        updated_at: time(r.try_get("updated_at")?),
        finished_at: opt_time("finished_at")?,
        leased: r.try_get("leased")?,
    })
}

/// Every replay ([`LIST`]).
pub(super) async fn list(b: &MySqlBackend) -> Result<Vec<ReplayInfo>> {
    let rows = sqlx::query(LIST).fetch_all(&b.pool).await?;
    Ok(rows.iter().map(info).collect::<Result<_, _>>()?)
}

/// One replay ([`GET`]).
pub(super) async fn get(b: &MySqlBackend, id: Uuid) -> Result<Option<ReplayInfo>> {
    let row = sqlx::query(GET).bind(id).fetch_optional(&b.pool).await?;
    Ok(row.as_ref().map(info).transpose()?)
}

/// A replay's failures ([`FAILURES`]).
pub(super) async fn failures(b: &MySqlBackend, id: Uuid) -> Result<Vec<ReplayFailure>> {
    let rows: Vec<(Uuid, i32, String, i64)> =
        sqlx::query_as(FAILURES).bind(id).fetch_all(&b.pool).await?;
    Ok(rows
        .into_iter()
        .map(|(event_id, attempts, error, failed_at)| ReplayFailure {
            event_id,
            attempts,
            error,
            failed_at: time(failed_at),
        })
        .collect())
}

/// Changes a replay's state ([`SET_STATE`]); false when it was not in a state to.
pub(super) async fn set_state(b: &MySqlBackend, id: Uuid, to: ReplayState) -> Result<bool> {
    let to = to.as_str();
    let r = sqlx::query(SET_STATE)
        .bind(to)
        .bind(to)
        .bind(id)
        .bind(to)
        .bind(to)
        .execute(&b.pool)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// Leases a runnable replay: picks and locks it ([`LEASE_PICK`]), leases it ([`LEASE`]) and
/// reads it back ([`LEASED`]), in one transaction.
pub(super) async fn lease(
    b: &MySqlBackend,
    worker: Uuid,
    token: Uuid,
    handlers: &[(&str, &str)],
    lease: Duration,
) -> Result<Option<ReplayInfo>> {
    if handlers.is_empty() {
        return Ok(None);
    }
    let pairs: Vec<String> = handlers.iter().map(|(t, h)| pair(t, h)).collect();
    retrying("replay lease", || async {
        let mut tx = b.begin().await?;
        let mut q = sqlx::query_scalar(with_list(LEASE_PICK, pairs.len()));
        for p in &pairs {
            q = q.bind(p);
        }
        let picked: Option<Uuid> = q.fetch_optional(&mut *tx).await?;
        let Some(id) = picked else {
            tx.commit().await?;
            return Ok(None);
        };
        sqlx::query(LEASE)
            .bind(token)
            .bind(worker)
            .bind(ms(lease))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(LEASED).bind(id).fetch_one(&mut *tx).await?;
        let leased = info(&row)?;
        tx.commit().await?;
        Ok(Some(leased))
    })
    .await
}

/// Moves a replay under its lease ([`ADVANCE_LOCK`], [`ADVANCE`], [`ADVANCED`]) and records
/// its failures ([`FAIL`]) in one transaction; `None` when its lease was taken over (nothing
/// is written then).
pub(super) async fn advance(
    b: &MySqlBackend,
    id: Uuid,
    token: Uuid,
    step: &ReplayStep,
) -> Result<Option<ReplayState>> {
    let failed = i64::try_from(step.failures.len()).unwrap_or(i64::MAX);
    retrying("replay advance", || async {
        let mut tx = b.begin().await?;
        let held: Option<String> = sqlx::query_scalar(ADVANCE_LOCK)
            .bind(id)
            .bind(token)
            .fetch_optional(&mut *tx)
            .await?;
        if held.is_none() {
            tx.commit().await?;
            return Ok(None);
        }
        sqlx::query(ADVANCE)
            .bind(step.cursor)
            .bind(step.cursor_seq)
            .bind(step.cursor)
            .bind(step.delivered)
            .bind(failed)
            .bind(step.finished)
            .bind(step.release)
            .bind(step.finished)
            .bind(ms(step.lease))
            .bind(step.release)
            .bind(step.finished)
            .bind(step.finished)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        let state: String = sqlx::query_scalar(ADVANCED)
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
        for (event, attempts, error) in &step.failures {
            sqlx::query(FAIL)
                .bind(id)
                .bind(*event)
                .bind(*attempts)
                .bind(error)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(ReplayState::parse(&state)))
    })
    .await
}

/// Records handlers as run, in one transaction: each marked seen ([`TOUCH`]) or, when it never
/// ran, inserted ([`SEEN`]); returns those seen for the first time. A pair another worker
/// inserts first (a duplicate key here) is not new.
pub(super) async fn seen(
    b: &MySqlBackend,
    handlers: &[(&str, &str)],
) -> Result<Vec<(String, String)>> {
    // One order for every worker's locks: two workers starting together never wait on each
    // other in a ring.
    let mut order: Vec<(&str, &str)> = handlers.to_vec();
    order.sort_unstable();
    order.dedup();
    let mut new = retrying("handlers seen", || async {
        let mut tx = b.begin().await?;
        let mut new = HashSet::new();
        for (topic, handler) in &order {
            let touched = sqlx::query(TOUCH)
                .bind(*topic)
                .bind(*handler)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            // sqlx counts matched rows (CLIENT_FOUND_ROWS); counting changed ones instead, a
            // touch within the same millisecond reads 0 and the insert below meets the key.
            if touched > 0 {
                continue;
            }
            match sqlx::query(SEEN)
                .bind(*topic)
                .bind(*handler)
                .execute(&mut *tx)
                .await
            {
                Ok(_) => {
                    new.insert((*topic, *handler));
                }
                // The statement alone is rolled back; the transaction goes on.
                Err(e) if is_duplicate(&e, "PRIMARY") => {}
                Err(e) => return Err(e),
            }
        }
        tx.commit().await?;
        Ok(new)
    })
    .await?;
    // In the caller's order, each pair once.
    Ok(handlers
        .iter()
        .filter(|p| new.remove(*p))
        .map(|(t, h)| ((*t).to_string(), (*h).to_string()))
        .collect())
}

/// Whether a handler has run on a topic ([`KNOWN`]).
pub(super) async fn known(b: &MySqlBackend, topic: &str, handler: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(KNOWN)
        .bind(topic)
        .bind(handler)
        .fetch_one(&b.pool)
        .await?)
}
