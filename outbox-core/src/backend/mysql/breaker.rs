//! The circuit breakers of handlers (`outbox_breakers`), and the claim of the message a
//! breaker's probe runs.
//!
//! A change of a breaker reads its row `FOR UPDATE`, writes what the worker's rules make of it
//! and, for a close, unparks the handler's messages, in one READ COMMITTED transaction; the
//! park (`outcome.rs`) reads the row `LOCK IN SHARE MODE`. So a close and a park that raced it
//! leave no message parked for a handler whose breaker is closed, as with a resume
//! (`pause.rs`). Times are the server's clock in milliseconds.

use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{ms, now_ms, retrying, time, MySqlBackend};
use crate::backend::{ClaimParams, ClaimedMessage};
use crate::breaker::{BreakerRow, Transition};
use crate::error::Result;

/// Every breaker; with `?` (1), how many messages are parked for each open one.
const LIST: &str =
    "SELECT handler, `open`, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
         probe_by, last_error, \
         CAST(CASE WHEN ? AND `open` THEN \
             (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = b.handler) \
         ELSE 0 END AS SIGNED) AS waiting \
     FROM outbox_breakers b ORDER BY handler";

/// The server's clock.
const NOW: &str = concat!("SELECT ", now_ms!());

/// The breaker of `?`, locked.
const LOCK: &str =
    "SELECT handler, `open`, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
         probe_by, last_error, CAST(0 AS SIGNED) AS waiting \
     FROM outbox_breakers WHERE handler = ? FOR UPDATE";

/// Writes the breaker row of the first `?`.
const UPSERT: &str = "INSERT INTO outbox_breakers (handler, `open`, failures, repeats, window_start, opened_at, \
         probe_at, failed_probes, probe_by, last_error) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
     ON DUPLICATE KEY UPDATE `open` = VALUES(`open`), failures = VALUES(failures), repeats = VALUES(repeats), \
         window_start = VALUES(window_start), opened_at = VALUES(opened_at), \
         probe_at = VALUES(probe_at), failed_probes = VALUES(failed_probes), \
         probe_by = VALUES(probe_by), last_error = VALUES(last_error)";

/// Deletes the breaker row of `?`.
const DELETE: &str = "DELETE FROM outbox_breakers WHERE handler = ?";

/// Makes the messages parked for `?` claimable, unless the handler (`?` again) is paused.
const UNPARK: &str = concat!(
    "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = ? \
     AND NOT EXISTS (SELECT 1 FROM outbox_pauses WHERE scope = 'handler' AND name = ? \
                     AND (`until` IS NULL OR `until` > ",
    now_ms!(),
    "))"
);

/// One message parked for `?` of the topic `?` at a version up to `?`, locked: the one parked
/// longest ago (see the PostgreSQL backend's `CLAIM_PARKED`).
const PICK_PARKED: &str =
    "SELECT id, topic, payload, version, idempotency_key, attempts, created_at, \
         last_error, ordering_key, seq, releases_key, traceparent, tracestate \
     FROM outbox_messages WHERE parked_by = ? AND topic = ? AND version <= ? \
     ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED";

/// Counts the attempt of the locked message `?` (last) and leases it under claim token `?` to
/// worker `?` for `?` ms, no longer parked.
const TAKE_PARKED: &str = concat!(
    "UPDATE outbox_messages SET attempts = attempts + 1, claim_token = ?, claimed_by = ?, \
     parked_by = NULL, locked_until = ",
    now_ms!(),
    " + ? WHERE id = ?"
);

fn row(r: &MySqlRow) -> Result<BreakerRow, sqlx::Error> {
    let probe_by: Option<String> = r.try_get("probe_by")?;
    Ok(BreakerRow {
        handler: r.try_get("handler")?,
        open: r.try_get("open")?,
        failures: u32::try_from(r.try_get::<i32, _>("failures")?).unwrap_or(0),
        repeats: u32::try_from(r.try_get::<i32, _>("repeats")?).unwrap_or(0),
        window_start: time(r.try_get("window_start")?),
        opened_at: r.try_get::<Option<i64>, _>("opened_at")?.map(time),
        probe_at: r.try_get::<Option<i64>, _>("probe_at")?.map(time),
        failed_probes: u32::try_from(r.try_get::<i32, _>("failed_probes")?).unwrap_or(0),
        probe_by: probe_by.and_then(|s| uuid::Uuid::parse_str(&s).ok()),
        last_error: r.try_get("last_error")?,
        waiting: r.try_get("waiting")?,
    })
}

/// Every breaker ([`LIST`]).
pub(super) async fn list(b: &MySqlBackend, counts: bool) -> Result<Vec<BreakerRow>> {
    let rows = sqlx::query(LIST).bind(counts).fetch_all(&b.pool).await?;
    Ok(rows.iter().map(row).collect::<Result<_, _>>()?)
}

/// Changes a breaker under its lock ([`LOCK`], then [`UPSERT`] or [`DELETE`] and [`UNPARK`]).
pub(super) async fn update(
    b: &MySqlBackend,
    handler: &str,
    change: Transition<'_>,
) -> Result<(Option<BreakerRow>, Option<BreakerRow>)> {
    retrying("breaker", || async {
        let mut tx = b.begin().await?;
        let now: i64 = sqlx::query_scalar(NOW).fetch_one(&mut *tx).await?;
        let before = match sqlx::query(LOCK)
            .bind(handler)
            .fetch_optional(&mut *tx)
            .await?
        {
            Some(r) => Some(row(&r)?),
            None => None,
        };
        let after = change(before.as_ref(), time(now));
        if after == before {
            tx.commit().await?;
            return Ok((before, after));
        }
        match &after {
            Some(a) => {
                sqlx::query(UPSERT)
                    .bind(handler)
                    .bind(a.open)
                    .bind(i32::try_from(a.failures).unwrap_or(i32::MAX))
                    .bind(i32::try_from(a.repeats).unwrap_or(i32::MAX))
                    .bind(a.window_start.timestamp_millis())
                    .bind(a.opened_at.map(|t| t.timestamp_millis()))
                    .bind(a.probe_at.map(|t| t.timestamp_millis()))
                    .bind(i32::try_from(a.failed_probes).unwrap_or(i32::MAX))
                    .bind(a.probe_by.map(|u| u.to_string()))
                    .bind(&a.last_error)
                    .execute(&mut *tx)
                    .await?;
            }
            None => {
                sqlx::query(DELETE).bind(handler).execute(&mut *tx).await?;
            }
        }
        let was_open = before.as_ref().is_some_and(|b| b.open);
        if was_open && !after.as_ref().is_some_and(|a| a.open) {
            sqlx::query(UNPARK)
                .bind(handler)
                .bind(handler)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok((before, after))
    })
    .await
}

/// Claims one parked message of the handler ([`PICK_PARKED`], [`TAKE_PARKED`]), topic by
/// topic.
pub(super) async fn claim_parked(
    b: &MySqlBackend,
    handler: &str,
    p: &ClaimParams<'_>,
) -> Result<Option<ClaimedMessage>> {
    retrying("claim a parked message", || async {
        let mut tx = b.begin().await?;
        for (topic, version) in p.topics.iter().zip(p.versions) {
            let Some(r) = sqlx::query(PICK_PARKED)
                .bind(handler)
                .bind(*topic)
                .bind(*version)
                .fetch_optional(&mut *tx)
                .await?
            else {
                continue;
            };
            let msg = super::claim::claimed(&r, p.claim_token)?;
            sqlx::query(TAKE_PARKED)
                .bind(p.claim_token)
                .bind(p.worker)
                .bind(ms(p.lease))
                .bind(msg.id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Ok(Some(msg));
        }
        tx.commit().await?;
        Ok(None)
    })
    .await
}
