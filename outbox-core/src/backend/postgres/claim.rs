//! Claims: unordered messages, the heads of ordering keys, and the handlers a claimed message
//! already passed.
//!
//! Unordered and ordered messages are claimed by separate statements. Every claim counts the
//! attempt and takes the lease in one UPDATE, and updates the picked rows through
//! `ctid = ANY(ARRAY(...))`, a TID scan that goes straight to the rows its scan locked: joined
//! to the CTE instead, a batch of a few hundred made PostgreSQL hash the whole table (a
//! sequential scan per claim, growing with the backlog: 8.9 ms against 3.6 ms for 1,000 of
//! 30,000 rows), and a primary-key probe per row (`id = ANY(...)`) cost 3.3 ms against 2.6 ms
//! for the TID scan. The row locks make the TIDs safe to use: nobody can move a row a
//! statement has locked.
//!
//! A claim commits without waiting for its WAL flush (`synchronous_commit` off for this one
//! transaction, set where the topic list is read, which each scan needs first). A claim lost
//! in a server crash only hands the message out again, which at-least-once allows; outcomes
//! (done, failed, dead) still commit durably.
//!
//! A head of a key may start when it is due, not running, and not behind a dead letter that
//! holds its key. The first, uncorrelated test of the last term (no dead letter holds any key)
//! is evaluated once per statement, from the partial index of such letters; only when one
//! exists is each head checked against its own key. With no such letter, which is the usual
//! case, the planner would otherwise probe `outbox_dead` once per head (a scan of the empty
//! table when its statistics say it is empty), some 8 % of a key step on the server. The
//! claims of heads here and the done write's claim (`outcome.rs`) state these terms alike.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;
use uuid::Uuid;

use super::{secs, PgBackend};
use crate::backend::{ClaimParams, ClaimedMessage, CHAINED_WALK_INTERVAL, RELEASED_WALK_INTERVAL};
use crate::error::Result;

/// Up to `$2` unordered messages of the topics `$1`, in due order per topic, claimed under
/// claim token `$3` by worker `$4` for a lease of `$5` seconds; each row also says whether any
/// ordered message is live (`any_keyed`). Only messages whose version is at most the one at
/// the topic's position in `$6` are taken; newer ones wait for a worker that knows them.
///
/// Per topic, the index gives rows in due order; running rows whose lease still runs are
/// skipped on the heap, and the outer LIMIT stops the lateral scan as soon as the batch is
/// full. Rows of topics not asked for are never read, and ordered rows are not in that index.
/// The UPDATE writes no indexed column, so PostgreSQL can keep it on the row's page without
/// new index entries.
const CLAIM_UNKEYED: &str = "WITH picked AS ( \
        SELECT c.ctid \
        FROM unnest(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                         THEN $1::text[] END, $6::int4[]) AS t(topic, max_version) \
        CROSS JOIN LATERAL ( \
            SELECT ctid FROM outbox_messages \
            WHERE topic = t.topic AND ordering_key IS NULL AND available_at <= now() AND parked_by IS NULL \
              AND (locked_until IS NULL OR locked_until < now()) AND version <= t.max_version \
            ORDER BY available_at \
            LIMIT $2 \
            FOR UPDATE SKIP LOCKED \
        ) c \
        LIMIT $2 \
     ) \
     UPDATE outbox_messages m \
     SET attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, \
         locked_until = now() + make_interval(secs => $5) \
     WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) \
     RETURNING m.id, m.topic, m.payload::text AS payload, m.version, m.idempotency_key, \
               m.attempts, m.created_at, m.last_error, m.traceparent, m.tracestate, \
               EXISTS (SELECT 1 FROM outbox_messages k WHERE k.ordering_key IS NOT NULL) AS any_keyed";

/// Up to `$2` heads of keys, found by a walk over every key that starts after the key `$6` and
/// wraps around, that may start and are of the topics `$1` with a version at most the one at
/// the topic's position in `$7`, claimed under claim token `$3` by worker `$4` for a lease of
/// `$5` seconds. A head of a newer version is not taken, and holds the later messages of its
/// key behind it.
///
/// The walk goes from key to key, one probe of the key index per key (a loose index scan),
/// and yields each key's head (its live message with the smallest `seq`, the number the
/// database gave it at insert). A later row of a key
/// is never a head while an earlier one exists, locked or not, so two workers can never start
/// two messages of one key.
pub(super) const CLAIM_KEYED: &str = "WITH RECURSIVE after_cursor(k, seq) AS ( \
        (SELECT ordering_key, seq FROM outbox_messages \
         WHERE ordering_key > $6 ORDER BY ordering_key, seq LIMIT 1) \
        UNION ALL \
        SELECT n.ordering_key, n.seq FROM after_cursor a CROSS JOIN LATERAL ( \
            SELECT ordering_key, seq FROM outbox_messages \
            WHERE ordering_key > a.k ORDER BY ordering_key, seq LIMIT 1) n \
     ), up_to_cursor(k, seq) AS ( \
        (SELECT ordering_key, seq FROM outbox_messages \
         WHERE ordering_key IS NOT NULL AND ordering_key <= $6 \
         ORDER BY ordering_key, seq LIMIT 1) \
        UNION ALL \
        SELECT n.ordering_key, n.seq FROM up_to_cursor a CROSS JOIN LATERAL ( \
            SELECT ordering_key, seq FROM outbox_messages \
            WHERE ordering_key > a.k AND ordering_key <= $6 \
            ORDER BY ordering_key, seq LIMIT 1) n \
     ), heads AS ( \
        SELECT k, seq FROM after_cursor UNION ALL SELECT k, seq FROM up_to_cursor \
     ), picked AS ( \
        SELECT m.ctid FROM heads h JOIN outbox_messages m ON m.ordering_key = h.k AND m.seq = h.seq \
        WHERE m.topic = ANY(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                                 THEN $1::text[] END) \
          AND m.version <= ($7::int4[])[array_position($1::text[], m.topic)] \
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
        LIMIT $2 \
        FOR UPDATE OF m SKIP LOCKED \
     ) \
     UPDATE outbox_messages m \
     SET attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, \
         locked_until = now() + make_interval(secs => $5) \
     WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) \
     RETURNING m.id, m.topic, m.payload::text AS payload, m.version, m.idempotency_key, \
               m.attempts, m.created_at, m.last_error, m.ordering_key, m.seq, m.releases_key, m.traceparent, m.tracestate";

/// As [`CLAIM_KEYED`], but the heads are those of the keys `$6` only, one probe per key.
const CLAIM_RELEASED: &str = "WITH heads AS ( \
        SELECT r.k, h.seq FROM unnest((SELECT $6::text[])) AS r(k) \
        CROSS JOIN LATERAL ( \
            SELECT seq FROM outbox_messages \
            WHERE ordering_key = r.k ORDER BY ordering_key, seq LIMIT 1) h \
     ), picked AS ( \
        SELECT m.ctid FROM heads h JOIN outbox_messages m ON m.ordering_key = h.k AND m.seq = h.seq \
        WHERE m.topic = ANY(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                                 THEN $1::text[] END) \
          AND m.version <= ($7::int4[])[array_position($1::text[], m.topic)] \
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
        LIMIT $2 \
        FOR UPDATE OF m SKIP LOCKED \
     ) \
     UPDATE outbox_messages m \
     SET attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, \
         locked_until = now() + make_interval(secs => $5) \
     WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) \
     RETURNING m.id, m.topic, m.payload::text AS payload, m.version, m.idempotency_key, \
               m.attempts, m.created_at, m.last_error, m.ordering_key, m.seq, m.releases_key, m.traceparent, m.tracestate";

/// The handlers of the messages `$1` that already succeeded.
const DELIVERY_COMPLETED: &str =
    "SELECT message_id, handler FROM outbox_deliveries WHERE message_id = ANY($1::uuid[])";

/// What one backend's claims remember from one call to the next.
pub(super) struct ClaimState {
    /// The greatest ordering key of this backend's last claim that took ordered messages: the
    /// next claim walks the keys after it first.
    cursor: Mutex<Option<String>>,
    /// Whether the next claim takes ordered messages before unordered ones.
    keyed_first: AtomicBool,
    /// Ordered messages were live at the last look (or it is not known): claims look for them.
    keyed_present: AtomicBool,
    /// When the claim last walked every key.
    walked: Mutex<Instant>,
    /// When a done write last claimed the next messages of the keys it released.
    chained: Mutex<Option<Instant>>,
    /// How long after the last walk the next one runs while keys are released or chained:
    /// from RELEASED_WALK_INTERVAL, doubled after each walk that found nothing.
    walk_gap: Mutex<Duration>,
}

impl ClaimState {
    pub(super) fn new() -> Self {
        Self {
            cursor: Mutex::new(None),
            keyed_first: AtomicBool::new(false),
            keyed_present: AtomicBool::new(true),
            walked: Mutex::new(Instant::now()),
            chained: Mutex::new(None),
            walk_gap: Mutex::new(RELEASED_WALK_INTERVAL),
        }
    }

    /// Notes that a done write claimed the next messages of the keys it released: ordered
    /// messages are live, and the walk over every key may wait.
    pub(super) fn chained_now(&self) {
        self.keyed_present.store(true, AtomicOrdering::Relaxed);
        *locked(&self.chained) = Some(Instant::now());
    }
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Claims up to `p.limit` ready messages of `p.topics`.
pub(super) async fn batch(b: &PgBackend, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
    // Unordered and ordered messages are claimed by two statements. The statement for
    // unordered ones also says whether any ordered message is live, so a worker that only
    // sees unordered ones never runs (nor has PostgreSQL plan) the other: they pay nothing
    // for ordering. When no unordered message was due, the ordered claim runs anyway. The
    // two kinds take turns at going first, so neither keeps the other out of full batches.
    //
    // The heads of the keys this worker just released are claimed first, a probe per key;
    // while there are such keys, the walk over every key (which finds the heads that other
    // workers' writes, new keys and due retries made) runs only every
    // RELEASED_WALK_INTERVAL, not on every claim.
    let s = &b.claims;
    let keyed_first = !s.keyed_first.fetch_xor(true, AtomicOrdering::Relaxed);
    let mut out = Vec::new();
    if !p.released.is_empty() {
        released(b, p, p.limit, &mut out).await?;
    }
    // Keys this worker's done writes keep passing on (their next messages claimed by the
    // write itself, see `outcome::mark_done_and_claim`) count as released keys here.
    let chaining = locked(&s.chained).is_some_and(|at| at.elapsed() < 2 * RELEASED_WALK_INTERVAL);
    let gap = if chaining {
        *locked(&s.walk_gap)
    } else {
        RELEASED_WALK_INTERVAL
    };
    let mut keyed_ran = (chaining || !p.released.is_empty()) && locked(&s.walked).elapsed() < gap;
    let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
    if !keyed_ran && want > 0 && keyed_first && s.keyed_present.load(AtomicOrdering::Relaxed) {
        keyed(b, p, want, &mut out).await?;
        keyed_ran = true;
    }
    let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
    let mut unkeyed_claimed = 0;
    if want > 0 {
        unkeyed_claimed = unkeyed(b, p, want, &mut out).await?;
    }
    if !keyed_ran && (unkeyed_claimed == 0 || s.keyed_present.load(AtomicOrdering::Relaxed)) {
        let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
        if want > 0 {
            keyed(b, p, want, &mut out).await?;
        }
    }
    Ok(out)
}

/// Claims up to `limit` unordered messages into `out` ([`CLAIM_UNKEYED`]); returns how many,
/// and notes whether ordered messages are live.
async fn unkeyed(
    b: &PgBackend,
    p: &ClaimParams<'_>,
    limit: i64,
    out: &mut Vec<ClaimedMessage>,
) -> Result<usize> {
    let rows = sqlx::query(CLAIM_UNKEYED)
        .bind(p.topics)
        .bind(limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .bind(p.versions)
        .fetch_all(&b.pool)
        .await?;
    let mut any_keyed = false;
    for r in &rows {
        any_keyed |= r.try_get::<bool, _>("any_keyed")?;
        out.push(claimed(r, p.claim_token, false)?);
    }
    if !rows.is_empty() {
        b.claims
            .keyed_present
            .store(any_keyed, AtomicOrdering::Relaxed);
    }
    Ok(rows.len())
}

/// Claims up to `limit` heads of keys into `out` ([`CLAIM_KEYED`]), walking the keys from the
/// one after the key this backend claimed last, so keys take turns.
async fn keyed(
    b: &PgBackend,
    p: &ClaimParams<'_>,
    limit: i64,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    let s = &b.claims;
    let cursor = locked(&s.cursor).clone().unwrap_or_default();
    *locked(&s.walked) = Instant::now();
    let rows = sqlx::query(CLAIM_KEYED)
        .bind(p.topics)
        .bind(limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .bind(&cursor)
        .bind(p.versions)
        .fetch_all(&b.pool)
        .await?;
    let mut last_key: Option<String> = None;
    for r in &rows {
        let key: Option<String> = r.try_get("ordering_key")?;
        if let Some(key) = key {
            if last_key.as_ref().is_none_or(|last| key > *last) {
                last_key = Some(key);
            }
        }
        out.push(claimed(r, p.claim_token, true)?);
    }
    {
        let mut gap = locked(&s.walk_gap);
        *gap = if rows.is_empty() {
            (*gap * 2).min(CHAINED_WALK_INTERVAL)
        } else {
            RELEASED_WALK_INTERVAL
        };
    }
    // Keys compare byte-wise in the database ("C" collation) as Rust strings do.
    if last_key.is_some() {
        s.keyed_present.store(true, AtomicOrdering::Relaxed);
        *locked(&s.cursor) = last_key;
    }
    Ok(())
}

/// Claims into `out` the heads of `p.released`, the keys this worker's done writes just
/// released ([`CLAIM_RELEASED`]): a worker whose keys all run would otherwise walk a thousand
/// keys to find the few just released.
async fn released(
    b: &PgBackend,
    p: &ClaimParams<'_>,
    limit: i64,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    let keys: Vec<&str> = p.released.iter().map(|k| &**k).collect();
    let rows = sqlx::query(CLAIM_RELEASED)
        .bind(p.topics)
        .bind(limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .bind(keys)
        .bind(p.versions)
        .fetch_all(&b.pool)
        .await?;
    for r in &rows {
        out.push(claimed(r, p.claim_token, true)?);
    }
    if !rows.is_empty() {
        b.claims.keyed_present.store(true, AtomicOrdering::Relaxed);
    }
    Ok(())
}

/// The handlers that already succeeded for these messages.
pub(super) async fn delivery_completed(
    pool: &PgPool,
    message_ids: &[Uuid],
) -> Result<Vec<(Uuid, String)>> {
    Ok(sqlx::query_as(DELIVERY_COMPLETED)
        .bind(message_ids)
        .fetch_all(pool)
        .await?)
}

/// A claimed row as the worker sees it; `ordered` when the statement returns its ordering key.
pub(super) fn claimed(
    r: &PgRow,
    claim_token: Uuid,
    ordered: bool,
) -> Result<ClaimedMessage, sqlx::Error> {
    Ok(ClaimedMessage {
        id: r.try_get("id")?,
        topic: r.try_get("topic")?,
        payload: r.try_get("payload")?,
        version: u32::try_from(r.try_get::<i32, _>("version")?).unwrap_or(1),
        idempotency_key: r.try_get("idempotency_key")?,
        attempts: r.try_get("attempts")?,
        created_at: r.try_get("created_at")?,
        claim_token,
        last_error: r.try_get("last_error")?,
        key: if ordered {
            r.try_get::<Option<String>, _>("ordering_key")?
                .map(Arc::from)
        } else {
            None
        },
        seq: if ordered {
            Some(r.try_get("seq")?)
        } else {
            None
        },
        releases_key: ordered && r.try_get::<bool, _>("releases_key")?,
        trace: trace(r.try_get("traceparent")?, r.try_get("tracestate")?),
    })
}

/// The stored trace context of a row, if it has one.
fn trace(
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> Option<crate::trace::TraceContext> {
    traceparent.map(|p| crate::trace::TraceContext::new(p, tracestate))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::from;

    /// Both claims of heads decide and write alike; only where their heads come from differs.
    #[test]
    fn both_claims_of_heads_claim_alike() {
        let tail = from(CLAIM_KEYED, "picked AS (");
        assert!(!tail.is_empty());
        assert_eq!(tail, from(CLAIM_RELEASED, "picked AS ("));
    }
}
