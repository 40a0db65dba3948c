//! Pauses of handlers and topics (`outbox_pauses`), and the messages parked for a paused
//! handler (`outbox_messages.parked_by`).
//!
//! SQLite runs one write transaction at a time: a resume (delete the pause, unpark its
//! messages, in one `BEGIN IMMEDIATE` transaction) and a park (one statement that reads the
//! pause) never interleave, so no message is left parked for a handler that is not paused.
//! Times are this process's clock, in milliseconds, as every SQLite time of the outbox.

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;

use super::{ms, time};
use crate::clock::now_ms;
use crate::error::Result;
use crate::pause::{PauseInfo, PauseTarget, PauseWrite};

/// Pauses `?1` (scope) `?2` (name) at `?3` until `?4` (NULL: until resumed), by `?5` for
/// reason `?6`. A pause still in force keeps its start.
const SET: &str =
    "INSERT INTO outbox_pauses AS p (scope, name, paused_at, until, paused_by, reason) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
     ON CONFLICT (scope, name) DO UPDATE SET \
         paused_at = CASE WHEN p.until IS NULL OR p.until > ?3 THEN p.paused_at ELSE ?3 END, \
         until = excluded.until, paused_by = excluded.paused_by, reason = excluded.reason \
     RETURNING scope, name, paused_at, until, paused_by, reason, 1 AS active, 0 AS waiting";

/// Deletes the pause of `?1` (scope) `?2` (name); returns it.
const DELETE: &str = "DELETE FROM outbox_pauses WHERE scope = ?1 AND name = ?2 RETURNING name";

/// Makes the messages parked for the handler `?1` claimable again.
const UNPARK: &str = "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = ?1";

/// Every pause at `?2`; with `?1`, how many messages wait on each (a handler's parked
/// messages, a topic's messages not running).
const LIST: &str = "SELECT scope, name, paused_at, until, paused_by, reason, \
         (until IS NULL OR until > ?2) AS active, \
         CASE WHEN NOT ?1 THEN 0 \
              WHEN scope = 'handler' THEN \
                  (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = p.name) \
              ELSE (SELECT count(*) FROM outbox_messages m WHERE m.topic = p.name \
                      AND (m.locked_until IS NULL OR m.locked_until < ?2)) END AS waiting \
     FROM outbox_pauses p ORDER BY scope, name";

/// Deletes the pauses whose end has passed at `?1`; returns their scope and name.
const EXPIRE: &str = "DELETE FROM outbox_pauses WHERE until <= ?1 RETURNING scope, name";

/// Every (topic, handler) pair a worker has run.
const KNOWN: &str = "SELECT topic, handler FROM outbox_handlers ORDER BY topic, handler";

fn info(r: &SqliteRow) -> Result<Option<PauseInfo>> {
    let scope: String = r.try_get("scope")?;
    let Some(target) = PauseTarget::from_row(&scope, r.try_get("name")?) else {
        return Ok(None);
    };
    Ok(Some(PauseInfo {
        target,
        paused_at: time(r.try_get("paused_at")?),
        until: r.try_get::<Option<i64>, _>("until")?.map(time),
        paused_by: r.try_get("paused_by")?,
        reason: r.try_get("reason")?,
        active: r.try_get("active")?,
        waiting: r.try_get("waiting")?,
    }))
}

/// Pauses a target ([`SET`]).
pub(super) async fn set(pool: &SqlitePool, p: &PauseWrite<'_>) -> Result<PauseInfo> {
    let now = now_ms();
    let row = sqlx::query(SET)
        .bind(p.target.scope())
        .bind(p.target.name())
        .bind(now)
        .bind(p.until.map(|d| now.saturating_add(ms(d))))
        .bind(p.paused_by)
        .bind(p.reason)
        .fetch_one(pool)
        .await?;
    info(&row)?.ok_or_else(|| crate::error::Error::InvalidArgument("unknown pause scope".into()))
}

/// Lifts a pause ([`DELETE`], then [`UNPARK`] for a handler), in one transaction.
pub(super) async fn remove(pool: &SqlitePool, target: &PauseTarget) -> Result<Option<u64>> {
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let gone = sqlx::query(DELETE)
        .bind(target.scope())
        .bind(target.name())
        .fetch_optional(&mut *tx)
        .await?
        .is_some();
    let unparked = match target {
        PauseTarget::Handler(name) => sqlx::query(UNPARK)
            .bind(name)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        PauseTarget::Topic(_) => 0,
    };
    tx.commit().await?;
    Ok((gone || unparked > 0).then_some(unparked))
}

/// Every pause ([`LIST`]).
pub(super) async fn list(pool: &SqlitePool, counts: bool) -> Result<Vec<PauseInfo>> {
    let rows = sqlx::query(LIST)
        .bind(counts)
        .bind(now_ms())
        .fetch_all(pool)
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.extend(info(r)?);
    }
    Ok(out)
}

/// Deletes expired pauses and unparks their handlers' messages ([`EXPIRE`], [`UNPARK`]).
pub(super) async fn expire(pool: &SqlitePool) -> Result<u64> {
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let gone: Vec<(String, String)> = sqlx::query_as(EXPIRE)
        .bind(now_ms())
        .fetch_all(&mut *tx)
        .await?;
    for (_, name) in gone.iter().filter(|(scope, _)| scope == "handler") {
        sqlx::query(UNPARK).bind(name).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(u64::try_from(gone.len()).unwrap_or(u64::MAX))
}

/// Every (topic, handler) pair run ([`KNOWN`]).
pub(super) async fn known(pool: &SqlitePool) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(KNOWN).fetch_all(pool).await?)
}
