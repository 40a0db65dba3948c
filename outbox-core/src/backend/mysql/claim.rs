//! Claims: unordered messages, the heads of ordering keys, and the handlers a claimed message
//! already passed.
//!
//! Every claim is one short READ COMMITTED transaction: a `SELECT ... FOR UPDATE SKIP LOCKED`
//! that reads and locks the rows it takes, an `UPDATE` of those rows by primary key that
//! counts the attempt and takes the lease, and the commit. The attempt is counted in the
//! update and in the row handed to the worker alike (the select read it one lower).
//!
//! Unordered messages are read on `outbox_messages_ready_idx (topic, ordering_key,
//! available_at)`: the equalities `topic = ?` and `ordering_key IS NULL` then the order column,
//! so InnoDB reads candidates in due order, never sorts them, and stops at the limit. A
//! running row (its lease still running) is read and let go again: at READ COMMITTED, InnoDB
//! keeps no lock on a row that fails the `WHERE`.
//!
//! Ordered messages are claimed through the heads of their keys (each key's live message with
//! the smallest `seq`, the number InnoDB gave it at insert), found on `outbox_messages_key_idx
//! (ordering_key, seq)`: the walk over every key by a loose index scan (`GROUP BY ordering_key`
//! with `MIN(seq)`), the heads of the keys a worker just released by one probe each (`ORDER BY
//! seq LIMIT 1`), which reads one entry whatever the optimizer's statistics say. A page of heads
//! is first checked without locks (due, not running, no earlier message of the key live, not
//! behind a dead letter that holds the key), in one consistent read; the heads that pass are
//! then locked by primary key with `SKIP LOCKED`, checked for what another worker may have
//! changed since (due, not running), and checked once more without locks for an earlier
//! message or a dead letter of their key, which a retry committed between those statements
//! may have brought. A later message of a key is never a head while an earlier one is live, so
//! two workers never start two messages of one key.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use sqlx::mysql::MySqlRow;
use sqlx::Row;
use uuid::Uuid;

use super::{ms, now_ms, retrying, time, with_list, MySqlBackend};
use crate::backend::{ClaimParams, ClaimedMessage, RELEASED_WALK_INTERVAL};
use crate::error::Result;

/// The columns a claim hands to the worker, as the locking select reads them.
macro_rules! claimed_columns {
    () => {
        "id, topic, payload, version, idempotency_key, attempts, created_at, last_error, \
         ordering_key, seq, releases_key, traceparent, tracestate"
    };
}

/// Up to `?` (third) unordered messages of topic `?` (first) with a version at most `?`
/// (second), due and not running, in due order, locked; rows another claim holds are skipped.
pub(super) const CLAIM_UNKEYED: &str = concat!(
    "SELECT ",
    claimed_columns!(),
    " FROM outbox_messages FORCE INDEX (outbox_messages_ready_idx) \
     WHERE topic = ? AND ordering_key IS NULL AND parked_by IS NULL AND available_at <= ",
    now_ms!(),
    " AND (locked_until IS NULL OR locked_until < ",
    now_ms!(),
    ") AND version <= ? \
     ORDER BY available_at LIMIT ? \
     FOR UPDATE SKIP LOCKED"
);

/// Counts the attempt of the locked rows `{list}` and leases them under claim token `?` to
/// worker `?` for `?` ms (the first three parameters).
const TAKE: &str = concat!(
    "UPDATE outbox_messages SET attempts = attempts + 1, claim_token = ?, claimed_by = ?, \
     locked_until = ",
    now_ms!(),
    " + ? WHERE id IN ({list})"
);

/// One page of the walk over every key: the keys after the key `?`, up to `$bound` (nothing,
/// or `AND ... <= ?`), in key order, each with its head (its live message with the smallest
/// `seq`, the number InnoDB gave it at insert).
///
/// The first row is a probe: the first entry of `outbox_messages_key_idx (ordering_key, seq)`
/// after the key, which is the next key and its head, one entry read. Then up to `?` keys by
/// `GROUP BY ordering_key` with `MIN(seq)` on that index: a loose index scan, one probe per key,
/// where the optimizer picks it (MySQL 8 is told to by `GROUP_INDEX`; MariaDB has no such
/// hint). On the statistics of a nearly empty table, as an outbox table's usually are,
/// MariaDB may pick a range scan over every message of those keys instead, so there the
/// statement stops after `ROWS EXAMINED` entries (in a comment only MariaDB runs) and returns
/// what it has: the probe row at least, so a walk moves on by one key a page however its
/// plan goes. A group cut short still has its true head, as the index is read in `(key, seq)`
/// order, but the walk keeps the last group of a short page only where the probe confirms it.
macro_rules! walk_page {
    ($bound:literal) => {
        concat!(
            "(SELECT CAST(0 AS SIGNED) AS part, ordering_key, seq \
              FROM outbox_messages FORCE INDEX (outbox_messages_key_idx) \
              WHERE ordering_key > ?",
            $bound,
            " ORDER BY ordering_key, seq LIMIT 1) \
             UNION ALL \
             (SELECT /*+ GROUP_INDEX(outbox_messages outbox_messages_key_idx) */ \
                     CAST(1 AS SIGNED), ordering_key, MIN(seq) \
              FROM outbox_messages FORCE INDEX (outbox_messages_key_idx) \
              WHERE ordering_key > ?",
            $bound,
            " GROUP BY ordering_key ORDER BY ordering_key LIMIT ?) \
             /*M! LIMIT ROWS EXAMINED 2000 */"
        )
    };
}

/// A page of the walk after the key `?` (the first two), up to `?` (third) keys.
pub(super) const WALK_AFTER: &str = walk_page!("");

/// A page of the walk's wrap-around: after the key `?` and up to the key `?` where the walk
/// started (first and second, again third and fourth), up to `?` (fifth) keys.
const WALK_UP_TO: &str = walk_page!(" AND ordering_key <= ?");

/// The head of key `?` (its live message with the smallest `seq`), if it has one: one probe of
/// `outbox_messages_key_idx` in the index's own order, one entry read however many messages
/// the key holds and whatever the table's statistics say. (`MIN(seq)` with `GROUP BY` is a
/// loose index scan only where the optimizer picks it; on the statistics of a nearly empty
/// table, as an outbox table's usually are, it read every message of the key, and one key of
/// 20,000 messages drained ever slower.) The heads of several keys are this, once per key,
/// joined by `UNION ALL`.
pub(super) const KEY_HEAD: &str = "(SELECT ordering_key, seq FROM outbox_messages \
     FORCE INDEX (outbox_messages_key_idx) WHERE ordering_key = ? ORDER BY seq LIMIT 1)";

/// Which of the messages whose `$column` is in `{list}` may start as their key's head, read
/// without locks: due, not running, no earlier message of the key live, not behind a dead
/// letter that holds the key, and, for a retried dead letter that had released its key, no
/// later message of the key running. With topic and version, for the worker's own checks.
macro_rules! startable {
    ($column:literal) => {
        concat!(
            "SELECT m.id, m.topic, m.version FROM outbox_messages m \
             WHERE m.",
            $column,
            " IN ({list}) AND m.parked_by IS NULL AND m.available_at <= ",
            now_ms!(),
            " AND (m.locked_until IS NULL OR m.locked_until < ",
            now_ms!(),
            ") AND NOT EXISTS (SELECT 1 FROM outbox_messages e \
                               WHERE e.ordering_key = m.ordering_key AND e.seq < m.seq) \
               AND NOT EXISTS (SELECT 1 FROM outbox_dead d \
                               WHERE d.ordering_key = m.ordering_key AND d.releases_key = FALSE \
                                 AND d.seq < m.seq) \
               AND (m.retried_release = FALSE \
                    OR NOT EXISTS (SELECT 1 FROM outbox_messages l \
                                   WHERE l.ordering_key = m.ordering_key AND l.seq > m.seq \
                                     AND l.locked_until >= ",
            now_ms!(),
            "))"
        )
    };
}

/// Which of the heads `{list}` (their `seq`) may start ([`startable!`]).
const STARTABLE: &str = startable!("seq");

/// Which of the locked heads `{list}` (their ids) still may start ([`startable!`]), read
/// after the lock: the walk, the first check and the lock are statements of their own, and
/// an operator's retry of a dead letter may commit between them (the dead letter becomes a
/// live message of the key, earlier than the head the walk found). Read again once the head
/// is locked, the key is seen either before that commit (the dead letter holds the key) or
/// after it (an earlier message is live): either way the head waits.
const STILL_STARTABLE: &str = startable!("id");

/// The heads `{list}` locked, if still due and not running; rows another claim holds are
/// skipped.
const LOCK_HEADS: &str = concat!(
    "SELECT ",
    claimed_columns!(),
    " FROM outbox_messages WHERE id IN ({list}) AND parked_by IS NULL AND available_at <= ",
    now_ms!(),
    " AND (locked_until IS NULL OR locked_until < ",
    now_ms!(),
    ") FOR UPDATE SKIP LOCKED"
);

/// The handlers of the messages `{list}` that already succeeded.
const DELIVERY_COMPLETED: &str =
    "SELECT message_id, handler FROM outbox_deliveries WHERE message_id IN ({list})";

/// Heads looked at per page of the walk over every key, at least.
const WALK_PAGE: i64 = 100;

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
pub(super) async fn batch(b: &MySqlBackend, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
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
        let keys: Vec<&str> = p.released.iter().map(|k| &**k).collect();
        let heads = released_heads(b, &keys).await?;
        take_heads(b, p, &heads, &mut out).await?;
    }
    let walk = p.released.is_empty()
        || b.claims
            .walked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
            >= RELEASED_WALK_INTERVAL;
    if keyed_first && walk {
        walk_keys(b, p, &mut out).await?;
    }
    unkeyed(b, p, &mut out).await?;
    if !keyed_first && walk {
        walk_keys(b, p, &mut out).await?;
    }
    Ok(out)
}

/// What is left of the batch.
fn room(p: &ClaimParams<'_>, out: &[ClaimedMessage]) -> i64 {
    p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX)
}

/// Claims unordered messages into `out` up to the rest of the batch ([`CLAIM_UNKEYED`]),
/// topic by topic, one transaction each.
async fn unkeyed(
    b: &MySqlBackend,
    p: &ClaimParams<'_>,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    for (topic, version) in p.topics.iter().zip(p.versions) {
        let want = room(p, out);
        if want <= 0 {
            break;
        }
        let rows = retrying("claim", || async {
            let mut tx = b.begin().await?;
            let rows = sqlx::query(CLAIM_UNKEYED)
                .bind(*topic)
                .bind(*version)
                .bind(want)
                .fetch_all(&mut *tx)
                .await?;
            take(&mut tx, p, &rows).await?;
            tx.commit().await?;
            Ok(rows)
        })
        .await?;
        for r in &rows {
            out.push(claimed(r, p.claim_token)?);
        }
    }
    Ok(())
}

/// Counts the attempt of the locked `rows` and leases them ([`TAKE`]).
async fn take(
    tx: &mut sqlx::MySqlConnection,
    p: &ClaimParams<'_>,
    rows: &[MySqlRow],
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut q = sqlx::query(with_list(TAKE, rows.len()))
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(ms(p.lease));
    for r in rows {
        q = q.bind(r.try_get::<Uuid, _>("id")?);
    }
    q.execute(&mut *tx).await?;
    Ok(())
}

/// The heads of `keys` ([`KEY_HEAD`] for each).
async fn released_heads(b: &MySqlBackend, keys: &[&str]) -> Result<Vec<(String, i64)>> {
    let sql = vec![KEY_HEAD; keys.len()].join(" UNION ALL ");
    let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
    for k in keys {
        q = q.bind(*k);
    }
    Ok(q.fetch_all(&b.pool).await?)
}

/// Walks every key from the one after the key this backend claimed last, wrapping around,
/// a page of heads at a time, claiming those that may start, until the batch is full or every
/// key was looked at; then remembers the greatest key claimed, so keys take turns.
async fn walk_keys(
    b: &MySqlBackend,
    p: &ClaimParams<'_>,
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    if room(p, out) <= 0 {
        return Ok(());
    }
    *b.claims
        .walked
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    let cursor = b
        .claims
        .cursor
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
        .unwrap_or_default();
    let start = out.len();
    // First the keys after the cursor, then from the first key up to the cursor. A page
    // that comes back empty ends its part of the walk.
    let mut after = cursor.clone();
    let mut wrapped = false;
    loop {
        let want = room(p, out);
        if want <= 0 {
            break;
        }
        let page = (want * 2).max(WALK_PAGE);
        let rows: Vec<(i64, String, i64)> = if wrapped {
            sqlx::query_as(WALK_UP_TO)
                .bind(&after)
                .bind(&cursor)
                .bind(&after)
                .bind(&cursor)
                .bind(page)
                .fetch_all(&b.pool)
                .await?
        } else {
            sqlx::query_as(WALK_AFTER)
                .bind(&after)
                .bind(&after)
                .bind(page)
                .fetch_all(&b.pool)
                .await?
        };
        let heads = page_heads(rows, page);
        match heads.last().map(|(k, _)| k.clone()) {
            Some(last) => {
                take_heads(b, p, &heads, out).await?;
                if wrapped && last == cursor {
                    break;
                }
                after = last;
            }
            None if wrapped || cursor.is_empty() => break,
            None => {
                wrapped = true;
                after = String::new();
            }
        }
    }
    let greatest = out[start..]
        .iter()
        .filter_map(|m| m.key.as_deref())
        .max()
        .map(str::to_owned);
    if greatest.is_some() {
        *b.claims
            .cursor
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = greatest;
    }
    Ok(())
}

/// The heads of a page of the walk ([`walk_page!`]), in key order, from its rows (part,
/// key, head): the probe's (part 0) first, then the groups (part 1) of other keys; of a page
/// cut short (fewer than `page` groups), all groups but the last, whose key the next page's
/// probe reads again.
fn page_heads(rows: Vec<(i64, String, i64)>, page: i64) -> Vec<(String, i64)> {
    let Some(probe) = rows
        .iter()
        .find(|(part, ..)| *part == 0)
        .map(|(_, k, h)| (k.clone(), *h))
    else {
        return Vec::new();
    };
    let mut groups: Vec<(String, i64)> = rows
        .into_iter()
        .filter(|(part, ..)| *part == 1)
        .map(|(_, k, h)| (k, h))
        .collect();
    if i64::try_from(groups.len()).unwrap_or(i64::MAX) < page {
        groups.pop();
    }
    let probe_key = probe.0.clone();
    let mut heads = vec![probe];
    heads.extend(groups.into_iter().filter(|(k, _)| *k != probe_key));
    heads
}

/// Claims into `out`, up to the rest of the batch, those of `heads` that may start
/// ([`STARTABLE`]) and are of the worker's topics and versions, locking them
/// ([`LOCK_HEADS`]), checking them again ([`STILL_STARTABLE`]) and leasing those that pass
/// ([`TAKE`]) in one transaction.
async fn take_heads(
    b: &MySqlBackend,
    p: &ClaimParams<'_>,
    heads: &[(String, i64)],
    out: &mut Vec<ClaimedMessage>,
) -> Result<()> {
    if heads.is_empty() || room(p, out) <= 0 {
        return Ok(());
    }
    let mut q = sqlx::query_as(with_list(STARTABLE, heads.len()));
    for (_, seq) in heads {
        q = q.bind(*seq);
    }
    let startable: Vec<(Uuid, String, i32)> = q.fetch_all(&b.pool).await?;
    let mut ids: Vec<Uuid> = startable
        .into_iter()
        .filter(|(_, topic, version)| {
            p.topics
                .iter()
                .position(|t| t == topic)
                .is_some_and(|i| p.versions.get(i).is_some_and(|max| version <= max))
        })
        .map(|(id, _, _)| id)
        .collect();
    ids.sort_unstable();
    ids.truncate(usize::try_from(room(p, out)).unwrap_or(0));
    if ids.is_empty() {
        return Ok(());
    }
    let rows = retrying("claim", || async {
        let mut tx = b.begin().await?;
        let mut q = sqlx::query(with_list(LOCK_HEADS, ids.len()));
        for id in &ids {
            q = q.bind(*id);
        }
        let locked = q.fetch_all(&mut *tx).await?;
        let rows = if locked.is_empty() {
            locked
        } else {
            let mut q = sqlx::query_as(with_list(STILL_STARTABLE, locked.len()));
            for r in &locked {
                q = q.bind(r.try_get::<Uuid, _>("id")?);
            }
            let still: Vec<(Uuid, String, i32)> = q.fetch_all(&mut *tx).await?;
            let mut rows = Vec::with_capacity(still.len());
            for r in locked {
                let id: Uuid = r.try_get("id")?;
                if still.iter().any(|(s, ..)| *s == id) {
                    rows.push(r);
                }
            }
            rows
        };
        take(&mut tx, p, &rows).await?;
        tx.commit().await?;
        Ok(rows)
    })
    .await?;
    for r in &rows {
        out.push(claimed(r, p.claim_token)?);
    }
    Ok(())
}

/// The handlers that already succeeded for these messages.
pub(super) async fn delivery_completed(
    b: &MySqlBackend,
    message_ids: &[Uuid],
) -> Result<Vec<(Uuid, String)>> {
    if message_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sqlx::query_as(with_list(DELIVERY_COMPLETED, message_ids.len()));
    for id in message_ids {
        q = q.bind(*id);
    }
    Ok(q.fetch_all(&b.pool).await?)
}

/// A claimed row as the worker sees it, its attempt counted.
pub(super) fn claimed(r: &MySqlRow, claim_token: Uuid) -> Result<ClaimedMessage, sqlx::Error> {
    let created: i64 = r.try_get("created_at")?;
    let key: Option<String> = r.try_get("ordering_key")?;
    Ok(ClaimedMessage {
        id: r.try_get("id")?,
        topic: r.try_get("topic")?,
        payload: r.try_get("payload")?,
        version: u32::try_from(r.try_get::<i32, _>("version")?).unwrap_or(1),
        idempotency_key: r.try_get("idempotency_key")?,
        attempts: r.try_get::<i32, _>("attempts")?.saturating_add(1),
        created_at: time(created),
        claim_token,
        last_error: r.try_get("last_error")?,
        seq: match key {
            Some(_) => Some(r.try_get("seq")?),
            None => None,
        },
        releases_key: key.is_some() && r.try_get::<bool, _>("releases_key")?,
        key: key.map(Arc::from),
        trace: r
            .try_get::<Option<String>, _>("traceparent")?
            .map(|p| crate::trace::TraceContext::new(p, r.try_get("tracestate").unwrap_or(None))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head's place in its key's order.
    fn id(n: i64) -> i64 {
        n
    }

    #[test]
    fn a_page_of_the_walk_puts_the_probe_first_and_drops_the_last_group_of_a_short_page() {
        let rows = vec![
            (0, "a".to_string(), id(1)),
            (1, "a".to_string(), id(1)),
            (1, "b".to_string(), id(5)),
            (1, "c".to_string(), id(9)),
        ];
        // Three groups of a page of 100: cut short (or the last keys); "c" waits for the next
        // page's probe.
        assert_eq!(
            page_heads(rows.clone(), 100),
            vec![("a".to_string(), id(1)), ("b".to_string(), id(5))]
        );
        // A full page keeps every group.
        assert_eq!(
            page_heads(rows, 3),
            vec![
                ("a".to_string(), id(1)),
                ("b".to_string(), id(5)),
                ("c".to_string(), id(9))
            ]
        );
        // A page cut before any group ended still moves on by the probe's key.
        assert_eq!(
            page_heads(vec![(0, "a".to_string(), id(1))], 100),
            vec![("a".to_string(), id(1))]
        );
        assert!(page_heads(Vec::new(), 100).is_empty());
    }
}
