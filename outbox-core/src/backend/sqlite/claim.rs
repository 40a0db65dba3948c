//! Claims: unordered messages, the heads of ordering keys, and the handlers a claimed message
//! already passed.
//!
//! Every claim is one `UPDATE ... WHERE seq IN (SELECT ... LIMIT n) RETURNING` statement that
//! counts the attempt and takes the lease under the write lock. Its parameters are numbered
//! alike: `?1` claim token, `?2` worker, `?3` now, `?4` the lease's end.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use sqlx::sqlite::{SqlitePool, SqliteRow};
use sqlx::Row;
use uuid::Uuid;

use super::{ms, parse_uuid, time, uuids, SqliteBackend};
use crate::backend::{ClaimParams, ClaimedMessage, RELEASED_WALK_INTERVAL};
use crate::clock::now_ms;
use crate::error::{Error, Result};

/// Up to `?6` unordered messages of topic `?5` and a version at most `?7`, in due order (one
/// statement per topic keeps each claim on the ready index); newer versions wait for a worker
/// that knows them.
const CLAIM_UNKEYED: &str = concat!(
    "UPDATE outbox_messages \
     SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, locked_until = ",
    db_now_ms!(),
    " + ?4 \
     WHERE seq IN ( \
         SELECT seq FROM outbox_messages \
         WHERE topic = ?5 AND ordering_key IS NULL AND available_at <= ?3 AND parked_by IS NULL \
           AND (locked_until IS NULL OR locked_until < ?3) AND version <= ?7 \
         ORDER BY available_at LIMIT ?6) \
     RETURNING id, topic, payload, version, idempotency_key, attempts, created_at, last_error, \
               traceparent, tracestate"
);

/// Up to `?7` heads of keys of the topics `?6` that may start: of a version at most the
/// topic's in `?6` (a JSON object, topic to highest version), due, not running, and not behind
/// a dead letter that holds the key. A head of a newer version holds its key's later messages. The keys are walked one index
/// probe each (a loose index scan), starting after the key `?5` and wrapping around; each
/// key's head is its live message with the smallest `seq` (its rowid: insert order), so a later message of a key is never
/// a head while an earlier one exists, and two workers never start two messages of one key.
const CLAIM_KEYED: &str = concat!(
    "WITH RECURSIVE after_cursor(k) AS ( \
        SELECT (SELECT min(ordering_key) FROM outbox_messages WHERE ordering_key > ?5) \
        UNION ALL \
        SELECT (SELECT min(ordering_key) FROM outbox_messages WHERE ordering_key > a.k) \
        FROM after_cursor a WHERE a.k IS NOT NULL \
     ), up_to_cursor(k) AS ( \
        SELECT (SELECT min(ordering_key) FROM outbox_messages \
                WHERE ordering_key IS NOT NULL AND ordering_key <= ?5) \
        UNION ALL \
        SELECT (SELECT min(ordering_key) FROM outbox_messages \
                WHERE ordering_key > u.k AND ordering_key <= ?5) \
        FROM up_to_cursor u WHERE u.k IS NOT NULL \
     ), keys(k) AS ( \
        SELECT k FROM after_cursor WHERE k IS NOT NULL \
        UNION ALL SELECT k FROM up_to_cursor WHERE k IS NOT NULL \
     ), heads(k, seq) AS ( \
        SELECT k, (SELECT min(seq) FROM outbox_messages WHERE ordering_key = keys.k) FROM keys \
     ) \
     UPDATE outbox_messages \
     SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, locked_until = ", db_now_ms!(), " + ?4 \
     WHERE seq IN ( \
         SELECT m.seq FROM heads h JOIN outbox_messages m ON m.seq = h.seq \
         WHERE m.version <= (SELECT value FROM json_each(?6) WHERE key = m.topic) \
           AND m.available_at <= ?3 AND m.parked_by IS NULL \
           AND (m.locked_until IS NULL OR m.locked_until < ?3) \
           AND NOT EXISTS (SELECT 1 FROM outbox_dead d \
                           WHERE d.ordering_key = h.k AND d.seq < h.seq AND d.releases_key = 0) \
           AND (m.retried_release = 0 \
                OR NOT EXISTS (SELECT 1 FROM outbox_messages l \
                               WHERE l.ordering_key = h.k AND l.seq > h.seq AND l.locked_until >= ?3)) \
         LIMIT ?7) \
     RETURNING id, topic, payload, version, idempotency_key, attempts, created_at, last_error, ordering_key, \
               seq, releases_key, traceparent, tracestate"
);

/// As [`CLAIM_KEYED`], but the heads are those of the keys `?5` (a JSON array) only, one probe
/// per key.
const CLAIM_RELEASED: &str = concat!(
    "WITH keys(k) AS (SELECT value FROM json_each(?5)), heads(k, seq) AS ( \
        SELECT k, (SELECT min(seq) FROM outbox_messages WHERE ordering_key = keys.k) FROM keys \
     ) \
     UPDATE outbox_messages \
     SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, locked_until = ", db_now_ms!(), " + ?4 \
     WHERE seq IN ( \
         SELECT m.seq FROM heads h JOIN outbox_messages m ON m.seq = h.seq \
         WHERE m.version <= (SELECT value FROM json_each(?6) WHERE key = m.topic) \
           AND m.available_at <= ?3 AND m.parked_by IS NULL \
           AND (m.locked_until IS NULL OR m.locked_until < ?3) \
           AND NOT EXISTS (SELECT 1 FROM outbox_dead d \
                           WHERE d.ordering_key = h.k AND d.seq < h.seq AND d.releases_key = 0) \
           AND (m.retried_release = 0 \
                OR NOT EXISTS (SELECT 1 FROM outbox_messages l \
                               WHERE l.ordering_key = h.k AND l.seq > h.seq AND l.locked_until >= ?3)) \
         LIMIT ?7) \
     RETURNING id, topic, payload, version, idempotency_key, attempts, created_at, last_error, ordering_key, \
               seq, releases_key, traceparent, tracestate"
);

/// The handlers of the messages `?1` (a JSON array) that already succeeded.
const DELIVERY_COMPLETED: &str = "SELECT message_id, handler FROM outbox_deliveries WHERE message_id IN (SELECT value FROM json_each(?1))";

/// What one backend's claims remember from one call to the next.
pub(super) struct ClaimState {
    /// The greatest ordering key of this backend's last claim of ordered messages: the next
    /// one walks the keys after it first.
    cursor: Mutex<Option<String>>,
    /// Whether the next claim takes ordered messages before unordered ones.
    keyed_first: AtomicBool,
    /// When the claim last walked every key.
    walked: Mutex<Instant>,
}

impl ClaimState {
    pub(super) fn new() -> Self {
        Self {
            cursor: Mutex::new(None),
            keyed_first: AtomicBool::new(false),
            walked: Mutex::new(Instant::now()),
        }
    }
}

/// Claims up to `p.limit` ready messages of `p.topics`.
pub(super) async fn batch(b: &SqliteBackend, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
    let now = now_ms();
    let mut out = Vec::new();
    // Ordered and unordered messages take turns at going first, so neither kind can keep
    // the other out of full batches.
    let keyed_first = !b
        .claims
        .keyed_first
        .fetch_xor(true, AtomicOrdering::Relaxed);
    // The heads of the keys this worker just released first; while there are such keys,
    // the walk over every key runs only every RELEASED_WALK_INTERVAL.
    if !p.released.is_empty() {
        keyed(b, p, now, true, &mut out).await?;
    }
    let walk = p.released.is_empty()
        || b.claims
            .walked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
            >= RELEASED_WALK_INTERVAL;
    if keyed_first && walk {
        keyed(b, p, now, false, &mut out).await?;
    }
    unkeyed(&b.pool, p, now, &mut out).await?;
    if !keyed_first && walk {
        keyed(b, p, now, false, &mut out).await?;
    }
    Ok(out)
}

/// Claims unordered messages into `out` up to the rest of the batch ([`CLAIM_UNKEYED`]), topic
/// by topic.
async fn unkeyed(
    pool: &SqlitePool,
    p: &ClaimParams<'_>,
    now: i64,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    let token = p.claim_token.to_string();
    let worker = p.worker.to_string();
    for (topic, version) in p.topics.iter().zip(p.versions) {
        let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
        if want <= 0 {
            break;
        }
        let rows = sqlx::query(CLAIM_UNKEYED)
            .bind(&token)
            .bind(&worker)
            .bind(now)
            .bind(ms(p.lease))
            .bind(*topic)
            .bind(want)
            .bind(version)
            .fetch_all(pool)
            .await?;
        for r in rows {
            out.push(claimed(&r, p.claim_token)?);
        }
    }
    Ok(())
}

/// Claims heads of keys into `out` up to the rest of the batch: walking every key from the
/// one after the key this backend claimed last ([`CLAIM_KEYED`]), so keys take turns, or, with
/// `released`, the heads of `p.released` only ([`CLAIM_RELEASED`]), leaving the cursor alone.
async fn keyed(
    b: &SqliteBackend,
    p: &ClaimParams<'_>,
    now: i64,
    released: bool,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
    if want <= 0 {
        return Ok(());
    }
    let s = &b.claims;
    let cursor = s
        .cursor
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_default();
    let topics: serde_json::Map<String, serde_json::Value> = p
        .topics
        .iter()
        .zip(p.versions)
        .map(|(t, v)| ((*t).to_owned(), (*v).into()))
        .collect();
    let topics = serde_json::Value::Object(topics).to_string();
    if !released {
        *s.walked.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
    let (sql, fifth) = if released {
        let keys: Vec<&str> = p.released.iter().map(|k| &**k).collect();
        (
            CLAIM_RELEASED,
            serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into()),
        )
    } else {
        (CLAIM_KEYED, cursor)
    };
    let rows = sqlx::query(sql)
        .bind(p.claim_token.to_string())
        .bind(p.worker.to_string())
        .bind(now)
        .bind(ms(p.lease))
        .bind(fifth)
        .bind(topics)
        .bind(want)
        .fetch_all(&b.pool)
        .await?;
    let mut last_key: Option<String> = None;
    for r in rows {
        let key: Option<String> = r.try_get("ordering_key")?;
        if let Some(key) = key {
            if last_key.as_ref().is_none_or(|last| key > *last) {
                last_key = Some(key);
            }
        }
        out.push(claimed(&r, p.claim_token)?);
    }
    if last_key.is_some() && !released {
        *s.cursor.lock().unwrap_or_else(PoisonError::into_inner) = last_key;
    }
    Ok(())
}

/// The handlers that already succeeded for these messages.
pub(super) async fn delivery_completed(
    pool: &SqlitePool,
    message_ids: &[Uuid],
) -> Result<Vec<(Uuid, String)>> {
    let rows: Vec<(String, String)> = sqlx::query_as(DELIVERY_COMPLETED)
        .bind(uuids(message_ids))
        .fetch_all(pool)
        .await?;
    rows.into_iter()
        .map(|(id, h)| Ok((parse_uuid(&id)?, h)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::from)
}

/// A claimed row as the worker sees it.
pub(super) fn claimed(r: &SqliteRow, claim_token: Uuid) -> Result<ClaimedMessage, sqlx::Error> {
    let created: i64 = r.try_get("created_at")?;
    // Only the claim of ordered messages returns the key.
    let ordered: Option<String> = r.try_get("ordering_key").unwrap_or(None);
    Ok(ClaimedMessage {
        id: parse_uuid(r.try_get("id")?)?,
        topic: r.try_get("topic")?,
        payload: r.try_get("payload")?,
        version: u32::try_from(r.try_get::<i64, _>("version")?).unwrap_or(1),
        idempotency_key: r.try_get("idempotency_key")?,
        attempts: r.try_get("attempts")?,
        created_at: time(created),
        claim_token,
        last_error: r.try_get("last_error")?,
        seq: match ordered {
            Some(_) => Some(r.try_get("seq")?),
            None => None,
        },
        releases_key: ordered.is_some() && r.try_get::<bool, _>("releases_key")?,
        key: ordered.map(Arc::from),
        trace: r
            .try_get::<Option<String>, _>("traceparent")?
            .map(|p| crate::trace::TraceContext::new(p, r.try_get("tracestate").unwrap_or(None))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::from;

    /// Both claims of heads decide and write alike; only where their keys come from differs.
    #[test]
    fn both_claims_of_heads_claim_alike() {
        let tail = from(CLAIM_KEYED, "heads(k, seq) AS (");
        assert!(!tail.is_empty());
        assert_eq!(tail, from(CLAIM_RELEASED, "heads(k, seq) AS ("));
    }
}
