//! Every SQL statement for PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::schema::{self, Migration};
use super::selection;
use super::{
    Backend, Beat, ClaimParams, ClaimedMessage, Done, Failure, Fence, Wake, WakeupListener,
};
use crate::__private::NewMessage;
use crate::error::Result;
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

/// The channel producers notify when a worker is waiting.
pub(crate) const WAKEUP_CHANNEL: &str = "outbox_wakeup";

/// The advisory lock key that serialises migrations ("outbox" in ASCII).
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78;

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox messages, deliveries and workers",
        sql: include_str!("../../migrations/postgres/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "processed-id records",
        sql: include_str!("../../migrations/postgres/0002_processed.sql"),
    },
    Migration {
        version: 3,
        description: "partial indexes for operations",
        sql: include_str!("../../migrations/postgres/0003_ops_indexes.sql"),
    },
    Migration {
        version: 4,
        description: "live rows only: UUID keys, HOT claims, deleted when done, dead letters apart",
        sql: include_str!("../../migrations/postgres/0004_live_rows.sql"),
    },
    Migration {
        version: 5,
        description: "dead letters counted per topic",
        sql: include_str!("../../migrations/postgres/0005_dead_counts.sql"),
    },
    Migration {
        version: 6,
        description: "ordering keys: per-key order, dead letters that hold their key",
        sql: include_str!("../../migrations/postgres/0006_ordering_keys.sql"),
    },
    Migration {
        version: 7,
        description: "trace context (W3C traceparent and tracestate) of messages and dead letters",
        sql: include_str!("../../migrations/postgres/0007_trace_context.sql"),
    },
];

/// Columns of [`MessageInfo`], from either the live or the dead table (`status` and the
/// time columns are computed by each query).
fn message_info(r: &sqlx::postgres::PgRow) -> Result<MessageInfo, sqlx::Error> {
    Ok(MessageInfo {
        id: r.try_get("id")?,
        topic: r.try_get("topic")?,
        status: {
            let status: String = r.try_get("status")?;
            status
                .parse()
                .map_err(|e| sqlx::Error::Decode(Box::new(e)))?
        },
        attempts: r.try_get("attempts")?,
        payload: r.try_get("payload")?,
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
        available_at: r.try_get("available_at")?,
        processed_at: r.try_get("processed_at")?,
        idempotency_key: r.try_get("idempotency_key")?,
        ordering_key: r.try_get("ordering_key")?,
        handlers_done: Vec::new(),
    })
}

const DEAD_COLUMNS: &str =
    "id, topic, 'dead' AS status, attempts, payload::text AS payload, last_error, \
     created_at, dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key";

fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(crate) struct PgBackend {
    pool: PgPool,
    /// The greatest ordering key of this backend's last claim that took ordered messages: the
    /// next claim walks the keys after it first.
    cursor: std::sync::Mutex<Option<String>>,
    /// Whether the next claim takes ordered messages before unordered ones.
    keyed_first: AtomicBool,
    /// Ordered messages were live at the last look (or it is not known): claims look for them.
    keyed_present: AtomicBool,
    /// When the claim last walked every key.
    walked: std::sync::Mutex<Instant>,
    /// When a done write last claimed the next messages of the keys it released.
    chained: std::sync::Mutex<Option<Instant>>,
    /// How long after the last walk the next one runs while keys are released or chained:
    /// from RELEASED_WALK_INTERVAL, doubled after each walk that found nothing.
    walk_gap: std::sync::Mutex<std::time::Duration>,
}

impl PgBackend {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            cursor: std::sync::Mutex::new(None),
            keyed_first: AtomicBool::new(false),
            keyed_present: AtomicBool::new(true),
            walked: std::sync::Mutex::new(Instant::now()),
            chained: std::sync::Mutex::new(None),
            walk_gap: std::sync::Mutex::new(super::RELEASED_WALK_INTERVAL),
        }
    }

    /// Claims up to `limit` unordered messages into `out`; returns how many, and notes
    /// whether ordered messages are live.
    ///
    /// Per topic, the index gives rows in due order; running rows whose lease still runs are
    /// skipped on the heap, and the outer LIMIT stops the lateral scan as soon as the batch is
    /// full. Rows of topics not asked for are never read, and ordered rows are not in that
    /// index. The UPDATE writes no indexed column, so PostgreSQL can keep it on the row's page
    /// without new index entries.
    ///
    /// The claim commits without waiting for its WAL flush (`synchronous_commit` off for this
    /// one transaction, set where the topic list is read, which the lateral scan needs first).
    /// A claim lost in a server crash only hands the message out again, which at-least-once
    /// allows; outcomes (done, failed, dead) still commit durably.
    // Both claims update the picked rows through `ctid = ANY(ARRAY(...))`, a TID scan that
    // goes straight to the rows the scan above locked: joined to the CTE instead, a batch of a
    // few hundred made PostgreSQL hash the whole table (a sequential scan per claim, growing
    // with the backlog: 8.9 ms against 3.6 ms for 1,000 of 30,000 rows), and a primary-key
    // probe per row (`id = ANY(...)`) cost 3.3 ms against 2.6 ms for the TID scan. The row
    // locks make the TIDs safe to use: nobody can move a row this statement has locked.
    async fn claim_unkeyed(
        &self,
        p: &ClaimParams<'_>,
        limit: i64,
        out: &mut Vec<ClaimedMessage>,
    ) -> Result<usize> {
        let rows = sqlx::query(
            "WITH picked AS ( \
                SELECT c.ctid \
                FROM unnest(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                                 THEN $1::text[] END) AS t(topic) \
                CROSS JOIN LATERAL ( \
                    SELECT ctid FROM outbox_messages \
                    WHERE topic = t.topic AND ordering_key IS NULL AND available_at <= now() \
                      AND (locked_until IS NULL OR locked_until < now()) \
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
             RETURNING m.id, m.topic, m.payload::text AS payload, m.idempotency_key, \
                       m.attempts, m.created_at, m.last_error, m.traceparent, m.tracestate, \
                       EXISTS (SELECT 1 FROM outbox_messages k WHERE k.ordering_key IS NOT NULL) AS any_keyed",
        )
        .bind(p.topics)
        .bind(limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .fetch_all(&self.pool)
        .await?;
        let mut any_keyed = false;
        for r in &rows {
            any_keyed |= r.try_get::<bool, _>("any_keyed")?;
            out.push(claimed(r, p.claim_token, false)?);
        }
        if !rows.is_empty() {
            self.keyed_present.store(any_keyed, AtomicOrdering::Relaxed);
        }
        Ok(rows.len())
    }

    /// Claims up to `limit` ordered messages into `out`: the heads of their keys (each key's
    /// live message with the smallest id) that are due, not running, of a topic asked for, and
    /// not behind a dead letter that holds the key.
    ///
    /// The claim walks the key index from key to key, one probe per key (a loose index scan).
    /// A later row of a key is never a head while an earlier one exists, locked or not, so two
    /// workers can never start two messages of one key. The walk starts after the key this
    /// backend claimed last and wraps around, so keys take turns.
    async fn claim_keyed(
        &self,
        p: &ClaimParams<'_>,
        limit: i64,
        out: &mut Vec<ClaimedMessage>,
    ) -> Result<()> {
        let cursor = self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_default();
        *locked(&self.walked) = Instant::now();
        let rows = heads_query(
            concat!(
                "WITH RECURSIVE after_cursor(k, id) AS ( \
                (SELECT ordering_key, id FROM outbox_messages \
                 WHERE ordering_key > $6 ORDER BY ordering_key, id LIMIT 1) \
                UNION ALL \
                SELECT n.ordering_key, n.id FROM after_cursor a CROSS JOIN LATERAL ( \
                    SELECT ordering_key, id FROM outbox_messages \
                    WHERE ordering_key > a.k ORDER BY ordering_key, id LIMIT 1) n \
             ), up_to_cursor(k, id) AS ( \
                (SELECT ordering_key, id FROM outbox_messages \
                 WHERE ordering_key IS NOT NULL AND ordering_key <= $6 \
                 ORDER BY ordering_key, id LIMIT 1) \
                UNION ALL \
                SELECT n.ordering_key, n.id FROM up_to_cursor a CROSS JOIN LATERAL ( \
                    SELECT ordering_key, id FROM outbox_messages \
                    WHERE ordering_key > a.k AND ordering_key <= $6 \
                    ORDER BY ordering_key, id LIMIT 1) n \
             ), heads AS ( \
                SELECT k, id FROM after_cursor UNION ALL SELECT k, id FROM up_to_cursor \
             ), ",
                claim_heads!()
            ),
            p,
            limit,
        )
        .bind(&cursor)
        .fetch_all(&self.pool)
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
            let mut gap = locked(&self.walk_gap);
            *gap = if rows.is_empty() {
                (*gap * 2).min(super::CHAINED_WALK_INTERVAL)
            } else {
                super::RELEASED_WALK_INTERVAL
            };
        }
        // Keys compare byte-wise in the database ("C" collation) as Rust strings do.
        if last_key.is_some() {
            self.keyed_present.store(true, AtomicOrdering::Relaxed);
            *self
                .cursor
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = last_key;
        }
        Ok(())
    }

    /// Claims into `out` the heads of `p.released`, the keys this worker's done writes just
    /// released, on the same terms as [`claim_keyed`](Self::claim_keyed) but one probe per
    /// released key instead of a walk over every key: a worker whose keys all run walks
    /// a thousand keys to find the few just released.
    async fn claim_released(
        &self,
        p: &ClaimParams<'_>,
        limit: i64,
        out: &mut Vec<ClaimedMessage>,
    ) -> Result<()> {
        let keys: Vec<&str> = p.released.iter().map(|k| &**k).collect();
        let rows = heads_query(
            concat!(
                "WITH heads AS ( \
                SELECT r.k, h.id FROM unnest((SELECT $6::text[])) AS r(k) \
                CROSS JOIN LATERAL ( \
                    SELECT id FROM outbox_messages \
                    WHERE ordering_key = r.k ORDER BY ordering_key, id LIMIT 1) h \
             ), ",
                claim_heads!()
            ),
            p,
            limit,
        )
        .bind(keys)
        .fetch_all(&self.pool)
        .await?;
        for r in &rows {
            out.push(claimed(r, p.claim_token, true)?);
        }
        if !rows.is_empty() {
            self.keyed_present.store(true, AtomicOrdering::Relaxed);
        }
        Ok(())
    }
}

/// The rest of both claims of ordered messages, after their CTE `heads(k, id)` (a key and the
/// id of its head): the heads that may start, locked and claimed. `$1` topics, `$2` limit, `$3`
/// claim token, `$4` worker, `$5` lease in seconds.
macro_rules! claim_heads {
    () => {
        concat!("picked AS ( \
            SELECT m.ctid FROM heads h JOIN outbox_messages m ON m.id = h.id \
            WHERE m.topic = ANY(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                                     THEN $1::text[] END) \
              AND ", head_may_start!(), " \
            LIMIT $2 \
            FOR UPDATE OF m SKIP LOCKED \
         ) \
         UPDATE outbox_messages m \
         SET attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, \
             locked_until = now() + make_interval(secs => $5) \
         WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM picked)) \
         RETURNING ", head_columns!())
    };
}
use claim_heads;

/// The terms on which a key's head `m` may start, besides its topic: due, not running, and
/// not behind a dead letter that holds its key. Both claims of ordered messages (the claim's
/// and the done write's) use them.
///
/// The first, uncorrelated test (no dead letter holds any key) is evaluated once per
/// statement, from the partial index of such letters; only when one exists is each head
/// checked against its own key. With no such letter, which is the usual case, the planner
/// would otherwise probe `outbox_dead` once per head (a scan of the empty table when its
/// statistics say it is empty), some 8 % of a key step on the server.
macro_rules! head_may_start {
    () => {
        "m.available_at <= now() \
         AND (m.locked_until IS NULL OR m.locked_until < now()) \
         AND (NOT EXISTS (SELECT 1 FROM outbox_dead \
                          WHERE ordering_key IS NOT NULL AND NOT releases_key) \
              OR NOT EXISTS (SELECT 1 FROM outbox_dead d \
                             WHERE d.ordering_key = m.ordering_key AND d.id < m.id \
                               AND NOT d.releases_key))"
    };
}
use head_may_start;

/// The columns a claim of ordered messages returns, as [`claimed`] reads them.
macro_rules! head_columns {
    () => {
        "m.id, m.topic, m.payload::text AS payload, m.idempotency_key, \
         m.attempts, m.created_at, m.last_error, m.ordering_key, m.traceparent, m.tracestate"
    };
}
use head_columns;

/// A claim of ordered messages (its SQL ends in [`claim_heads`]) with its first five
/// parameters bound; the caller binds `$6`, what its `heads` are made from.
fn heads_query<'q>(
    sql: &'static str,
    p: &'q ClaimParams<'_>,
    limit: i64,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(p.topics)
        .bind(limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
}

/// The done write's CTEs: `del` (the done messages deleted, each only under its claim token),
/// their done counts and their per-handler progress deleted. A worker's writes in flight at
/// once add to the same count rows, so they lock them in one order (by topic): the later waits
/// for the earlier's commit, and they never deadlock. `$1` ids, `$2` claim tokens, `$3`
/// worker, `$4` the ids with earlier attempts.
macro_rules! done_ctes {
    () => {
        "WITH del AS ( \
            DELETE FROM outbox_messages m \
            USING UNNEST((SELECT $1::uuid[]), (SELECT $2::uuid[])) AS d(id, claim_token) \
            WHERE m.id = d.id AND m.claim_token = d.claim_token \
            RETURNING m.id, m.topic, m.ordering_key \
         ), counted AS ( \
            INSERT INTO outbox_done_counts (topic, minute, worker, done) \
            SELECT topic, date_trunc('minute', now()), $3, count(*) FROM del GROUP BY topic ORDER BY topic \
            ON CONFLICT (topic, minute, worker) DO UPDATE SET done = outbox_done_counts.done + excluded.done \
         ), progress AS ( \
            DELETE FROM outbox_deliveries WHERE message_id = ANY($4::uuid[]) \
         ) "
    };
}

/// A done write (its SQL starts with [`done_ctes`]) with its first four parameters bound.
fn done_query<'q>(
    sql: &'static str,
    worker: Uuid,
    done: &[Done],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let (ids, tokens): (Vec<Uuid>, Vec<Uuid>) = done
        .iter()
        .map(|d| (d.fence.id, d.fence.claim_token))
        .unzip();
    let progress: Vec<Uuid> = done
        .iter()
        .filter(|d| d.had_attempts)
        .map(|d| d.fence.id)
        .collect();
    sqlx::query(sql)
        .bind(ids)
        .bind(tokens)
        .bind(worker)
        .bind(progress)
}

/// A claimed row as the worker sees it.
fn claimed(
    r: &sqlx::postgres::PgRow,
    claim_token: Uuid,
    ordered: bool,
) -> Result<ClaimedMessage, sqlx::Error> {
    Ok(ClaimedMessage {
        id: r.try_get("id")?,
        topic: r.try_get("topic")?,
        payload: r.try_get("payload")?,
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
        trace: trace(r.try_get("traceparent")?, r.try_get("tracestate")?),
    })
}

/// The stored trace context of a row, if it has one.
pub(crate) fn trace(
    traceparent: Option<String>,
    tracestate: Option<String>,
) -> Option<crate::trace::TraceContext> {
    traceparent.map(|p| crate::trace::TraceContext::new(p, tracestate))
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// Waiting workers of a topic count as alive while their heartbeat is this fresh (seconds).
/// Workers write it every second; a crashed worker stops being notified within this time.
const LIVE_SECS: &str = "5";

/// Records `(handler, message_id)` as processed on `conn` (the dedup wrapper's transaction);
/// false when it already was. A concurrent transaction recording the same pair makes this wait
/// on the primary key until it ends.
pub(crate) async fn processed_record(
    conn: &mut PgConnection,
    handler: &str,
    message_id: uuid::Uuid,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO outbox_processed (handler, message_id) VALUES ($1, $2) \
         ON CONFLICT (handler, message_id) DO NOTHING",
    )
    .bind(handler)
    .bind(message_id)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// One insert for one or many rows; it also wakes a waiting worker, but only one that serves
/// the message's topic, is alive and sleeps on LISTEN, and only when the message is due now:
/// busy systems never take NOTIFY's commit lock. The notification names the worker it is for,
/// so the others sleep on.
///
/// The trace columns are named only when a row has a trace context: without one the statement
/// is the same as without the `opentelemetry` feature.
pub(crate) async fn outbox_insert(
    conn: &mut PgConnection,
    rows: &[NewMessage],
) -> Result<(), sqlx::Error> {
    if let [row] = rows {
        let (trace_columns, trace_values) = match row.trace {
            Some(_) => (", traceparent, tracestate", ", $8, $9"),
            None => ("", ""),
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "WITH ins AS ( \
                INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                             ordering_key, releases_key{trace_columns}) \
                VALUES ($1, $2, $3::json, $4, now() + make_interval(secs => $5), $6, $7{trace_values}) \
             ) \
             SELECT pg_notify('{WAKEUP_CHANNEL}', w.id::text) FROM outbox_workers w \
             WHERE $5 = 0 AND w.waiting AND $2 = ANY(w.topics) \
               AND w.heartbeat_at > now() - interval '{LIVE_SECS} seconds' LIMIT 1"
        ));
        let mut query = sqlx::query(sql)
            .bind(row.id)
            .bind(row.topic)
            .bind(&row.payload)
            .bind(&row.idempotency_key)
            .bind(secs(row.delay))
            .bind(&row.ordering_key)
            .bind(row.releases_key);
        if let Some(trace) = &row.trace {
            query = query.bind(trace.traceparent()).bind(trace.tracestate());
        }
        query.execute(conn).await?;
        return Ok(());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic).collect();
    let payloads: Vec<&str> = rows.iter().map(|r| r.payload.as_str()).collect();
    let keys: Vec<Option<&str>> = rows.iter().map(|r| r.idempotency_key.as_deref()).collect();
    let delays: Vec<f64> = rows.iter().map(|r| secs(r.delay)).collect();
    let ordering: Vec<Option<&str>> = rows.iter().map(|r| r.ordering_key.as_deref()).collect();
    let releases: Vec<bool> = rows.iter().map(|r| r.releases_key).collect();
    let due_now: Vec<&str> = rows
        .iter()
        .filter(|r| r.delay.is_zero())
        .map(|r| r.topic)
        .collect();
    let traced = rows.iter().any(|r| r.trace.is_some());
    let (trace_columns, trace_values, trace_arrays, trace_names) = if traced {
        (
            ", traceparent, tracestate",
            ", u.traceparent, u.tracestate",
            ", $9::text[], $10::text[]",
            ", traceparent, tracestate",
        )
    } else {
        ("", "", "", "")
    };
    let sql = sqlx::AssertSqlSafe(format!(
        "WITH ins AS ( \
            INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, \
                                         ordering_key, releases_key{trace_columns}) \
            SELECT u.id, u.topic, u.payload::json, u.idempotency_key, now() + make_interval(secs => u.delay), \
                   u.ordering_key, u.releases_key{trace_values} \
            FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $7::text[], $8::bool[]{trace_arrays}) \
                 AS u(id, topic, payload, idempotency_key, delay, ordering_key, releases_key{trace_names}) \
         ) \
         SELECT pg_notify('{WAKEUP_CHANNEL}', w.id::text) FROM outbox_workers w \
         WHERE w.waiting AND w.topics && $6::text[] \
           AND w.heartbeat_at > now() - interval '{LIVE_SECS} seconds' LIMIT 1"
    ));
    let mut query = sqlx::query(sql)
        .bind(ids)
        .bind(topics)
        .bind(payloads)
        .bind(keys)
        .bind(delays)
        .bind(due_now)
        .bind(ordering)
        .bind(releases);
    if traced {
        let parents: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.trace.as_ref().map(|t| t.traceparent()))
            .collect();
        let states: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.trace.as_ref().and_then(|t| t.tracestate()))
            .collect();
        query = query.bind(parents).bind(states);
    }
    query.execute(conn).await?;
    Ok(())
}

/// The ids and claim tokens of `f`, as the two arrays the outcome statements unnest.
///
/// Those statements join the live table to `UNNEST((SELECT $1), (SELECT $2))`: behind a scalar
/// subquery the planner cannot count the arrays, plans for a few rows and probes the primary
/// key once per fence. Given the arrays' real length, a batch of a few hundred made it hash
/// the whole live table instead, a sequential scan on every done write whose cost grew with
/// the backlog (5.1 ms against 2.5 ms for 1,000 of 30,000 rows).
fn fences(f: &[Fence]) -> (Vec<Uuid>, Vec<Uuid>) {
    f.iter().map(|f| (f.id, f.claim_token)).unzip()
}

#[async_trait]
impl Backend for PgBackend {
    async fn migrate(&self) -> Result<()> {
        // A connection of its own, out of the pool: the advisory lock is the session's, and if
        // this future is dropped mid-way the connection closes with it (releasing the lock)
        // rather than going back to the pool still holding it.
        let mut conn = self.pool.acquire().await?.detach();
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await?;
        let result = apply_migrations(&mut conn).await;
        // Closing the session releases the lock; an unlock first says so explicitly.
        let unlock = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut conn)
            .await;
        let _ = sqlx::Connection::close(conn).await;
        result?;
        unlock?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn detached(&self, connections: u32) -> Result<std::sync::Arc<dyn Backend>> {
        let options = (*self.pool.connect_options()).clone();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(connections.max(1))
            .min_connections(connections.max(1))
            .connect_with(options)
            .await?;
        // Open every connection now: a cold worker picks up as fast as a warm one.
        let mut open = Vec::new();
        for _ in 0..connections {
            open.push(pool.acquire());
        }
        let conns = futures_util::future::try_join_all(open).await?;
        drop(conns);
        Ok(std::sync::Arc::new(PgBackend::new(pool)))
    }

    async fn outbox_claim_batch(&self, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
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
        let keyed_first = !self.keyed_first.fetch_xor(true, AtomicOrdering::Relaxed);
        let mut out = Vec::new();
        if !p.released.is_empty() {
            self.claim_released(p, p.limit, &mut out).await?;
        }
        // Keys this worker's done writes keep passing on (their next messages claimed by the
        // write itself, see outbox_mark_done_and_claim) count as released keys here.
        let chaining = locked(&self.chained)
            .is_some_and(|at| at.elapsed() < 2 * super::RELEASED_WALK_INTERVAL);
        let gap = if chaining {
            *locked(&self.walk_gap)
        } else {
            super::RELEASED_WALK_INTERVAL
        };
        let mut keyed_ran =
            (chaining || !p.released.is_empty()) && locked(&self.walked).elapsed() < gap;
        let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
        if !keyed_ran && want > 0 && keyed_first && self.keyed_present.load(AtomicOrdering::Relaxed)
        {
            self.claim_keyed(p, want, &mut out).await?;
            keyed_ran = true;
        }
        let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
        let mut unkeyed = 0;
        if want > 0 {
            unkeyed = self.claim_unkeyed(p, want, &mut out).await?;
        }
        if !keyed_ran && (unkeyed == 0 || self.keyed_present.load(AtomicOrdering::Relaxed)) {
            let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
            if want > 0 {
                self.claim_keyed(p, want, &mut out).await?;
            }
        }
        Ok(out)
    }

    async fn delivery_completed(&self, message_ids: &[Uuid]) -> Result<Vec<(Uuid, String)>> {
        Ok(sqlx::query_as(
            "SELECT message_id, handler FROM outbox_deliveries WHERE message_id = ANY($1::uuid[])",
        )
        .bind(message_ids)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_mark_done(&self, worker: Uuid, done: &[Done]) -> Result<u64> {
        let n: i64 = done_query(
            concat!(done_ctes!(), "SELECT count(*) FROM del"),
            worker,
            done,
        )
        .fetch_one(&self.pool)
        .await?
        .try_get(0)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    // The heads this write makes are found in the statement's own snapshot, where the rows it
    // deletes are still live: each released key's first entry other than the row this write
    // deletes (a key has one running message, so a batch holds at most one row of a key; the
    // whole batch's ids in that filter cost a comparison per id and entry, 5 us a row at 1,000).
    // No other claim can take such a head first: until this statement commits, the row it
    // deletes is its key's head, and the DELETE holds that row's lock. So the UPDATE takes
    // each head by the TID its probe found, without a locking step that skips locked rows
    // first: nothing else locks a head behind a running message (claims lock only heads that
    // may start), and a row updated meanwhile has moved from that TID, so the recheck leaves
    // it out. That saves each key step a primary-key probe and a row lock. The claim commits
    // durably with the done rows (no `synchronous_commit` off here).
    async fn outbox_mark_done_and_claim(
        &self,
        worker: Uuid,
        done: &[Done],
        next: &ClaimParams<'_>,
    ) -> Result<(u64, Option<Vec<ClaimedMessage>>)> {
        if done.iter().all(|d| d.key.is_none()) {
            return Ok((self.outbox_mark_done(worker, done).await?, None));
        }
        let rows = done_query(
            concat!(
                done_ctes!(),
                ", heads AS ( \
                    SELECT h.ctid FROM del d CROSS JOIN LATERAL ( \
                        SELECT ctid FROM outbox_messages \
                        WHERE ordering_key = d.ordering_key AND id <> d.id \
                        ORDER BY ordering_key, id LIMIT 1) h \
                    WHERE d.ordering_key IS NOT NULL \
                 ), claimed AS ( \
                    UPDATE outbox_messages m \
                    SET attempts = m.attempts + 1, claim_token = $6, claimed_by = $3, \
                        locked_until = now() + make_interval(secs => $7) \
                    WHERE m.ctid = ANY(ARRAY(SELECT ctid FROM heads)) \
                      AND m.topic = ANY($5::text[]) AND ",
                head_may_start!(),
                " \
                    RETURNING ",
                head_columns!(),
                " \
                 ) \
                 SELECT (SELECT count(*) FROM del) AS done, c.* \
                 FROM (SELECT 1) one LEFT JOIN claimed c ON true"
            ),
            worker,
            done,
        )
        .bind(next.topics)
        .bind(next.claim_token)
        .bind(secs(next.lease))
        .fetch_all(&self.pool)
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
            self.keyed_present.store(true, AtomicOrdering::Relaxed);
            *locked(&self.chained) = Some(Instant::now());
        }
        Ok((u64::try_from(n).unwrap_or(0), Some(out)))
    }

    async fn outbox_mark_failed(&self, f: &Failure<'_>) -> Result<bool> {
        let sql = if f.retry_in.is_some() {
            "WITH upd AS ( \
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
             SELECT count(*) FROM upd"
        } else {
            "WITH del AS ( \
                DELETE FROM outbox_messages WHERE id = $1 AND claim_token = $2 \
                RETURNING id, topic, payload, idempotency_key, attempts, created_at, ordering_key, releases_key, \
                          traceparent, tracestate \
             ), dead AS ( \
                INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, \
                                         ordering_key, releases_key, traceparent, tracestate) \
                SELECT id, topic, payload, idempotency_key, attempts, $4, created_at, ordering_key, releases_key, \
                       traceparent, tracestate \
                FROM del \
             ), ins AS ( \
                INSERT INTO outbox_deliveries (message_id, handler) \
                SELECT $1, h FROM unnest($5::text[]) AS h WHERE EXISTS (SELECT 1 FROM del) \
                ON CONFLICT DO NOTHING \
             ) \
             SELECT count(*) FROM del"
        };
        let n: i64 = sqlx::query_scalar(sql)
            .bind(f.fence.id)
            .bind(f.fence.claim_token)
            .bind(f.retry_in.map(secs).unwrap_or(0.0))
            .bind(f.error)
            .bind(f.succeeded)
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }

    async fn outbox_hand_back(&self, f: &[Fence]) -> Result<u64> {
        let (ids, tokens) = fences(f);
        let r = sqlx::query(
            "UPDATE outbox_messages m \
             SET attempts = greatest(m.attempts - 1, 0), locked_until = NULL, claim_token = NULL \
             FROM UNNEST((SELECT $1::uuid[]), (SELECT $2::uuid[])) AS d(id, claim_token) \
             WHERE m.id = d.id AND m.claim_token = d.claim_token",
        )
        .bind(ids)
        .bind(tokens)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_renew(&self, f: &[Fence], lease: std::time::Duration) -> Result<u64> {
        let (ids, tokens) = fences(f);
        // A renewal lost in a server crash only shortens a lease: no WAL flush to wait for.
        let r = sqlx::query(
            "UPDATE outbox_messages m \
             SET locked_until = now() + make_interval(secs => $3) \
             FROM UNNEST(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' THEN $1::uuid[] END, \
                         (SELECT $2::uuid[])) AS d(id, claim_token) \
             WHERE m.id = d.id AND m.claim_token = d.claim_token",
        )
        .bind(ids)
        .bind(tokens)
        .bind(secs(lease))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT topic, count(*) FROM outbox_messages \
             WHERE NOT (topic = ANY($1::text[])) \
             GROUP BY topic ORDER BY topic",
        )
        .bind(known)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_stats(&self) -> Result<Vec<TopicStats>> {
        // The live table holds only pending and running rows; dead letters and the done counts
        // have tables of their own. Ordered rows are ranked within their key by a window over
        // the key index, never by a subquery per row: per-row subqueries make the planner's
        // estimate large enough to JIT-compile the statement, which costs more than the query.
        type Row = (
            String,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<f64>,
            Option<f64>,
            i64,
            i64,
            i64,
            Option<f64>,
        );
        let sql = sqlx::AssertSqlSafe(format!(
            "WITH live AS ( \
                SELECT topic, \
                       count(*) FILTER (WHERE ordering_key IS NULL AND available_at <= now() \
                           AND (locked_until IS NULL OR locked_until < now())) AS ready, \
                       count(*) FILTER (WHERE available_at > now() AND locked_until IS NULL) AS scheduled, \
                       count(*) FILTER (WHERE locked_until >= now()) AS in_flight, \
                       count(*) FILTER (WHERE locked_until < now()) AS stalled, \
                       min(available_at) FILTER (WHERE ordering_key IS NULL AND available_at <= now() \
                           AND (locked_until IS NULL OR locked_until < now())) AS oldest_at, \
                       extract(epoch FROM now() - min(locked_until) FILTER (WHERE locked_until < now()))::float8 AS stalled_for \
                FROM outbox_messages GROUP BY topic \
             ), keyed_rows AS ( \
                SELECT m.topic, m.available_at, \
                       m.available_at <= now() AND (m.locked_until IS NULL OR m.locked_until < now()) AS due, \
                       m.id <> first_value(m.id) OVER (PARTITION BY m.ordering_key ORDER BY m.id) AS behind, \
                       coalesce(d.id < m.id, false) AS behind_dead \
                FROM outbox_messages m \
                LEFT JOIN (SELECT DISTINCT ON (ordering_key) ordering_key, id FROM outbox_dead \
                           WHERE ordering_key IS NOT NULL AND NOT releases_key \
                           ORDER BY ordering_key, id) d ON d.ordering_key = m.ordering_key \
                WHERE m.ordering_key IS NOT NULL \
             ), keyed AS ( \
                SELECT topic, \
                       count(*) FILTER (WHERE due AND NOT behind AND NOT behind_dead) AS ready, \
                       count(*) FILTER (WHERE due AND (behind OR behind_dead)) AS blocked, \
                       count(*) FILTER (WHERE due AND behind_dead) AS blocked_by_dead, \
                       min(available_at) FILTER (WHERE due AND NOT behind AND NOT behind_dead) AS oldest_at, \
                       min(available_at) FILTER (WHERE due AND (behind OR behind_dead)) AS blocked_at \
                FROM keyed_rows GROUP BY topic \
             ), dead AS ( \
                SELECT topic, n AS dead FROM outbox_dead_counts \
             ), done AS ( \
                SELECT topic, sum(done)::bigint AS done FROM outbox_done_counts \
                WHERE minute > now() - interval '5 minutes' GROUP BY topic \
             ), served AS ( \
                SELECT t AS topic, count(*) AS workers FROM outbox_workers, unnest(topics) AS t \
                WHERE heartbeat_at > now() - interval '{LIVE_SECS} seconds' GROUP BY t \
             ), topics AS ( \
                SELECT topic FROM live UNION SELECT topic FROM dead UNION SELECT topic FROM done \
                UNION SELECT topic FROM served \
             ) \
             SELECT t.topic, coalesce(l.ready, 0) + coalesce(k.ready, 0), coalesce(l.scheduled, 0), \
                    coalesce(l.in_flight, 0), coalesce(l.stalled, 0), coalesce(d.dead, 0), coalesce(o.done, 0), \
                    extract(epoch FROM now() - least(l.oldest_at, k.oldest_at))::float8, \
                    l.stalled_for, coalesce(s.workers, 0), coalesce(k.blocked, 0), \
                    coalesce(k.blocked_by_dead, 0), extract(epoch FROM now() - k.blocked_at)::float8 \
             FROM topics t \
             LEFT JOIN live l ON l.topic = t.topic \
             LEFT JOIN keyed k ON k.topic = t.topic \
             LEFT JOIN dead d ON d.topic = t.topic \
             LEFT JOIN done o ON o.topic = t.topic \
             LEFT JOIN served s ON s.topic = t.topic \
             ORDER BY t.topic"
        ));
        let rows: Vec<Row> = sqlx::query_as(sql).fetch_all(&self.pool).await?;
        let age = |s: Option<f64>| {
            s.and_then(|s| std::time::Duration::try_from_secs_f64(s.max(0.0)).ok())
        };
        Ok(rows
            .into_iter()
            .map(
                |(
                    topic,
                    ready,
                    scheduled,
                    in_flight,
                    stalled,
                    dead,
                    done_last_5m,
                    oldest,
                    stalled_for,
                    workers,
                    blocked,
                    blocked_by_dead,
                    oldest_blocked,
                )| {
                    TopicStats {
                        topic,
                        ready,
                        blocked,
                        blocked_by_dead,
                        oldest_blocked_age: age(oldest_blocked),
                        scheduled,
                        in_flight,
                        stalled,
                        dead,
                        done_last_5m,
                        oldest_ready_age: age(oldest),
                        oldest_stalled_age: age(stalled_for),
                        live_workers: workers,
                    }
                },
            )
            .collect())
    }

    async fn outbox_done_per_minute(
        &self,
        minutes: u32,
    ) -> Result<Vec<(chrono::DateTime<chrono::Utc>, i64)>> {
        Ok(sqlx::query_as(
            "SELECT minute, sum(done)::bigint FROM outbox_done_counts \
             WHERE minute >= date_trunc('minute', now()) - make_interval(mins => $1) \
             GROUP BY minute ORDER BY minute",
        )
        .bind(i32::try_from(minutes).unwrap_or(i32::MAX))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_dead_list(&self, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {DEAD_COLUMNS} FROM outbox_dead \
             WHERE ($1::text IS NULL OR topic = $1) \
               AND ($2::float8 IS NULL OR dead_at <= now() - make_interval(secs => $2)) \
               AND ($4::timestamptz IS NULL OR (dead_at, id) < ($4, $5)) \
             ORDER BY dead_at DESC, id DESC LIMIT $3"
        ));
        let rows = sqlx::query(sql)
            .bind(f.topic.as_deref())
            .bind(f.older_than.map(secs))
            .bind(i64::from(f.limit.unwrap_or(100)))
            .bind(f.after.map(|c| c.dead_at))
            .bind(f.after.map(|c| c.id))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
    }

    async fn outbox_message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT id, topic, CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END AS status, \
                    attempts, payload::text AS payload, last_error, created_at, \
                    coalesce(locked_until, available_at) AS available_at, NULL::timestamptz AS processed_at, \
                    idempotency_key, ordering_key \
             FROM outbox_messages WHERE id = $1 \
             UNION ALL SELECT {DEAD_COLUMNS} FROM outbox_dead WHERE id = $1"
        ));
        let row = sqlx::query(sql).bind(id).fetch_optional(&self.pool).await?;
        let Some(mut info) = row.as_ref().map(message_info).transpose()? else {
            return Ok(None);
        };
        info.handlers_done = sqlx::query_as(
            "SELECT handler, completed_at FROM outbox_deliveries WHERE message_id = $1 \
             ORDER BY completed_at, handler",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(info))
    }

    async fn outbox_dead_retry(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        // Waiting workers of the retried topics are woken, as a producer would wake them: the
        // operator may run this from another process, long before their next poll.
        let sql = sqlx::AssertSqlSafe(format!(
            "WITH del AS ( \
                DELETE FROM outbox_dead \
                WHERE ($1::uuid IS NULL OR id = $1) AND ($2::text IS NULL OR topic = $2) \
                RETURNING id, topic, payload, idempotency_key, last_error, created_at, ordering_key, releases_key, \
                          traceparent, tracestate \
             ), ins AS ( \
                INSERT INTO outbox_messages (id, topic, payload, idempotency_key, last_error, created_at, \
                                             ordering_key, releases_key, traceparent, tracestate) \
                SELECT id, topic, payload, idempotency_key, last_error, created_at, ordering_key, releases_key, \
                       traceparent, tracestate \
                FROM del \
                RETURNING topic \
             ), woke AS ( \
                SELECT pg_notify('{WAKEUP_CHANNEL}', w.id::text) FROM outbox_workers w \
                WHERE w.waiting AND w.heartbeat_at > now() - interval '{LIVE_SECS} seconds' \
                  AND w.topics && ARRAY(SELECT DISTINCT topic FROM ins) \
             ) \
             SELECT count(*) + 0 * (SELECT count(*) FROM woke) FROM ins"
        ));
        let n: i64 = sqlx::query_scalar(sql)
            .bind(id)
            .bind(topic)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn outbox_dead_discard(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        // A discarded dead letter with an ordering key unblocks the later messages of its key:
        // waiting workers are woken to take them.
        let sql = sqlx::AssertSqlSafe(format!(
            "WITH del AS ( \
                DELETE FROM outbox_dead \
                WHERE ($1::uuid IS NULL OR id = $1) AND ($2::text IS NULL OR topic = $2) \
                RETURNING id, ordering_key \
             ), progress AS ( \
                DELETE FROM outbox_deliveries WHERE message_id IN (SELECT id FROM del) \
             ), woke AS ( \
                SELECT pg_notify('{WAKEUP_CHANNEL}', w.id::text) FROM outbox_workers w \
                WHERE w.waiting AND w.heartbeat_at > now() - interval '{LIVE_SECS} seconds' \
                  AND EXISTS (SELECT 1 FROM del WHERE ordering_key IS NOT NULL) \
             ) \
             SELECT count(*) + 0 * (SELECT count(*) FROM woke) FROM del"
        ));
        let n: i64 = sqlx::query_scalar(sql)
            .bind(id)
            .bind(topic)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn outbox_purge_done(&self, older_than: std::time::Duration, batch: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM outbox_done_counts WHERE ctid = ANY(ARRAY( \
                SELECT ctid FROM outbox_done_counts \
                WHERE minute < now() - make_interval(secs => $1) \
                ORDER BY minute LIMIT $2))",
        )
        .bind(secs(older_than))
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_purge_processed(
        &self,
        older_than: std::time::Duration,
        batch: i64,
    ) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM outbox_processed WHERE ctid = ANY(ARRAY( \
                SELECT ctid FROM outbox_processed \
                WHERE processed_at < now() - make_interval(secs => $1) \
                ORDER BY processed_at LIMIT $2))",
        )
        .bind(secs(older_than))
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn worker_heartbeat(&self, b: &Beat<'_>) -> Result<i64> {
        // Rows of workers that died without deregistering are deleted after a minute; producers
        // stop notifying them long before (LIVE_SECS). The row is a hint, so it commits without
        // waiting for its WAL flush.
        let sql = sqlx::AssertSqlSafe(format!(
            "WITH gone AS ( \
                DELETE FROM outbox_workers WHERE heartbeat_at < now() - interval '1 minute' AND id <> $1 \
             ), me AS ( \
                INSERT INTO outbox_workers (id, name, waiting, topics) \
                SELECT $1, $2, $3, $4::text[] FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
                ON CONFLICT (id) DO UPDATE SET waiting = $3, topics = $4::text[], heartbeat_at = now() \
             ), woke AS ( \
                SELECT pg_notify('{WAKEUP_CHANNEL}', w.id::text) FROM outbox_workers w \
                WHERE $5 AND w.id <> $1 AND w.waiting AND w.topics && $4::text[] \
                  AND w.heartbeat_at > now() - interval '{LIVE_SECS} seconds' LIMIT 1 \
             ) \
             SELECT 1 + count(*) + (SELECT count(*) FROM woke) * 0 FROM outbox_workers \
             WHERE id <> $1 AND topics && $4::text[] AND heartbeat_at > now() - interval '{LIVE_SECS} seconds'"
        ));
        Ok(sqlx::query_scalar(sql)
            .bind(b.id)
            .bind(b.name)
            .bind(b.waiting)
            .bind(b.topics)
            .bind(b.wake_peer)
            .fetch_one(&self.pool)
            .await?)
    }

    async fn worker_list(&self) -> Result<Vec<crate::model::WorkerInfo>> {
        type Row = (
            Uuid,
            String,
            Vec<String>,
            bool,
            chrono::DateTime<chrono::Utc>,
            chrono::DateTime<chrono::Utc>,
            bool,
        );
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT id, name, topics, waiting, started_at, heartbeat_at, \
                    heartbeat_at > now() - interval '{LIVE_SECS} seconds' AS live \
             FROM outbox_workers ORDER BY live DESC, name"
        ));
        let rows: Vec<Row> = sqlx::query_as(sql).fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, name, topics, waiting, started_at, heartbeat_at, live)| {
                    crate::model::WorkerInfo {
                        id,
                        name,
                        topics,
                        waiting,
                        started_at,
                        heartbeat_at,
                        live,
                    }
                },
            )
            .collect())
    }

    async fn worker_deregister(&self, id: Uuid) -> Result<()> {
        sqlx::query("DELETE FROM outbox_workers WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn done_writes_in_flight(&self) -> usize {
        2
    }

    fn listens(&self) -> bool {
        true
    }

    async fn wakeup_listener(&self, worker: Uuid) -> Result<Option<Box<dyn WakeupListener>>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(WAKEUP_CHANNEL).await?;
        Ok(Some(Box::new(PgWakeup {
            listener,
            me: worker.to_string(),
        })))
    }
}

struct PgWakeup {
    listener: PgListener,
    /// This worker's id: a notification for another worker is not a reason to look.
    me: String,
}

#[async_trait]
impl WakeupListener for PgWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        loop {
            // `None` means the connection was lost: it reconnects on the next call, and
            // notifications sent meanwhile are gone, so wake the worker to look for itself.
            match self.listener.try_recv().await? {
                Some(n) if n.payload() != self.me && !n.payload().is_empty() => continue,
                _ => return Ok(Wake::Committed),
            }
        }
    }
}

async fn apply_migrations(conn: &mut PgConnection) -> Result<()> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
            version BIGINT PRIMARY KEY, \
            description TEXT NOT NULL, \
            checksum BIGINT NOT NULL, \
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&mut *conn)
    .await?;
    let applied: Vec<(i64, i64)> =
        sqlx::query_as("SELECT version, checksum FROM outbox_migrations ORDER BY version")
            .fetch_all(&mut *conn)
            .await?;
    for m in schema::pending(MIGRATIONS, &applied)? {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
        sqlx::query(
            "INSERT INTO outbox_migrations (version, description, checksum) VALUES ($1, $2, $3)",
        )
        .bind(m.version)
        .bind(m.description)
        .bind(m.checksum())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        tracing::info!(
            version = m.version,
            description = m.description,
            "applied outbox migration"
        );
    }
    Ok(())
}
