//! Every SQL statement for PostgreSQL.

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::selection;
use super::{Backend, ClaimParams, ClaimedMessage, Failure, Fence, Wake, WakeupListener};
use crate::__private::NewMessage;
use crate::error::{Error, Result};
use crate::migrate::Migration;
use crate::ops::{DeadLetterFilter, DeadSelection, MessageInfo, TopicStats};

/// The channel producers notify when a worker is waiting.
const WAKEUP_CHANNEL: &str = "outbox_wakeup";

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
];

const MESSAGE_COLUMNS: &str =
    "public_id, topic, status, attempts, payload::text AS payload, last_error, \
     created_at, available_at, processed_at";

fn message_info(r: &sqlx::postgres::PgRow) -> Result<MessageInfo, sqlx::Error> {
    Ok(MessageInfo {
        id: r.try_get("public_id")?,
        topic: r.try_get("topic")?,
        status: r.try_get("status")?,
        attempts: r.try_get("attempts")?,
        payload: r.try_get("payload")?,
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
        available_at: r.try_get("available_at")?,
        processed_at: r.try_get("processed_at")?,
    })
}

pub(crate) struct PgBackend {
    pool: PgPool,
}

impl PgBackend {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// One insert for one or many rows; it also wakes a waiting worker, but only when one is
/// waiting and the message is due now, so busy systems never take NOTIFY's commit lock.
pub(crate) async fn outbox_insert(
    conn: &mut PgConnection,
    rows: &[NewMessage],
) -> Result<(), sqlx::Error> {
    if let [row] = rows {
        sqlx::query(
            "WITH ins AS ( \
                INSERT INTO outbox_messages (public_id, topic, payload, idempotency_key, available_at) \
                VALUES ($1, $2, $3::jsonb, $4, now() + make_interval(secs => $5)) \
             ) \
             SELECT pg_notify('outbox_wakeup', '') FROM outbox_workers WHERE waiting AND $5 = 0 LIMIT 1",
        )
        .bind(row.public_id)
        .bind(row.topic)
        .bind(&row.payload)
        .bind(&row.idempotency_key)
        .bind(secs(row.delay))
        .execute(conn)
        .await?;
        return Ok(());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.public_id).collect();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic).collect();
    let payloads: Vec<&str> = rows.iter().map(|r| r.payload.as_str()).collect();
    let keys: Vec<Option<&str>> = rows.iter().map(|r| r.idempotency_key.as_deref()).collect();
    let delays: Vec<f64> = rows.iter().map(|r| secs(r.delay)).collect();
    let due_now = rows.iter().any(|r| r.delay.is_zero());
    sqlx::query(
        "WITH ins AS ( \
            INSERT INTO outbox_messages (public_id, topic, payload, idempotency_key, available_at) \
            SELECT u.public_id, u.topic, u.payload::jsonb, u.idempotency_key, now() + make_interval(secs => u.delay) \
            FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[]) \
                 AS u(public_id, topic, payload, idempotency_key, delay) \
         ) \
         SELECT pg_notify('outbox_wakeup', '') FROM outbox_workers WHERE waiting AND $6 LIMIT 1",
    )
    .bind(ids)
    .bind(topics)
    .bind(payloads)
    .bind(keys)
    .bind(delays)
    .bind(due_now)
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait]
impl Backend for PgBackend {
    async fn migrate(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
        let result = apply_migrations(&mut conn).await;
        let unlock = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        result?;
        unlock?;
        Ok(())
    }

    async fn outbox_claim_batch(&self, p: &ClaimParams<'_>) -> Result<Vec<ClaimedMessage>> {
        // Per topic, the index gives due rows in order; the outer LIMIT stops the lateral scan as
        // soon as the batch is full, and rows of topics not asked for are never read.
        //
        // The claim commits without waiting for its WAL flush (`synchronous_commit` off for this
        // one transaction, set where the topic list is read, which the lateral scan needs first).
        // A claim lost in a server crash only hands the message out again, which at-least-once
        // allows; outcomes (done, failed, dead) still commit durably.
        let rows = sqlx::query(
            "WITH picked AS ( \
                SELECT c.id \
                FROM unnest(CASE WHEN set_config('synchronous_commit', 'off', true) = 'off' \
                                 THEN $1::text[] END) AS t(topic) \
                CROSS JOIN LATERAL ( \
                    SELECT id FROM outbox_messages \
                    WHERE topic = t.topic AND status IN ('pending', 'running') AND available_at <= now() \
                    ORDER BY available_at, id \
                    LIMIT $2 \
                    FOR UPDATE SKIP LOCKED \
                ) c \
                LIMIT $2 \
             ) \
             UPDATE outbox_messages m \
             SET status = 'running', attempts = m.attempts + 1, claim_token = $3, claimed_by = $4, \
                 claimed_at = now(), available_at = now() + make_interval(secs => $5) \
             FROM picked WHERE m.id = picked.id \
             RETURNING m.id, m.public_id, m.topic, m.payload::text AS payload, m.idempotency_key, \
                       m.attempts, m.created_at, m.last_error",
        )
        .bind(p.topics)
        .bind(p.limit)
        .bind(p.claim_token)
        .bind(p.worker)
        .bind(secs(p.lease))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ClaimedMessage {
                    id: r.try_get("id")?,
                    public_id: r.try_get("public_id")?,
                    topic: r.try_get("topic")?,
                    payload: r.try_get("payload")?,
                    idempotency_key: r.try_get("idempotency_key")?,
                    attempts: r.try_get("attempts")?,
                    created_at: r.try_get("created_at")?,
                    claim_token: p.claim_token,
                    last_error: r.try_get("last_error")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(Error::from)
    }

    async fn delivery_completed(&self, message_ids: &[i64]) -> Result<Vec<(i64, String)>> {
        Ok(sqlx::query_as(
            "SELECT message_id, handler FROM outbox_deliveries WHERE message_id = ANY($1::bigint[])",
        )
        .bind(message_ids)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_mark_done(&self, done: &[Fence]) -> Result<u64> {
        let ids: Vec<i64> = done.iter().map(|f| f.id).collect();
        let tokens: Vec<Uuid> = done.iter().map(|f| f.claim_token).collect();
        let r = sqlx::query(
            "UPDATE outbox_messages m \
             SET status = 'done', processed_at = now(), claim_token = NULL \
             FROM UNNEST($1::bigint[], $2::uuid[]) AS d(id, claim_token) \
             WHERE m.id = d.id AND m.claim_token = d.claim_token AND m.status = 'running'",
        )
        .bind(ids)
        .bind(tokens)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_mark_failed(&self, f: &Failure<'_>) -> Result<bool> {
        let dead = f.retry_in.is_none();
        let delay = f.retry_in.map(secs).unwrap_or(0.0);
        let n: i64 = sqlx::query_scalar(
            "WITH upd AS ( \
                UPDATE outbox_messages \
                SET status = CASE WHEN $3 THEN 'dead' ELSE 'pending' END, \
                    available_at = CASE WHEN $3 THEN available_at ELSE now() + make_interval(secs => $4) END, \
                    processed_at = CASE WHEN $3 THEN now() ELSE NULL END, \
                    last_error = $5, claim_token = NULL \
                WHERE id = $1 AND claim_token = $2 AND status = 'running' \
                RETURNING id \
             ), ins AS ( \
                INSERT INTO outbox_deliveries (message_id, handler) \
                SELECT $1, h FROM unnest($6::text[]) AS h WHERE EXISTS (SELECT 1 FROM upd) \
                ON CONFLICT DO NOTHING \
             ) \
             SELECT count(*) FROM upd",
        )
        .bind(f.fence.id)
        .bind(f.fence.claim_token)
        .bind(dead)
        .bind(delay)
        .bind(f.error)
        .bind(f.succeeded)
        .fetch_one(&self.pool)
        .await?;
        Ok(n > 0)
    }

    async fn outbox_unknown_topics(&self, known: &[&str]) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT topic, count(*) FROM outbox_messages \
             WHERE status IN ('pending', 'running') AND NOT (topic = ANY($1::text[])) \
             GROUP BY topic ORDER BY topic",
        )
        .bind(known)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn outbox_stats(&self) -> Result<Vec<TopicStats>> {
        // Each part reads through its own partial index: pending/running, dead, recent done.
        let rows: Vec<(String, i64, i64, i64, i64, i64, Option<f64>)> = sqlx::query_as(
            "WITH live AS ( \
                SELECT topic, \
                       count(*) FILTER (WHERE available_at <= now()) AS ready, \
                       count(*) FILTER (WHERE status = 'pending' AND available_at > now()) AS scheduled, \
                       count(*) FILTER (WHERE status = 'running' AND available_at > now()) AS in_flight, \
                       extract(epoch FROM now() - min(available_at) FILTER (WHERE available_at <= now()))::float8 AS oldest \
                FROM outbox_messages WHERE status IN ('pending', 'running') GROUP BY topic \
             ), dead AS ( \
                SELECT topic, count(*) AS dead FROM outbox_messages WHERE status = 'dead' GROUP BY topic \
             ), done AS ( \
                SELECT topic, count(*) AS done FROM outbox_messages \
                WHERE status = 'done' AND processed_at > now() - interval '5 minutes' GROUP BY topic \
             ), topics AS ( \
                SELECT topic FROM live UNION SELECT topic FROM dead UNION SELECT topic FROM done \
             ) \
             SELECT t.topic, coalesce(l.ready, 0), coalesce(l.scheduled, 0), coalesce(l.in_flight, 0), \
                    coalesce(d.dead, 0), coalesce(o.done, 0), l.oldest \
             FROM topics t \
             LEFT JOIN live l ON l.topic = t.topic \
             LEFT JOIN dead d ON d.topic = t.topic \
             LEFT JOIN done o ON o.topic = t.topic \
             ORDER BY t.topic",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(topic, ready, scheduled, in_flight, dead, done_last_5m, oldest)| TopicStats {
                    topic,
                    ready,
                    scheduled,
                    in_flight,
                    dead,
                    done_last_5m,
                    oldest_ready_age: oldest
                        .and_then(|s| std::time::Duration::try_from_secs_f64(s.max(0.0)).ok()),
                },
            )
            .collect())
    }

    async fn outbox_dead_list(&self, f: &DeadLetterFilter) -> Result<Vec<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS} FROM outbox_messages \
             WHERE status = 'dead' AND ($1::text IS NULL OR topic = $1) \
               AND ($2::float8 IS NULL OR processed_at <= now() - make_interval(secs => $2)) \
             ORDER BY processed_at DESC LIMIT $3"
        ));
        let rows = sqlx::query(sql)
            .bind(f.topic.as_deref())
            .bind(f.older_than.map(secs))
            .bind(i64::from(f.limit.unwrap_or(100)))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(message_info).collect::<Result<_, _>>()?)
    }

    async fn outbox_message(&self, id: Uuid) -> Result<Option<MessageInfo>> {
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS} FROM outbox_messages WHERE public_id = $1"
        ));
        let row = sqlx::query(sql).bind(id).fetch_optional(&self.pool).await?;
        Ok(row.as_ref().map(message_info).transpose()?)
    }

    async fn outbox_dead_retry(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        let r = sqlx::query(
            "UPDATE outbox_messages \
             SET status = 'pending', attempts = 0, available_at = now(), processed_at = NULL, claim_token = NULL \
             WHERE status = 'dead' AND ($1::uuid IS NULL OR public_id = $1) AND ($2::text IS NULL OR topic = $2)",
        )
        .bind(id)
        .bind(topic)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_dead_discard(&self, which: &DeadSelection) -> Result<u64> {
        let (id, topic) = selection(which);
        let r = sqlx::query(
            "DELETE FROM outbox_messages \
             WHERE status = 'dead' AND ($1::uuid IS NULL OR public_id = $1) AND ($2::text IS NULL OR topic = $2)",
        )
        .bind(id)
        .bind(topic)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    async fn outbox_purge_done(&self, older_than: std::time::Duration, batch: i64) -> Result<u64> {
        let r = sqlx::query(
            // `= ANY(ARRAY(...))` keeps the delete on the primary key; `IN (...)` lets the
            // planner hash-join against a scan of the whole table.
            "DELETE FROM outbox_messages WHERE id = ANY(ARRAY( \
                SELECT id FROM outbox_messages \
                WHERE status = 'done' AND processed_at < now() - make_interval(secs => $1) \
                ORDER BY processed_at LIMIT $2))",
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

    async fn worker_set_waiting(&self, id: Uuid, name: &str, waiting: bool) -> Result<()> {
        // Rows of workers that died without deregistering stop counting after a minute, so
        // producers do not notify for ever on their behalf.
        // The flag is a hint (a lost write means one poll interval of delay at worst), so it
        // commits without waiting for its WAL flush.
        sqlx::query(
            "WITH gone AS (DELETE FROM outbox_workers WHERE heartbeat_at < now() - interval '1 minute' AND id <> $1) \
             INSERT INTO outbox_workers (id, name, waiting) \
             SELECT $1, $3, $2 FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit \
             ON CONFLICT (id) DO UPDATE SET waiting = $2, heartbeat_at = now()",
        )
        .bind(id)
        .bind(waiting)
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn worker_deregister(&self, id: Uuid) -> Result<()> {
        sqlx::query("DELETE FROM outbox_workers WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn listens(&self) -> bool {
        true
    }

    async fn wakeup_listener(&self) -> Result<Option<Box<dyn WakeupListener>>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(WAKEUP_CHANNEL).await?;
        Ok(Some(Box::new(PgWakeup(listener))))
    }
}

struct PgWakeup(PgListener);

#[async_trait]
impl WakeupListener for PgWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        // `None` means the connection was lost: it reconnects on the next call, and
        // notifications sent meanwhile are gone, so wake the worker to look for itself.
        let _ = self.0.try_recv().await?;
        Ok(Wake::Committed)
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
    if let Some((v, _)) = applied
        .iter()
        .find(|(v, _)| MIGRATIONS.iter().all(|m| m.version != *v))
    {
        return Err(Error::MigrationUnknown { version: *v });
    }
    for m in MIGRATIONS {
        match applied.iter().find(|(v, _)| *v == m.version) {
            Some((_, sum)) if *sum != m.checksum() => {
                return Err(Error::MigrationChanged { version: m.version })
            }
            Some(_) => continue,
            None => {}
        }
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
