//! Shared helpers for the integration tests: a fresh, migrated database per test.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{
    ConnectOptions, Connection, MySqlConnection, MySqlPool, PgConnection, PgPool, SqlitePool,
};
use uuid::Uuid;

pub mod nats;
pub mod protocol_trace;
mod throwaway;

/// The server the PostgreSQL tests use: `DATABASE_URL`, else the local test server, else a
/// throwaway server started for this test binary when PostgreSQL is installed (see
/// `support/throwaway.rs`).
pub fn database_url() -> String {
    throwaway::url()
}

/// Waits until `done` holds, looking every 5 ms.
///
/// # Panics
///
/// With `what` as the message, when `done` still does not hold after `limit`.
pub async fn wait_until(limit: Duration, what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A database of its own for one test, created empty and migrated. It is dropped by
/// [`TestDb::drop_db`], or, when a test panics or returns early, when the `TestDb` goes away.
#[derive(Debug)]
pub struct TestDb {
    /// A pool on the new database.
    pub pool: PgPool,
    /// The URL of the new database, for child processes.
    pub url: String,
    /// The database's name.
    pub name: String,
    guard: DropGuard,
}

/// Drops a test database when it goes away without [`TestDb::drop_db`] (or
/// [`MySqlDb::drop_db`]): a panicking test leaves nothing behind.
#[derive(Debug)]
struct DropGuard {
    name: Option<String>,
    server: Server,
}

/// The server a test database is on.
#[derive(Debug, Clone, Copy)]
enum Server {
    Postgres,
    MySql,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else { return };
        let server = self.server;
        // Drop may run inside a runtime (or while one unwinds): a thread of its own, with a
        // runtime of its own, does the async work.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                match server {
                    Server::Postgres => {
                        if let Ok(mut admin) = PgConnection::connect(&database_url()).await {
                            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )))
                            .execute(&mut admin)
                            .await;
                        }
                    }
                    Server::MySql => {
                        if let Ok(mut admin) = MySqlConnection::connect(&mysql_url()).await {
                            mysql_drop(&mut admin, &name).await;
                        }
                    }
                }
            });
        })
        .join();
    }
}

/// A plain HTTP/1.0 GET of `path` on `addr`: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Sends SIGKILL to a child process: it dies at once, as in a crash or an OOM kill, with no
/// chance to clean up.
pub fn sigkill(child: &tokio::process::Child) {
    send_signal(child, "-KILL");
}

/// Sends SIGTERM to a child process: a supervisor's stop request.
pub fn sigterm(child: &tokio::process::Child) {
    send_signal(child, "-TERM");
}

fn send_signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("the child is running");
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}: {status}");
}

/// A number of milliseconds below `below`, different from run to run: when the next kill of a
/// chaos test falls.
pub fn random_ms(below: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(Instant::now()) % below.max(1)
}

/// Workers running in the background, each until its sender is dropped or sent on.
pub type Running = Vec<(
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
)>;

/// Runs `workers` in the background until [`stop`].
pub fn start(workers: Vec<outbox::Worker>) -> Running {
    workers
        .into_iter()
        .map(|w| {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                w.run_until(async {
                    let _ = rx.await;
                })
                .await
                .expect("the worker runs");
            });
            (tx, task)
        })
        .collect()
}

/// Stops workers started with [`start`], one after another, and waits for each to end.
pub async fn stop(running: Running) {
    for (tx, task) in running {
        let _ = tx.send(());
        task.await.expect("the worker task ends");
    }
}

/// Creates a fresh database, applies the outbox migrations and returns it.
///
/// # Panics
///
/// When PostgreSQL cannot be reached: a misconfigured run fails loudly instead of skipping.
pub async fn pg() -> TestDb {
    let db = pg_empty().await;
    outbox::migrate(&db.pool)
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
        guard: DropGuard {
            name: Some(name.clone()),
            server: Server::Postgres,
        },
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
    pub async fn drop_db(mut self) {
        self.guard.name = None;
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

    /// How many sequential scans `tables` have had, in order, counting those of every
    /// connection of `watched` (a pool of one connection that ran the statements under test):
    /// its statistics are flushed first, which a backend otherwise reports up to 10 s later.
    pub async fn seq_scans(&self, watched: &PgPool, tables: &[&str]) -> Vec<i64> {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(watched)
            .await
            .expect("flush the statistics");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut conn = self.pool.acquire().await.expect("a connection");
        sqlx::query("SELECT pg_stat_clear_snapshot()")
            .execute(&mut *conn)
            .await
            .expect("a fresh snapshot");
        let mut scans = Vec::new();
        for table in tables {
            scans.push(
                sqlx::query_scalar("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = $1")
                    .bind(table)
                    .fetch_one(&mut *conn)
                    .await
                    .expect("the table's statistics"),
            );
        }
        scans
    }

    /// The number of stored messages: live (pending or running) and dead. A done message is
    /// deleted, so it is not counted.
    pub async fn count(&self) -> i64 {
        scalar(
            &self.pool,
            "SELECT (SELECT count(*) FROM outbox_messages) + (SELECT count(*) FROM outbox_dead)",
        )
        .await
    }

    /// The number of messages in `status`: `pending` (live, not under a running lease),
    /// `running` (lease running), `dead` (in `outbox_dead`) or `done` (deleted, counted in
    /// `outbox_done_counts` until `purge_done` removes the count).
    pub async fn count_status(&self, status: &str) -> i64 {
        let sql = match status {
            "pending" => {
                "SELECT count(*) FROM outbox_messages WHERE locked_until IS NULL OR locked_until < now()"
            }
            "running" => "SELECT count(*) FROM outbox_messages WHERE locked_until >= now()",
            "dead" => "SELECT count(*) FROM outbox_dead",
            "done" => "SELECT coalesce(sum(done), 0)::bigint FROM outbox_done_counts",
            other => panic!("no status {other}"),
        };
        scalar(&self.pool, sql).await
    }

    /// (status, attempts, last_error) of one message, from the live table, then the dead one;
    /// `None` when it is in neither: done (deleted).
    pub async fn state(&self, id: Uuid) -> Option<(String, i32, Option<String>)> {
        sqlx::query_as(
            "SELECT CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END, attempts, last_error \
             FROM outbox_messages WHERE id = $1 \
             UNION ALL SELECT 'dead', attempts, last_error FROM outbox_dead WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .expect("message state")
    }

    /// (status, attempts, last_error) of a message that is live or dead.
    ///
    /// # Panics
    ///
    /// When the message is in neither table (done, or never stored).
    pub async fn status(&self, id: Uuid) -> (String, i32, Option<String>) {
        self.state(id)
            .await
            .unwrap_or_else(|| panic!("message {id} is neither live nor dead"))
    }

    /// Keeps a copy of every row deleted from the live table (done, or moved to the dead
    /// letters), so a test can still see how a done message ended
    /// ([`status_archived`](Self::status_archived)) or put it back as if its "done" had been
    /// lost ([`undo_done`](Self::undo_done)). A trigger of the test only: the library deletes a
    /// done message for good.
    pub async fn archive_done(&self) {
        sqlx::raw_sql(
            "CREATE TABLE test_deleted (LIKE outbox_messages); \
             ALTER TABLE test_deleted ADD COLUMN archived BIGSERIAL PRIMARY KEY; \
             CREATE FUNCTION test_archive_deleted() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 INSERT INTO test_deleted SELECT (OLD).*; \
                 RETURN OLD; \
             END $$; \
             CREATE TRIGGER test_archive_deleted AFTER DELETE ON outbox_messages \
                 FOR EACH ROW EXECUTE FUNCTION test_archive_deleted();",
        )
        .execute(&self.pool)
        .await
        .expect("archive deleted rows");
    }

    /// (status, attempts, last_error) of one message, as [`status`](Self::status), and for a
    /// message deleted as done, `"done"` with the attempts and error of its last row. Needs
    /// [`archive_done`](Self::archive_done) before the message was done.
    ///
    /// # Panics
    ///
    /// When the message is in none of the tables.
    pub async fn status_archived(&self, id: Uuid) -> (String, i32, Option<String>) {
        sqlx::query_as(
            "SELECT status, attempts, last_error FROM ( \
                SELECT 0 AS rank, CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END AS status, \
                       attempts, last_error FROM outbox_messages WHERE id = $1 \
                UNION ALL SELECT 1, 'dead', attempts, last_error FROM outbox_dead WHERE id = $1 \
                UNION ALL (SELECT 2, 'done', attempts, last_error FROM test_deleted WHERE id = $1 \
                           ORDER BY archived DESC LIMIT 1) \
             ) s ORDER BY rank LIMIT 1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .expect("archived message state")
        .unwrap_or_else(|| panic!("message {id} was never stored"))
    }

    /// Puts a done message back as if its "done" had been lost in a crash: its last row, still
    /// claimed, by a worker whose lease ran out a second ago, so it is delivered again. Needs
    /// [`archive_done`](Self::archive_done) before the message was done.
    pub async fn undo_done(&self, id: Uuid) {
        let n = sqlx::query(
            "INSERT INTO outbox_messages (id, topic, payload, idempotency_key, attempts, available_at, \
                                          locked_until, claim_token, claimed_by, last_error, created_at) \
             SELECT id, topic, payload, idempotency_key, attempts, available_at, \
                    now() - interval '1 second', coalesce(claim_token, gen_random_uuid()), claimed_by, \
                    last_error, created_at \
             FROM test_deleted WHERE id = $1 ORDER BY archived DESC LIMIT 1",
        )
        .bind(id)
        .execute(&self.pool)
        .await
        .expect("undo done")
        .rows_affected();
        assert_eq!(n, 1, "message {id} was not archived as deleted");
    }

    /// Makes every pending (unclaimed) message due now, instead of waiting for its backoff.
    pub async fn make_due(&self) {
        sqlx::query("UPDATE outbox_messages SET available_at = now() WHERE locked_until IS NULL")
            .execute(&self.pool)
            .await
            .expect("make due");
    }

    /// Makes every live message look claimed by a worker that died: `attempts` counted, a
    /// claim token, a lease that ran out a second ago, and `last_error`.
    pub async fn crash_claims(&self, attempts: i32, last_error: &str) {
        sqlx::query(
            "UPDATE outbox_messages SET attempts = $1, last_error = $2, claim_token = gen_random_uuid(), \
             claimed_by = gen_random_uuid(), locked_until = now() - interval '1 second'",
        )
        .bind(attempts)
        .bind(last_error)
        .execute(&self.pool)
        .await
        .expect("crash claims");
    }

    /// Seconds until the message is available (negative when due).
    pub async fn delay_secs(&self, id: Uuid) -> f64 {
        sqlx::query_scalar("SELECT extract(epoch FROM available_at - now())::float8 FROM outbox_messages WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("delay")
    }

    /// Seconds between creation and availability.
    pub async fn scheduled_secs(&self, id: Uuid) -> f64 {
        sqlx::query_scalar(
            "SELECT extract(epoch FROM available_at - created_at)::float8 FROM outbox_messages WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("scheduled delay")
    }

    /// Replaces the claim of a claimed message, as a newer claim would: a new token, one more
    /// attempt, a fresh minute-long lease. True if it was claimed.
    pub async fn steal_claim(&self, id: Uuid, token: Uuid) -> bool {
        sqlx::query(
            "UPDATE outbox_messages SET claim_token = $1, attempts = attempts + 1, \
             locked_until = now() + interval '60 seconds' \
             WHERE id = $2 AND claim_token IS NOT NULL",
        )
        .bind(token)
        .bind(id)
        .execute(&self.pool)
        .await
        .expect("steal claim")
        .rows_affected()
            == 1
    }

    /// (status, claim token, last_error) of one live message.
    pub async fn claim_state(&self, id: Uuid) -> (String, Option<Uuid>, Option<String>) {
        sqlx::query_as(
            "SELECT CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END, claim_token, last_error \
             FROM outbox_messages WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("claim state")
    }

    /// The handlers recorded as succeeded for a message.
    pub async fn deliveries(&self, id: Uuid) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT handler FROM outbox_deliveries WHERE message_id = $1 ORDER BY handler",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .expect("deliveries")
    }

    /// Inserts `n` messages of `topic` with a raw JSON payload, bypassing `enqueue`.
    pub async fn insert_raw(&self, topic: &str, payload: &str, n: i64) {
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        sqlx::query(
            "INSERT INTO outbox_messages (id, topic, payload) \
             SELECT u.id, $2, $3::json FROM UNNEST($1::uuid[]) AS u(id)",
        )
        .bind(ids)
        .bind(topic)
        .bind(payload)
        .execute(&self.pool)
        .await
        .expect("raw insert");
    }

    /// Inserts one message of `topic` with a raw JSON payload stored as event version
    /// `version`, bypassing `enqueue`; returns its id.
    pub async fn insert_version(&self, topic: &str, payload: &str, version: i32) -> Uuid {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO outbox_messages (id, topic, payload, version) VALUES ($1, $2, $3::json, $4)",
        )
        .bind(id)
        .bind(topic)
        .bind(payload)
        .bind(version)
        .execute(&self.pool)
        .await
        .expect("raw insert");
        id
    }

    /// Drops the event log's day partitions after today of the first retained topic, as if no
    /// worker had created the days ahead; returns how many it dropped.
    pub async fn drop_future_log_days(&self) -> i64 {
        const FUTURE: &str =
            "FROM outbox_event_days(1) WHERE day > (now() AT TIME ZONE 'UTC')::date";
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) {FUTURE}")))
            .fetch_one(&self.pool)
            .await
            .expect("count the days ahead");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DO $$ DECLARE p regclass; BEGIN \
               FOR p IN SELECT partition {FUTURE} LOOP EXECUTE format('DROP TABLE %s', p); END LOOP; \
             END $$"
        )))
        .execute(&self.pool)
        .await
        .expect("drop the days ahead");
        n
    }

    /// Rewrites the stored payload of event `id` of the event log, as a build whose type has
    /// since changed would have stored it; returns how many events it rewrote.
    pub async fn set_event_payload(&self, id: Uuid, payload: &str) -> u64 {
        sqlx::query("UPDATE outbox_events SET payload = $1::json WHERE id = $2")
            .bind(payload)
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("rewrite an event's payload")
            .rows_affected()
    }

    /// The applied outbox migration versions.
    pub async fn migration_versions(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT version FROM outbox_migrations ORDER BY version")
            .fetch_all(&self.pool)
            .await
            .expect("migration versions")
    }
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// A SQLite database of its own for one test: a file in a temporary directory, migrated.
#[derive(Debug)]
pub struct SqliteDb {
    /// A pool on the database (WAL, busy timeout).
    pub pool: SqlitePool,
    /// The URL of the database, for child processes.
    pub url: String,
    dir: tempfile::TempDir,
}

/// Creates a fresh SQLite database file and applies the outbox migrations.
pub async fn sqlite() -> SqliteDb {
    let db = sqlite_empty().await;
    outbox::migrate(&db.pool)
        .await
        .expect("outbox migrations apply on SQLite");
    db
}

/// Creates a fresh, empty SQLite database file.
pub async fn sqlite_empty() -> SqliteDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("outbox.sqlite").display());
    let pool = outbox::sqlite_pool(&url).await.expect("open SQLite");
    SqliteDb { pool, url, dir }
}

fn now_ms_sql() -> &'static str {
    "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
}

impl SqliteDb {
    /// Closes the pool; the directory goes with `self`.
    pub async fn drop_db(self) {
        self.pool.close().await;
        drop(self.dir);
    }

    /// The number of stored messages: live (pending or running) and dead. A done message is
    /// deleted, so it is not counted.
    pub async fn count(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM outbox_messages) + (SELECT count(*) FROM outbox_dead)",
        )
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    /// The number of messages in `status`: `pending` (live, not under a running lease),
    /// `running` (lease running), `dead` (in `outbox_dead`) or `done` (deleted, counted in
    /// `outbox_done_counts` until `purge_done` removes the count).
    pub async fn count_status(&self, status: &str) -> i64 {
        let now = now_ms_sql();
        let sql = match status {
            "pending" => format!(
                "SELECT count(*) FROM outbox_messages WHERE locked_until IS NULL OR locked_until < {now}"
            ),
            "running" => format!("SELECT count(*) FROM outbox_messages WHERE locked_until >= {now}"),
            "dead" => "SELECT count(*) FROM outbox_dead".to_string(),
            "done" => "SELECT coalesce(sum(done), 0) FROM outbox_done_counts".to_string(),
            other => panic!("no status {other}"),
        };
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("count by status")
    }

    /// (status, attempts, last_error) of one message, from the live table, then the dead one;
    /// `None` when it is in neither: done (deleted).
    pub async fn state(&self, id: Uuid) -> Option<(String, i32, Option<String>)> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT CASE WHEN locked_until >= {} THEN 'running' ELSE 'pending' END, attempts, last_error \
             FROM outbox_messages WHERE id = ?1 \
             UNION ALL SELECT 'dead', attempts, last_error FROM outbox_dead WHERE id = ?1",
            now_ms_sql()
        )))
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await
        .expect("message state")
    }

    /// (status, attempts, last_error) of a message that is live or dead.
    ///
    /// # Panics
    ///
    /// When the message is in neither table (done, or never stored).
    pub async fn status(&self, id: Uuid) -> (String, i32, Option<String>) {
        self.state(id)
            .await
            .unwrap_or_else(|| panic!("message {id} is neither live nor dead"))
    }

    /// Keeps a copy of every row deleted from the live table (done, or moved to the dead
    /// letters) in `test_deleted`, so a test can still see how a done message ended (its
    /// attempts, who claimed it). A trigger of the test only: the library deletes a done
    /// message for good.
    pub async fn archive_done(&self) {
        sqlx::raw_sql(
            "CREATE TABLE test_deleted (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, \
                 topic TEXT, payload TEXT, idempotency_key TEXT, attempts INTEGER, available_at INTEGER, \
                 locked_until INTEGER, claim_token TEXT, claimed_by TEXT, last_error TEXT, created_at INTEGER); \
             CREATE TRIGGER test_archive_deleted AFTER DELETE ON outbox_messages BEGIN \
                 INSERT INTO test_deleted (id, topic, payload, idempotency_key, attempts, available_at, \
                                           locked_until, claim_token, claimed_by, last_error, created_at) \
                 VALUES (OLD.id, OLD.topic, OLD.payload, OLD.idempotency_key, OLD.attempts, OLD.available_at, \
                         OLD.locked_until, OLD.claim_token, OLD.claimed_by, OLD.last_error, OLD.created_at); \
             END;",
        )
        .execute(&self.pool)
        .await
        .expect("archive deleted rows");
    }

    /// Makes every pending (unclaimed) message due now.
    pub async fn make_due(&self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET available_at = {} WHERE locked_until IS NULL",
            now_ms_sql()
        )))
        .execute(&self.pool)
        .await
        .expect("make due");
    }

    /// Makes every live message look claimed by a worker that died: `attempts` counted, a
    /// claim token, a lease that ran out a second ago, and `last_error`.
    pub async fn crash_claims(&self, attempts: i32, last_error: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET attempts = ?1, last_error = ?2, claim_token = ?3, \
             claimed_by = ?4, locked_until = {} - 1000",
            now_ms_sql()
        )))
        .bind(attempts)
        .bind(last_error)
        .bind(Uuid::now_v7().to_string())
        .bind(Uuid::now_v7().to_string())
        .execute(&self.pool)
        .await
        .expect("crash claims");
    }

    /// Seconds until the message is available.
    pub async fn delay_secs(&self, id: Uuid) -> f64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT (available_at - {}) / 1000.0 FROM outbox_messages WHERE id = ?1",
            now_ms_sql()
        )))
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await
        .expect("delay")
    }

    /// Seconds between creation and availability.
    pub async fn scheduled_secs(&self, id: Uuid) -> f64 {
        sqlx::query_scalar(
            "SELECT (available_at - created_at) / 1000.0 FROM outbox_messages WHERE id = ?1",
        )
        .bind(id.to_string())
        .fetch_one(&self.pool)
        .await
        .expect("scheduled delay")
    }

    /// Replaces the claim of a claimed message, as a newer claim would: a new token, one more
    /// attempt, a fresh minute-long lease. True if it was claimed.
    pub async fn steal_claim(&self, id: Uuid, token: Uuid) -> bool {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET claim_token = ?1, attempts = attempts + 1, \
             locked_until = {} + 60000 WHERE id = ?2 AND claim_token IS NOT NULL",
            now_ms_sql()
        )))
        .bind(token.to_string())
        .bind(id.to_string())
        .execute(&self.pool)
        .await
        .expect("steal claim")
        .rows_affected()
            == 1
    }

    /// (status, claim token, last_error) of one live message.
    pub async fn claim_state(&self, id: Uuid) -> (String, Option<Uuid>, Option<String>) {
        let (s, t, e): (String, Option<String>, Option<String>) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT CASE WHEN locked_until >= {} THEN 'running' ELSE 'pending' END, claim_token, last_error \
                 FROM outbox_messages WHERE id = ?1",
                now_ms_sql()
            )))
            .bind(id.to_string())
            .fetch_one(&self.pool)
            .await
            .expect("claim state");
        (s, t.map(|t| Uuid::parse_str(&t).expect("uuid text")), e)
    }

    /// The handlers recorded as succeeded for a message.
    pub async fn deliveries(&self, id: Uuid) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT handler FROM outbox_deliveries WHERE message_id = ?1 ORDER BY handler",
        )
        .bind(id.to_string())
        .fetch_all(&self.pool)
        .await
        .expect("deliveries")
    }

    /// Inserts `n` messages of `topic` with a raw JSON payload, bypassing `enqueue`.
    pub async fn insert_raw(&self, topic: &str, payload: &str, n: i64) {
        for _ in 0..n {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO outbox_messages (id, topic, payload, available_at, created_at) \
                 VALUES (?1, ?2, ?3, {0}, {0})",
                now_ms_sql()
            )))
            .bind(Uuid::now_v7().to_string())
            .bind(topic)
            .bind(payload)
            .execute(&self.pool)
            .await
            .expect("raw insert");
        }
    }

    /// Inserts one message of `topic` with a raw JSON payload stored as event version
    /// `version`, bypassing `enqueue`; returns its id.
    pub async fn insert_version(&self, topic: &str, payload: &str, version: i32) -> Uuid {
        let id = Uuid::now_v7();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO outbox_messages (id, topic, payload, version, available_at, created_at) \
             VALUES (?1, ?2, ?3, ?4, {0}, {0})",
            now_ms_sql()
        )))
        .bind(id.to_string())
        .bind(topic)
        .bind(payload)
        .bind(version)
        .execute(&self.pool)
        .await
        .expect("raw insert");
        id
    }

    /// Rewrites the stored payload of event `id` of the event log, as a build whose type has
    /// since changed would have stored it; returns how many events it rewrote.
    pub async fn set_event_payload(&self, id: Uuid, payload: &str) -> u64 {
        sqlx::query("UPDATE outbox_events SET payload = ?1 WHERE id = ?2")
            .bind(payload)
            .bind(id.to_string())
            .execute(&self.pool)
            .await
            .expect("rewrite an event's payload")
            .rows_affected()
    }

    /// The applied outbox migration versions.
    pub async fn migration_versions(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT version FROM outbox_migrations ORDER BY version")
            .fetch_all(&self.pool)
            .await
            .expect("migration versions")
    }
}

/// Whether the MariaDB/MySQL tests can run: the server at [`mysql_url`] accepts a TCP
/// connection (looked at once per test process). When it does not, each test that needs it
/// says on stderr that it is skipped and why, and passes; with `OUTBOX_REQUIRE_MYSQL=1` (set
/// by `.ci/run`) a missing server fails it instead. Use [`skip_without_mysql!`] at the top of
/// such a test.
///
/// # Panics
///
/// When the server is missing and `OUTBOX_REQUIRE_MYSQL=1`.
pub fn mysql_up(test: &str) -> bool {
    static UP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let url = mysql_url();
    let up = *UP.get_or_init(|| {
        let opts: MySqlConnectOptions = match url.parse() {
            Ok(o) => o,
            Err(_) => return false,
        };
        let addr = format!("{}:{}", opts.get_host(), opts.get_port());
        std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| {
                std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
            })
    });
    if up {
        return true;
    }
    assert!(
        !std::env::var("OUTBOX_REQUIRE_MYSQL").is_ok_and(|v| v == "1"),
        "{test}: no MariaDB/MySQL at {url}; start it or set MYSQL_URL (OUTBOX_REQUIRE_MYSQL=1 \
         makes this a failure rather than a skip)"
    );
    eprintln!(
        "SKIPPED {test}: no MariaDB/MySQL at {url}; start one (or set MYSQL_URL) to run the \
         MariaDB tests"
    );
    false
}

/// Returns from the test (a skip, said on stderr) when no MariaDB/MySQL server is there to
/// run it; see [`mysql_up`].
#[macro_export]
macro_rules! skip_without_mysql {
    () => {
        if !$crate::mysql_up(module_path!()) {
            return;
        }
    };
}

/// The MariaDB or MySQL server the MySQL tests use: `MYSQL_URL`, else the local test server
/// (`mysql://root@127.0.0.1:3306`). Each test gets a database of its own on it.
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// A MariaDB (or MySQL) database of its own for one test, created empty and migrated. It is
/// dropped by [`MySqlDb::drop_db`], or, when a test panics or returns early, when the
/// `MySqlDb` goes away.
#[derive(Debug)]
pub struct MySqlDb {
    /// A pool on the new database.
    pub pool: MySqlPool,
    /// The URL of the new database, for child processes.
    pub url: String,
    /// The database's name.
    pub name: String,
    guard: DropGuard,
}

/// Creates a fresh MariaDB database, applies the outbox migrations and returns it.
///
/// # Panics
///
/// When the server cannot be reached: a misconfigured run fails loudly instead of skipping.
pub async fn mysql() -> MySqlDb {
    let db = mysql_empty().await;
    outbox::migrate(&db.pool)
        .await
        .expect("outbox migrations apply on MySQL");
    db
}

/// Creates a fresh, empty MariaDB database (no migrations).
///
/// # Panics
///
/// When the server cannot be reached.
pub async fn mysql_empty() -> MySqlDb {
    let base = mysql_url();
    let opts: MySqlConnectOptions = base.parse().expect("MYSQL_URL parses");
    let mut admin = MySqlConnection::connect_with(&opts)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot connect to MariaDB/MySQL at {base}: {e}; start it or set MYSQL_URL")
        });
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    mysql_drop_stale(&mut admin, now).await;
    let name = format!("outbox_t_{now}_{}", uuid::Uuid::now_v7().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    )))
    .execute(&mut admin)
    .await
    .expect("create test database");
    admin.close().await.ok();
    let db_opts = opts.clone().database(&name);
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .connect_with(db_opts.clone())
        .await
        .expect("connect to test database");
    MySqlDb {
        pool,
        url: db_opts.to_url_lossy().to_string(),
        guard: DropGuard {
            name: Some(name.clone()),
            server: Server::MySql,
        },
        name,
    }
}

/// Ends the sessions still on database `name` (as PostgreSQL's `WITH (FORCE)` does: a
/// session in a transaction would hold the drop back), then drops it.
async fn mysql_drop(admin: &mut MySqlConnection, name: &str) {
    let sessions: Vec<i64> = sqlx::query_scalar(
        "SELECT CAST(id AS SIGNED) FROM information_schema.processlist WHERE db = ?",
    )
    .bind(name)
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for id in sessions {
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
            .execute(&mut *admin)
            .await;
    }
    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name}"
    )))
    .execute(&mut *admin)
    .await;
}

/// Drops MariaDB test databases left behind more than an hour ago by runs that failed or were
/// killed.
async fn mysql_drop_stale(admin: &mut MySqlConnection, now: u64) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT CAST(schema_name AS CHAR) FROM information_schema.schemata \
         WHERE schema_name LIKE 'outbox\\_t\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for name in names {
        let created: Option<u64> = name.split('_').nth(2).and_then(|s| s.parse().ok());
        if created.is_some_and(|t| t + 3600 < now) {
            mysql_drop(admin, &name).await;
        }
    }
}

/// The server's clock in Unix milliseconds, as the MySQL backend reads it.
const MYSQL_NOW_MS: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

impl MySqlDb {
    /// Closes the pool and drops the database.
    pub async fn drop_db(mut self) {
        self.guard.name = None;
        // A test may still hold a connection; `mysql_drop` ends it rather than waiting for it.
        let _ = tokio::time::timeout(Duration::from_secs(1), self.pool.close()).await;
        if let Ok(mut admin) = MySqlConnection::connect(&mysql_url()).await {
            mysql_drop(&mut admin, &self.name).await;
        }
    }

    /// The number of stored messages: live (pending or running) and dead. A done message is
    /// deleted, so it is not counted.
    pub async fn count(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT CAST((SELECT count(*) FROM outbox_messages) \
                         + (SELECT count(*) FROM outbox_dead) AS SIGNED)",
        )
        .fetch_one(&self.pool)
        .await
        .expect("count")
    }

    /// The number of messages in `status`: `pending` (live, not under a running lease),
    /// `running` (lease running), `dead` (in `outbox_dead`) or `done` (deleted, counted in
    /// `outbox_done_counts` until `purge_done` removes the count).
    pub async fn count_status(&self, status: &str) -> i64 {
        let sql = match status {
            "pending" => format!(
                "SELECT count(*) FROM outbox_messages \
                 WHERE locked_until IS NULL OR locked_until < {MYSQL_NOW_MS}"
            ),
            "running" => {
                format!("SELECT count(*) FROM outbox_messages WHERE locked_until >= {MYSQL_NOW_MS}")
            }
            "dead" => "SELECT count(*) FROM outbox_dead".to_string(),
            // SUM is DECIMAL on MySQL.
            "done" => {
                "SELECT CAST(coalesce(sum(done), 0) AS SIGNED) FROM outbox_done_counts".to_string()
            }
            other => panic!("no status {other}"),
        };
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("count by status")
    }

    /// (status, attempts, last_error) of one message, from the live table, then the dead one;
    /// `None` when it is in neither: done (deleted).
    pub async fn state(&self, id: Uuid) -> Option<(String, i32, Option<String>)> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT CASE WHEN locked_until >= {MYSQL_NOW_MS} THEN 'running' ELSE 'pending' END, \
                    attempts, last_error \
             FROM outbox_messages WHERE id = ? \
             UNION ALL SELECT 'dead', attempts, last_error FROM outbox_dead WHERE id = ?"
        )))
        .bind(id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .expect("message state")
    }

    /// (status, attempts, last_error) of a message that is live or dead.
    ///
    /// # Panics
    ///
    /// When the message is in neither table (done, or never stored).
    pub async fn status(&self, id: Uuid) -> (String, i32, Option<String>) {
        self.state(id)
            .await
            .unwrap_or_else(|| panic!("message {id} is neither live nor dead"))
    }

    /// Keeps a copy of every row deleted from the live table (done, or moved to the dead
    /// letters) in `test_deleted`, so a test can still see how a done message ended (its
    /// attempts, who claimed it). A trigger of the test only: the library deletes a done
    /// message for good.
    pub async fn archive_done(&self) {
        for statement in [
            "CREATE TABLE test_deleted (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 id BINARY(16) NOT NULL, topic VARCHAR(64), payload LONGTEXT, \
                 idempotency_key TEXT, attempts INT, available_at BIGINT, locked_until BIGINT, \
                 claim_token BINARY(16), claimed_by BINARY(16), last_error TEXT, \
                 created_at BIGINT) ENGINE = InnoDB",
            "CREATE TRIGGER test_archive_deleted AFTER DELETE ON outbox_messages FOR EACH ROW \
                 INSERT INTO test_deleted (id, topic, payload, idempotency_key, attempts, \
                                           available_at, locked_until, claim_token, claimed_by, \
                                           last_error, created_at) \
                 VALUES (OLD.id, OLD.topic, OLD.payload, OLD.idempotency_key, OLD.attempts, \
                         OLD.available_at, OLD.locked_until, OLD.claim_token, OLD.claimed_by, \
                         OLD.last_error, OLD.created_at)",
        ] {
            sqlx::raw_sql(statement)
                .execute(&self.pool)
                .await
                .expect("archive deleted rows");
        }
    }

    /// Makes every pending (unclaimed) message due now.
    pub async fn make_due(&self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET available_at = {MYSQL_NOW_MS} WHERE locked_until IS NULL"
        )))
        .execute(&self.pool)
        .await
        .expect("make due");
    }

    /// Makes every live message look claimed by a worker that died: `attempts` counted, a
    /// claim token, a lease that ran out a second ago, and `last_error`.
    pub async fn crash_claims(&self, attempts: i32, last_error: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET attempts = ?, last_error = ?, claim_token = ?, \
             claimed_by = ?, locked_until = {MYSQL_NOW_MS} - 1000"
        )))
        .bind(attempts)
        .bind(last_error)
        .bind(Uuid::now_v7())
        .bind(Uuid::now_v7())
        .execute(&self.pool)
        .await
        .expect("crash claims");
    }

    /// Seconds until the message is available (negative when due).
    pub async fn delay_secs(&self, id: Uuid) -> f64 {
        // Divided by a float literal: a DOUBLE, where `/ 1000.0` would be a DECIMAL.
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT (available_at - {MYSQL_NOW_MS}) / 1e3 FROM outbox_messages WHERE id = ?"
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("delay")
    }

    /// Seconds between creation and availability.
    pub async fn scheduled_secs(&self, id: Uuid) -> f64 {
        sqlx::query_scalar(
            "SELECT (available_at - created_at) / 1e3 FROM outbox_messages WHERE id = ?",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("scheduled delay")
    }

    /// Replaces the claim of a claimed message, as a newer claim would: a new token, one more
    /// attempt, a fresh minute-long lease. True if it was claimed.
    pub async fn steal_claim(&self, id: Uuid, token: Uuid) -> bool {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox_messages SET claim_token = ?, attempts = attempts + 1, \
             locked_until = {MYSQL_NOW_MS} + 60000 WHERE id = ? AND claim_token IS NOT NULL"
        )))
        .bind(token)
        .bind(id)
        .execute(&self.pool)
        .await
        .expect("steal claim")
        .rows_affected()
            == 1
    }

    /// (status, claim token, last_error) of one live message.
    pub async fn claim_state(&self, id: Uuid) -> (String, Option<Uuid>, Option<String>) {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT CASE WHEN locked_until >= {MYSQL_NOW_MS} THEN 'running' ELSE 'pending' END, \
                    claim_token, last_error \
             FROM outbox_messages WHERE id = ?"
        )))
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .expect("claim state")
    }

    /// The handlers recorded as succeeded for a message.
    pub async fn deliveries(&self, id: Uuid) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT handler FROM outbox_deliveries WHERE message_id = ? ORDER BY handler",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .expect("deliveries")
    }

    /// Inserts `n` messages of `topic` with a raw JSON payload, bypassing `enqueue`.
    pub async fn insert_raw(&self, topic: &str, payload: &str, n: i64) {
        for _ in 0..n {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO outbox_messages (id, topic, payload, available_at, created_at) \
                 VALUES (?, ?, ?, {MYSQL_NOW_MS}, {MYSQL_NOW_MS})"
            )))
            .bind(Uuid::now_v7())
            .bind(topic)
            .bind(payload)
            .execute(&self.pool)
            .await
            .expect("raw insert");
        }
    }

    /// Inserts one message of `topic` with a raw JSON payload stored as event version
    /// `version`, bypassing `enqueue`; returns its id.
    pub async fn insert_version(&self, topic: &str, payload: &str, version: i32) -> Uuid {
        let id = Uuid::now_v7();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO outbox_messages (id, topic, payload, version, available_at, created_at) \
             VALUES (?, ?, ?, ?, {MYSQL_NOW_MS}, {MYSQL_NOW_MS})"
        )))
        .bind(id)
        .bind(topic)
        .bind(payload)
        .bind(version)
        .execute(&self.pool)
        .await
        .expect("raw insert");
        id
    }

    /// Rewrites the stored payload of event `id` of the event log, as a build whose type has
    /// since changed would have stored it; returns how many events it rewrote.
    pub async fn set_event_payload(&self, id: Uuid, payload: &str) -> u64 {
        sqlx::query("UPDATE outbox_events SET payload = ? WHERE id = ?")
            .bind(payload)
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("rewrite an event's payload")
            .rows_affected()
    }

    /// The applied outbox migration versions.
    pub async fn migration_versions(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT version FROM outbox_migrations ORDER BY version")
            .fetch_all(&self.pool)
            .await
            .expect("migration versions")
    }
}

/// Events shared by the tests and the test worker binary.
pub mod events {
    use outbox::outbox_event;
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

/// A test event whose payload says how its handler should behave, and that handler.
pub mod jobs {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use outbox::{
        outbox_event, Context, Handler, HandlerError, RetryPolicy, Store, Worker, WorkerConfig,
    };
    use serde::{Deserialize, Serialize};

    /// A job for [`Runner`]; topic `test.job`.
    #[outbox_event(topic = "test.job")]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct Job {
        /// A number, echoed in errors.
        pub n: i64,
        /// What the handler does with it.
        #[serde(default)]
        pub mode: Mode,
    }

    /// What [`Runner`] does with a job.
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub enum Mode {
        /// Succeeds.
        #[default]
        Ok,
        /// Fails, retryably.
        Fail,
        /// Fails for good.
        Permanent,
        /// Panics.
        Panic,
        /// Sleeps an hour (past any test's handler timeout).
        Hang,
        /// Fails with a 100 KB error.
        HugeError,
        /// Asks to be retried in 100 s.
        RetryAfter,
        /// Sleeps 600 ms, then succeeds.
        Slow,
    }

    /// A job.
    pub fn job(n: i64, mode: Mode) -> Job {
        Job { n, mode }
    }

    /// How often a handler was called.
    #[derive(Debug, Default)]
    pub struct Counts {
        /// Calls so far.
        pub calls: AtomicUsize,
    }

    impl Counts {
        /// Calls so far.
        pub fn get(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    /// Does what the job's mode says; counts its calls.
    #[derive(Debug)]
    pub struct Runner(pub Arc<Counts>);

    #[outbox::async_trait]
    impl Handler for Runner {
        type Event = Job;
        const NAME: &'static str = "runner";

        async fn handle(&self, job: Job, _ctx: &Context) -> Result<(), HandlerError> {
            self.0.calls.fetch_add(1, Ordering::SeqCst);
            match job.mode {
                Mode::Ok => Ok(()),
                Mode::Fail => Err(HandlerError::retry(format!(
                    "provider unavailable for job {}",
                    job.n
                ))),
                Mode::Permanent => Err(HandlerError::permanent("recipient rejected")),
                Mode::Panic => panic!("job {} exploded", job.n),
                Mode::Hang => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }
                Mode::HugeError => Err(HandlerError::retry("x".repeat(100_000))),
                Mode::RetryAfter => Err(HandlerError::retry_after(
                    Duration::from_secs(100),
                    "rate limited",
                )),
                Mode::Slow => {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    Ok(())
                }
            }
        }
    }

    /// The tests' worker config: exact backoff (no jitter), a 300 ms handler timeout, a 5 s lease.
    pub fn config() -> WorkerConfig {
        WorkerConfig::default()
            .retry(RetryPolicy::default().jitter(false))
            .handler_timeout(Duration::from_millis(300))
            .lease(Duration::from_secs(5))
    }

    /// A worker running in the background: its runner's counts, the channel that stops it, and
    /// its task.
    pub type Started = (
        Arc<Counts>,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), outbox::Error>>,
    );

    /// Starts a worker with a [`Runner`] and `config` in the background; send on the returned
    /// channel to stop it.
    pub fn start(store: impl Into<Store>, config: WorkerConfig) -> Started {
        let counts = Arc::new(Counts::default());
        let w = Worker::builder(store)
            .handler(Runner(counts.clone()))
            .config(config)
            .build()
            .expect("the test worker builds");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            w.run_until(async {
                let _ = stop_rx.await;
            })
            .await
        });
        (counts, stop_tx, running)
    }

    /// A worker with a [`Runner`] and [`config`], and the runner's call counts.
    pub fn worker(store: impl Into<Store>) -> (Worker, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let w = Worker::builder(store)
            .handler(Runner(counts.clone()))
            .config(config())
            .build()
            .expect("the test worker builds");
        (w, counts)
    }
}

/// RabbitMQ for the relay tests: the broker at `AMQP_URL`
/// (default amqp://guest:guest@127.0.0.1:5672/%2f).
pub mod rabbitmq {
    use std::collections::HashMap;
    use std::time::Duration;

    use futures_util::StreamExt;
    use outbox_handlers::lapin::options::{
        BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    };
    use outbox_handlers::lapin::types::{AMQPValue, FieldTable};
    use outbox_handlers::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
    use outbox_handlers::relay::headers;
    use uuid::Uuid;

    /// The string value of header `name` in a delivery's headers table.
    ///
    /// # Panics
    ///
    /// When the header is absent or not a string.
    pub fn header(table: &FieldTable, name: &str) -> String {
        match table.inner().get(name) {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("header {name}: {other:?}"),
        }
    }

    /// The broker's URL.
    pub fn amqp_url() -> String {
        std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
    }

    /// A topic exchange and a queue bound to it for one routing key, unique to one test.
    pub struct Topology {
        /// The connection the topology was declared on.
        pub conn: Connection,
        /// A channel on it.
        pub channel: Channel,
        /// The exchange's name.
        pub exchange: String,
        /// The queue's name.
        pub queue: String,
    }

    impl Topology {
        /// Declares the exchange and the queue, bound for `routing_key`.
        ///
        /// # Panics
        ///
        /// When RabbitMQ cannot be reached.
        pub async fn new(routing_key: &str) -> Topology {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
                .await
                .unwrap_or_else(|e| panic!("cannot connect to RabbitMQ at {}: {e}", amqp_url()));
            let channel = conn.create_channel().await.expect("a channel");
            let id = uuid::Uuid::now_v7().simple().to_string();
            let (exchange, queue) = (format!("test-x-{id}"), format!("test-q-{id}"));
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("declare the exchange");
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("declare the queue");
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    routing_key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("bind the queue");
            Topology {
                conn,
                channel,
                exchange,
                queue,
            }
        }

        /// The `Outbox-Message-Id` of every message in the queue, with how often each occurs.
        ///
        /// Consumes exactly as many deliveries as the broker says the queue holds, so a slow
        /// consumer cannot pass for a lost message: stop every publisher first.
        ///
        /// # Panics
        ///
        /// When a delivery does not arrive within 30 s or has no message id header.
        pub async fn message_ids(&self) -> HashMap<Uuid, usize> {
            let channel = self.conn.create_channel().await.unwrap();
            let held = channel
                .queue_declare(
                    self.queue.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .expect("the queue exists")
                .message_count();
            let mut consumer = channel
                .basic_consume(
                    self.queue.as_str().into(),
                    "message-ids".into(),
                    BasicConsumeOptions {
                        no_ack: true,
                        ..BasicConsumeOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            let mut ids: HashMap<Uuid, usize> = HashMap::new();
            for seen in 0..held {
                let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
                    .await
                    .unwrap_or_else(|_| panic!("the queue holds {held} messages; {seen} arrived"))
                    .expect("a delivery")
                    .expect("no error");
                let table = delivery.properties.headers().as_ref().expect("headers");
                let Some(AMQPValue::LongString(id)) = table.inner().get(headers::MESSAGE_ID) else {
                    panic!("no message id header")
                };
                *ids.entry(id.to_string().parse::<Uuid>().unwrap())
                    .or_default() += 1;
            }
            eprintln!(
                "RabbitMQ's queue held {held} messages, {} distinct",
                ids.len()
            );
            ids
        }

        /// Deletes the queue and the exchange.
        pub async fn delete(self) {
            let _ = self
                .channel
                .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                .await;
            let _ = self
                .channel
                .exchange_delete(
                    self.exchange.as_str().into(),
                    ExchangeDeleteOptions::default(),
                )
                .await;
        }
    }
}

/// A TCP proxy on loopback in front of a broker, to cut connections as a network would.
pub mod proxy {
    use std::sync::{Arc, Mutex};

    use tokio::net::{TcpListener, TcpStream};
    use tokio::task::AbortHandle;

    /// `host:port` of a broker URL (`amqp://user:pw@host:port/vhost` or `host:port`).
    pub fn host_port(url: &str) -> String {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        rest.split('/').next().unwrap_or(rest).to_string()
    }

    /// A TCP proxy on loopback in front of a broker or a database: [`drop_all`](Proxy::drop_all)
    /// closes every connection through it at once, as a network blip or a broker restart would;
    /// [`black_hole`](Proxy::black_hole) stops moving bytes while keeping every connection open,
    /// as a network partition does.
    pub struct Proxy {
        /// The loopback port to connect to instead of the upstream's.
        pub port: u16,
        conns: Arc<Mutex<Vec<AbortHandle>>>,
        accept: AbortHandle,
        holed: tokio::sync::watch::Sender<bool>,
    }

    impl Proxy {
        /// Listens on a free loopback port and forwards every connection to `upstream`
        /// (`host:port`).
        pub async fn start(upstream: String) -> Proxy {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let conns: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
            let held = conns.clone();
            let (holed, hole) = tokio::sync::watch::channel(false);
            let accept = tokio::spawn(async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    let upstream = upstream.clone();
                    let mut hole = hole.clone();
                    let task = tokio::spawn(async move {
                        let holed_now = *hole.borrow();
                        if holed_now {
                            // Accepted, never answered: held open until the test ends.
                            std::future::pending::<()>().await;
                        }
                        if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                                _ = async { hole.wait_for(|h| *h).await.is_ok() } => {
                                    // Both ends stay open; nothing moves any more.
                                    std::future::pending::<()>().await;
                                }
                            }
                        }
                    });
                    let mut conns = held.lock().unwrap();
                    conns.retain(|c| !c.is_finished());
                    conns.push(task.abort_handle());
                }
            })
            .abort_handle();
            Proxy {
                port,
                conns,
                accept,
                holed,
            }
        }

        /// From now on no byte moves either way, and new connections are accepted and never
        /// answered: every open connection hangs, as behind a network partition.
        pub fn black_hole(&self) {
            self.holed.send_replace(true);
        }

        /// Closes every connection through the proxy; returns how many there were.
        pub fn drop_all(&self) -> usize {
            let mut conns = self.conns.lock().unwrap();
            let n = conns.iter().filter(|c| !c.is_finished()).count();
            for c in conns.drain(..) {
                c.abort();
            }
            n
        }
    }

    impl Drop for Proxy {
        fn drop(&mut self) {
            self.accept.abort();
            self.drop_all();
        }
    }
}

/// What a process logs and measures, for tests that check it: the WARN and ERROR events, and
/// the counters of the `metrics` facade.
///
/// Both are process-wide; a test that reads them takes [`ALONE`](crate::observe::ALONE) for writing, and every other
/// test of its binary takes it for reading, so that it runs alone.
pub mod observe {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
    use tracing_subscriber::layer::SubscriberExt;

    /// Taken for writing by a test that reads the log or the metrics, for reading by the others.
    pub static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

    /// One WARN or ERROR event.
    #[derive(Debug)]
    pub struct Line {
        /// WARN or ERROR.
        pub level: tracing::Level,
        /// The event's target, e.g. `lapin::io_loop`.
        pub target: String,
        /// The event's message.
        pub message: String,
        /// The other fields, as `Display` shows a string and `Debug` anything else.
        pub fields: BTreeMap<String, String>,
    }

    impl Line {
        /// Field `name` as a number.
        ///
        /// # Panics
        ///
        /// When the line has no such field, or it is not a number.
        pub fn number(&self, name: &str) -> u64 {
            self.fields
                .get(name)
                .unwrap_or_else(|| panic!("no `{name}` in {self:?}"))
                .parse()
                .unwrap_or_else(|e| panic!("`{name}` in {self:?}: {e}"))
        }
    }

    /// The WARN and ERROR events of this process since the first call, in order. Installs the
    /// process's `tracing` subscriber on the first call.
    ///
    /// # Panics
    ///
    /// When another subscriber was installed first.
    pub fn captured_log() -> &'static Mutex<Vec<Line>> {
        static LOG: OnceLock<&'static Mutex<Vec<Line>>> = OnceLock::new();
        LOG.get_or_init(|| {
            let log: &'static Mutex<Vec<Line>> = Box::leak(Box::default());
            let subscriber = tracing_subscriber::registry()
                .with(tracing_subscriber::filter::LevelFilter::WARN)
                .with(Capture(log));
            tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");
            log
        })
    }

    /// Takes the lines captured since the last call (or since `captured_log` was first called).
    pub fn take_lines() -> Vec<Line> {
        std::mem::take(&mut *lock(captured_log()))
    }

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    struct Capture(&'static Mutex<Vec<Line>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields::default();
            event.record(&mut fields);
            let message = fields.0.remove("message").unwrap_or_default();
            lock(self.0).push(Line {
                level: *event.metadata().level(),
                target: event.metadata().target().to_string(),
                message,
                fields: fields.0,
            });
        }
    }

    #[derive(Default)]
    struct Fields(BTreeMap<String, String>);

    impl tracing::field::Visit for Fields {
        fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
            self.0.insert(field.name().to_string(), value.to_string());
        }

        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0
                .insert(field.name().to_string(), format!("{value:?}"));
        }
    }

    /// The process's metrics recorder, installed on the first call.
    ///
    /// # Panics
    ///
    /// When another recorder was installed first.
    pub fn metrics() -> &'static Snapshotter {
        static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
        SNAPSHOTTER.get_or_init(|| {
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            recorder.install().expect("no other recorder");
            snapshotter
        })
    }

    /// A counter's name and labels as [`counters`] keys it: `name{a=x,b=y}`, labels sorted.
    pub fn key(name: &str, labels: &[(&str, &str)]) -> String {
        let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        format!("{name}{{{}}}", labels.join(","))
    }

    /// The counters that grew since the last call (or since [`metrics`] was first called), by
    /// [`key`], with how much they grew.
    pub fn counters() -> BTreeMap<String, u64> {
        metrics()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(composite, _, _, value)| match value {
                DebugValue::Counter(n) if n > 0 => {
                    let (_, metric) = composite.into_parts();
                    let labels: Vec<(&str, &str)> =
                        metric.labels().map(|l| (l.key(), l.value())).collect();
                    Some((key(metric.name(), &labels), n))
                }
                _ => None,
            })
            .collect()
    }
}

/// Relaying through broker outages, for the relay tests: a worker run while a proxy cuts its
/// broker connection, and what the log and the metrics must say of the cuts.
pub mod outages {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};

    use outbox::{Handler, Worker, WorkerConfig};

    use super::observe::{self, key, Line};
    use super::proxy::Proxy;
    use super::TestDb;

    /// Enqueues `events` and relays them with `relay`, 64 at a time, cutting every connection
    /// through `proxy` at each of `cuts` even steps. The last cut is an outage of a second, as a
    /// broker restarting behind a load balancer: every connection made meanwhile is cut too,
    /// handshake or not. The log and the counters are read from the start of the relay on.
    ///
    /// # Panics
    ///
    /// When the events are not all relayed within two minutes, the worker fails, or a cut
    /// finds no connection to cut.
    pub async fn relay_through_cuts<H: Handler>(
        relay: H,
        events: Vec<H::Event>,
        db: &TestDb,
        proxy: &Proxy,
        cuts: usize,
    ) {
        let total = events.len() as i64;
        let mut tx = db.pool.begin().await.expect("begin");
        outbox::enqueue_many(&mut *tx, &events)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        let worker = Worker::builder(&db.pool)
            .handler(relay)
            .config(WorkerConfig::default().concurrency(64))
            .build()
            .expect("the relay worker builds");
        // Everything before this point is another test's or the setup's.
        observe::captured_log();
        observe::counters();
        observe::take_lines();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            worker
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        });
        let started = Instant::now();
        let mut made = 0;
        // What was left at the last cut: the next cut waits until the relay has moved 200
        // messages since, which it cannot do without a new connection, so that each cut meets
        // an established connection (one that drops only attempts to connect is no loss).
        let mut left_at_cut = total;
        loop {
            let left = db.count().await;
            if left == 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{left} of {total} events left after 120 s"
            );
            let due = (total - left) * (cuts as i64 + 1) / total;
            if made < cuts && due > made as i64 && left <= left_at_cut - 200 {
                left_at_cut = left;
                let mut cut = proxy.drop_all();
                if made == cuts - 1 {
                    let outage = Instant::now() + Duration::from_secs(1);
                    while Instant::now() < outage {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        cut += proxy.drop_all();
                    }
                }
                if cut > 0 {
                    made += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        running.await.expect("the worker task").expect("the worker");
        assert_eq!(made, cuts, "the connection is cut during the relay");
    }

    /// What one relay's log says of its outages.
    #[derive(Debug)]
    pub struct Reports {
        /// Publishes caught in flight, by the loss lines.
        pub in_flight: u64,
        /// Publishes that waited for the connection, by the lines that say it is back.
        pub waited: u64,
    }

    /// Checks what the log and the counters caught since they were last read: each outage is
    /// logged once lost and once back, at WARN, by `broker` (`RabbitMQ`, `NATS`) with the
    /// `relay` field and label and the `address` as `broker` field, when given; no more outages
    /// than connections lost (`outbox_relay_connection_losses_total`, at least `cuts`: one
    /// outage may span several); nothing else is at WARN or ERROR but the lines of the `quiet` targets; the
    /// publishes caught in flight waited, as the waited-publishes counter says; no message of
    /// `topic` needed a retry of the worker.
    ///
    /// # Panics
    ///
    /// When any of it is not so.
    pub fn check_reports(
        broker: &str,
        relay: &str,
        address: Option<&str>,
        topic: &str,
        quiet: &[&str],
        cuts: usize,
    ) -> Reports {
        let lines = observe::take_lines();
        let (quieted, shown): (Vec<&Line>, Vec<&Line>) = lines
            .iter()
            .partition(|l| quiet.iter().any(|q| l.target.starts_with(q)));
        let lost: Vec<&Line> = shown
            .iter()
            .copied()
            .filter(|l| l.message.starts_with(&format!("{broker} connection lost")))
            .collect();
        let back: Vec<&Line> = shown
            .iter()
            .copied()
            .filter(|l| {
                l.message
                    .starts_with(&format!("{broker} connection restored"))
            })
            .collect();
        eprintln!(
            "{} WARN/ERROR lines through {cuts} cuts: {} of {quiet:?}, {} shown",
            lines.len(),
            quieted.len(),
            shown.len(),
        );
        let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
        for l in &quieted {
            *kinds
                .entry(format!("{} {}: {}", l.level, l.target, l.message))
                .or_default() += 1;
        }
        for (kind, n) in kinds {
            eprintln!("  {n} x {kind}");
        }
        for l in &shown {
            eprintln!("  {} {}: {}", l.level, l.target, l.message);
        }

        let counters = observe::counters();
        let label = [("relay", relay)];
        let count = |name: &str| {
            counters
                .get(&key(name, &label))
                .copied()
                .unwrap_or_default()
        };
        let losses = count("outbox_relay_connection_losses_total");
        // The outage may let a connection through before it cuts it too: a loss more.
        assert!(
            losses >= cuts as u64,
            "{losses} losses counted: {counters:#?}"
        );
        assert!(
            !lost.is_empty() && lost.len() as u64 <= losses,
            "one line per outage, {losses} connections lost: {shown:#?}"
        );
        assert_eq!(lost.len(), back.len(), "one line per recovery: {shown:#?}");
        assert_eq!(
            back.iter().map(|l| l.number("losses")).sum::<u64>(),
            losses,
            "the recoveries count the connections lost: {shown:#?}"
        );
        assert_eq!(
            shown.len(),
            lost.len() + back.len(),
            "nothing else at WARN or ERROR, per publish or per channel: {shown:#?}"
        );
        assert!(
            lost.iter()
                .chain(&back)
                .all(|l| l.level == tracing::Level::WARN
                    && l.fields.get("relay").map(String::as_str) == Some(relay)
                    && l.fields.get("broker").map(String::as_str) == address),
            "WARN, with the relay and the broker named: {shown:#?}"
        );
        let reports = Reports {
            in_flight: lost.iter().map(|l| l.number("in_flight")).sum(),
            waited: back.iter().map(|l| l.number("waited")).sum(),
        };
        assert!(reports.in_flight > 0, "the cuts caught publishes in flight");
        assert!(
            reports.waited >= reports.in_flight,
            "the publishes caught in flight waited for the reconnect: {reports:?}"
        );
        assert_eq!(
            count("outbox_relay_publishes_waited_for_reconnect_total"),
            reports.waited,
            "{counters:#?}"
        );
        let retried = [("topic", topic), ("outcome", "retry")];
        assert_eq!(
            counters.get(&key("outbox_messages_processed_total", &retried)),
            None,
            "no message needed a retry of the worker: {counters:#?}"
        );
        reports
    }
}

/// The tests given, in a module of their own per backend (`postgres`, `sqlite`, `mysql`), each
/// on a fresh database: `async fn name(db, store, pool) { ... }` binds the database, a `Store` on
/// it and its pool.
#[macro_export]
macro_rules! on_backend {
    ($module:ident, $open:path, $(async fn $name:ident($db:ident, $store:ident, $pool:ident) $body:block)*) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if stringify!($module) == "mysql" {
                        $crate::skip_without_mysql!();
                    }
                    let $db = $open().await;
                    let $store = ::outbox::Store::from(&$db.pool);
                    let $pool = $db.pool.clone();
                    $body
                    $db.drop_db().await;
                }
            )*
        }
    };
}

/// [`on_backend!`] on every backend: PostgreSQL, SQLite and MariaDB/MySQL.
#[macro_export]
macro_rules! all_backends {
    ($($tests:tt)*) => {
        $crate::on_backend!(postgres, $crate::pg, $($tests)*);
        $crate::on_backend!(sqlite, $crate::sqlite, $($tests)*);
        $crate::on_backend!(mysql, $crate::mysql, $($tests)*);
    };
}

/// Serves the operator's console for `store` on a free loopback port, without credentials
/// (loopback only), and returns a function that GETs a path and gives the page's body.
///
/// # Panics
///
/// When the console does not answer 200 within 10 s.
pub async fn console_page(store: outbox::Store) -> impl AsyncFn(&str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = outbox::console::router(store, outbox::console::ConsoleConfig::new());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    move |path: &str| {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(request.as_bytes()).await.unwrap();
            let mut raw = Vec::new();
            tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
                .await
                .expect("the console answers in time")
                .unwrap();
            let raw = String::from_utf8_lossy(&raw).into_owned();
            let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            body.to_owned()
        }
    }
}
