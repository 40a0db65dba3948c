//! Pauses of handlers and topics (`outbox_pauses`), and the messages parked for a paused
//! handler (`outbox_messages.parked_by`).
//!
//! A resume (or an expiry) deletes the pause row first and unparks the handler's messages in
//! a second statement of the same transaction; the park (`outcome.rs`) reads the pause row
//! `FOR SHARE`. So a park that raced a resume either ran first (the delete waited for it, and
//! the unpark, a statement with a snapshot of its own, sees the parked row) or after it (it
//! finds no pause and only gives the message back): no message is left parked for a handler
//! that is not paused.

use sqlx::postgres::PgPool;
use sqlx::Row;

use super::secs;
use crate::error::Result;
use crate::pause::{PauseInfo, PauseTarget, PauseWrite};

/// Pauses `$1` (scope) `$2` (name) until `$3` seconds from now (NULL: until resumed), by `$4`
/// for reason `$5`. A pause still in force keeps its start.
const SET: &str = "INSERT INTO outbox_pauses AS p (scope, name, until, paused_by, reason) \
     VALUES ($1, $2, now() + make_interval(secs => $3::float8), $4, $5) \
     ON CONFLICT (scope, name) DO UPDATE SET \
         paused_at = CASE WHEN p.until IS NULL OR p.until > now() THEN p.paused_at ELSE now() END, \
         until = excluded.until, paused_by = excluded.paused_by, reason = excluded.reason \
     RETURNING scope, name, paused_at, until, paused_by, reason, true AS active, 0::int8 AS waiting";

/// Deletes the pause of `$1` (scope) `$2` (name); returns it.
const DELETE: &str = "DELETE FROM outbox_pauses WHERE scope = $1 AND name = $2 RETURNING name";

/// Makes the messages parked for the handlers `$1` claimable again.
const UNPARK: &str =
    "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = ANY($1::text[])";

/// Every pause; with `$1`, how many messages wait on each (a handler's parked messages, a
/// topic's messages not running).
const LIST: &str = "SELECT scope, name, paused_at, until, paused_by, reason, \
         (until IS NULL OR until > now()) AS active, \
         CASE WHEN NOT $1 THEN 0::int8 \
              WHEN scope = 'handler' THEN \
                  (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = p.name) \
              ELSE (SELECT count(*) FROM outbox_messages m WHERE m.topic = p.name \
                      AND (m.locked_until IS NULL OR m.locked_until < now())) END AS waiting \
     FROM outbox_pauses p ORDER BY scope, name";

/// Deletes the pauses whose end has passed; returns their scope and name.
const EXPIRE: &str = "DELETE FROM outbox_pauses WHERE until <= now() RETURNING scope, name";

/// Every (topic, handler) pair a worker has run.
const KNOWN: &str = "SELECT topic, handler FROM outbox_handlers ORDER BY topic, handler";

fn info(r: &sqlx::postgres::PgRow) -> Result<Option<PauseInfo>> {
    let scope: String = r.try_get("scope")?;
    let Some(target) = PauseTarget::from_row(&scope, r.try_get("name")?) else {
        return Ok(None);
    };
    Ok(Some(PauseInfo {
        target,
        paused_at: r.try_get("paused_at")?,
        until: r.try_get("until")?,
        paused_by: r.try_get("paused_by")?,
        reason: r.try_get("reason")?,
        active: r.try_get("active")?,
        waiting: r.try_get("waiting")?,
    }))
}

/// Pauses a target ([`SET`]).
pub(super) async fn set(pool: &PgPool, p: &PauseWrite<'_>) -> Result<PauseInfo> {
    let row = sqlx::query(SET)
        .bind(p.target.scope())
        .bind(p.target.name())
        .bind(p.until.map(secs))
        .bind(p.paused_by)
        .bind(p.reason)
        .fetch_one(pool)
        .await?;
    info(&row)?.ok_or_else(|| crate::error::Error::InvalidArgument("unknown pause scope".into()))
}

/// Lifts a pause ([`DELETE`], then [`UNPARK`] for a handler).
pub(super) async fn remove(pool: &PgPool, target: &PauseTarget) -> Result<Option<u64>> {
    let mut tx = pool.begin().await?;
    let gone = sqlx::query(DELETE)
        .bind(target.scope())
        .bind(target.name())
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    let unparked = match target {
        PauseTarget::Handler(name) => sqlx::query(UNPARK)
            .bind(vec![name.as_str()])
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        PauseTarget::Topic(_) => 0,
    };
    tx.commit().await?;
    // Messages parked for a handler whose pause row is gone are unparked all the same.
    Ok((gone || unparked > 0).then_some(unparked))
}

/// Every pause ([`LIST`]).
pub(super) async fn list(pool: &PgPool, counts: bool) -> Result<Vec<PauseInfo>> {
    let rows = sqlx::query(LIST).bind(counts).fetch_all(pool).await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.extend(info(r)?);
    }
    Ok(out)
}

/// Deletes expired pauses and unparks their handlers' messages ([`EXPIRE`], [`UNPARK`]).
pub(super) async fn expire(pool: &PgPool) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let gone: Vec<(String, String)> = sqlx::query_as(EXPIRE).fetch_all(&mut *tx).await?;
    let handlers: Vec<&str> = gone
        .iter()
        .filter(|(scope, _)| scope == "handler")
        .map(|(_, name)| name.as_str())
        .collect();
    if !handlers.is_empty() {
        sqlx::query(UNPARK).bind(handlers).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(u64::try_from(gone.len()).unwrap_or(u64::MAX))
}

/// Every (topic, handler) pair run ([`KNOWN`]).
pub(super) async fn known(pool: &PgPool) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(KNOWN).fetch_all(pool).await?)
}
