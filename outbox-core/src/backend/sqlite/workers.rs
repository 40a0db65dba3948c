//! The workers table: each live worker's heartbeat, the list of workers, deregistration.

use uuid::Uuid;

use sqlx::sqlite::SqlitePool;

use super::{parse_uuid, time, LIVE_MS};
use crate::backend::{worker_handlers, Beat};
use crate::clock::now_ms;
use crate::error::{Error, Result};
use crate::model::WorkerInfo;

/// Deletes the rows of workers whose heartbeat is older than `?1`, other than worker `?2`:
/// workers that died without deregistering.
const GONE: &str = "DELETE FROM outbox_workers WHERE heartbeat_at < ?1 AND id <> ?2";

/// Records worker `?1` named `?2`: its topics `?3` (a JSON array) with the highest version it
/// decodes of each (`?6`, a JSON array in the same order), whether it waits (`?4`), its host
/// (`?7`), process id (`?8`) and handlers' names per topic (`?9`, JSON), and a fresh heartbeat
/// `?5`.
const BEAT: &str = "INSERT INTO outbox_workers (id, name, topics, versions, waiting, started_at, \
                                 heartbeat_at, host, pid, handlers) \
     VALUES (?1, ?2, ?3, ?6, ?4, ?5, ?5, ?7, ?8, ?9) \
     ON CONFLICT (id) DO UPDATE SET topics = ?3, versions = ?6, waiting = ?4, heartbeat_at = ?5, \
                                    handlers = ?9";

/// How many workers with a heartbeat after `?1` serve any of the topics `?2` (a JSON array).
const PEERS: &str = "SELECT count(*) FROM outbox_workers AS w \
     WHERE w.heartbeat_at > ?1 AND EXISTS ( \
         SELECT 1 FROM json_each(w.topics) AS a JOIN json_each(?2) AS b ON a.value = b.value)";

/// Registered workers, those with a heartbeat after `?1` (the live ones) first.
const LIST: &str =
    "SELECT id, name, topics, versions, waiting, started_at, heartbeat_at, host, pid, handlers \
     FROM outbox_workers \
     ORDER BY heartbeat_at > ?1 DESC, name";

/// Removes worker `?1`.
const DEREGISTER: &str = "DELETE FROM outbox_workers WHERE id = ?1";

/// Records a live worker ([`GONE`], [`BEAT`], [`PEERS`] in one transaction); returns how many
/// live workers (itself included) serve any of its topics.
pub(super) async fn heartbeat(pool: &SqlitePool, b: &Beat<'_>) -> Result<i64> {
    // SQLite workers poll: there is no sleeping peer to wake.
    let _ = b.wake_peer;
    let now = now_ms();
    let topics = serde_json::to_string(b.topics).unwrap_or_else(|_| "[]".into());
    let id = b.id.to_string();
    let mut conn = pool.acquire().await?;
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    sqlx::query(GONE)
        .bind(now - 60_000)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    sqlx::query(BEAT)
        .bind(&id)
        .bind(b.name)
        .bind(&topics)
        .bind(b.waiting)
        .bind(now)
        .bind(serde_json::to_string(b.versions).unwrap_or_else(|_| "[]".into()))
        .bind(b.host)
        .bind(i64::from(b.pid))
        .bind(b.handlers_json())
        .execute(&mut *tx)
        .await?;
    let peers: i64 = sqlx::query_scalar(PEERS)
        .bind(now - LIVE_MS)
        .bind(&topics)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(peers.max(1))
}

pub(super) async fn list(pool: &SqlitePool) -> Result<Vec<WorkerInfo>> {
    let now = now_ms();
    type Row = (
        String,
        String,
        String,
        String,
        bool,
        i64,
        i64,
        Option<String>,
        Option<i64>,
        String,
    );
    let rows: Vec<Row> = sqlx::query_as(LIST)
        .bind(now - LIVE_MS)
        .fetch_all(pool)
        .await?;
    rows.into_iter()
        .map(
            |(id, name, topics, versions, waiting, started, beat, host, pid, handlers)| {
                Ok(WorkerInfo {
                    id: parse_uuid(&id)?,
                    name,
                    host,
                    pid: pid.and_then(|p| u32::try_from(p).ok()),
                    topics: serde_json::from_str(&topics).unwrap_or_default(),
                    versions: serde_json::from_str(&versions).unwrap_or_default(),
                    handlers: worker_handlers(Some(&handlers)),
                    waiting,
                    started_at: time(started),
                    heartbeat_at: time(beat),
                    live: beat > now - LIVE_MS,
                })
            },
        )
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::from)
}

pub(super) async fn deregister(pool: &SqlitePool, id: Uuid) -> Result<()> {
    sqlx::query(DEREGISTER)
        .bind(id.to_string())
        .execute(pool)
        .await?;
    Ok(())
}
