//! Every SQL statement for SQLite.
//!
//! SQLite has one writer at a time, so each claim is a single `UPDATE ... WHERE id IN (SELECT
//! ... LIMIT n) RETURNING` statement: atomic under the write lock, so several workers on one
//! file always take different messages. There is no `SKIP LOCKED` and no LISTEN; idle workers
//! poll (fast right after activity), and are woken by inserts of their own process and by
//! changes of the write-ahead log file (commits of other processes).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{Row, SqliteConnection};
use uuid::Uuid;

use super::schema::{self, Migration};
use super::selection;
use super::{
    Backend, Beat, ClaimParams, ClaimedMessage, Done, Failure, Fence, Wake, WakeupListener,
};
use crate::__private::NewMessage;
use crate::error::{Error, Result};
use crate::model::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox messages and deliveries",
        sql: include_str!("../../migrations/sqlite/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "processed-id records",
        sql: include_str!("../../migrations/sqlite/0002_processed.sql"),
    },
    Migration {
        version: 3,
        description: "partial indexes for operations",
        sql: include_str!("../../migrations/sqlite/0003_ops_indexes.sql"),
    },
    Migration {
        version: 4,
        description: "live rows only: UUID keys, deleted when done, dead letters apart, workers",
        sql: include_str!("../../migrations/sqlite/0004_live_rows.sql"),
    },
    Migration {
        version: 5,
        description: "dead letters counted per topic",
        sql: include_str!("../../migrations/sqlite/0005_dead_counts.sql"),
    },
    Migration {
        version: 6,
        description: "ordering keys: per-key order, dead letters that hold their key",
        sql: include_str!("../../migrations/sqlite/0006_ordering_keys.sql"),
    },
    Migration {
        version: 7,
        description: "trace context (W3C traceparent and tracestate) of messages and dead letters",
        sql: include_str!("../../migrations/sqlite/0007_trace_context.sql"),
    },
];

const DEAD_COLUMNS: &str =
    "id, topic, 'dead' AS status, attempts, payload, last_error, created_at, \
     dead_at AS available_at, dead_at AS processed_at, idempotency_key, ordering_key";

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default()
}

fn message_info(r: &sqlx::sqlite::SqliteRow) -> Result<MessageInfo, sqlx::Error> {
    let processed: Option<i64> = r.try_get("processed_at")?;
    Ok(MessageInfo {
        id: parse_uuid(r.try_get("id")?)?,
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
        created_at: time(r.try_get("created_at")?),
        available_at: time(r.try_get("available_at")?),
        processed_at: processed.map(time),
        idempotency_key: r.try_get("idempotency_key")?,
        ordering_key: r.try_get("ordering_key")?,
        handlers_done: Vec::new(),
    })
}

/// Workers count as alive while their heartbeat is this fresh.
const LIVE_MS: i64 = 5_000;

pub(crate) struct SqliteBackend {
    pool: SqlitePool,
    /// The greatest ordering key of this backend's last claim of ordered messages: the next
    /// one walks the keys after it first.
    cursor: std::sync::Mutex<Option<String>>,
    /// Whether the next claim takes ordered messages before unordered ones.
    keyed_first: std::sync::atomic::AtomicBool,
    /// When the claim last walked every key.
    walked: std::sync::Mutex<std::time::Instant>,
}

impl SqliteBackend {
    pub(crate) fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            cursor: std::sync::Mutex::new(None),
            keyed_first: std::sync::atomic::AtomicBool::new(false),
            walked: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }

    /// Claims up to the rest of the batch among ordered messages: the heads of their keys
    /// (each key's live message with the smallest id) that are due, not running, of a topic
    /// asked for, and not behind a dead letter that holds the key. The keys are walked one
    /// index probe each (a loose index scan), starting after the key this backend claimed last
    /// and wrapping around, so keys take turns. A later message of a key is never a head while
    /// an earlier one exists, so two workers never start two messages of one key.
    /// With `released`, it claims the heads of `p.released` only, one probe per key, and
    /// leaves the cursor alone.
    async fn claim_keyed(
        &self,
        p: &ClaimParams<'_>,
        now: i64,
        released: bool,
        out: &mut Vec<ClaimedMessage>,
    ) -> Result<()> {
        let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
        if want <= 0 {
            return Ok(());
        }
        let cursor = self
            .cursor
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_default();
        let topics = serde_json::to_string(p.topics).unwrap_or_else(|_| "[]".into());
        if !released {
            *self
                .walked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = std::time::Instant::now();
        }
        let (sql, fifth) = if released {
            let keys: Vec<&str> = p.released.iter().map(|k| &**k).collect();
            (
                concat!(
                    "WITH keys(k) AS (SELECT value FROM json_each(?5)), ",
                    sqlite_claim_heads!()
                ),
                serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into()),
            )
        } else {
            (
                concat!(
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
                     ), ",
                    sqlite_claim_heads!()
                ),
                cursor,
            )
        };
        let rows = sqlx::query(sql)
            .bind(p.claim_token.to_string())
            .bind(p.worker.to_string())
            .bind(now)
            .bind(now.saturating_add(ms(p.lease)))
            .bind(fifth)
            .bind(topics)
            .bind(want)
            .fetch_all(&self.pool)
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
            *self
                .cursor
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = last_key;
        }
        Ok(())
    }
}

/// The rest of both claims of ordered messages, after their CTE `keys(k)`: each key's head,
/// claimed if it may start. `?1` claim token, `?2` worker, `?3` now, `?4` lease end, `?6`
/// topics, `?7` limit.
macro_rules! sqlite_claim_heads {
    () => {
        "heads(k, id) AS ( \
                SELECT k, (SELECT min(id) FROM outbox_messages WHERE ordering_key = keys.k) FROM keys \
             ) \
             UPDATE outbox_messages \
             SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, locked_until = ?4 \
             WHERE id IN ( \
                 SELECT m.id FROM heads h JOIN outbox_messages m ON m.id = h.id \
                 WHERE m.topic IN (SELECT value FROM json_each(?6)) AND m.available_at <= ?3 \
                   AND (m.locked_until IS NULL OR m.locked_until < ?3) \
                   AND NOT EXISTS (SELECT 1 FROM outbox_dead d \
                                   WHERE d.ordering_key = h.k AND d.id < h.id AND d.releases_key = 0) \
                 LIMIT ?7) \
             RETURNING id, topic, payload, idempotency_key, attempts, created_at, last_error, ordering_key, \
                       traceparent, tracestate"
    };
}
use sqlite_claim_heads;

/// A claimed row as the worker sees it.
fn claimed(r: &sqlx::sqlite::SqliteRow, claim_token: Uuid) -> Result<ClaimedMessage, sqlx::Error> {
    let created: i64 = r.try_get("created_at")?;
    // Only the claim of ordered messages returns the key.
    let ordered: Option<String> = r.try_get("ordering_key").unwrap_or(None);
    Ok(ClaimedMessage {
        id: parse_uuid(r.try_get("id")?)?,
        topic: r.try_get("topic")?,
        payload: r.try_get("payload")?,
        idempotency_key: r.try_get("idempotency_key")?,
        attempts: r.try_get("attempts")?,
        created_at: time(created),
        claim_token,
        last_error: r.try_get("last_error")?,
        key: ordered.map(Arc::from),
        trace: r
            .try_get::<Option<String>, _>("traceparent")?
            .map(|p| crate::trace::TraceContext::new(p, r.try_get("tracestate").unwrap_or(None))),
    })
}

pub(crate) use crate::__private::now_ms;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The connect options the outbox expects on SQLite: WAL, a busy timeout, foreign keys, and the
/// file created if missing.
///
/// # Errors
///
/// When `url` is not a valid SQLite URL.
pub fn sqlite_options(url: &str) -> Result<SqliteConnectOptions> {
    let opts: SqliteConnectOptions = url
        .parse()
        .map_err(|e| Error::Config(format!("`{url}` is not a SQLite URL: {e}")))?;
    Ok(opts
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true))
}

/// Opens a pool on `url` with [`sqlite_options`].
///
/// # Errors
///
/// When the URL is invalid or the file cannot be opened.
pub async fn sqlite_pool(url: &str) -> Result<SqlitePool> {
    Ok(SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(sqlite_options(url)?)
        .await?)
}

/// Records `(handler, message_id)` as processed on `conn` (the dedup wrapper's transaction);
/// false when it already was. Its INSERT takes the database's write lock, so a concurrent
/// transaction recording the same pair waits (up to the busy timeout) until this one ends.
pub(crate) async fn processed_record(
    conn: &mut SqliteConnection,
    handler: &str,
    message_id: uuid::Uuid,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO outbox_processed (handler, message_id, processed_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (handler, message_id) DO NOTHING",
    )
    .bind(handler)
    .bind(message_id.to_string())
    .bind(now_ms())
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// One insert for one or many rows. The trace columns are named only when a row has a trace
/// context: without one the statement is the same as without the `opentelemetry` feature.
pub(crate) async fn outbox_insert(
    conn: &mut SqliteConnection,
    rows: &[NewMessage],
) -> Result<(), sqlx::Error> {
    let now = now_ms();
    if let [row] = rows {
        let query = sqlx::query(match row.trace {
            None => {
                "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                              ordering_key, releases_key) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            }
            Some(_) => {
                "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                              ordering_key, releases_key, traceparent, tracestate) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            }
        })
        .bind(row.id.to_string())
        .bind(row.topic)
        .bind(&row.payload)
        .bind(&row.idempotency_key)
        .bind(now.saturating_add(ms(row.delay)))
        .bind(now)
        .bind(&row.ordering_key)
        .bind(row.releases_key);
        let query = match &row.trace {
            Some(trace) => query.bind(trace.traceparent()).bind(trace.tracestate()),
            None => query,
        };
        query.execute(conn).await?;
        if row.delay.is_zero() {
            ENQUEUED.notify_waiters();
        }
        return Ok(());
    }
    // One statement for the whole slice: the rows travel as one JSON array.
    let batch: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!([
                r.id.to_string(),
                r.topic,
                r.payload,
                r.idempotency_key,
                now.saturating_add(ms(r.delay)),
                r.ordering_key,
                r.releases_key,
                r.trace.as_ref().map(|t| t.traceparent()),
                r.trace.as_ref().and_then(|t| t.tracestate()),
            ])
        })
        .collect();
    let batch = serde_json::Value::Array(batch).to_string();
    sqlx::query(
        "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, created_at, \
                                      ordering_key, releases_key, traceparent, tracestate) \
         SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, ?2, value ->> 5, \
                coalesce(value ->> 6, 0), value ->> 7, value ->> 8 FROM json_each(?1)",
    )
    .bind(batch)
    .bind(now)
    .execute(conn)
    .await?;
    if rows.iter().any(|r| r.delay.is_zero()) {
        ENQUEUED.notify_waiters();
    }
    Ok(())
}

/// Wakes the SQLite workers of this process when a due message is inserted. SQLite has no
/// NOTIFY, and the insert runs before its transaction commits, so a woken worker looks again
/// every millisecond for a little while (see the worker loop) until the commit shows the row.
static ENQUEUED: std::sync::LazyLock<tokio::sync::Notify> =
    std::sync::LazyLock::new(tokio::sync::Notify::new);

/// How often a SQLite worker looks at the database's write-ahead log for commits of other
/// processes: one `stat` call, no query.
const WAL_LOOK: Duration = Duration::from_millis(10);

/// The wake-up channel of SQLite workers: inserts in this process, and commits of other
/// processes, seen as a change of the write-ahead log file (every commit appends to it).
///
/// The log also changes with this worker's own writes, and a look may fall between the frames
/// of one commit; either way the next look sees the change that matters, and a claim that finds
/// nothing costs little. Where the file cannot be read (an in-memory database), only inserts
/// in this process wake the worker, and the poll interval finds the rest.
struct SqliteWakeup {
    wal: PathBuf,
    seen: Option<(u64, SystemTime)>,
}

impl SqliteWakeup {
    fn new(database: &Path) -> Self {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let seen = stamp(&wal);
        SqliteWakeup { wal, seen }
    }
}

/// The size and modification time of a file, `None` while it does not exist.
fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

#[async_trait]
impl WakeupListener for SqliteWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        let enqueued = ENQUEUED.notified();
        tokio::pin!(enqueued);
        enqueued.as_mut().enable();
        loop {
            tokio::select! {
                () = &mut enqueued => return Ok(Wake::BeforeCommit),
                () = tokio::time::sleep(WAL_LOOK) => {
                    let now = stamp(&self.wal);
                    if now != self.seen {
                        self.seen = now;
                        return Ok(Wake::Committed);
                    }
                }
            }
        }
    }
}

/// Message ids as one JSON array, for `json_each`.
fn uuids(ids: &[Uuid]) -> String {
    serde_json::to_string(&ids.iter().map(Uuid::to_string).collect::<Vec<_>>())
        .unwrap_or_else(|_| "[]".into())
}

/// (id, claim token) pairs as one JSON array of arrays, for `json_each`.
fn fence_pairs(fences: &[Fence]) -> String {
    let pairs: Vec<[String; 2]> = fences
        .iter()
        .map(|f| [f.id.to_string(), f.claim_token.to_string()])
        .collect();
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into())
}

fn parse_uuid(s: &str) -> Result<Uuid, sqlx::Error> {
    Uuid::parse_str(s).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        // BEGIN IMMEDIATE takes the write lock first, so concurrent migrators queue up.
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
                version INTEGER PRIMARY KEY, description TEXT NOT NULL, \
                checksum INTEGER NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        let applied: Vec<(i64, i64)> =
            sqlx::query_as("SELECT version, checksum FROM outbox_migrations ORDER BY version")
                .fetch_all(&mut *tx)
                .await?;
        for m in schema::pending(MIGRATIONS, &applied)? {
            sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
            sqlx::query("INSERT INTO outbox_migrations (version, description, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)")
                .bind(m.version)
                .bind(m.description)
                .bind(m.checksum())
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
            tracing::info!(
                version = m.version,
                description = m.description,
                "applied outbox migration"
            );
        }
        tx.commit().await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn detached(&self, connections: u32) -> Result<std::sync::Arc<dyn Backend>> {
        let options = (*self.pool.connect_options()).clone();
        let pool = SqlitePoolOptions::new()
            .max_connections(connections.max(1))
            .min_connections(connections.max(1))
            .connect_with(options)
            .await?;
        let mut open = Vec::new();
        for _ in 0..connections {
            open.push(pool.acquire());
        }
        drop(futures_util::future::try_join_all(open).await?);
        Ok(std::sync::Arc::new(SqliteBackend::new(pool)))
    }

    async fn outbox_claim_batch(&self, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
        let now = now_ms();
        let token = p.claim_token.to_string();
        let worker = p.worker.to_string();
        let mut out = Vec::new();
        // Ordered and unordered messages take turns at going first, so neither kind can keep
        // the other out of full batches.
        let keyed_first = !self
            .keyed_first
            .fetch_xor(true, std::sync::atomic::Ordering::Relaxed);
        // The heads of the keys this worker just released first; while there are such keys,
        // the walk over every key runs only every RELEASED_WALK_INTERVAL.
        if !p.released.is_empty() {
            self.claim_keyed(p, now, true, &mut out).await?;
        }
        let walk = p.released.is_empty()
            || self
                .walked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .elapsed()
                >= super::RELEASED_WALK_INTERVAL;
        if keyed_first && walk {
            self.claim_keyed(p, now, false, &mut out).await?;
        }
        // One statement per topic keeps each claim on the ready index, in due order.
        for topic in p.topics {
            let want = p.limit - i64::try_from(out.len()).unwrap_or(i64::MAX);
            if want <= 0 {
                break;
            }
            let rows = sqlx::query(
                "UPDATE outbox_messages \
                 SET attempts = attempts + 1, claim_token = ?1, claimed_by = ?2, locked_until = ?4 \
                 WHERE id IN ( \
                     SELECT id FROM outbox_messages \
                     WHERE topic = ?5 AND ordering_key IS NULL AND available_at <= ?3 \
                       AND (locked_until IS NULL OR locked_until < ?3) \
                     ORDER BY available_at LIMIT ?6) \
                 RETURNING id, topic, payload, idempotency_key, attempts, created_at, last_error, \
                           traceparent, tracestate",
            )
            .bind(&token)
            .bind(&worker)
            .bind(now)
            .bind(now.saturating_add(ms(p.lease)))
            .bind(*topic)
            .bind(want)
            .fetch_all(&self.pool)
            .await?;
            for r in rows {
                out.push(claimed(&r, p.claim_token)?);
            }
        }
        if !keyed_first && walk {
            self.claim_keyed(p, now, false, &mut out).await?;
        }
        Ok(out)
    }

    async fn delivery_completed(&self, message_ids: &[Uuid]) -> Result<Vec<(Uuid, String)>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT message_id, handler FROM outbox_deliveries WHERE message_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(uuids(message_ids))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, h)| Ok((parse_uuid(&id)?, h)))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    async fn outbox_mark_done(&self, worker: Uuid, done: &[Done]) -> Result<u64> {
        let now = now_ms();
        let fences: Vec<Fence> = done.iter().map(|d| d.fence).collect();
        let progress: Vec<Uuid> = done
            .iter()
            .filter(|d| d.had_attempts)
            .map(|d| d.fence.id)
            .collect();
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        let topics: Vec<(String,)> = sqlx::query_as(
            "DELETE FROM outbox_messages WHERE id IN ( \
                 SELECT m.id FROM json_each(?1) AS d \
                 JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1) \
             RETURNING topic",
        )
        .bind(fence_pairs(&fences))
        .fetch_all(&mut *tx)
        .await?;
        let mut counts: std::collections::BTreeMap<String, i64> = std::collections::BTreeMap::new();
        for (t,) in &topics {
            *counts.entry(t.clone()).or_default() += 1;
        }
        for (topic, n) in counts {
            sqlx::query(
                "INSERT INTO outbox_done_counts (topic, minute, worker, done) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (topic, minute, worker) DO UPDATE SET done = done + excluded.done",
            )
            .bind(topic)
            .bind(now - now.rem_euclid(60_000))
            .bind(worker.to_string())
            .bind(n)
            .execute(&mut *tx)
            .await?;
        }
        if !progress.is_empty() {
            sqlx::query(
                "DELETE FROM outbox_deliveries WHERE message_id IN (SELECT value FROM json_each(?1))",
            )
            .bind(uuids(&progress))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(topics.len() as u64)
    }

    async fn outbox_mark_failed(&self, f: &Failure<'_>) -> Result<bool> {
        let now = now_ms();
        let id = f.fence.id.to_string();
        let token = f.fence.claim_token.to_string();
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        let current = match f.retry_in {
            Some(delay) => {
                sqlx::query(
                    "UPDATE outbox_messages \
                     SET available_at = ?3, locked_until = NULL, claim_token = NULL, last_error = ?4 \
                     WHERE id = ?1 AND claim_token = ?2",
                )
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
                sqlx::query(
                    "INSERT INTO outbox_dead (id, topic, payload, idempotency_key, attempts, last_error, created_at, dead_at, \
                                              ordering_key, releases_key, traceparent, tracestate) \
                     SELECT id, topic, payload, idempotency_key, attempts, ?3, created_at, ?4, ordering_key, releases_key, \
                            traceparent, tracestate \
                     FROM outbox_messages WHERE id = ?1 AND claim_token = ?2",
                )
                .bind(&id)
                .bind(&token)
                .bind(f.error)
                .bind(now)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM outbox_messages WHERE id = ?1 AND claim_token = ?2")
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
            sqlx::query(
                "INSERT INTO outbox_deliveries (message_id, handler, completed_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(&id)
            .bind(*handler)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(current)
    }

    async fn outbox_hand_back(&self, fences: &[Fence]) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox_messages \
             SET attempts = max(attempts - 1, 0), locked_until = NULL, claim_token = NULL \
             WHERE id IN ( \
                 SELECT m.id FROM json_each(?1) AS d \
                 JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1)",
        )
        .bind(fence_pairs(fences))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_renew(&self, fences: &[Fence], lease: Duration) -> Result<u64> {
        let r = sqlx::query(
            "UPDATE outbox_messages SET locked_until = ?2 \
             WHERE id IN ( \
                 SELECT m.id FROM json_each(?1) AS d \
                 JOIN outbox_messages AS m ON m.id = d.value ->> 0 AND m.claim_token = d.value ->> 1)",
        )
        .bind(fence_pairs(fences))
        .bind(now_ms().saturating_add(ms(lease)))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>> {
        let known = serde_json::to_string(known).unwrap_or_else(|_| "[]".into());
        Ok(sqlx::query_as(
            "SELECT topic, count(*) FROM outbox_messages \
             WHERE topic NOT IN (SELECT value FROM json_each(?1)) \
             GROUP BY topic ORDER BY topic",
        )
        .bind(known)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_stats(&self) -> Result<Vec<TopicStats>> {
        type Row = (
            String,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<i64>,
            Option<i64>,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let now = now_ms();
        let rows: Vec<Row> = sqlx::query_as(
            "WITH msgs AS ( \
                SELECT topic, available_at, locked_until, \
                       (available_at <= ?1 AND (locked_until IS NULL OR locked_until < ?1)) AS due, \
                       CASE WHEN m.ordering_key IS NULL \
                                 OR NOT (available_at <= ?1 AND (locked_until IS NULL OR locked_until < ?1)) THEN 0 \
                            WHEN EXISTS (SELECT 1 FROM outbox_dead d WHERE d.ordering_key = m.ordering_key \
                                         AND d.id < m.id AND d.releases_key = 0) THEN 2 \
                            WHEN EXISTS (SELECT 1 FROM outbox_messages e WHERE e.ordering_key = m.ordering_key \
                                         AND e.id < m.id) THEN 1 \
                            ELSE 0 END AS held \
                FROM outbox_messages m \
             ), live AS ( \
                SELECT topic, \
                       sum(due AND held = 0) AS ready, \
                       sum(due AND held > 0) AS blocked, \
                       sum(due AND held = 2) AS blocked_by_dead, \
                       sum(available_at > ?1 AND locked_until IS NULL) AS scheduled, \
                       sum(locked_until >= ?1) AS in_flight, \
                       sum(locked_until < ?1) AS stalled, \
                       min(CASE WHEN due AND held = 0 THEN available_at END) AS oldest, \
                       min(CASE WHEN locked_until < ?1 THEN locked_until END) AS stalled_since, \
                       min(CASE WHEN due AND held > 0 THEN available_at END) AS oldest_blocked \
                FROM msgs GROUP BY topic \
             ), dead AS ( \
                SELECT topic, n AS dead FROM outbox_dead_counts \
             ), done AS ( \
                SELECT topic, sum(done) AS done FROM outbox_done_counts WHERE minute > ?1 - 300000 GROUP BY topic \
             ), served AS ( \
                SELECT j.value AS topic, count(*) AS workers FROM outbox_workers, json_each(outbox_workers.topics) AS j \
                WHERE heartbeat_at > ?1 - ?2 GROUP BY j.value \
             ), topics AS ( \
                SELECT topic FROM live UNION SELECT topic FROM dead UNION SELECT topic FROM done \
                UNION SELECT topic FROM served \
             ) \
             SELECT t.topic, coalesce(l.ready, 0), coalesce(l.scheduled, 0), coalesce(l.in_flight, 0), \
                    coalesce(l.stalled, 0), coalesce(d.dead, 0), coalesce(o.done, 0), l.oldest, \
                    l.stalled_since, coalesce(s.workers, 0), coalesce(l.blocked, 0), \
                    coalesce(l.blocked_by_dead, 0), l.oldest_blocked \
             FROM topics t \
             LEFT JOIN live l ON l.topic = t.topic \
             LEFT JOIN dead d ON d.topic = t.topic \
             LEFT JOIN done o ON o.topic = t.topic \
             LEFT JOIN served s ON s.topic = t.topic \
             ORDER BY t.topic",
        )
        .bind(now)
        .bind(LIVE_MS)
        .fetch_all(&self.pool)
        .await?;
        let age =
            |t: Option<i64>| t.map(|t| Duration::from_millis(u64::try_from(now - t).unwrap_or(0)));
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
                    stalled_since,
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
                        oldest_stalled_age: age(stalled_since),
                        live_workers: workers,
                    }
                },
            )
            .collect())
    }

    async fn outbox_done_per_minute(&self, minutes: u32) -> Result<Vec<(DateTime<Utc>, i64)>> {
        let now = now_ms();
        let since = now - now.rem_euclid(60_000) - i64::from(minutes) * 60_000;
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT minute, sum(done) FROM outbox_done_counts WHERE minute >= ?1 \
             GROUP BY minute ORDER BY minute",
        )
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(m, n)| (time(m), n)).collect())
    }

    async fn outbox_dead_list(&self, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {DEAD_COLUMNS} FROM outbox_dead \
             WHERE (?1 IS NULL OR topic = ?1) AND (?2 IS NULL OR dead_at <= ?2) \
               AND (?4 IS NULL OR (dead_at, id) < (?4, ?5)) \
             ORDER BY dead_at DESC, id DESC LIMIT ?3"
        ));
        let rows = sqlx::query(sql)
            .bind(f.topic.as_deref())
            .bind(f.older_than.map(|d| now_ms().saturating_sub(ms(d))))
            .bind(i64::from(f.limit.unwrap_or(100)))
            .bind(f.after.map(|c| c.dead_at.timestamp_millis()))
            .bind(f.after.map(|c| c.id.to_string()))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
    }

    async fn outbox_message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT id, topic, CASE WHEN locked_until >= ?2 THEN 'running' ELSE 'pending' END AS status, \
                    attempts, payload, last_error, created_at, \
                    coalesce(locked_until, available_at) AS available_at, NULL AS processed_at, \
                    idempotency_key, ordering_key \
             FROM outbox_messages WHERE id = ?1 \
             UNION ALL SELECT {DEAD_COLUMNS} FROM outbox_dead WHERE id = ?1"
        ));
        let row = sqlx::query(sql)
            .bind(id.to_string())
            .bind(now_ms())
            .fetch_optional(&self.pool)
            .await?;
        let Some(mut info) = row.as_ref().map(message_info).transpose()? else {
            return Ok(None);
        };
        let done: Vec<(String, i64)> = sqlx::query_as(
            "SELECT handler, completed_at FROM outbox_deliveries WHERE message_id = ?1 \
             ORDER BY completed_at, handler",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await?;
        info.handlers_done = done.into_iter().map(|(h, at)| (h, time(at))).collect();
        Ok(Some(info))
    }

    async fn outbox_dead_retry(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        let id = id.map(|u| u.to_string());
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        let r = sqlx::query(
            "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, available_at, last_error, created_at, \
                                          ordering_key, releases_key, traceparent, tracestate) \
             SELECT id, topic, payload, idempotency_key, ?3, last_error, created_at, ordering_key, releases_key, \
                    traceparent, tracestate \
             FROM outbox_dead \
             WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2)",
        )
        .bind(&id)
        .bind(topic)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM outbox_dead WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2)",
        )
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(r.rows_affected())
    }

    async fn outbox_dead_discard(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        let id = id.map(|u| u.to_string());
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        sqlx::query(
            "DELETE FROM outbox_deliveries WHERE message_id IN ( \
                 SELECT id FROM outbox_dead WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2))",
        )
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
        let r = sqlx::query(
            "DELETE FROM outbox_dead WHERE (?1 IS NULL OR id = ?1) AND (?2 IS NULL OR topic = ?2)",
        )
        .bind(&id)
        .bind(topic)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(r.rows_affected())
    }

    async fn outbox_purge_done(&self, older_than: Duration, batch: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM outbox_done_counts WHERE rowid IN ( \
                SELECT rowid FROM outbox_done_counts WHERE minute < ?1 ORDER BY minute LIMIT ?2)",
        )
        .bind(now_ms().saturating_sub(ms(older_than)))
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_purge_processed(&self, older_than: Duration, batch: i64) -> Result<u64> {
        let r = sqlx::query(
            "DELETE FROM outbox_processed WHERE rowid IN ( \
                SELECT rowid FROM outbox_processed WHERE processed_at < ?1 ORDER BY processed_at LIMIT ?2)",
        )
        .bind(now_ms().saturating_sub(ms(older_than)))
        .bind(batch)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn worker_heartbeat(&self, b: &Beat<'_>) -> Result<i64> {
        // SQLite workers poll: there is no sleeping peer to wake.
        let _ = b.wake_peer;
        let now = now_ms();
        let topics = serde_json::to_string(b.topics).unwrap_or_else(|_| "[]".into());
        let id = b.id.to_string();
        let mut conn = self.pool.acquire().await?;
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
        sqlx::query("DELETE FROM outbox_workers WHERE heartbeat_at < ?1 AND id <> ?2")
            .bind(now - 60_000)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO outbox_workers (id, name, topics, waiting, started_at, heartbeat_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?5) \
             ON CONFLICT (id) DO UPDATE SET topics = ?3, waiting = ?4, heartbeat_at = ?5",
        )
        .bind(&id)
        .bind(b.name)
        .bind(&topics)
        .bind(b.waiting)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let peers: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox_workers AS w \
             WHERE w.heartbeat_at > ?1 AND EXISTS ( \
                 SELECT 1 FROM json_each(w.topics) AS a JOIN json_each(?2) AS b ON a.value = b.value)",
        )
        .bind(now - LIVE_MS)
        .bind(&topics)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(peers.max(1))
    }

    async fn worker_list(&self) -> Result<Vec<crate::model::WorkerInfo>> {
        let now = now_ms();
        let rows: Vec<(String, String, String, bool, i64, i64)> = sqlx::query_as(
            "SELECT id, name, topics, waiting, started_at, heartbeat_at FROM outbox_workers \
             ORDER BY heartbeat_at > ?1 DESC, name",
        )
        .bind(now - LIVE_MS)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, name, topics, waiting, started, beat)| {
                Ok(crate::model::WorkerInfo {
                    id: parse_uuid(&id)?,
                    name,
                    topics: serde_json::from_str(&topics).unwrap_or_default(),
                    waiting,
                    started_at: time(started),
                    heartbeat_at: time(beat),
                    live: beat > now - LIVE_MS,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Error::from)
    }

    async fn worker_deregister(&self, id: Uuid) -> Result<()> {
        sqlx::query("DELETE FROM outbox_workers WHERE id = ?1")
            .bind(id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn listens(&self) -> bool {
        false
    }

    async fn wakeup_listener(&self, _worker: Uuid) -> Result<Option<Box<dyn WakeupListener>>> {
        let options = self.pool.connect_options();
        Ok(Some(Box::new(SqliteWakeup::new(options.get_filename()))))
    }
}
