//! The circuit breakers of handlers (`outbox_breakers`), and the claim of the message a
//! breaker's probe runs.
//!
//! A change of a breaker row reads it `FOR UPDATE` and writes what the worker's rules make of
//! it in the same transaction; the park (`outcome.rs`) reads the row `FOR SHARE`. So a close
//! (the row deleted, then the handler's messages unparked, in one transaction) and a park that
//! raced it leave no message parked for a handler whose breaker is closed, as with a resume
//! (`pause.rs`).

use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use super::secs;
use crate::backend::{ClaimParams, ClaimedMessage};
use crate::breaker::{BreakerRow, Transition};
use crate::error::Result;

/// Every breaker; with `$1`, how many messages are parked for each open one.
const LIST: &str =
    "SELECT handler, open, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
         probe_by, last_error, \
         CASE WHEN $1 AND open THEN \
             (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = b.handler) \
         ELSE 0::int8 END AS waiting \
     FROM outbox_breakers b ORDER BY handler";

/// The breaker of `$1`, locked, and the database's clock.
const LOCK: &str = "SELECT now() AS now, b.* FROM (SELECT 1) AS one \
     LEFT JOIN (SELECT handler, open, failures, repeats, window_start, opened_at, probe_at, failed_probes, \
                       probe_by, last_error, 0::int8 AS waiting \
                FROM outbox_breakers WHERE handler = $1 FOR UPDATE) AS b ON true";

/// Writes the breaker row of `$1`.
const UPSERT: &str = "INSERT INTO outbox_breakers AS b (handler, open, failures, repeats, window_start, opened_at, \
         probe_at, failed_probes, probe_by, last_error) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
     ON CONFLICT (handler) DO UPDATE SET open = excluded.open, failures = excluded.failures, repeats = excluded.repeats, \
         window_start = excluded.window_start, opened_at = excluded.opened_at, \
         probe_at = excluded.probe_at, failed_probes = excluded.failed_probes, \
         probe_by = excluded.probe_by, last_error = excluded.last_error";

/// Deletes the breaker row of `$1`.
const DELETE: &str = "DELETE FROM outbox_breakers WHERE handler = $1";

/// Makes the messages parked for `$1` claimable, unless the handler is paused.
const UNPARK: &str = "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = $1 \
     AND NOT EXISTS (SELECT 1 FROM outbox_pauses WHERE scope = 'handler' AND name = $1 \
                     AND (until IS NULL OR until > now()))";

/// One message parked for `$1`, of the topics `$2` at versions up to `$6`, claimed under claim
/// token `$3` by worker `$4` for a lease of `$5` seconds, no longer parked: the one parked
/// longest ago, so that a message whose probe failed (parked again) is probed last, and a
/// poison message among the parked cannot hold the breaker open.
const CLAIM_PARKED: &str = "WITH picked AS ( \
        SELECT m.ctid FROM outbox_messages m \
        JOIN unnest($2::text[], $6::int4[]) AS t(topic, max_version) ON t.topic = m.topic \
        WHERE m.parked_by = $1 AND m.version <= t.max_version \
        ORDER BY m.available_at LIMIT 1 FOR UPDATE OF m SKIP LOCKED \
     ) \
     UPDATE outbox_messages m \
     SET attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, parked_by = NULL, \
         locked_until = now() + make_interval(secs => $5) \
     WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) \
     RETURNING m.id, m.topic, m.payload::text AS payload, m.version, m.idempotency_key, \
               m.attempts, m.created_at, m.last_error, m.ordering_key, m.seq, m.releases_key, \
               m.traceparent, m.tracestate";

fn row(r: &PgRow) -> Result<Option<BreakerRow>> {
    let Some(handler) = r.try_get::<Option<String>, _>("handler")? else {
        return Ok(None);
    };
    Ok(Some(BreakerRow {
        handler,
        open: r.try_get("open")?,
        failures: u32::try_from(r.try_get::<i32, _>("failures")?).unwrap_or(0),
        repeats: u32::try_from(r.try_get::<i32, _>("repeats")?).unwrap_or(0),
        window_start: r.try_get("window_start")?,
        opened_at: r.try_get("opened_at")?,
        probe_at: r.try_get("probe_at")?,
        failed_probes: u32::try_from(r.try_get::<i32, _>("failed_probes")?).unwrap_or(0),
        probe_by: r.try_get("probe_by")?,
        last_error: r.try_get("last_error")?,
        waiting: r.try_get("waiting")?,
    }))
}

/// Every breaker ([`LIST`]).
pub(super) async fn list(pool: &PgPool, counts: bool) -> Result<Vec<BreakerRow>> {
    let rows = sqlx::query(LIST).bind(counts).fetch_all(pool).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.extend(row(r)?);
    }
    Ok(out)
}

/// Changes a breaker under its lock ([`LOCK`], then [`UPSERT`] or [`DELETE`] and [`UNPARK`]).
pub(super) async fn update(
    pool: &PgPool,
    handler: &str,
    change: Transition<'_>,
) -> Result<(Option<BreakerRow>, Option<BreakerRow>)> {
    // Two workers may both find no row and both insert: the upsert keeps the second's, which
    // lost one failure count at worst.
    let mut tx = pool.begin().await?;
    let r = sqlx::query(LOCK).bind(handler).fetch_one(&mut *tx).await?;
    let now: chrono::DateTime<chrono::Utc> = r.try_get("now")?;
    let before = row(&r)?;
    let after = change(before.as_ref(), now);
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
                .bind(a.window_start)
                .bind(a.opened_at)
                .bind(a.probe_at)
                .bind(i32::try_from(a.failed_probes).unwrap_or(i32::MAX))
                .bind(a.probe_by)
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
        sqlx::query(UNPARK).bind(handler).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok((before, after))
}

/// Claims one parked message of the handler ([`CLAIM_PARKED`]).
pub(super) async fn claim_parked(
    pool: &PgPool,
    handler: &str,
    p: &ClaimParams<'_>,
) -> Result<Option<ClaimedMessage>> {
    let r = sqlx::query(CLAIM_PARKED)
        .bind(handler)
        .bind(p.topics)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .bind(p.versions)
        .fetch_optional(pool)
        .await?;
    let Some(r) = r else { return Ok(None) };
    let ordered = r.try_get::<Option<String>, _>("ordering_key")?.is_some();
    Ok(Some(super::claim::claimed(&r, p.claim_token, ordered)?))
}
