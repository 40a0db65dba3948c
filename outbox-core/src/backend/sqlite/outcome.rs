//! What became of claimed messages: done (deleted and counted), failed (retry or dead letter),
//! handed back, lease renewed.
//!
//! Every write is fenced: it touches a message only while its claim token is the one the
//! worker claimed it under. The writes of more than one statement run in one `BEGIN
//! IMMEDIATE` transaction, which takes the write lock first.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::{fence_pairs, ms, uuids};
use crate::backend::{Done, Failure, Fence};
use crate::clock::now_ms;
use crate::error::Result;

/// Deletes the done messages of `?1`, a JSON array of (id, claim token) pairs, each only under
/// its claim token; returns the topic of each.
const DONE: &str = "DELETE FROM outbox_messages WHERE seq IN ( \
         SELECT m.seq FROM json_each(?1) AS d \
         JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1) \
     RETURNING topic";

/// Copies the done messages of `?1` (as [`DONE`] takes them) of retained topics into the
/// event log, delivered at `?2`. Whether a topic is retained is read from `outbox_retention`,
/// as every worker recorded it, not from what this worker was built with.
const DONE_KEEP: &str = "INSERT INTO outbox_events (id, topic, payload, version, idempotency_key, \
         ordering_key, created_at, delivered_at, traceparent, tracestate, seq) \
     SELECT m.id, m.topic, m.payload, m.version, m.idempotency_key, m.ordering_key, m.created_at, \
            ?2, m.traceparent, m.tracestate, CASE WHEN m.ordering_key IS NULL THEN 0 ELSE m.seq END \
     FROM json_each(?1) AS d \
     JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1 \
     JOIN outbox_retention AS r ON r.topic = m.topic \
     ON CONFLICT (id) DO NOTHING";

/// Adds `?4` done messages of topic `?1` to the count of minute `?2` and worker `?3`.
const DONE_COUNT: &str =
    "INSERT INTO outbox_done_counts (topic, minute, worker, done) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (topic, minute, worker) DO UPDATE SET done = done + excluded.done";

/// Deletes the per-handler progress of the messages `?1` (a JSON array).
const DONE_PROGRESS: &str =
    "DELETE FROM outbox_deliveries WHERE message_id IN (SELECT value FROM json_each(?1))";

/// Message `?1` under claim token `?2` back to pending at `?3`, with its error `?4`.
const FAILED_RETRY: &str = "UPDATE outbox_messages \
     SET available_at = ?3, locked_until = NULL, claim_token = NULL, last_error = ?4 \
     WHERE id = ?1 AND claim_token = ?2";

/// Message `?1` under claim token `?2` copied to the dead letters with its error `?3`, dead
/// at `?4`; [`FAILED_DEAD_DELETE`] then deletes it from the live table.
const FAILED_DEAD: &str =
    "INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, dead_at, \
                              ordering_key, releases_key, traceparent, tracestate, version, seq) \
     SELECT id, topic, payload, idempotency_key, attempts, ?3, created_at, ?4, ordering_key, releases_key, \
            traceparent, tracestate, version, seq \
     FROM outbox_messages WHERE id = ?1 AND claim_token = ?2";

/// Deletes message `?1` under claim token `?2`.
const FAILED_DEAD_DELETE: &str = "DELETE FROM outbox_messages WHERE id = ?1 AND claim_token = ?2";

/// Records that handler `?2` succeeded for message `?1` at `?3`.
const FAILED_SUCCEEDED: &str =
    "INSERT INTO outbox_deliveries (message_id, handler, completed_at) VALUES (?1, ?2, ?3) \
     ON CONFLICT DO NOTHING";

/// The messages of `?1`, a JSON array of (id, claim token) pairs, back to pending, ready at
/// once, their attempt not counted.
const HAND_BACK: &str = "UPDATE outbox_messages \
     SET attempts = max(attempts - 1, 0), locked_until = NULL, claim_token = NULL \
     WHERE seq IN ( \
         SELECT m.seq FROM json_each(?1) AS d \
         JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1)";

/// Message `?1` under claim token `?2` parked for the handler `?3`, paused or its breaker open:
/// back to pending, its attempt not counted, its `available_at` now (last in a breaker's probe
/// order); when the handler's pause is gone or past its end
/// at `?4` and its breaker is not open, only given back, not parked. The first park notes it in `last_error`, which tells the next claim
/// to read the message's per-handler progress (its attempts may be back at 0).
const PARK: &str = "UPDATE outbox_messages \
     SET attempts = max(attempts - 1, 0), locked_until = NULL, claim_token = NULL, \
         available_at = ?4, \
         parked_by = CASE WHEN EXISTS (SELECT 1 FROM outbox_pauses \
                                       WHERE scope = 'handler' AND name = ?3 \
                                         AND (until IS NULL OR until > ?4)) \
                              OR EXISTS (SELECT 1 FROM outbox_breakers \
                                         WHERE handler = ?3 AND open) THEN ?3 END, \
         last_error = coalesce(last_error, 'parked for handler `' || ?3 || '` (paused, or its breaker open)') \
     WHERE id = ?1 AND claim_token = ?2";

/// The leases of the messages of `?1`, a JSON array of (id, claim token) pairs, extended to
/// `?2` milliseconds from when the statement runs.
const RENEW: &str = concat!(
    "UPDATE outbox_messages SET locked_until = ",
    db_now_ms!(),
    " + ?2 \
     WHERE seq IN ( \
         SELECT m.seq FROM json_each(?1) AS d \
         JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1)"
);

/// Keeps the done messages of retained topics ([`DONE_KEEP`]), deletes them ([`DONE`]),
/// counts them per topic ([`DONE_COUNT`]) and deletes their
/// progress ([`DONE_PROGRESS`]); returns how many were deleted.
pub(super) async fn mark_done(pool: &SqlitePool, worker: Uuid, done: &[Done]) -> Result<u64> {
    let now = now_ms();
    let fences: Vec<Fence> = done.iter().map(|d| d.fence).collect();
    let progress: Vec<Uuid> = done
        .iter()
        .filter(|d| d.had_attempts)
        .map(|d| d.fence.id)
        .collect();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let pairs = fence_pairs(&fences);
    sqlx::query(DONE_KEEP)
        .bind(&pairs)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    let topics: Vec<(String,)> = sqlx::query_as(DONE).bind(pairs).fetch_all(&mut *tx).await?;
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for (t,) in &topics {
        *counts.entry(t.clone()).or_default() += 1;
    }
    for (topic, n) in counts {
        sqlx::query(DONE_COUNT)
            .bind(topic)
            .bind(now - now.rem_euclid(60_000))
            .bind(worker.to_string())
            .bind(n)
            .execute(&mut *tx)
            .await?;
    }
    if !progress.is_empty() {
        sqlx::query(DONE_PROGRESS)
            .bind(uuids(&progress))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(topics.len() as u64)
}

/// Writes one failed attempt ([`FAILED_RETRY`], or [`FAILED_DEAD`] and
/// [`FAILED_DEAD_DELETE`]) and the handlers that succeeded ([`FAILED_SUCCEEDED`]); false when
/// fenced out.
pub(super) async fn mark_failed(pool: &SqlitePool, f: &Failure<'_>) -> Result<bool> {
    let now = now_ms();
    let id = f.fence.id.to_string();
    let token = f.fence.claim_token.to_string();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let current = match f.retry_in {
        Some(delay) => {
            sqlx::query(FAILED_RETRY)
                .bind(&id)
                .bind(&token)
                .bind(now.saturating_add(ms(delay)))
                .bind(f.error)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                > 0
        }
        None => {
            sqlx::query(FAILED_DEAD)
                .bind(&id)
                .bind(&token)
                .bind(f.error)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            sqlx::query(FAILED_DEAD_DELETE)
                .bind(&id)
                .bind(&token)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                > 0
        }
    };
    // A fenced-out attempt (its claim was taken over) records nothing, its handlers either.
    let succeeded: &[&str] = if current { f.succeeded } else { &[] };
    for handler in succeeded {
        sqlx::query(FAILED_SUCCEEDED)
            .bind(&id)
            .bind(*handler)
            .bind(now)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(current)
}

/// Gives claimed messages back ([`HAND_BACK`]); returns how many.
pub(super) async fn hand_back(pool: &SqlitePool, fences: &[Fence]) -> Result<u64> {
    let r = sqlx::query(HAND_BACK)
        .bind(fence_pairs(fences))
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

/// Parks a claimed message for a paused handler ([`PARK`]) and records the handlers that
/// succeeded, in one transaction; false when fenced out.
pub(super) async fn park(
    pool: &SqlitePool,
    fence: Fence,
    handler: &str,
    succeeded: &[&str],
) -> Result<bool> {
    let now = now_ms();
    let id = fence.id.to_string();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    let current = sqlx::query(PARK)
        .bind(&id)
        .bind(fence.claim_token.to_string())
        .bind(handler)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        > 0;
    if current {
        for h in succeeded {
            sqlx::query(FAILED_SUCCEEDED)
                .bind(&id)
                .bind(*h)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    Ok(current)
}

/// Extends leases ([`RENEW`]); returns how many.
pub(super) async fn renew(pool: &SqlitePool, fences: &[Fence], lease: Duration) -> Result<u64> {
    let r = sqlx::query(RENEW)
        .bind(fence_pairs(fences))
        .bind(ms(lease))
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}
