//! The embedded migrations and the runner that applies them, one migrator at a time.

use sqlx::sqlite::SqlitePool;

use crate::backend::schema::{self, Migration};
use crate::clock::now_ms;
use crate::error::Result;

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox messages and deliveries",
        sql: include_str!("../../../migrations/sqlite/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "processed-id records",
        sql: include_str!("../../../migrations/sqlite/0002_processed.sql"),
    },
    Migration {
        version: 3,
        description: "partial indexes for operations",
        sql: include_str!("../../../migrations/sqlite/0003_ops_indexes.sql"),
    },
    Migration {
        version: 4,
        description: "live rows only: UUID keys, deleted when done, dead letters apart, workers",
        sql: include_str!("../../../migrations/sqlite/0004_live_rows.sql"),
    },
    Migration {
        version: 5,
        description: "dead letters counted per topic",
        sql: include_str!("../../../migrations/sqlite/0005_dead_counts.sql"),
    },
    Migration {
        version: 6,
        description: "ordering keys: per-key order, dead letters that hold their key",
        sql: include_str!("../../../migrations/sqlite/0006_ordering_keys.sql"),
    },
    Migration {
        version: 7,
        description: "trace context (W3C traceparent and tracestate) of messages and dead letters",
        sql: include_str!("../../../migrations/sqlite/0007_trace_context.sql"),
    },
    Migration {
        version: 8,
        description:
            "retried dead letters that released their key wait for the key's claimed messages",
        sql: include_str!("../../../migrations/sqlite/0008_retried_releases.sql"),
    },
    Migration {
        version: 9,
        description: "event versions of messages and dead letters, and the versions workers know",
        sql: include_str!("../../../migrations/sqlite/0009_event_versions.sql"),
    },
    Migration {
        version: 10,
        description: "the event log: retention per topic and the delivered events it keeps",
        sql: include_str!("../../../migrations/sqlite/0010_event_log.sql"),
    },
    Migration {
        version: 11,
        description: "replays of the event log to one handler, and the handlers seen",
        sql: include_str!("../../../migrations/sqlite/0011_replays.sql"),
    },
    Migration {
        version: 12,
        description: "a key's order is the database's insert order (seq), not the id's",
        sql: include_str!("../../../migrations/sqlite/0012_commit_order.sql"),
    },
    Migration {
        version: 13,
        description: "who each worker is: its host, process id and handlers per topic",
        sql: include_str!("../../../migrations/sqlite/0013_worker_identity.sql"),
    },
    Migration {
        version: 14,
        description: "pauses of handlers and topics, and the messages parked by a paused handler",
        sql: include_str!("../../../migrations/sqlite/0014_pauses.sql"),
    },
    Migration {
        version: 15,
        description: "circuit breakers per handler, shared by every worker",
        sql: include_str!("../../../migrations/sqlite/0015_breakers.sql"),
    },
];

const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
    version INTEGER PRIMARY KEY, description TEXT NOT NULL, \
    checksum INTEGER NOT NULL, applied_at INTEGER NOT NULL)";

const APPLIED: &str = "SELECT version, checksum FROM outbox_migrations ORDER BY version";

/// `?1` version, `?2` description, `?3` checksum, `?4` now.
const RECORD_APPLIED: &str = "INSERT INTO outbox_migrations (version, description, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)";

/// Applies the migrations this database still needs, all in one transaction.
pub(super) async fn migrate(pool: &SqlitePool, up_to: Option<i64>) -> Result<()> {
    let mut conn = pool.acquire().await?;
    // BEGIN IMMEDIATE takes the write lock first, so concurrent migrators queue up.
    let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE").await?;
    sqlx::query(CREATE_MIGRATIONS_TABLE)
        .execute(&mut *tx)
        .await?;
    let applied: Vec<(i64, i64)> = sqlx::query_as(APPLIED).fetch_all(&mut *tx).await?;
    for m in schema::pending(MIGRATIONS, &applied)?
        .into_iter()
        .filter(|m| up_to.is_none_or(|last| m.version <= last))
    {
        sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
        sqlx::query(RECORD_APPLIED)
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
