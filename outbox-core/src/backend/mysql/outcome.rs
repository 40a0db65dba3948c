//! What became of claimed messages: done (deleted and counted), failed (retry or dead letter),
//! handed back, lease renewed.
//!
//! Every write is fenced: it touches a message only while its claim token is the one the
//! worker claimed it under. A write of more than one statement runs in one READ COMMITTED
//! transaction that first locks its rows by primary key (`FOR UPDATE`), so the fence it reads
//! holds until it commits; a deadlock or a lock wait timeout runs the transaction again.

use std::collections::BTreeMap;
use std::time::Duration;

use uuid::Uuid;

use super::{ms, now_ms, retrying, with_list, MySqlBackend};
use crate::backend::{Done, Failure, Fence};
use crate::error::Result;

/// The messages `{list}` locked, with their claim token and topic.
const LOCK: &str =
    "SELECT id, claim_token, topic FROM outbox_messages WHERE id IN ({list}) FOR UPDATE";

/// Copies the messages `{list}` (locked and fenced by [`LOCK`]) of retained topics into the
/// event log, delivered now. Whether a topic is retained is read from `outbox_retention`, as
/// every worker recorded it, not from what this worker was built with.
const DONE_KEEP: &str = concat!(
    "INSERT IGNORE INTO outbox_events (id, topic, payload, version, idempotency_key, \
         ordering_key, created_at, delivered_at, traceparent, tracestate, seq) \
     SELECT m.id, m.topic, m.payload, m.version, m.idempotency_key, m.ordering_key, m.created_at, ",
    now_ms!(),
    ", m.traceparent, m.tracestate, CASE WHEN m.ordering_key IS NULL THEN 0 ELSE m.seq END \
     FROM outbox_messages m JOIN outbox_retention r ON r.topic = m.topic \
     WHERE m.id IN ({list})"
);

/// Deletes the messages `{list}`.
const DONE: &str = "DELETE FROM outbox_messages WHERE id IN ({list})";

/// Deletes the per-handler progress of the messages `{list}`.
const DONE_PROGRESS: &str = "DELETE FROM outbox_deliveries WHERE message_id IN ({list})";

/// Adds `?` done messages of topic `?` to this minute's count of worker `?`: one `{row}` per
/// topic.
const DONE_COUNT: &str =
    "INSERT INTO outbox_done_counts (topic, minute, worker, done) VALUES {rows} \
     ON DUPLICATE KEY UPDATE done = done + VALUES(done)";

/// One row of [`DONE_COUNT`]: topic, worker, count.
const DONE_COUNT_ROW: &str = concat!("(?, (", now_ms!(), " DIV 60000) * 60000, ?, ?)");

/// Back to pending: due in `?` ms, with the error `?`, message `?` under claim token `?`.
const FAILED_RETRY: &str = concat!(
    "UPDATE outbox_messages SET available_at = ",
    now_ms!(),
    " + ?, locked_until = NULL, claim_token = NULL, last_error = ? \
     WHERE id = ? AND claim_token = ?"
);

/// Locks message `?` and reads its claim token: the fence of a failed attempt, held until it
/// commits, so no claim can take the message over between its statements.
const FAILED_LOCK: &str = "SELECT claim_token FROM outbox_messages WHERE id = ? FOR UPDATE";

/// Message `?` under claim token `?` copied to the dead letters with its error `?` (first),
/// dead now; [`FAILED_DEAD_DELETE`] then deletes it from the live table.
const FAILED_DEAD: &str = concat!(
    "INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, \
         created_at, dead_at, ordering_key, releases_key, traceparent, tracestate, version, seq) \
     SELECT id, topic, payload, idempotency_key, attempts, ?, created_at, ",
    now_ms!(),
    ", ordering_key, releases_key, traceparent, tracestate, version, seq \
     FROM outbox_messages WHERE id = ? AND claim_token = ?"
);

/// Deletes message `?` under claim token `?`.
const FAILED_DEAD_DELETE: &str = "DELETE FROM outbox_messages WHERE id = ? AND claim_token = ?";

/// Records that handler `?` succeeded for message `?`.
const FAILED_SUCCEEDED: &str = concat!(
    "INSERT IGNORE INTO outbox_deliveries (message_id, handler, completed_at) VALUES (?, ?, ",
    now_ms!(),
    ")"
);

/// Whether handler `?` is paused now, its pause row locked in share mode until the park
/// commits (see `pause.rs`).
const PARK_PAUSED: &str = concat!(
    "SELECT 1 FROM outbox_pauses WHERE scope = 'handler' AND name = ? \
     AND (`until` IS NULL OR `until` > ",
    now_ms!(),
    ") LOCK IN SHARE MODE"
);

/// Whether handler `?`'s breaker is open now, its row locked in share mode until the park
/// commits (see `breaker.rs`).
const PARK_BREAKER: &str =
    "SELECT 1 FROM outbox_breakers WHERE handler = ? AND `open` LOCK IN SHARE MODE";

/// Message `?` (third) under claim token `?` (fourth) parked for the paused handler `?`
/// (first; NULL when its pause ended: then only given back), its attempt not counted, its
/// `available_at` now (last in a breaker's probe order). The
/// first park notes it in `last_error` (the handler `?`, second), which tells the next claim
/// to read the message's per-handler progress (its attempts may be back at 0).
const PARK: &str = concat!(
    "UPDATE outbox_messages \
     SET attempts = GREATEST(attempts - 1, 0), locked_until = NULL, claim_token = NULL, \
         available_at = ",
    now_ms!(),
    ", parked_by = ?, \
         last_error = COALESCE(last_error, CONCAT('parked for handler `', ?, '` (paused, or its breaker open)')) \
     WHERE id = ? AND claim_token = ?"
);

/// The messages `{list}` under claim token `?` back to pending, ready at once, their attempt
/// not counted.
const HAND_BACK: &str = "UPDATE outbox_messages \
     SET attempts = GREATEST(attempts - 1, 0), locked_until = NULL, claim_token = NULL \
     WHERE claim_token = ? AND id IN ({list})";

/// The leases of the messages `{list}` under claim token `?` (second) extended by `?` ms
/// (first).
const RENEW: &str = concat!(
    "UPDATE outbox_messages SET locked_until = ",
    now_ms!(),
    " + ? WHERE claim_token = ? AND id IN ({list})"
);

/// Locks the done messages ([`LOCK`]) and keeps those still under their claim, copies those of
/// retained topics to the log ([`DONE_KEEP`]), deletes their progress ([`DONE_PROGRESS`]) and
/// them ([`DONE`]), and counts them per topic ([`DONE_COUNT`]); returns how many were deleted.
pub(super) async fn mark_done(b: &MySqlBackend, worker: Uuid, done: &[Done]) -> Result<u64> {
    if done.is_empty() {
        return Ok(0);
    }
    let mut ids: Vec<Uuid> = done.iter().map(|d| d.fence.id).collect();
    // One order for every worker's locks: two done writes never wait on each other in a ring.
    ids.sort_unstable();
    retrying("done", || async {
        let mut tx = b.begin().await?;
        let mut q = sqlx::query_as(with_list(LOCK, ids.len()));
        for id in &ids {
            q = q.bind(*id);
        }
        let locked: Vec<(Uuid, Option<Uuid>, String)> = q.fetch_all(&mut *tx).await?;
        let mut fenced: Vec<Uuid> = Vec::with_capacity(locked.len());
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for (id, token, topic) in locked {
            let current = done
                .iter()
                .any(|d| d.fence.id == id && Some(d.fence.claim_token) == token);
            if current {
                fenced.push(id);
                *counts.entry(topic).or_default() += 1;
            }
        }
        if fenced.is_empty() {
            tx.commit().await?;
            return Ok(0);
        }
        let mut q = sqlx::query(with_list(DONE_KEEP, fenced.len()));
        for id in &fenced {
            q = q.bind(*id);
        }
        q.execute(&mut *tx).await?;
        let progress: Vec<Uuid> = done
            .iter()
            .filter(|d| d.had_attempts && fenced.contains(&d.fence.id))
            .map(|d| d.fence.id)
            .collect();
        if !progress.is_empty() {
            let mut q = sqlx::query(with_list(DONE_PROGRESS, progress.len()));
            for id in &progress {
                q = q.bind(*id);
            }
            q.execute(&mut *tx).await?;
        }
        let mut q = sqlx::query(with_list(DONE, fenced.len()));
        for id in &fenced {
            q = q.bind(*id);
        }
        let deleted = q.execute(&mut *tx).await?.rows_affected();
        let rows = vec![DONE_COUNT_ROW; counts.len()].join(", ");
        let mut q = sqlx::query(sqlx::AssertSqlSafe(DONE_COUNT.replace("{rows}", &rows)));
        for (topic, n) in &counts {
            q = q.bind(topic).bind(worker).bind(*n);
        }
        q.execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(deleted)
    })
    .await
}

/// Locks the message and checks its fence ([`FAILED_LOCK`]), then writes one failed attempt
/// ([`FAILED_RETRY`], or [`FAILED_DEAD`] and [`FAILED_DEAD_DELETE`]) and the handlers that
/// succeeded ([`FAILED_SUCCEEDED`]); false when fenced out.
pub(super) async fn mark_failed(b: &MySqlBackend, f: &Failure<'_>) -> Result<bool> {
    let id = f.fence.id;
    let token = f.fence.claim_token;
    retrying("failed", || async {
        let mut tx = b.begin().await?;
        let held: Option<Option<Uuid>> = sqlx::query_scalar(FAILED_LOCK)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
        if held != Some(Some(token)) {
            // Fenced out: its claim was taken over, or the message is gone.
            tx.commit().await?;
            return Ok(false);
        }
        let current = match f.retry_in {
            Some(delay) => {
                sqlx::query(FAILED_RETRY)
                    .bind(ms(delay))
                    .bind(f.error)
                    .bind(id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected()
                    > 0
            }
            None => {
                sqlx::query(FAILED_DEAD)
                    .bind(f.error)
                    .bind(id)
                    .bind(token)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(FAILED_DEAD_DELETE)
                    .bind(id)
                    .bind(token)
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
                .bind(id)
                .bind(*handler)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(current)
    })
    .await
}

/// Parks a claimed message for a paused handler ([`PARK_PAUSED`], [`PARK`]) and records the
/// handlers that succeeded, in one transaction; false when fenced out.
pub(super) async fn park(
    b: &MySqlBackend,
    fence: Fence,
    handler: &str,
    succeeded: &[&str],
) -> Result<bool> {
    retrying("park", || async {
        let mut tx = b.begin().await?;
        let held: Option<Option<Uuid>> = sqlx::query_scalar(FAILED_LOCK)
            .bind(fence.id)
            .fetch_optional(&mut *tx)
            .await?;
        if held != Some(Some(fence.claim_token)) {
            tx.commit().await?;
            return Ok(false);
        }
        let paused = sqlx::query(PARK_PAUSED)
            .bind(handler)
            .fetch_optional(&mut *tx)
            .await?
            .is_some()
            || sqlx::query(PARK_BREAKER)
                .bind(handler)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
        let current = sqlx::query(PARK)
            .bind(paused.then_some(handler))
            .bind(handler)
            .bind(fence.id)
            .bind(fence.claim_token)
            .execute(&mut *tx)
            .await?
            .rows_affected()
            > 0;
        if current {
            for h in succeeded {
                sqlx::query(FAILED_SUCCEEDED)
                    .bind(fence.id)
                    .bind(*h)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        tx.commit().await?;
        Ok(current)
    })
    .await
}

/// The fences grouped by claim token, ids sorted: one statement per claim.
fn by_token(fences: &[Fence]) -> BTreeMap<Uuid, Vec<Uuid>> {
    let mut groups: BTreeMap<Uuid, Vec<Uuid>> = BTreeMap::new();
    for f in fences {
        groups.entry(f.claim_token).or_default().push(f.id);
    }
    for ids in groups.values_mut() {
        ids.sort_unstable();
    }
    groups
}

/// Gives claimed messages back ([`HAND_BACK`]); returns how many.
pub(super) async fn hand_back(b: &MySqlBackend, fences: &[Fence]) -> Result<u64> {
    let mut n = 0;
    for (token, ids) in by_token(fences) {
        n += retrying("hand back", || async {
            let mut q = sqlx::query(with_list(HAND_BACK, ids.len())).bind(token);
            for id in &ids {
                q = q.bind(*id);
            }
            Ok(q.execute(&b.pool).await?.rows_affected())
        })
        .await?;
    }
    Ok(n)
}

/// Extends leases ([`RENEW`]); returns how many.
pub(super) async fn renew(b: &MySqlBackend, fences: &[Fence], lease: Duration) -> Result<u64> {
    let mut n = 0;
    for (token, ids) in by_token(fences) {
        n += retrying("renew", || async {
            let mut q = sqlx::query(with_list(RENEW, ids.len()))
                .bind(ms(lease))
                .bind(token);
            for id in &ids {
                q = q.bind(*id);
            }
            Ok(q.execute(&b.pool).await?.rows_affected())
        })
        .await?;
    }
    Ok(n)
}
