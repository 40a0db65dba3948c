//! The embedded migrations and the runner that applies them, one migrator at a time.

use sqlx::postgres::PgPool;
use sqlx::PgConnection;

use crate::backend::schema::{self, Migration};
use crate::error::Result;

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox messages, deliveries and workers",
        sql: include_str!("../../../migrations/postgres/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "processed-id records",
        sql: include_str!("../../../migrations/postgres/0002_processed.sql"),
    },
    Migration {
        version: 3,
        description: "partial indexes for operations",
        sql: include_str!("../../../migrations/postgres/0003_ops_indexes.sql"),
    },
    Migration {
        version: 4,
        description: "live rows only: UUID keys, HOT claims, deleted when done, dead letters apart",
        sql: include_str!("../../../migrations/postgres/0004_live_rows.sql"),
    },
    Migration {
        version: 5,
        description: "dead letters counted per topic",
        sql: include_str!("../../../migrations/postgres/0005_dead_counts.sql"),
    },
    Migration {
        version: 6,
        description: "ordering keys: per-key order, dead letters that hold their key",
        sql: include_str!("../../../migrations/postgres/0006_ordering_keys.sql"),
    },
    Migration {
        version: 7,
        description: "trace context (W3C traceparent and tracestate) of messages and dead letters",
        sql: include_str!("../../../migrations/postgres/0007_trace_context.sql"),
    },
    Migration {
        version: 8,
        description:
            "retried dead letters that released their key wait for the key's claimed messages",
        sql: include_str!("../../../migrations/postgres/0008_retried_releases.sql"),
    },
    Migration {
        version: 9,
        description: "event versions of messages and dead letters, and the versions workers know",
        sql: include_str!("../../../migrations/postgres/0009_event_versions.sql"),
    },
    Migration {
        version: 10,
        description: "the event log: retention per topic and the delivered events it keeps",
        sql: include_str!("../../../migrations/postgres/0010_event_log.sql"),
    },
    Migration {
        version: 11,
        description: "replays of the event log to one handler, and the handlers seen",
        sql: include_str!("../../../migrations/postgres/0011_replays.sql"),
    },
    Migration {
        version: 12,
        description: "a key's order is the database's insert order (seq), not the id's",
        sql: include_str!("../../../migrations/postgres/0012_commit_order.sql"),
    },
    Migration {
        version: 13,
        description: "who each worker is: its host, process id and handlers per topic",
        sql: include_str!("../../../migrations/postgres/0013_worker_identity.sql"),
    },
    Migration {
        version: 14,
        description: "pauses of handlers and topics, and the messages parked by a paused handler",
        sql: include_str!("../../../migrations/postgres/0014_pauses.sql"),
    },
    Migration {
        version: 15,
        description: "circuit breakers per handler, shared by every worker",
        sql: include_str!("../../../migrations/postgres/0015_breakers.sql"),
    },
];

/// The advisory lock key that serialises migrations ("outbox" in ASCII).
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78;

/// `$1` the lock key.
const LOCK: &str = "SELECT pg_advisory_lock($1)";

/// `$1` the lock key.
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
    version BIGINT PRIMARY KEY, \
    description TEXT NOT NULL, \
    checksum BIGINT NOT NULL, \
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";

/// Whether `outbox_migrations` exists where an unqualified name finds it: only then is
/// [`CREATE_MIGRATIONS_TABLE`] skipped, so a start on a migrated database logs no server
/// notice ("relation ... already exists, skipping").
const MIGRATIONS_TABLE_EXISTS: &str = "SELECT to_regclass('outbox_migrations') IS NOT NULL";

const APPLIED: &str = "SELECT version, checksum FROM outbox_migrations ORDER BY version";

/// `$1` version, `$2` description, `$3` checksum.
const RECORD_APPLIED: &str =
    "INSERT INTO outbox_migrations (version, description, checksum) VALUES ($1, $2, $3)";

/// Applies the migrations this database still needs, under the migration lock.
pub(super) async fn migrate(pool: &PgPool, up_to: Option<i64>) -> Result<()> {
    // A connection of its own, out of the pool: the advisory lock is the session's, and if
    // this future is dropped mid-way the connection closes with it (releasing the lock)
    // rather than going back to the pool still holding it.
    let mut conn = pool.acquire().await?.detach();
    sqlx::query(LOCK)
        .bind(MIGRATION_LOCK)
        .execute(&mut conn)
        .await?;
    let result = apply(&mut conn, up_to).await;
    // Closing the session releases the lock; an unlock first says so explicitly.
    let unlock = sqlx::query(UNLOCK)
        .bind(MIGRATION_LOCK)
        .execute(&mut conn)
        .await;
    let _ = sqlx::Connection::close(conn).await;
    result?;
    unlock?;
    Ok(())
}

/// Runs each pending migration in a transaction of its own, recording it there.
async fn apply(conn: &mut PgConnection, up_to: Option<i64>) -> Result<()> {
    let exists: bool = sqlx::query_scalar(MIGRATIONS_TABLE_EXISTS)
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        sqlx::query(CREATE_MIGRATIONS_TABLE)
            .execute(&mut *conn)
            .await?;
    }
    let applied: Vec<(i64, i64)> = sqlx::query_as(APPLIED).fetch_all(&mut *conn).await?;
    for m in schema::pending(MIGRATIONS, &applied)?
        .into_iter()
        .filter(|m| up_to.is_none_or(|last| m.version <= last))
    {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
        sqlx::query(RECORD_APPLIED)
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
