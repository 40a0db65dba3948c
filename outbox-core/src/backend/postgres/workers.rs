//! The workers table: each live worker's heartbeat, the list of workers, deregistration.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use uuid::Uuid;

use crate::backend::{worker_handlers, Beat};
use crate::error::Result;
use crate::model::WorkerInfo;

/// Records worker `$1` named `$2`: whether it waits on its wake-up channel (`$3`), its topics
/// (`$4`) with the highest version it decodes of each (`$6`) and its handlers' names for each
/// (`$9`, JSON), its host (`$7`) and process id (`$8`), and a fresh heartbeat; with `$5`, wakes
/// one other waiting worker of its topics.
/// Returns how many live workers (itself included) serve any of its topics.
///
/// Rows of workers that died without deregistering are deleted after a minute; producers stop
/// notifying them long before. The row is a hint, so it commits without waiting for its WAL
/// flush.
const HEARTBEAT: &str = "WITH gone AS ( \
        DELETE FROM outbox_workers WHERE heartbeat_at < now() - interval '1 minute' AND id <> $1 \
     ), me AS ( \
        INSERT INTO outbox_workers (id, name, waiting, topics, versions, host, pid, handlers) \
        SELECT $1, $2, $3, $4::text[], $6::int4[], $7, $8, $9 \
        FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
        ON CONFLICT (id) DO UPDATE SET waiting = $3, topics = $4::text[], versions = $6::int4[], \
                                       handlers = $9, heartbeat_at = now() \
     ), woke AS ( \
        SELECT pg_notify('outbox_wakeup', w.id::text) FROM outbox_workers w \
        WHERE $5 AND w.id <> $1 AND w.waiting AND w.topics && $4::text[] \
          AND w.heartbeat_at > now() - interval '5 seconds' LIMIT 1 \
     ) \
     SELECT 1 + count(*) + (SELECT count(*) FROM woke) * 0 FROM outbox_workers \
     WHERE id <> $1 AND topics && $4::text[] AND heartbeat_at > now() - interval '5 seconds'";

/// Registered workers, live ones first.
const LIST: &str = "SELECT id, name, topics, versions, waiting, started_at, heartbeat_at, \
            heartbeat_at > now() - interval '5 seconds' AS live, host, pid, handlers \
     FROM outbox_workers ORDER BY live DESC, name";

/// Removes worker `$1`.
const DEREGISTER: &str = "DELETE FROM outbox_workers WHERE id = $1";

pub(super) async fn heartbeat(pool: &PgPool, b: &Beat<'_>) -> Result<i64> {
    Ok(sqlx::query_scalar(HEARTBEAT)
        .bind(b.id)
        .bind(b.name)
        .bind(b.waiting)
        .bind(b.topics)
        .bind(b.wake_peer)
        .bind(b.versions)
        .bind(b.host)
        .bind(i64::from(b.pid))
        .bind(b.handlers_json())
        .fetch_one(pool)
        .await?)
}

pub(super) async fn list(pool: &PgPool) -> Result<Vec<WorkerInfo>> {
    type Row = (
        Uuid,
        String,
        Vec<String>,
        Vec<i32>,
        bool,
        DateTime<Utc>,
        DateTime<Utc>,
        bool,
        Option<String>,
        Option<i64>,
        String,
    );
    let rows: Vec<Row> = sqlx::query_as(LIST).fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(
            |(
                id,
                name,
                topics,
                versions,
                waiting,
                started_at,
                heartbeat_at,
                live,
                host,
                pid,
                handlers,
            )| {
                WorkerInfo {
                    id,
                    name,
                    host,
                    pid: pid.and_then(|p| u32::try_from(p).ok()),
                    topics,
                    versions,
                    handlers: worker_handlers(Some(&handlers)),
                    waiting,
                    started_at,
                    heartbeat_at,
                    live,
                }
            },
        )
        .collect())
}

pub(super) async fn deregister(pool: &PgPool, id: Uuid) -> Result<()> {
    sqlx::query(DEREGISTER).bind(id).execute(pool).await?;
    Ok(())
}
