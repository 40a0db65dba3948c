//! Pauses of handlers and topics (`outbox_pauses`), and the messages parked for a paused
//! handler (`outbox_messages.parked_by`).
//!
//! A resume (or an expiry) deletes the pause row, then unparks the handler's messages, in one
//! READ COMMITTED transaction; the park (`outcome.rs`) reads the pause row `LOCK IN SHARE
//! MODE`. So a park that raced a resume either ran first (the delete waited for its commit,
//! and the unpark, which reads the latest committed rows, sees the parked one) or after it (it
//! finds no pause and only gives the message back): no message is left parked for a handler
//! that is not paused. Times are the server's clock in milliseconds.

use sqlx::mysql::MySqlRow;
use sqlx::Row;

use super::{ms, now_ms, retrying, time, MySqlBackend};
use crate::error::Result;
use crate::pause::{PauseInfo, PauseTarget, PauseWrite};

/// Pauses `?` (scope) `?` (name) until `?` ms from now (NULL: until resumed), by `?` for
/// reason `?`. A pause still in force keeps its start (`paused_at` is set before `until`:
/// MariaDB and MySQL assign left to right, and the test reads the old end).
const SET: &str = concat!(
    "INSERT INTO outbox_pauses (scope, name, paused_at, `until`, paused_by, reason) VALUES (?, ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + ?, ?, ?) ON DUPLICATE KEY UPDATE \
     paused_at = IF(`until` IS NULL OR `until` > ",
    now_ms!(),
    ", paused_at, VALUES(paused_at)), \
     `until` = VALUES(`until`), paused_by = VALUES(paused_by), reason = VALUES(reason)"
);

/// Every pause (`?` 1 with, 0 without the counts of the messages waiting on each: a
/// handler's parked messages, a topic's messages not running); `?` the scope and name of one,
/// or NULL for all.
const LIST: &str = concat!(
    "SELECT scope, name, paused_at, `until`, paused_by, reason, \
         CAST(`until` IS NULL OR `until` > ",
    now_ms!(),
    " AS SIGNED) AS active, \
         CAST(CASE WHEN ? = 0 THEN 0 \
              WHEN scope = 'handler' THEN \
                  (SELECT count(*) FROM outbox_messages m WHERE m.parked_by = p.name) \
              ELSE (SELECT count(*) FROM outbox_messages m WHERE m.topic = p.name \
                      AND (m.locked_until IS NULL OR m.locked_until < ",
    now_ms!(),
    ")) END AS SIGNED) AS waiting \
     FROM outbox_pauses p WHERE (? IS NULL OR (scope = ? AND name = ?)) ORDER BY scope, name"
);

/// Deletes the pause of `?` (scope) `?` (name).
const DELETE: &str = "DELETE FROM outbox_pauses WHERE scope = ? AND name = ?";

/// Makes the messages parked for the handler `?` claimable again.
const UNPARK: &str = "UPDATE outbox_messages SET parked_by = NULL WHERE parked_by = ?";

/// The handlers whose pauses ended, locked for the delete that follows.
const EXPIRED: &str = concat!(
    "SELECT scope, name FROM outbox_pauses WHERE `until` <= ",
    now_ms!(),
    " FOR UPDATE"
);

/// Every (topic, handler) pair a worker has run.
const KNOWN: &str = "SELECT topic, handler FROM outbox_handlers ORDER BY topic, handler";

fn info(r: &MySqlRow) -> Result<Option<PauseInfo>> {
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
        active: r.try_get::<i64, _>("active")? != 0,
        waiting: r.try_get("waiting")?,
    }))
}

/// The pauses [`LIST`] reads: all, or the one of `target`.
async fn read(
    b: &MySqlBackend,
    counts: bool,
    target: Option<&PauseTarget>,
) -> Result<Vec<PauseInfo>> {
    let rows = sqlx::query(LIST)
        .bind(i64::from(counts))
        .bind(target.map(PauseTarget::scope))
        .bind(target.map(PauseTarget::scope))
        .bind(target.map(PauseTarget::name))
        .fetch_all(&b.pool)
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        out.extend(info(r)?);
    }
    Ok(out)
}

/// Pauses a target ([`SET`]) and reads it back.
pub(super) async fn set(b: &MySqlBackend, p: &PauseWrite<'_>) -> Result<PauseInfo> {
    sqlx::query(SET)
        .bind(p.target.scope())
        .bind(p.target.name())
        .bind(p.until.map(ms))
        .bind(p.paused_by)
        .bind(p.reason)
        .execute(&b.pool)
        .await?;
    read(b, false, Some(p.target))
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| {
            crate::error::Error::InvalidArgument(format!(
                "the pause of {} vanished once written (resumed at the same moment?)",
                p.target
            ))
        })
}

/// Lifts a pause ([`DELETE`], then [`UNPARK`] for a handler), in one transaction.
pub(super) async fn remove(b: &MySqlBackend, target: &PauseTarget) -> Result<Option<u64>> {
    retrying("resume", || async {
        let mut tx = b.begin().await?;
        let gone = sqlx::query(DELETE)
            .bind(target.scope())
            .bind(target.name())
            .execute(&mut *tx)
            .await?
            .rows_affected()
            > 0;
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
    })
    .await
}

/// Every pause ([`LIST`]).
pub(super) async fn list(b: &MySqlBackend, counts: bool) -> Result<Vec<PauseInfo>> {
    read(b, counts, None).await
}

/// Deletes expired pauses and unparks their handlers' messages ([`EXPIRED`], [`DELETE`],
/// [`UNPARK`]), in one transaction.
pub(super) async fn expire(b: &MySqlBackend) -> Result<u64> {
    retrying("expire pauses", || async {
        let mut tx = b.begin().await?;
        let gone: Vec<(String, String)> = sqlx::query_as(EXPIRED).fetch_all(&mut *tx).await?;
        for (scope, name) in &gone {
            sqlx::query(DELETE)
                .bind(scope)
                .bind(name)
                .execute(&mut *tx)
                .await?;
            if scope == "handler" {
                sqlx::query(UNPARK).bind(name).execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        Ok(u64::try_from(gone.len()).unwrap_or(u64::MAX))
    })
    .await
}

/// Every (topic, handler) pair run ([`KNOWN`]).
pub(super) async fn known(b: &MySqlBackend) -> Result<Vec<(String, String)>> {
    Ok(sqlx::query_as(KNOWN).fetch_all(&b.pool).await?)
}
