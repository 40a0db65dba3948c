//! Shared helpers for the integration tests: a fresh, migrated database per test.

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};

/// The server the PostgreSQL tests use: `DATABASE_URL`, or the local test server.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A database of its own for one test, created empty and migrated.
#[derive(Debug)]
pub struct TestDb {
    /// A pool on the new database.
    pub pool: PgPool,
    /// The URL of the new database, for child processes.
    pub url: String,
    /// The database's name.
    pub name: String,
}

/// Creates a fresh database, applies the outbox migrations and returns it.
///
/// # Panics
///
/// When PostgreSQL cannot be reached: a misconfigured run fails loudly instead of skipping.
pub async fn pg() -> TestDb {
    let db = pg_empty().await;
    outbox_core::migrate(&db.pool)
        .await
        .expect("outbox migrations apply");
    db
}

/// Creates a fresh, empty database (no migrations).
///
/// # Panics
///
/// When PostgreSQL cannot be reached.
pub async fn pg_empty() -> TestDb {
    let base = database_url();
    let opts: PgConnectOptions = base.parse().expect("DATABASE_URL parses");
    let mut admin = PgConnection::connect_with(&opts).await.unwrap_or_else(|e| {
        panic!("cannot connect to PostgreSQL at {base}: {e}; start it or set DATABASE_URL")
    });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    drop_stale(&mut admin, now).await;
    let name = format!("outbox_t_{now}_{}", uuid::Uuid::now_v7().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .expect("create test database");
    admin.close().await.ok();
    let db_opts = opts.clone().database(&name);
    let pool = PgPoolOptions::new()
        .max_connections(10)
        .connect_with(db_opts.clone())
        .await
        .expect("connect to test database");
    TestDb {
        pool,
        url: db_opts.to_url_lossy().to_string(),
        name,
    }
}

/// Drops test databases left behind more than an hour ago by runs that failed or were killed.
async fn drop_stale(admin: &mut PgConnection, now: u64) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE 'outbox\\_t\\_%'")
            .fetch_all(&mut *admin)
            .await
            .unwrap_or_default();
    for name in names {
        let created: Option<u64> = name.split('_').nth(2).and_then(|s| s.parse().ok());
        if created.is_some_and(|t| t + 3600 < now) {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut *admin)
            .await;
        }
    }
}

impl TestDb {
    /// Closes the pool and drops the database.
    pub async fn drop_db(self) {
        // A test may still hold a connection; FORCE ends it rather than waiting for it.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), self.pool.close()).await;
        if let Ok(mut admin) = PgConnection::connect(&database_url()).await {
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut admin)
            .await;
        }
    }

    /// The number of outbox messages in the database.
    pub async fn count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
            .fetch_one(&self.pool)
            .await
            .expect("count outbox rows")
    }
}

/// Events shared by the tests and the test worker binary.
pub mod events {
    use outbox_core::outbox_event;
    use serde::{Deserialize, Serialize};

    /// A unit of work for the test worker: record `n`, after sleeping `sleep_ms`.
    #[outbox_event(topic = "test.work")]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Work {
        /// A number to record.
        pub n: i64,
        /// How long the handler sleeps before recording.
        #[serde(default)]
        pub sleep_ms: u64,
    }
}

