//! The circuit breakers of handlers (`outbox_breakers`), and the claim of the message a
//! breaker's probe runs.
//!
//! SQLite runs one write transaction at a time: a change of a breaker (read, write, and for a
//! close unpark its messages, in one `BEGIN IMMEDIATE` transaction) and a park (one statement
//! that reads the breaker) never interleave, so no message is left parked for a handler whose
//! breaker is closed. Times are this process's clock, in milliseconds, as for pauses.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;

use super::{ms, time};
use crate::backend::{ClaimParams, ClaimedMessage};
use crate::breaker::{BreakerRow, Transition};
use crate::clock::now_ms;
use crate::error::Result;

/// Every breaker; with `?1`, how many messages are parked for each open one.
const LIST: &str =
    "SELECT handler, open, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
         probe_by, last_error, \
         CASE WHEN ?1 AND open THEN \
             (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = b.handler) \
         ELSE 0 END AS waiting \
     FROM outbox_breakers b ORDER BY handler";

/// The breaker of `?1`.
const GET: &str =
    "SELECT handler, open, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
         probe_by, last_error, 0 AS waiting \
     FROM outbox_breakers WHERE handler = ?1";

/// Writes the breaker row of `?1`.
const UPSERT: &str = "INSERT INTO outbox_breakers (handler, open, failures, repeats, window_start, opened_at, \
         probe_at, failed_probes, probe_by, last_error) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
     ON CONFLICT (handler) DO UPDATE SET open = excluded.open, failures = excluded.failures, repeats = excluded.repeats, \
         window_start = excluded.window_start, opened_at = excluded.opened_at, \
         probe_at = excluded.probe_at, failed_probes = excluded.failed_probes, \
         probe_by = excluded.probe_by, last_error = excluded.last_error";

/// Deletes the breaker row of `?1`.
const DELETE: &str = "DELETE FROM outbox_breakers WHERE handler = ?1";

/// Makes the messages parked for `?1` claimable, unless the handler is paused at `?2`.
const UNPARK: &str = "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = ?1 \
     AND NOT EXISTS (SELECT 1 FROM outbox_pauses WHERE scope = 'handler' AND name = ?1 \
                     AND (until IS NULL OR until > ?2))";

/// One message parked for `?3` of the topic `?5` at a version up to `?6`, claimed under claim
/// token `?1` by worker `?2` for a lease of `?4` milliseconds, no longer parked: the one parked
/// longest ago (see the PostgreSQL backend's `CLAIM_PARKED`).
const CLAIM_PARKED: &str = concat!(
    "UPDATE outbox_messages \
     SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, parked_by = NULL, \
         locked_until = ",
    db_now_ms!(),
    " + ?4 \
     WHERE seq IN ( \
         SELECT seq FROM outbox_messages \
         WHERE parked_by = ?3 AND topic = ?5 AND version <= ?6 ORDER BY available_at LIMIT 1) \
     RETURNING id, topic, payload, version, idempotency_key, attempts, created_at, last_error, \
               ordering_key, seq, releases_key, traceparent, tracestate"
);

fn row(r: &SqliteRow) -> Result<BreakerRow> {
    let probe_by: Option<String> = r.try_get("probe_by")?;
    Ok(BreakerRow {
        handler: r.try_get("handler")?,
        open: r.try_get("open")?,
        failures: u32::try_from(r.try_get::<i64, _>("failures")?).unwrap_or(0),
        repeats: u32::try_from(r.try_get::<i64, _>("repeats")?).unwrap_or(0),
        window_start: time(r.try_get("window_start")?),
        opened_at: r.try_get::<Option<i64>, _>("opened_at")?.map(time),
        probe_at: r.try_get::<Option<i64>, _>("probe_at")?.map(time),
        failed_probes: u32::try_from(r.try_get::<i64, _>("failed_probes")?).unwrap_or(0),
        probe_by: probe_by.and_then(|s| uuid::Uuid::parse_str(&s).ok()),
        last_error: r.try_get("last_error")?,
        waiting: r.try_get("waiting")?,
    })
}

/// Every breaker ([`LIST`]).
pub(super) async fn list(pool: &SqlitePool, counts: bool) -> Result<Vec<BreakerRow>> {
    let rows = sqlx::query(LIST).bind(counts).fetch_all(pool).await?;
    rows.iter().map(row).collect()
}

/// Changes a breaker ([`GET`], then [`UPSERT`] or [`DELETE`] and [`UNPARK`]) in one write
/// transaction.
pub(super) async fn update(
    pool: &SqlitePool,
    handler: &str,
    change: Transition<'_>,
) -> Result<(Option<BreakerRow>, Option<BreakerRow>)> {
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let now = now_ms();
    let before = match sqlx::query(GET)
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
                .bind(i64::from(a.failures))
                .bind(i64::from(a.repeats))
                .bind(a.window_start.timestamp_millis())
                .bind(a.opened_at.map(|t| t.timestamp_millis()))
                .bind(a.probe_at.map(|t| t.timestamp_millis()))
                .bind(i64::from(a.failed_probes))
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
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok((before, after))
}

/// Claims one parked message of the handler ([`CLAIM_PARKED`]), topic by topic.
pub(super) async fn claim_parked(
    pool: &SqlitePool,
    handler: &str,
    p: &ClaimParams<'_>,
) -> Result<Option<ClaimedMessage>> {
    let token = p.claim_token.to_string();
    let worker = p.worker.to_string();
    for (topic, version) in p.topics.iter().zip(p.versions) {
        let r = sqlx::query(CLAIM_PARKED)
            .bind(&token)
            .bind(&worker)
            .bind(handler)
            .bind(ms(p.lease))
            .bind(*topic)
            .bind(*version)
            .fetch_optional(pool)
            .await?;
        if let Some(r) = r {
            return Ok(Some(super::claim::claimed(&r, p.claim_token)?));
        }
    }
    Ok(None)
}
