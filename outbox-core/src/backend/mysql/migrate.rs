//! The embedded migrations and the runner that applies them, one migrator at a time.
//!
//! MySQL commits every DDL statement on its own, so migrations cannot share one transaction
//! as on PostgreSQL and SQLite. One migrator runs at a time per database, under a named lock
//! (`GET_LOCK`; the name holds a hash of the database's name, since named locks are the whole
//! server's), held by a connection of its own that is closed, not pooled, when the migrator
//! ends or is cancelled, so no pooled session keeps the lock; each migration's statements run one
//! by one, and its record is written after the last. A migration that fails part-way leaves
//! its earlier statements applied and is not recorded: the error names it, and the schema
//! must be mended by hand before the next run (each statement here is one that a rerun would
//! refuse, such as a table that already exists, rather than silently repeat).

use sqlx::mysql::MySqlPool;
use sqlx::Connection;

use crate::backend::schema::{self, Migration};
use crate::error::{Error, Result};

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "outbox messages and deliveries",
        sql: include_str!("../../../migrations/mysql/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        description: "processed-id records",
        sql: include_str!("../../../migrations/mysql/0002_processed.sql"),
    },
    Migration {
        version: 3,
        description: "the claim's index",
        sql: include_str!("../../../migrations/mysql/0003_ops_indexes.sql"),
    },
    Migration {
        version: 4,
        description: "live rows only: UUID keys, deleted when done, dead letters apart, workers",
        sql: include_str!("../../../migrations/mysql/0004_live_rows.sql"),
    },
    Migration {
        version: 5,
        description: "dead letters counted per topic",
        sql: include_str!("../../../migrations/mysql/0005_dead_counts.sql"),
    },
    Migration {
        version: 6,
        description: "ordering keys: per-key order, dead letters that hold their key",
        sql: include_str!("../../../migrations/mysql/0006_ordering_keys.sql"),
    },
    Migration {
        version: 7,
        description: "trace context (W3C traceparent and tracestate) of messages and dead letters",
        sql: include_str!("../../../migrations/mysql/0007_trace_context.sql"),
    },
    Migration {
        version: 8,
        description:
            "retried dead letters that released their key wait for the key's claimed messages",
        sql: include_str!("../../../migrations/mysql/0008_retried_releases.sql"),
    },
    Migration {
        version: 9,
        description: "event versions of messages and dead letters, and the versions workers know",
        sql: include_str!("../../../migrations/mysql/0009_event_versions.sql"),
    },
    Migration {
        version: 10,
        description: "the event log: retention per topic and the delivered events it keeps",
        sql: include_str!("../../../migrations/mysql/0010_event_log.sql"),
    },
    Migration {
        version: 11,
        description: "replays of the event log to one handler, and the handlers seen",
        sql: include_str!("../../../migrations/mysql/0011_replays.sql"),
    },
    Migration {
        version: 12,
        description: "a key's order is the database's insert order (seq), not the id's",
        sql: include_str!("../../../migrations/mysql/0012_commit_order.sql"),
    },
    Migration {
        version: 13,
        description: "who each worker is: its host, process id and handlers per topic",
        sql: include_str!("../../../migrations/mysql/0013_worker_identity.sql"),
    },
    Migration {
        version: 14,
        description: "pauses of handlers and topics, and the messages parked by a paused handler",
        sql: include_str!("../../../migrations/mysql/0014_pauses.sql"),
    },
    Migration {
        version: 15,
        description: "circuit breakers per handler, shared by every worker",
        sql: include_str!("../../../migrations/mysql/0015_breakers.sql"),
    },
];

const CREATE_MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS outbox_migrations ( \
    version BIGINT PRIMARY KEY, description VARCHAR(255) NOT NULL, \
    checksum BIGINT NOT NULL, applied_at BIGINT NOT NULL) ENGINE = InnoDB";

const APPLIED: &str = "SELECT version, checksum FROM outbox_migrations ORDER BY version";

/// `?` version, description, checksum.
const RECORD_APPLIED: &str = concat!(
    "INSERT INTO outbox_migrations (version, description, checksum, applied_at) VALUES (?, ?, ?, ",
    super::now_ms!(),
    ")"
);

/// Takes this database's migrators' named lock, waiting up to 60 s: 1 when taken.
const LOCK: &str = "SELECT GET_LOCK(CONCAT('outbox_migrate.', MD5(DATABASE())), 60)";

/// Applies the migrations this database still needs, one migrator at a time.
pub(super) async fn migrate(pool: &MySqlPool, up_to: Option<i64>) -> Result<()> {
    // Out of the pool: the lock ends with this connection, whatever happens.
    let mut conn = pool.acquire().await?.detach();
    let locked: Option<i64> = sqlx::query_scalar(LOCK).fetch_one(&mut conn).await?;
    if locked != Some(1) {
        return Err(Error::Config(
            "another process has been migrating this database for over 60 s (its named lock \
             `outbox_migrate.<hash of the database name>` is held); wait for it to finish, or \
             end its session"
                .into(),
        ));
    }
    let result = apply(&mut conn, up_to).await;
    // Closing the connection releases the lock; an error here changes nothing.
    let _ = conn.close().await;
    result
}

async fn apply(conn: &mut sqlx::MySqlConnection, up_to: Option<i64>) -> Result<()> {
    sqlx::query(CREATE_MIGRATIONS_TABLE)
        .execute(&mut *conn)
        .await?;
    let applied: Vec<(i64, i64)> = sqlx::query_as(APPLIED).fetch_all(&mut *conn).await?;
    for m in schema::pending(MIGRATIONS, &applied)?
        .into_iter()
        .filter(|m| up_to.is_none_or(|last| m.version <= last))
    {
        for statement in statements(m.sql) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(&mut *conn)
                .await?;
        }
        let mut tx = conn.begin().await?;
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

/// The statements of a migration: its text split at each `;` that ends a line, comment lines
/// left out. (The migrations here keep every statement's own semicolons, if any, inside a
/// line.)
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in sql.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let statement = current.trim().trim_end_matches(';').to_owned();
            out.push(statement);
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_splits_into_whole_statements() {
        for m in MIGRATIONS {
            let parts = statements(m.sql);
            assert!(!parts.is_empty(), "migration {} has statements", m.version);
            for p in parts {
                assert!(
                    !p.contains(";\n"),
                    "one statement per part in {}: {p}",
                    m.version
                );
                assert!(!p.ends_with(';'));
            }
        }
    }
}
