//! The workers table: each live worker's heartbeat, the list of workers, deregistration.
//!
//! Heartbeats are the server's clock ([`now_ms!`]). A worker's topics and versions are JSON
//! arrays in `LONGTEXT`; which workers serve any of a list of topics is read with `JSON_TABLE`
//! and `JSON_CONTAINS` (MariaDB >= 10.6, MySQL >= 8.0; `JSON_OVERLAPS` would need MariaDB
//! 10.9).

use uuid::Uuid;

use super::{now_ms, retrying, time, MySqlBackend, LIVE_MS};
use crate::backend::{worker_handlers, Beat};
use crate::error::Result;
use crate::model::WorkerInfo;

/// Deletes the rows of workers whose heartbeat is more than a minute old, other than worker
/// `?`: workers that died without deregistering.
const GONE: &str = concat!(
    "DELETE FROM outbox_workers WHERE heartbeat_at < ",
    now_ms!(),
    " - 60000 AND id <> ?"
);

/// Records worker `?` named `?`: its topics `?` (a JSON array) with the highest version it
/// decodes of each (`?`, a JSON array in the same order), whether it waits (`?`), its host
/// (`?`), process id (`?`) and handlers' names per topic (`?`, JSON), and a fresh heartbeat.
const BEAT: &str = concat!(
    "INSERT INTO outbox_workers (id, name, topics, versions, waiting, host, pid, handlers, \
                                 started_at, heartbeat_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ",
    now_ms!(),
    ", ",
    now_ms!(),
    ") \
     ON DUPLICATE KEY UPDATE topics = VALUES(topics), versions = VALUES(versions), \
                             waiting = VALUES(waiting), handlers = VALUES(handlers), \
                             heartbeat_at = VALUES(heartbeat_at)"
);

/// How many workers with a heartbeat within the last `?` ms serve any of the topics `?` (a
/// JSON array).
const PEERS: &str = concat!(
    "SELECT count(DISTINCT w.id) FROM outbox_workers w, \
         JSON_TABLE(w.topics, '$[*]' COLUMNS ( \
             topic VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS t \
     WHERE w.heartbeat_at > ",
    now_ms!(),
    " - ? AND JSON_CONTAINS(?, JSON_QUOTE(t.topic))"
);

/// Registered workers, whether each had a heartbeat within the last `?` ms (is live), the
/// live ones first.
const LIST: &str = concat!(
    "SELECT id, name, topics, versions, waiting, started_at, heartbeat_at, \
            heartbeat_at > ",
    now_ms!(),
    " - ? AS live, host, pid, handlers \
     FROM outbox_workers ORDER BY live DESC, name"
);

/// Removes worker `?`.
const DEREGISTER: &str = "DELETE FROM outbox_workers WHERE id = ?";

/// Records a live worker ([`GONE`], [`BEAT`], [`PEERS`] in one transaction); returns how many
/// live workers (itself included) serve any of its topics.
pub(super) async fn heartbeat(backend: &MySqlBackend, b: &Beat<'_>) -> Result<i64> {
    // MySQL workers poll: there is no sleeping peer to wake.
    let _ = b.wake_peer;
    let topics = serde_json::to_string(b.topics).unwrap_or_else(|_| "[]".into());
    let versions = serde_json::to_string(b.versions).unwrap_or_else(|_| "[]".into());
    let handlers = b.handlers_json();
    let peers: i64 = retrying("heartbeat", || async {
        let mut tx = backend.begin().await?;
        sqlx::query(GONE).bind(b.id).execute(&mut *tx).await?;
        sqlx::query(BEAT)
            .bind(b.id)
            .bind(b.name)
            .bind(&topics)
            .bind(&versions)
            .bind(b.waiting)
            .bind(b.host)
            .bind(i64::from(b.pid))
            .bind(&handlers)
            .execute(&mut *tx)
            .await?;
        let peers = sqlx::query_scalar(PEERS)
            .bind(LIVE_MS)
            .bind(&topics)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(peers)
    })
    .await?;
    Ok(peers.max(1))
}

pub(super) async fn list(b: &MySqlBackend) -> Result<Vec<WorkerInfo>> {
    type Row = (
        Uuid,
        String,
        String,
        Option<String>,
        bool,
        i64,
        i64,
        bool,
        Option<String>,
        Option<i64>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(LIST)
        .bind(LIVE_MS)
        .fetch_all(&b.pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, topics, versions, waiting, started, beat, live, host, pid, handlers)| {
                WorkerInfo {
                    id,
                    name,
                    host,
                    pid: pid.and_then(|p| u32::try_from(p).ok()),
                    topics: serde_json::from_str(&topics).unwrap_or_default(),
                    versions: versions
                        .and_then(|v| serde_json::from_str(&v).ok())
                        .unwrap_or_default(),
                    handlers: worker_handlers(handlers.as_deref()),
                    waiting,
                    started_at: time(started),
                    heartbeat_at: time(beat),
                    live,
                }
            },
        )
        .collect())
}

pub(super) async fn deregister(b: &MySqlBackend, id: Uuid) -> Result<()> {
    sqlx::query(DEREGISTER).bind(id).execute(&b.pool).await?;
    Ok(())
}
