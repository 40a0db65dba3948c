//! What became of claimed messages: done (deleted and counted, optionally claiming the next
//! messages of their keys), failed (retry or dead letter), handed back, parked for a paused
//! handler, lease renewed.
//!
//! Every write is fenced: it touches a message only while its claim token is the one the
//! worker claimed it under. The statements given many fences join the live table to
//! `UNNEST((SELECT $1), (SELECT $2))`: behind a scalar subquery the planner cannot count the
//! arrays, plans for a few rows and probes the primary key once per fence. Given the arrays'
//! real length, a batch of a few hundred made it hash the whole live table instead, a
//! sequential scan on every done write whose cost grew with the backlog (5.1 ms against
//! 2.5 ms for 1,000 of 30,000 rows).

use std::time::Duration;

use sqlx::postgres::PgPool;
use sqlx::Row;
use uuid::Uuid;

use super::claim::claimed;
use super::{secs, PgBackend};
use crate::backend::{ClaimParams, ClaimedMessage, Done, Failure, Fence};
use crate::error::Result;

/// The common expressions of [`DONE`] and [`DONE_AND_CLAIM`], as one string literal.
macro_rules! done_ctes {
    () => {
        "WITH del AS ( \
        DELETE FROM outbox_messages m \
        USING UNNEST((SELECT $1::uuid[]), (SELECT $2::uuid[])) AS d(id, claim_token) \
        WHERE m.id = d.id AND m.claim_token = d.claim_token \
        RETURNING m.id, m.topic, m.ordering_key, m.seq, m.payload, m.version, m.idempotency_key, \
                  m.created_at, m.traceparent, m.tracestate \
     ), kept AS ( \
        INSERT INTO outbox_events (topic_id, delivered_at, id, topic, payload, version, \
                                   idempotency_key, ordering_key, created_at, traceparent, tracestate, seq) \
        SELECT r.id, now(), d.id, d.topic, d.payload, d.version, d.idempotency_key, d.ordering_key, \
               d.created_at, d.traceparent, d.tracestate, d.seq \
        FROM del d JOIN outbox_retention r ON r.topic = d.topic \
     ), counted AS ( \
        INSERT INTO outbox_done_counts (topic, minute, worker, done) \
        SELECT topic, date_trunc('minute', now()), $3, count(*) FROM del GROUP BY topic ORDER BY topic \
        ON CONFLICT (topic, minute, worker) DO UPDATE SET done = outbox_done_counts.done + excluded.done \
     ), progress AS ( \
        DELETE FROM outbox_deliveries WHERE message_id = ANY($4::uuid[]) \
     ) "
    };
}

/// Deletes the done messages `$1`, each only under its claim token in `$2`, keeps those of
/// retained topics in the event log (`log.rs`), counts them for the statistics under worker
/// `$3`, and deletes the per-handler progress of `$4` (the ids with earlier attempts). Returns
/// how many were deleted.
///
/// Whether a topic is retained is read here, from `outbox_retention`, not from what this
/// worker was built with: every worker logs what any declared, and a topic without retention
/// costs the join of the deleted rows with that small table.
///
/// A worker's writes in flight at once add to the same count rows, so they lock them in one
/// order (by topic): the later waits for the earlier's commit, and they never deadlock.
const DONE: &str = concat!(done_ctes!(), "SELECT count(*) FROM del");

/// [`DONE`] (`$1` to `$4`), and in the same statement claims, under claim token `$6` for a
/// lease of `$7` seconds, the messages that became the heads of the keys it released, if of
/// the topics `$5` with a version at most the one at the topic's position in `$8`, and they
/// may start (on the terms of the claims of heads in `claim.rs`).
/// Each row is the count of done messages with one claimed message, or with NULLs when none.
///
/// The heads this write makes are found in the statement's own snapshot, where the rows it
/// deletes are still live: each released key's first entry other than the row this write
/// deletes (a key has one running message, so a batch holds at most one row of a key; the
/// whole batch's ids in that filter cost a comparison per id and entry, 5 us a row at 1,000).
/// No other claim can take such a head first: until this statement commits, the row it
/// deletes is its key's head, and the DELETE holds that row's lock. So the UPDATE takes
/// each head by the TID its probe found, without a locking step that skips locked rows
/// first: nothing else locks a head behind a running message (claims lock only heads that
/// may start), and a row updated meanwhile has moved from that TID, so the recheck leaves
/// it out. That saves each key step a primary-key probe and a row lock. The claim commits
/// durably with the done rows (no `synchronous_commit` off here).
const DONE_AND_CLAIM: &str = concat!(
    done_ctes!(),
    ", heads AS ( \
        SELECT h.ctid FROM del d CROSS JOIN LATERAL ( \
            SELECT ctid FROM outbox_messages \
            WHERE ordering_key = d.ordering_key AND seq <> d.seq \
            ORDER BY ordering_key, seq LIMIT 1) h \
        WHERE d.ordering_key IS NOT NULL \
     ), claimed AS ( \
        UPDATE outbox_messages m \
        SET attempts = m.attempts + 1, claim_token = $6, claimed_by = $3, \
            locked_until = now() + make_interval(secs => $7) \
        WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM heads)) \
          AND m.topic = ANY($5::text[]) \
          AND m.version <= ($8::int4[])[array_position($5::text[], m.topic)] \
          AND m.available_at <= now() AND m.parked_by IS NULL \
          AND (m.locked_until IS NULL OR m.locked_until < now()) \
          AND (NOT EXISTS (SELECT 1 FROM outbox_dead \
                           WHERE ordering_key IS NOT NULL AND NOT releases_key) \
               OR NOT EXISTS (SELECT 1 FROM outbox_dead d \
                              WHERE d.ordering_key = m.ordering_key AND d.seq < m.seq \
                                AND NOT d.releases_key)) \
          AND (NOT m.retried_release \
               OR NOT EXISTS (SELECT 1 FROM outbox_messages l \
                              WHERE l.ordering_key = m.ordering_key AND l.seq > m.seq \
                                AND l.locked_until >= now())) \
        RETURNING m.id, m.topic, m.payload::text AS payload, m.version, m.idempotency_key, \
                  m.attempts, m.created_at, m.last_error, m.ordering_key, m.seq, m.releases_key, m.traceparent, m.tracestate \
     ) \
     SELECT (SELECT count(*) FROM del) AS done, c.* \
     FROM (SELECT 1) one LEFT JOIN claimed c ON true"
);

/// A failed attempt of message `$1` under claim token `$2`, back to pending after `$3`
/// seconds with its error `$4`, recording the handlers `$5` that succeeded. Returns 1, or 0
/// when the claim was taken over.
const FAILED_RETRY: &str = "WITH upd AS ( \
        UPDATE outbox_messages \
        SET available_at = now() + make_interval(secs => $3), locked_until = NULL, \
            claim_token = NULL, last_error = $4 \
        WHERE id = $1 AND claim_token = $2 \
        RETURNING id \
     ), ins AS ( \
        INSERT INTO outbox_deliveries (message_id, handler) \
        SELECT $1, h FROM unnest($5::text[]) AS h WHERE EXISTS (SELECT 1 FROM upd) \
        ON CONFLICT DO NOTHING \
     ) \
     SELECT count(*) FROM upd";

/// As [`FAILED_RETRY`], but the message moves to the dead letters (`$3` is not used).
const FAILED_DEAD: &str = "WITH del AS ( \
        DELETE FROM outbox_messages WHERE id = $1 AND claim_token = $2 \
        RETURNING id, topic, payload, idempotency_key, attempts, created_at, ordering_key, releases_key, \
                  traceparent, tracestate, version, seq \
     ), dead AS ( \
        INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, \
                                 ordering_key, releases_key, traceparent, tracestate, version, seq) \
        SELECT id, topic, payload, idempotency_key, attempts, $4, created_at, ordering_key, releases_key, \
               traceparent, tracestate, version, seq \
        FROM del \
     ), ins AS ( \
        INSERT INTO outbox_deliveries (message_id, handler) \
        SELECT $1, h FROM unnest($5::text[]) AS h WHERE EXISTS (SELECT 1 FROM del) \
        ON CONFLICT DO NOTHING \
     ) \
     SELECT count(*) FROM del";

/// The messages `$1` under the claim tokens `$2` back to pending, ready at once, their
/// attempt not counted.
const HAND_BACK: &str = "UPDATE outbox_messages m \
     SET attempts = greatest(m.attempts - 1, 0), locked_until = NULL, claim_token = NULL \
     FROM UNNEST((SELECT $1::uuid[]), (SELECT $2::uuid[])) AS d(id, claim_token) \
     WHERE m.id = d.id AND m.claim_token = d.claim_token";

/// Message `$1` under claim token `$2` parked for the handler `$3`, paused or its breaker open:
/// back to pending, its attempt not counted, recording the handlers `$4` that succeeded; its
/// `available_at` moves to now, which puts it last in a breaker's probe order. The
/// pause row and the breaker row are read `FOR SHARE` (see `pause.rs` and `breaker.rs`): when
/// neither holds the handler any more, the message is only given back, not parked. The first park notes it in `last_error`, which tells the next
/// claim to read the message's per-handler progress (its attempts may be back at 0). Returns
/// 1, or 0 when the claim was taken over.
const PARK: &str = "WITH pause AS ( \
        SELECT 1 FROM outbox_pauses \
        WHERE scope = 'handler' AND name = $3 AND (until IS NULL OR until > now()) \
        FOR SHARE \
     ), breaker AS ( \
        SELECT 1 FROM outbox_breakers WHERE handler = $3 AND open FOR SHARE \
     ), upd AS ( \
        UPDATE outbox_messages \
        SET attempts = greatest(attempts - 1, 0), locked_until = NULL, claim_token = NULL, \
            available_at = now(), \
            parked_by = CASE WHEN EXISTS (SELECT 1 FROM pause) OR EXISTS (SELECT 1 FROM breaker) \
                             THEN $3 END, \
            last_error = coalesce(last_error, 'parked for handler `' || $3 || '` (paused, or its breaker open)') \
        WHERE id = $1 AND claim_token = $2 \
        RETURNING id \
     ), ins AS ( \
        INSERT INTO outbox_deliveries (message_id, handler) \
        SELECT $1, h FROM unnest($4::text[]) AS h WHERE EXISTS (SELECT 1 FROM upd) \
        ON CONFLICT DO NOTHING \
     ) \
     SELECT count(*) FROM upd";

/// The leases of the messages `$1` under the claim tokens `$2` extended to `$3` seconds from
/// now. A renewal lost in a server crash only shortens a lease: no WAL flush to wait for.
const RENEW: &str = "UPDATE outbox_messages m \
     SET locked_until = now() + make_interval(secs => $3) \
     FROM UNNEST(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' THEN $1::uuid[] END, \
                 (SELECT $2::uuid[])) AS d(id, claim_token) \
     WHERE m.id = d.id AND m.claim_token = d.claim_token";

/// The ids and claim tokens of `f`, as the two arrays the fenced statements unnest.
fn fences(f: &[Fence]) -> (Vec<Uuid>, Vec<Uuid>) {
    f.iter().map(|f| (f.id, f.claim_token)).unzip()
}

/// What a done write binds first: the ids, their claim tokens, and the ids with earlier
/// attempts (whose per-handler progress is deleted with them).
fn done_arrays(done: &[Done]) -> (Vec<Uuid>, Vec<Uuid>, Vec<Uuid>) {
    let (ids, tokens): (Vec<Uuid>, Vec<Uuid>) = done
        .iter()
        .map(|d| (d.fence.id, d.fence.claim_token))
        .unzip();
    let progress: Vec<Uuid> = done
        .iter()
        .filter(|d| d.had_attempts)
        .map(|d| d.fence.id)
        .collect();
    (ids, tokens, progress)
}

/// Deletes done messages ([`DONE`]); returns how many were deleted.
pub(super) async fn mark_done(pool: &PgPool, worker: Uuid, done: &[Done]) -> Result<u64> {
    let (ids, tokens, progress) = done_arrays(done);
    let n: i64 = sqlx::query(DONE)
        .bind(ids)
        .bind(tokens)
        .bind(worker)
        .bind(progress)
        .fetch_one(pool)
        .await?
        .try_get(0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Deletes done messages and claims the next messages of their keys ([`DONE_AND_CLAIM`]); a
/// batch without ordered messages is only deleted ([`DONE`]).
pub(super) async fn mark_done_and_claim(
    b: &PgBackend,
    worker: Uuid,
    done: &[Done],
    next: &ClaimParams<'_>,
) -> Result<(u64, Option<Vec<ClaimedMessage>>)> {
    if done.iter().all(|d| d.key.is_none()) {
        return Ok((mark_done(&b.pool, worker, done).await?, None));
    }
    let (ids, tokens, progress) = done_arrays(done);
    let rows = sqlx::query(DONE_AND_CLAIM)
        .bind(ids)
        .bind(tokens)
        .bind(worker)
        .bind(progress)
        .bind(next.topics)
        .bind(next.claim_token)
        .bind(secs(next.lease))
        .bind(next.versions)
        .fetch_all(&b.pool)
        .await?;
    let mut n = 0i64;
    let mut out = Vec::new();
    for r in &rows {
        n = r.try_get("done")?;
        if r.try_get::<Option<Uuid>, _>("id")?.is_some() {
            out.push(claimed(r, next.claim_token, true)?);
        }
    }
    if !out.is_empty() {
        b.claims.chained_now();
    }
    Ok((u64::try_from(n).unwrap_or(0), Some(out)))
}

/// Writes one failed attempt ([`FAILED_RETRY`] or [`FAILED_DEAD`]); false when fenced out.
pub(super) async fn mark_failed(pool: &PgPool, f: &Failure<'_>) -> Result<bool> {
    let sql = if f.retry_in.is_some() {
        FAILED_RETRY
    } else {
        FAILED_DEAD
    };
    let n: i64 = sqlx::query_scalar(sql)
        .bind(f.fence.id)
        .bind(f.fence.claim_token)
        .bind(f.retry_in.map(secs).unwrap_or(0.0))
        .bind(f.error)
        .bind(f.succeeded)
        .fetch_one(pool)
        .await?;
    Ok(n > 0)
}

/// Gives claimed messages back ([`HAND_BACK`]); returns how many.
pub(super) async fn hand_back(pool: &PgPool, f: &[Fence]) -> Result<u64> {
    let (ids, tokens) = fences(f);
    let r = sqlx::query(HAND_BACK)
        .bind(ids)
        .bind(tokens)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

/// Parks a claimed message for a paused handler ([`PARK`]); false when fenced out.
pub(super) async fn park(
    pool: &PgPool,
    fence: Fence,
    handler: &str,
    succeeded: &[&str],
) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(PARK)
        .bind(fence.id)
        .bind(fence.claim_token)
        .bind(handler)
        .bind(succeeded)
        .fetch_one(pool)
        .await?;
    Ok(n > 0)
}

/// Extends leases ([`RENEW`]); returns how many.
pub(super) async fn renew(pool: &PgPool, f: &[Fence], lease: Duration) -> Result<u64> {
    let (ids, tokens) = fences(f);
    let r = sqlx::query(RENEW)
        .bind(ids)
        .bind(tokens)
        .bind(secs(lease))
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::{between, from};

    /// The done write that claims is the plain one with the claim added after its CTEs.
    #[test]
    fn the_done_write_that_claims_deletes_and_counts_alike() {
        let ctes = DONE.strip_suffix("SELECT count(*) FROM del").unwrap_or("");
        assert!(!ctes.is_empty());
        assert!(DONE_AND_CLAIM.starts_with(ctes));
    }

    /// The done write claims a key's head on the terms the claims of heads use.
    #[test]
    fn the_done_write_claims_heads_on_the_claims_terms() {
        let terms = between(
            super::super::claim::CLAIM_KEYED,
            "m.available_at",
            " LIMIT $2",
        );
        assert!(terms.ends_with("l.locked_until >= now()))"), "{terms}");
        assert!(from(DONE_AND_CLAIM, "), claimed AS (").contains(terms));
        // Both take only the versions the worker knows, each with its own parameters.
        let version = "AND m.version <= ($7::int4[])[array_position($1::text[], m.topic)]";
        assert!(super::super::claim::CLAIM_KEYED.contains(version));
        let version = version.replace("$7", "$8").replace("$1", "$5");
        assert!(from(DONE_AND_CLAIM, "), claimed AS (").contains(&version));
    }
}
