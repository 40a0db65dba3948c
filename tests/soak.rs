//! The fault-injection soak: the guarantees of DESIGN.md checked under the faults of production.
//!
//! Ignored by default (it takes minutes); `.ci/run` runs it as its own stage, on PostgreSQL
//! (`soak`), then on MariaDB (`soak_mariadb`), then on SQLite (`soak_sqlite`), one at a time:
//!
//! ```sh
//! cargo test -p outbox-tests --test soak -- --ignored --nocapture --test-threads=1
//! cargo test -p outbox-tests --test soak -- --ignored --nocapture --exact soak_mariadb
//! cargo test -p outbox-tests --test soak -- --ignored --nocapture --exact soak_sqlite
//! ```
//!
//! All three run the one harness below; what differs between the databases (the soak's own
//! tables, the queries of the checks, the connection kills, the enqueue's transaction) is in
//! [`Db`] and [`Admin`]. PostgreSQL's soak runs on a fresh database of the test server
//! (`DATABASE_URL`); MariaDB's on a fresh database `outbox_soak_<...>` created on
//! `mysql://root@127.0.0.1:3306` (`MYSQL_URL`, a server URL without a database, overrides it),
//! dropped at the end when the soak passes and kept for inspection when it fails (the next run
//! drops those older than a day). SQLite's runs on a fresh file `outbox_soak_<...>.sqlite` in
//! the temporary directory (WAL, as the backend opens it), shared by the worker processes and
//! the producers, removed when the soak passes and kept when it fails; with no server, there
//! are no connection kills, only the SIGKILLs, and it enqueues fewer messages by default
//! (20,000), so that it takes about two minutes.
//!
//! On a fresh database it starts with a backlog, then producers keep enqueuing (at least 50,000
//! messages over three topics, `soak.billing` with two handlers, `soak.index` ordered over 97 keys
//! that both producers write) while three `soak-worker`
//! processes (tests/bin/soak_worker.rs) drain them. Meanwhile a random worker is SIGKILLed every
//! 1 to 3 seconds and restarted, and twice every connection to the database but the harness's
//! own is killed (`pg_terminate_backend`, on MariaDB `KILL CONNECTION`). Handlers fail
//! transiently about 5% of the time, a few poison messages always fail, and a few "laggard"
//! messages stage a stale outcome (a claim that outlives its lease and then tries to
//! dead-letter a message a newer claim owns, or, every other laggard, writes it done while the
//! newer claim still runs it). On either server it takes about three minutes
//! on two cores: the drain keeps up with the production.
//!
//! Right after each kill the ids of the messages then running (for a SIGKILL: claimed by that
//! process) are recorded: only those, the laggards, and messages whose earlier attempt the
//! trace shows ended failed (a handler timed out after its effect) or lost its lease (claimed
//! again a lease or more after its last claim or renewal, a starved worker) may be delivered
//! twice. At the end,
//! with nothing left to do, it checks and fails loudly otherwise: every healthy message DONE
//! (or DEAD by crash exhaustion, when kills caught it in flight on every attempt no injected
//! fault explains), poison ones DEAD with their last error, none in flight, one dedup effect
//! per message, every handler reached, duplicates only where a kill or the trace explains them, enqueued ==
//! DONE + DEAD; and it prints one summary line.
//!
//! The workers also record their protocol steps (claims, starts, renewals, outcome writes,
//! hand-backs) in a trace, one file per process (`OUTBOX_PROTOCOL_TRACE`); at the end the soak
//! replays the traces through the protocol's model (`tests/model`, its `trace` module says what
//! that checks and what a trace cannot tell) and fails on a step the model does not allow.
//!
//! Knobs (environment): `SOAK_MESSAGES` (default 52000, on SQLite 20000), `SOAK_RATE` (messages a second of the
//! steady production, default 260), `SOAK_SEED` (the kill schedule), `SOAK_LAGGARD_EVERY` (one
//! `soak.billing` message in this many is a laggard, default 1200), `SOAK_VERBOSE=1`
//! (progress lines), and `SOAK_RESTART_POSTGRES=1`: the second mode of the PostgreSQL soak
//! (MariaDB's ignores it), run by hand and never in CI, which restarts the PostgreSQL server
//! in the middle of the drain with `pg_ctlcluster` (it restarts the shared server: other tests
//! running then will fail).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{enqueue_many, outbox_event};
use outbox_model::trace::{Event, Final, Validator};
use outbox_tests::{pg, protocol_trace, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{
    Connection, FromRow, MySqlConnection, MySqlPool, PgConnection, PgPool, SqliteConnection,
    SqlitePool,
};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// Worker flags: a short lease and handler timeout, few fast retries without jitter.
const WORKER_FLAGS: &[&str] = &[
    "--lease",
    "2.5",
    "--handler-timeout",
    "2",
    "--max-attempts",
    "6",
    "--retry-base",
    "0.1",
    "--retry-max",
    "1",
    "--no-jitter",
    "--concurrency",
    "16",
    "--batch-size",
    "16",
    "--poll-interval",
    "0.5",
    "--shutdown-timeout",
    "5",
];
/// `--max-attempts` above.
const MAX_ATTEMPTS: u32 = 6;
/// The first attempts of a message on which tests/bin/soak_worker.rs may inject a transient
/// failure (its `TRANSIENT_ATTEMPTS`).
const TRANSIENT_ATTEMPTS: u32 = 2;
/// The lease above: how long after a restart messages of the old server may still be in flight.
const LEASE: Duration = Duration::from_millis(2500);
const WORKERS: usize = 3;
/// Messages enqueued before the workers start.
const BACKLOG_SHARE: f64 = 0.15;
/// Messages enqueued in one burst when the steady production ends, so the end is a real drain.
const FINAL_BURST_SHARE: f64 = 0.10;
/// Producer tasks and the size of their transactions.
const PRODUCERS: usize = 2;
const BATCH: i64 = 40;
/// One message in this many is poison; one `soak.billing` message in this many is a laggard.
const POISON_EVERY: i64 = 2600;
const LAGGARD_EVERY: i64 = 1200;
const DRAIN_LIMIT: Duration = Duration::from_secs(150);

/// The payload of every soak topic, as tests/bin/soak_worker.rs reads it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Body {
    n: i64,
    poison: bool,
    laggard: bool,
    /// A laggard whose stale claim succeeds: its done write, not a dead-letter order, is the
    /// stale outcome (every other laggard).
    stale_done: bool,
}

#[outbox_event(topic = "soak.billing")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct InvoiceIssued {
    #[serde(flatten)]
    body: Body,
}

#[outbox_event(topic = "soak.emails")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct EmailRequested {
    #[serde(flatten)]
    body: Body,
}

/// Ordered: a key of [`INDEX_KEYS`], written by both producers, so the trace's replay checks a
/// key's order under the kills. A dead letter (poison, or a crash exhaustion) releases its key,
/// or the key's later messages would wait for an operator and the drain never end.
#[outbox_event(topic = "soak.index", ordering_key = "key", dead_releases_key)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct IndexChanged {
    key: String,
    #[serde(flatten)]
    body: Body,
}

/// The ordering keys of `soak.index`.
const INDEX_KEYS: i64 = 97;

struct Settings {
    messages: i64,
    backlog: i64,
    burst: i64,
    /// Messages per second of the steady production.
    rate: f64,
    seed: u64,
    /// One `soak.billing` message in this many is a laggard.
    laggard_every: i64,
    restart_postgres: bool,
    verbose: bool,
}

impl Settings {
    fn from_env(server: Server) -> Self {
        let messages: i64 = env_parse("SOAK_MESSAGES").unwrap_or(match server {
            Server::Sqlite => 20_000,
            Server::Postgres | Server::MariaDb => 52_000,
        });
        let seed = env_parse("SOAK_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
        Settings {
            messages,
            backlog: (messages as f64 * BACKLOG_SHARE) as i64,
            burst: (messages as f64 * FINAL_BURST_SHARE) as i64,
            rate: env_parse("SOAK_RATE").unwrap_or(260.0),
            seed,
            laggard_every: env_parse("SOAK_LAGGARD_EVERY")
                .filter(|&n: &i64| n >= 3)
                .unwrap_or(LAGGARD_EVERY),
            restart_postgres: server == Server::Postgres
                && std::env::var("SOAK_RESTART_POSTGRES").is_ok_and(|v| v == "1"),
            verbose: std::env::var("SOAK_VERBOSE").is_ok_and(|v| v == "1"),
        }
    }

    fn topic(n: i64) -> usize {
        (n % 3) as usize
    }

    fn body(&self, n: i64) -> Body {
        let poison = n % POISON_EVERY == 1301;
        // Laggards come with the steady production only: behind a backlog of their topic a
        // lapsed lease is not claimed again before the stale claim gives up waiting for that.
        let every = self.laggard_every;
        let laggard = !poison
            && Self::topic(n) == 0
            && n % every == (every / 2) / 3 * 3
            && n >= self.backlog
            && n < self.messages - self.burst;
        Body {
            n,
            poison,
            laggard,
            stale_done: laggard && (n / every) % 2 == 1,
        }
    }
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// xorshift64*: the kill schedule, reproducible from the seed in the summary line.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------------------------
// The database: what differs between PostgreSQL and MariaDB/MySQL

/// The database a soak runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Postgres,
    MariaDb,
    /// A file, no server: the workers and the producers open it each.
    Sqlite,
}

impl Server {
    /// Whether it has connections of its own to kill (SQLite has none).
    fn kills_connections(self) -> bool {
        self != Server::Sqlite
    }
}

/// A pool on the soak's database. The statements that differ between the databases are in
/// its methods (and in [`Admin`]'s); the final checks' queries are one text for all.
#[derive(Clone)]
enum Db {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// What became of one enqueue transaction.
enum Enqueued {
    Committed,
    /// Failed before COMMIT: rolled back with its connection.
    NotCommitted,
    /// The connection died during COMMIT: committed or not, the rows tell.
    CommitFailed,
}

/// The view `soak_rows` (ids and times as each backend keeps them, done messages archived in
/// `test_deleted`): `$now` is the database's now as `locked_until` holds times, `$done` the
/// archived rows (as `d`), `$latest` the condition, followed by AND, that keeps a message's last
/// archived row only (empty when `$done` keeps it only).
macro_rules! soak_rows_view {
    ($now:literal, $done:literal, $latest:literal) => {
        concat!(
            "CREATE VIEW soak_rows AS \
                 SELECT m.id, m.topic, m.payload, \
                        CASE WHEN m.locked_until >= ",
            $now,
            " THEN 'running' ELSE 'pending' END AS status, \
                        m.attempts, m.last_error, \
                        (SELECT w.name FROM outbox_workers w WHERE w.id = m.claimed_by) AS claimed_by \
                 FROM outbox_messages m \
                 UNION ALL \
                 SELECT x.id, x.topic, x.payload, 'dead', x.attempts, x.last_error, NULL FROM outbox_dead x \
                 UNION ALL \
                 SELECT d.id, d.topic, d.payload, 'done', d.attempts, d.last_error, \
                        (SELECT w.name FROM outbox_workers w WHERE w.id = d.claimed_by) \
                 FROM ",
            $done,
            " WHERE ",
            $latest,
            " NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.id = d.id) \
                   AND NOT EXISTS (SELECT 1 FROM outbox_dead x WHERE x.id = d.id)"
        )
    };
}

impl Db {
    /// Enqueues the three topics' events in one transaction, one `enqueue_many` per topic.
    async fn enqueue(
        &self,
        orders: &[InvoiceIssued],
        emails: &[EmailRequested],
        index: &[IndexChanged],
    ) -> Enqueued {
        macro_rules! in_one_transaction {
            ($begin:expr) => {{
                let Ok(mut tx) = $begin.await else {
                    return Enqueued::NotCommitted;
                };
                if enqueue_many(&mut *tx, orders).await.is_err()
                    || enqueue_many(&mut *tx, emails).await.is_err()
                    || enqueue_many(&mut *tx, index).await.is_err()
                {
                    return Enqueued::NotCommitted;
                }
                match tx.commit().await {
                    Ok(()) => Enqueued::Committed,
                    Err(_) => Enqueued::CommitFailed,
                }
            }};
        }
        match self {
            Db::Pg(pool) => in_one_transaction!(pool.begin()),
            Db::My(pool) => in_one_transaction!(pool.begin()),
            // As the docs tell SQLite producers to begin: the write lock up front.
            Db::Lite(pool) => in_one_transaction!(outbox::sqlite_begin_immediate(pool)),
        }
    }

    /// The rows of a query without parameters, written in SQL all three databases run.
    async fn rows<T>(&self, sql: &'static str) -> Result<Vec<T>, sqlx::Error>
    where
        T: Send
            + Unpin
            + for<'r> FromRow<'r, PgRow>
            + for<'r> FromRow<'r, MySqlRow>
            + for<'r> FromRow<'r, SqliteRow>,
    {
        match self {
            Db::Pg(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Db::My(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Db::Lite(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        }
    }

    /// The one `count(*)` of a query, as [`rows`](Self::rows).
    async fn count(&self, sql: &'static str) -> Result<i64, sqlx::Error> {
        let rows = self.rows::<(i64,)>(sql).await?;
        Ok(rows.first().map_or(0, |r| r.0))
    }

    /// The soak's tables, and the view `soak_messages` of every message the soak enqueued:
    /// live (`pending` or `running`), `dead`, or `done` (the last archived row of a deleted
    /// message), with its payload's `n`, `poison` and `laggard`.
    async fn schema(&self) {
        match self {
            Db::Pg(pool) => sqlx::raw_sql(concat!(
                "CREATE TABLE soak_effects (message_id uuid NOT NULL, n bigint NOT NULL, pid int NOT NULL, \
                     attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()); \
                 CREATE INDEX soak_effects_message ON soak_effects (message_id); \
                 CREATE TABLE soak_deliveries (message_id uuid NOT NULL, handler text NOT NULL, \
                     pid int NOT NULL, attempt int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()); \
                 CREATE INDEX soak_deliveries_message ON soak_deliveries (message_id, handler); \
                 CREATE TABLE soak_preempted (message_id uuid NOT NULL, handler text NOT NULL, \
                     attempt int NOT NULL, newer_attempt int NOT NULL, pid int NOT NULL, \
                     at timestamptz NOT NULL DEFAULT clock_timestamp()); ",
                soak_rows_view!(
                    "now()",
                    "(SELECT DISTINCT ON (id) * FROM test_deleted ORDER BY id, seq DESC) d",
                    ""
                ),
                "; CREATE VIEW soak_messages AS \
                     SELECT r.*, (r.payload->>'n')::bigint AS n, (r.payload->>'poison')::bool AS poison, \
                            (r.payload->>'laggard')::bool AS laggard \
                     FROM soak_rows r;",
            ))
            .execute(pool)
            .await
            .map(drop)
            .expect("create the soak tables"),
            Db::My(pool) => {
                // Done messages are deleted: `test_deleted` keeps their last rows, as the test
                // support's `archive_done` does on PostgreSQL.
                const STATEMENTS: &[&str] = &[
                    "CREATE TABLE soak_effects (message_id BINARY(16) NOT NULL, n BIGINT NOT NULL, \
                         pid INT NOT NULL, attempt INT NOT NULL, at DATETIME(6) NOT NULL DEFAULT NOW(6), \
                         INDEX soak_effects_message (message_id)) \
                     ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                    "CREATE TABLE soak_deliveries (message_id BINARY(16) NOT NULL, handler VARCHAR(255) NOT NULL, \
                         pid INT NOT NULL, attempt INT NOT NULL, at DATETIME(6) NOT NULL DEFAULT NOW(6), \
                         INDEX soak_deliveries_message (message_id, handler)) \
                     ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                    "CREATE TABLE soak_preempted (message_id BINARY(16) NOT NULL, handler VARCHAR(255) NOT NULL, \
                         attempt INT NOT NULL, newer_attempt INT NOT NULL, pid INT NOT NULL, \
                         at DATETIME(6) NOT NULL DEFAULT NOW(6)) \
                     ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                    "CREATE TABLE test_deleted (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                         id BINARY(16) NOT NULL, topic VARCHAR(64) NOT NULL, payload LONGTEXT NOT NULL, \
                         attempts INT NOT NULL, last_error TEXT NULL, claimed_by BINARY(16) NULL, \
                         INDEX test_deleted_id (id, seq)) \
                     ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
                    "CREATE TRIGGER test_archive_deleted AFTER DELETE ON outbox_messages FOR EACH ROW \
                         INSERT INTO test_deleted (id, topic, payload, attempts, last_error, claimed_by) \
                         VALUES (OLD.id, OLD.topic, OLD.payload, OLD.attempts, OLD.last_error, OLD.claimed_by)",
                    soak_rows_view!(
                        "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)",
                        "test_deleted d",
                        "d.seq = (SELECT max(l.seq) FROM test_deleted l WHERE l.id = d.id) AND"
                    ),
                    "CREATE VIEW soak_messages AS \
                         SELECT r.*, CAST(JSON_UNQUOTE(JSON_EXTRACT(r.payload, '$.n')) AS SIGNED) AS n, \
                                JSON_UNQUOTE(JSON_EXTRACT(r.payload, '$.poison')) = 'true' AS poison, \
                                JSON_UNQUOTE(JSON_EXTRACT(r.payload, '$.laggard')) = 'true' AS laggard \
                         FROM soak_rows r",
                ];
                for sql in STATEMENTS {
                    sqlx::raw_sql(*sql)
                        .execute(pool)
                        .await
                        .expect("create the soak tables");
                }
            }
            // The outbox's ids are hyphenated text here, its times Unix milliseconds; the
            // soak's tables keep ids as the blobs sqlx binds a `Uuid` as, and the view shows
            // the outbox's ids so (`unhex`), so that the checks compare and read them alike.
            Db::Lite(pool) => {
                const STATEMENTS: &[&str] = &[
                "CREATE TABLE soak_effects (message_id BLOB NOT NULL, n INTEGER NOT NULL, pid INTEGER NOT NULL, \
                     attempt INTEGER NOT NULL, at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))); \
                 CREATE INDEX soak_effects_message ON soak_effects (message_id); \
                 CREATE TABLE soak_deliveries (message_id BLOB NOT NULL, handler TEXT NOT NULL, \
                     pid INTEGER NOT NULL, attempt INTEGER NOT NULL, \
                     at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))); \
                 CREATE INDEX soak_deliveries_message ON soak_deliveries (message_id, handler); \
                 CREATE TABLE soak_preempted (message_id BLOB NOT NULL, handler TEXT NOT NULL, \
                     attempt INTEGER NOT NULL, newer_attempt INTEGER NOT NULL, pid INTEGER NOT NULL, \
                     at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))); \
                 CREATE TABLE test_deleted (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, \
                     topic TEXT NOT NULL, payload TEXT NOT NULL, attempts INTEGER NOT NULL, \
                     last_error TEXT, claimed_by TEXT); \
                 CREATE INDEX test_deleted_id ON test_deleted (id, seq); \
                 CREATE TRIGGER test_archive_deleted AFTER DELETE ON outbox_messages FOR EACH ROW \
                 BEGIN \
                     INSERT INTO test_deleted (id, topic, payload, attempts, last_error, claimed_by) \
                     VALUES (OLD.id, OLD.topic, OLD.payload, OLD.attempts, OLD.last_error, OLD.claimed_by); \
                 END",
                soak_rows_view!(
                    "CAST(unixepoch('subsec') * 1000 AS INTEGER)",
                    "test_deleted d",
                    "d.seq = (SELECT max(l.seq) FROM test_deleted l WHERE l.id = d.id) AND"
                ),
                "CREATE VIEW soak_messages AS \
                     SELECT unhex(replace(r.id, '-', '')) AS id, r.topic, r.payload, r.status, r.attempts, \
                            r.last_error, r.claimed_by, \
                            CAST(r.payload ->> '$.n' AS INTEGER) AS n, \
                            coalesce(r.payload ->> '$.poison', 0) = 1 AS poison, \
                            coalesce(r.payload ->> '$.laggard', 0) = 1 AS laggard \
                     FROM soak_rows r",
                ];
                for sql in STATEMENTS {
                    sqlx::raw_sql(*sql)
                        .execute(pool)
                        .await
                        .expect("create the soak tables");
                }
            }
        }
    }
}

/// The soak's fresh database, migrated, with the soak's tables.
struct SoakDb {
    pool: Db,
    /// For the worker processes.
    url: String,
    name: String,
    /// PostgreSQL's, from the test support: it drops the database when it goes away.
    pg: Option<TestDb>,
}

/// The MariaDB/MySQL server of the MariaDB soak: `MYSQL_URL`, without a database.
fn mysql_server_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// A failed MariaDB soak keeps its database for inspection: the next run drops those older
/// than this.
const KEEP_FAILED: Duration = Duration::from_secs(24 * 3600);

impl SoakDb {
    async fn create(server: Server) -> Self {
        let db = match server {
            Server::Postgres => {
                let db = pg().await;
                // Done messages are deleted: keep their last rows for the final checks
                // (`soak_messages`).
                db.archive_done().await;
                SoakDb {
                    pool: Db::Pg(db.pool.clone()),
                    url: db.url.clone(),
                    name: db.name.clone(),
                    pg: Some(db),
                }
            }
            Server::MariaDb => Self::create_mysql().await,
            Server::Sqlite => Self::create_sqlite().await,
        };
        db.pool.schema().await;
        db
    }

    /// `outbox_soak_<unix seconds>_<uuid>` on the server of [`mysql_server_url`], migrated.
    async fn create_mysql() -> Self {
        let base = mysql_server_url();
        let opts: MySqlConnectOptions = base.parse().expect("MYSQL_URL parses");
        let mut admin = MySqlConnection::connect_with(&opts)
            .await
            .unwrap_or_else(|e| {
                panic!("cannot connect to MariaDB/MySQL at {base}: {e}; start it or set MYSQL_URL")
            });
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let soaks: Vec<String> = sqlx::query_scalar(
            "SELECT schema_name FROM information_schema.schemata \
             WHERE schema_name LIKE 'outbox\\_soak\\_%'",
        )
        .fetch_all(&mut admin)
        .await
        .expect("list the soak databases");
        for stale in soaks {
            let created = stale
                .split('_')
                .nth(2)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0);
            if now.saturating_sub(created) > KEEP_FAILED.as_secs() {
                let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS `{stale}`"
                )))
                .execute(&mut admin)
                .await;
            }
        }
        let name = format!("outbox_soak_{now}_{}", Uuid::now_v7().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )))
        .execute(&mut admin)
        .await
        .expect("create the soak database");
        admin.close().await.ok();
        let pool = MySqlPoolOptions::new()
            .max_connections(10)
            .connect_with(opts.database(&name))
            .await
            .expect("connect to the soak database");
        outbox::migrate(&pool)
            .await
            .expect("outbox migrations apply");
        // The URL of the new database, for the workers: the server's, with its path.
        let url = match base.split_once('?') {
            Some((head, query)) => format!("{}/{name}?{query}", head.trim_end_matches('/')),
            None => format!("{}/{name}", base.trim_end_matches('/')),
        };
        SoakDb {
            pool: Db::My(pool),
            url,
            name,
            pg: None,
        }
    }

    /// `outbox_soak_<unix seconds>_<uuid>.sqlite` in the temporary directory, migrated.
    async fn create_sqlite() -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let name = format!("outbox_soak_{now}_{}", Uuid::now_v7().simple());
        let path = std::env::temp_dir().join(format!("{name}.sqlite"));
        let url = format!("sqlite://{}", path.display());
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(10)
            .connect_with(outbox::sqlite_options(&url).expect("the soak's SQLite URL parses"))
            .await
            .expect("create the soak's SQLite file");
        outbox::migrate(&pool)
            .await
            .expect("outbox migrations apply");
        SoakDb {
            pool: Db::Lite(pool),
            url,
            name,
            pg: None,
        }
    }

    /// Closes the pool and drops the database.
    async fn drop_db(self) {
        match (self.pg, self.pool) {
            (Some(db), _) => db.drop_db().await,
            (None, Db::Lite(pool)) => {
                pool.close().await;
                let path = std::env::temp_dir().join(format!("{}.sqlite", self.name));
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            (None, Db::My(pool)) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), pool.close()).await;
                if let Ok(mut admin) = MySqlConnection::connect(&mysql_server_url()).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS `{}`",
                        self.name
                    )))
                    .execute(&mut admin)
                    .await;
                }
            }
            (None, Db::Pg(_)) => unreachable!("a PostgreSQL soak database comes with its TestDb"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Producers

/// Enqueues messages `lo..hi` in one transaction, one `enqueue_many` per topic.
async fn enqueue_range(pool: &Db, s: &Settings, lo: i64, hi: i64) -> Result<(), String> {
    let mut orders = Vec::new();
    let mut emails = Vec::new();
    let mut index = Vec::new();
    for n in lo..hi {
        let body = s.body(n);
        match Settings::topic(n) {
            0 => orders.push(InvoiceIssued { body }),
            1 => emails.push(EmailRequested { body }),
            _ => index.push(IndexChanged {
                key: format!("doc-{}", n % INDEX_KEYS),
                body,
            }),
        }
    }
    let mut tries = 0;
    loop {
        tries += 1;
        if tries > 60 {
            return Err(format!("could not enqueue messages {lo}..{hi} in 60 tries"));
        }
        match pool.enqueue(&orders, &emails, &index).await {
            Enqueued::Committed => return Ok(()),
            Enqueued::NotCommitted => {
                // Not committed: the transaction went with its connection.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Enqueued::CommitFailed => {
                // The connection died during COMMIT: did it commit? All rows or none, or the
                // enqueue is not atomic.
                let found = count_range(pool, lo, hi).await;
                if found == hi - lo {
                    return Ok(());
                }
                if found != 0 {
                    return Err(format!(
                        "atomic intent broken: the transaction of messages {lo}..{hi} left {found} of {} rows",
                        hi - lo
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn count_range(pool: &Db, lo: i64, hi: i64) -> i64 {
    let mut tries = 0;
    loop {
        let r = match pool {
            Db::Pg(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM soak_messages WHERE n >= $1 AND n < $2")
                    .bind(lo)
                    .bind(hi)
                    .fetch_one(pool)
                    .await
            }
            Db::My(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM soak_messages WHERE n >= ? AND n < ?")
                    .bind(lo)
                    .bind(hi)
                    .fetch_one(pool)
                    .await
            }
            Db::Lite(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM soak_messages WHERE n >= ?1 AND n < ?2")
                    .bind(lo)
                    .bind(hi)
                    .fetch_one(pool)
                    .await
            }
        };
        match r {
            Ok(n) => return n,
            Err(e) if tries < 100 => {
                tries += 1;
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("soak: cannot count messages {lo}..{hi}: {e}"),
        }
    }
}

/// Producer `id` enqueues its share of `from..to` in batches, paced at `rate` messages a second
/// overall from `start`.
async fn produce(
    pool: Db,
    s: Arc<Settings>,
    next: Arc<AtomicI64>,
    enqueued: Arc<AtomicI64>,
    to: i64,
    start: Instant,
) -> Result<(), String> {
    let from = s.backlog;
    loop {
        let lo = next.fetch_add(BATCH, Ordering::SeqCst);
        if lo >= to {
            return Ok(());
        }
        let hi = (lo + BATCH).min(to);
        let due = start + Duration::from_secs_f64((lo - from) as f64 / s.rate);
        tokio::time::sleep_until(due.into()).await;
        enqueue_range(&pool, &s, lo, hi).await?;
        enqueued.fetch_add(hi - lo, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------------
// Workers

struct Slot {
    child: Child,
    pid: u32,
}

struct Fleet {
    url: String,
    logs: PathBuf,
    slots: Vec<Slot>,
    /// Exits nobody asked for: (worker name, status).
    unexpected: Vec<(String, ExitStatus)>,
}

/// Worker processes spawned so far: each records its protocol trace in a file of its own.
static SPAWNED: AtomicUsize = AtomicUsize::new(0);

fn worker_name(slot: usize, pid: u32) -> String {
    format!("soak-w{slot}:{pid}")
}

impl Fleet {
    fn spawn(url: &str, logs: &Path, slot: usize) -> Slot {
        let log = File::options()
            .create(true)
            .append(true)
            .open(logs.join(format!("worker-{slot}.log")))
            .expect("open the worker log");
        let child = Command::new(env!("CARGO_BIN_EXE_soak-worker"))
            .arg("--database-url")
            .arg(url)
            .args(WORKER_FLAGS)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .env("HOSTNAME", format!("soak-w{slot}"))
            .env(
                protocol_trace::ENV,
                logs.join(format!(
                    "protocol-{slot}-{}.jsonl",
                    SPAWNED.fetch_add(1, Ordering::Relaxed)
                )),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone the log file")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn soak-worker");
        let pid = child.id().expect("a fresh child has a pid");
        Slot { child, pid }
    }

    fn start(url: &str, logs: &Path) -> Self {
        let slots = (0..WORKERS).map(|i| Self::spawn(url, logs, i)).collect();
        Fleet {
            url: url.to_string(),
            logs: logs.to_path_buf(),
            slots,
            unexpected: Vec::new(),
        }
    }

    /// Restarts workers that exited on their own, and remembers them.
    fn reap(&mut self) {
        for i in 0..self.slots.len() {
            if let Ok(Some(status)) = self.slots[i].child.try_wait() {
                self.unexpected
                    .push((worker_name(i, self.slots[i].pid), status));
                self.slots[i] = Self::spawn(&self.url, &self.logs, i);
            }
        }
    }

    /// SIGKILLs worker `i`, waits for it, restarts it and returns the dead worker's name.
    async fn sigkill(&mut self, i: usize) -> String {
        let name = worker_name(i, self.slots[i].pid);
        let _ = self.slots[i].child.start_kill();
        let _ = self.slots[i].child.wait().await;
        self.slots[i] = Self::spawn(&self.url, &self.logs, i);
        name
    }

    /// SIGTERMs every worker and returns how each one ended.
    async fn stop(&mut self) -> Vec<(String, Result<ExitStatus, String>)> {
        for s in &self.slots {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &s.pid.to_string()])
                .status();
        }
        let mut out = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            let r = match tokio::time::timeout(Duration::from_secs(30), s.child.wait()).await {
                Ok(Ok(status)) => Ok(status),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => {
                    let _ = s.child.start_kill();
                    Err("did not exit within 30 s of SIGTERM".to_string())
                }
            };
            out.push((worker_name(i, s.pid), r));
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// The harness's own connection: kills, snapshots, progress. Reconnects when it is lost (only
// a PostgreSQL restart does that: the connection kills spare it).

enum AdminConn {
    Pg(PgConnection),
    My(MySqlConnection),
    Lite(SqliteConnection),
}

struct Admin {
    server: Server,
    url: String,
    conn: Option<AdminConn>,
}

impl Admin {
    async fn conn(&mut self) -> &mut AdminConn {
        if self.conn.is_none() {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                let r = match self.server {
                    Server::Postgres => PgConnection::connect(&self.url).await.map(AdminConn::Pg),
                    Server::MariaDb => MySqlConnection::connect(&self.url).await.map(AdminConn::My),
                    Server::Sqlite => match outbox::sqlite_options(&self.url) {
                        Ok(options) => SqliteConnection::connect_with(&options)
                            .await
                            .map(AdminConn::Lite),
                        Err(e) => panic!("soak: the SQLite URL {}: {e}", self.url),
                    },
                };
                match r {
                    Ok(c) => {
                        self.conn = Some(c);
                        break;
                    }
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(e) => panic!("soak: the harness cannot reconnect to the database: {e}"),
                }
            }
        }
        self.conn.as_mut().expect("connected")
    }

    /// Ids of the messages now running, of one worker or of all.
    async fn running(&mut self, claimed_by: Option<&str>) -> Vec<Uuid> {
        for _ in 0..100 {
            let r = match self.conn().await {
                AdminConn::Pg(c) => {
                    sqlx::query_scalar(
                        "SELECT id FROM soak_messages \
                         WHERE status = 'running' AND ($1::text IS NULL OR claimed_by = $1)",
                    )
                    .bind(claimed_by)
                    .fetch_all(c)
                    .await
                }
                AdminConn::My(c) => {
                    sqlx::query_scalar(
                        "SELECT id FROM soak_messages \
                         WHERE status = 'running' AND (? IS NULL OR claimed_by = ?)",
                    )
                    .bind(claimed_by)
                    .bind(claimed_by)
                    .fetch_all(c)
                    .await
                }
                AdminConn::Lite(c) => {
                    sqlx::query_scalar(
                        "SELECT id FROM soak_messages \
                         WHERE status = 'running' AND (?1 IS NULL OR claimed_by = ?1)",
                    )
                    .bind(claimed_by)
                    .fetch_all(c)
                    .await
                }
            };
            match r {
                Ok(ids) => return ids,
                Err(_) => {
                    self.conn = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("soak: cannot read the running messages");
    }

    /// Kills every other connection to the soak's database; returns how many.
    async fn terminate_all(&mut self, db: &str) -> usize {
        match self.conn().await {
            AdminConn::Pg(c) => {
                let killed: Vec<bool> = sqlx::query_scalar(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                )
                .bind(db)
                .fetch_all(c)
                .await
                .expect("pg_terminate_backend on the soak database");
                killed.len()
            }
            AdminConn::My(c) => {
                let ids: Vec<i64> = sqlx::query_scalar(
                    "SELECT CAST(id AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE db = ? AND id <> CONNECTION_ID()",
                )
                .bind(db)
                .fetch_all(&mut *c)
                .await
                .expect("the connections to the soak database");
                let mut killed = 0;
                for id in ids {
                    // A connection that ended meanwhile is an unknown thread id.
                    if sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL CONNECTION {id}")))
                        .execute(&mut *c)
                        .await
                        .is_ok()
                    {
                        killed += 1;
                    }
                }
                killed
            }
            AdminConn::Lite(_) => unreachable!("a SQLite database has no connections to kill"),
        }
    }

    async fn counts(&mut self) -> BTreeMap<String, i64> {
        for _ in 0..600 {
            let r: Result<Vec<(String, i64)>, _> = match self.conn().await {
                AdminConn::Pg(c) => {
                    sqlx::query_as("SELECT status, count(*) FROM soak_messages GROUP BY status")
                        .fetch_all(c)
                        .await
                }
                // The same counts without the view, which MariaDB materializes whole (payloads
                // and all, in a temporary table on disk): a quarter of a second a look.
                AdminConn::My(c) => {
                    sqlx::query_as(
                        "SELECT CASE WHEN locked_until >= CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) \
                                     THEN 'running' ELSE 'pending' END AS status, count(*) \
                         FROM outbox_messages GROUP BY status \
                         UNION ALL SELECT 'dead', count(*) FROM outbox_dead HAVING count(*) > 0 \
                         UNION ALL SELECT 'done', count(DISTINCT d.id) FROM test_deleted d \
                             WHERE NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.id = d.id) \
                               AND NOT EXISTS (SELECT 1 FROM outbox_dead x WHERE x.id = d.id) \
                             HAVING count(*) > 0",
                    )
                    .fetch_all(c)
                    .await
                }
                AdminConn::Lite(c) => {
                    sqlx::query_as("SELECT status, count(*) FROM soak_messages GROUP BY status")
                        .fetch_all(c)
                        .await
                }
            };
            match r {
                Ok(rows) => return rows.into_iter().collect(),
                Err(_) => {
                    self.conn = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("soak: cannot count messages by status");
    }
}

fn get(c: &BTreeMap<String, i64>, status: &str) -> i64 {
    c.get(status).copied().unwrap_or(0)
}

fn open(c: &BTreeMap<String, i64>) -> i64 {
    get(c, "pending") + get(c, "running")
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL restart (mode 2)

fn restart_postgres() -> Duration {
    let started = Instant::now();
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql lists the installed PostgreSQL versions")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a PostgreSQL version under /etc/postgresql");
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .status()
        .expect("run pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster restart failed: {status}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::process::Command::new("pg_isready")
        .args(["-q", "-h", "127.0.0.1", "-p", "5432"])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(
            Instant::now() < deadline,
            "PostgreSQL was not ready within 60 s of the restart"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Chaos {
    kills: usize,
    connection_kills: usize,
    postgres_restarts: usize,
    /// Messages in flight at a kill, with how many kills caught them: the only ones (with the
    /// laggards) allowed to run twice.
    in_flight_at_kills: HashMap<Uuid, u32>,
}

impl Chaos {
    /// Records the messages in flight at one kill.
    fn caught(&mut self, ids: impl IntoIterator<Item = Uuid>) {
        for id in ids.into_iter().collect::<HashSet<_>>() {
            *self.in_flight_at_kills.entry(id).or_default() += 1;
        }
    }
}

#[test]
#[ignore = "the fault-injection soak takes minutes: run with --ignored (CI runs it as its own stage)"]
fn soak() {
    soak_on(Server::Postgres);
}

#[test]
#[ignore = "the fault-injection soak takes minutes: run with --ignored (CI runs it as its own stage)"]
fn soak_mariadb() {
    outbox_tests::skip_without_mysql!();
    soak_on(Server::MariaDb);
}

#[test]
#[ignore = "the fault-injection soak takes minutes: run with --ignored (CI runs it as its own stage)"]
fn soak_sqlite() {
    soak_on(Server::Sqlite);
}

fn soak_on(server: Server) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(server));
}

async fn run(server: Server) {
    let s = Arc::new(Settings::from_env(server));
    assert!(
        s.messages >= 3 * BATCH,
        "SOAK_MESSAGES must be at least {}",
        3 * BATCH
    );
    let db = SoakDb::create(server).await;
    let logs = std::env::temp_dir().join(format!("outbox-soak-{}", db.name));
    std::fs::create_dir_all(&logs).expect("create the worker log directory");
    let mut admin = Admin {
        server,
        url: db.url.clone(),
        conn: None,
    };
    admin.conn().await;
    let say = |line: String| {
        if s.verbose {
            eprintln!("soak: {line}");
        }
    };

    // The backlog, then the workers, then steady production with kills, then a final burst.
    let started = Instant::now();
    for lo in (0..s.backlog).step_by(1000) {
        enqueue_range(&db.pool, &s, lo, (lo + 1000).min(s.backlog))
            .await
            .unwrap_or_else(|e| panic!("soak: {e}"));
    }
    let enqueued = Arc::new(AtomicI64::new(s.backlog));
    let mut fleet = Fleet::start(&db.url, &logs);
    let steady_end = s.messages - s.burst;
    let next = Arc::new(AtomicI64::new(s.backlog));
    let production_start = Instant::now();
    let production_time = Duration::from_secs_f64((steady_end - s.backlog) as f64 / s.rate);
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|_| {
            tokio::spawn(produce(
                db.pool.clone(),
                s.clone(),
                next.clone(),
                enqueued.clone(),
                steady_end,
                production_start,
            ))
        })
        .collect();
    let producing = Arc::new(AtomicBool::new(true));
    let watcher = {
        let producing = producing.clone();
        tokio::spawn(async move {
            let mut errors = Vec::new();
            for p in producers {
                match p.await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => errors.push(e),
                    Err(e) => errors.push(format!("producer task failed: {e}")),
                }
            }
            producing.store(false, Ordering::SeqCst);
            errors
        })
    };
    say(format!(
        "backlog {} enqueued, producing {} more at {}/s over {:.0?}, seed {}",
        s.backlog,
        steady_end - s.backlog,
        s.rate,
        production_time,
        s.seed
    ));

    let mut rng = Rng(s.seed);
    let mut chaos = Chaos::default();
    let connection_kills_at: &[Instant] = if server.kills_connections() {
        &[
            production_start + production_time.mul_f64(0.35),
            production_start + production_time.mul_f64(0.7),
        ]
    } else {
        &[]
    };
    let mut next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(2001));
    let mut next_progress = Instant::now() + Duration::from_secs(15);
    while producing.load(Ordering::SeqCst)
        || chaos.kills < 10
        || chaos.connection_kills < connection_kills_at.len()
    {
        fleet.reap();
        let now = Instant::now();
        if now >= next_kill {
            let victim = rng.below(WORKERS as u64) as usize;
            let name = fleet.sigkill(victim).await;
            let ids = admin.running(Some(&name)).await;
            chaos.caught(ids);
            chaos.kills += 1;
            next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(2001));
        }
        if chaos.connection_kills < connection_kills_at.len()
            && (now >= connection_kills_at[chaos.connection_kills]
                || !producing.load(Ordering::SeqCst))
        {
            let n = admin.terminate_all(&db.name).await;
            let ids = admin.running(None).await;
            say(format!(
                "connection kill {}: {n} backends terminated, {} messages running",
                chaos.connection_kills + 1,
                ids.len()
            ));
            chaos.caught(ids);
            chaos.connection_kills += 1;
        }
        if s.verbose && now >= next_progress {
            let c = admin.counts().await;
            say(format!(
                "{:.0?}: enqueued {} kills {} counts {c:?}",
                started.elapsed(),
                enqueued.load(Ordering::SeqCst),
                chaos.kills
            ));
            next_progress = now + Duration::from_secs(15);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut failures: Vec<String> = watcher.await.expect("producer watcher");

    // The final burst: the drain starts with real work to do.
    for lo in (steady_end..s.messages).step_by(1000) {
        if let Err(e) = enqueue_range(&db.pool, &s, lo, (lo + 1000).min(s.messages)).await {
            failures.push(e);
        }
    }
    enqueued.fetch_add(s.messages - steady_end, Ordering::SeqCst);
    let production_done = Instant::now();
    say(format!(
        "production done after {:.0?}; draining",
        started.elapsed()
    ));

    // The drain, with the PostgreSQL restart of mode 2 in its middle.
    let at_drain_start = open(&admin.counts().await);
    let drain_deadline = Instant::now() + DRAIN_LIMIT;
    let mut restarted = !s.restart_postgres;
    let last_counts = loop {
        fleet.reap();
        let c = admin.counts().await;
        if open(&c) == 0 {
            break c;
        }
        if !restarted && open(&c) <= at_drain_start / 2 {
            restarted = true;
            let mut around = admin.running(None).await;
            // Nothing of the harness may hold a connection across the restart.
            admin.conn = None;
            let took = tokio::task::spawn_blocking(restart_postgres)
                .await
                .expect("restart task");
            chaos.postgres_restarts += 1;
            // Messages claimed before the restart may still be in flight for a lease.
            let until = Instant::now() + LEASE + Duration::from_secs(1);
            while Instant::now() < until {
                around.extend(admin.running(None).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            chaos.caught(around);
            say(format!(
                "PostgreSQL restarted in {took:.1?} with {} messages open",
                open(&c)
            ));
            continue;
        }
        if Instant::now() > drain_deadline {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let wall = started.elapsed();
    let drain = production_done.elapsed();
    if s.restart_postgres && chaos.postgres_restarts == 0 {
        failures.push("SOAK_RESTART_POSTGRES=1 but the drain ended before the restart".into());
    }
    if open(&last_counts) > 0 {
        failures.push(format!(
            "the drain did not finish within {DRAIN_LIMIT:?}: status counts {last_counts:?}"
        ));
    }

    for (name, r) in fleet.stop().await {
        match r {
            Ok(status) if status.success() => {}
            Ok(status) => failures.push(format!(
                "worker {name} did not stop cleanly on SIGTERM: {status}"
            )),
            Err(e) => failures.push(format!("worker {name}: {e}")),
        }
    }
    for (name, status) in &fleet.unexpected {
        // A worker may fail to start while its connections are being killed (exit code 4, the
        // database); anything else is a crash.
        if status.code() != Some(4) {
            failures.push(format!(
                "worker {name} exited by itself: {status} (signal {:?})",
                status.signal()
            ));
        }
    }

    let events = read_traces(&logs);
    let explained = events
        .as_deref()
        .map(explained_attempts)
        .unwrap_or_default();
    let report = check(
        &db.pool,
        &s,
        &chaos,
        &explained,
        enqueued.load(Ordering::SeqCst),
    )
    .await;
    failures.extend(report.failures);
    let validated = match events {
        Ok(events) => validate_trace(&db.pool, events).await,
        Err(e) => Err(e),
    };
    let traced = match validated {
        Ok(summary) => summary,
        Err(e) => {
            failures.push(e);
            String::from("failed")
        }
    };
    let messages = enqueued.load(Ordering::SeqCst);
    let name = match server {
        Server::Postgres => "soak",
        Server::MariaDb => "soak (MariaDB)",
        Server::Sqlite => "soak (SQLite)",
    };
    let mut line = format!(
        "{name}: messages={messages} kills={} connection_kills={} duplicates={} dead={} wall={:.1}s rate={:.1} msg/s",
        chaos.kills,
        chaos.connection_kills,
        report.duplicates,
        report.dead,
        wall.as_secs_f64(),
        messages as f64 / wall.as_secs_f64(),
    );
    line.push_str(&format!(
        " (stale_outcomes={} crash_exhausted={} drain={:.1}s restarts={} seed={}",
        report.stale,
        report.crash_exhausted,
        drain.as_secs_f64(),
        chaos.postgres_restarts,
        s.seed
    ));
    line.push_str(&format!(" trace: {traced}"));
    if !fleet.unexpected.is_empty() {
        line.push_str(&format!(" worker_exits={}", fleet.unexpected.len()));
    }
    line.push(')');
    println!("{line}");

    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&logs);
        db.drop_db().await;
    } else {
        panic!(
            "soak FAILED: {} broken guarantee(s):\n  - {}\n(database {} kept for inspection; worker logs in {})",
            failures.len(),
            failures.join("\n  - "),
            db.name,
            logs.display()
        );
    }
}

/// The workers' protocol traces, every process's events together.
fn read_traces(logs: &Path) -> Result<Vec<Event>, String> {
    let mut events = Vec::new();
    let entries = std::fs::read_dir(logs).map_err(|e| format!("trace: {e}"))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.to_string_lossy().ends_with(".jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("trace: {e}"))?;
        events
            .extend(Validator::parse(&text).map_err(|e| format!("trace {}: {e}", path.display()))?);
    }
    if events.is_empty() {
        return Err("trace: the workers recorded no protocol event".into());
    }
    Ok(events)
}

/// How much earlier than its lease allows a re-claim may be recorded and still count as one
/// that found the lease run out: an event is written after its statement returned, so the
/// trace's times of a claim or renewal are late by up to this much on a loaded machine.
const LEASE_SLACK: Duration = Duration::from_millis(500);

/// The attempts (message id, attempt) after which the trace explains a second delivery
/// without a kill, as at least once allows:
/// - the claim ended in a failed outcome that landed: the handler ran (and may have had its
///   effect) but the run counted as failed, a handler timeout for one;
/// - the lease ran out under a live worker (renewals late on a starved machine, a done write
///   slower than the lease): the message's next claim came a lease or more after this claim's
///   last claim or renewal event (less [`LEASE_SLACK`]). A claim that took a lease still
///   running would come sooner, and stays unexplained.
fn explained_attempts(events: &[Event]) -> HashSet<(Uuid, i32)> {
    // Per message, its claims (time, token, attempt) in time order.
    let mut claims: HashMap<&str, Vec<(u64, &str, u32)>> = HashMap::new();
    // The last time each claim (message, token) was claimed or renewed.
    let mut touched: HashMap<(&str, &str), u64> = HashMap::new();
    let mut failed: HashSet<(&str, &str)> = HashSet::new();
    for e in events {
        match e.action.as_str() {
            "claim" => {
                if let (Some(m), Some(t), Some(a)) = (&e.message, &e.token, e.attempt) {
                    claims.entry(m).or_default().push((e.t, t, a));
                    touched.insert((m, t), e.t);
                }
            }
            "renew" => {
                if let (Some(ms), Some(ts)) = (&e.messages, &e.tokens) {
                    for (m, t) in ms.split(',').zip(ts.split(',')) {
                        let last = touched.entry((m, t)).or_insert(e.t);
                        *last = (*last).max(e.t);
                    }
                }
            }
            "failed" if e.written == Some(serde_json::Value::Bool(true)) => {
                if let (Some(m), Some(t)) = (&e.message, &e.token) {
                    failed.insert((m, t));
                }
            }
            _ => {}
        }
    }
    let lapse = (LEASE - LEASE_SLACK).as_micros() as u64;
    let mut explained = HashSet::new();
    for (m, mut list) in claims {
        let Ok(id) = Uuid::parse_str(m) else { continue };
        list.sort_unstable();
        for (i, &(_, token, attempt)) in list.iter().enumerate() {
            let lapsed = list.get(i + 1).is_some_and(|&(next, _, _)| {
                touched
                    .get(&(m, token))
                    .is_some_and(|&last| next >= last.saturating_add(lapse))
            });
            if lapsed || failed.contains(&(m, token)) {
                if let Ok(attempt) = i32::try_from(attempt) {
                    explained.insert((id, attempt));
                }
            }
        }
    }
    explained
}

/// Replays the workers' protocol traces through the model's statements (`tests/model`, see
/// its `trace` module for what that checks and what a trace cannot tell) and compares the
/// model's final state of every message with the database's. Returns the summary.
async fn validate_trace(pool: &Db, events: Vec<Event>) -> Result<String, String> {
    let statuses: Vec<(Uuid, String)> = pool
        .rows("SELECT id, status FROM soak_messages")
        .await
        .map_err(|e| format!("trace: reading the final statuses: {e}"))?;
    let finals: HashMap<String, Final> = statuses
        .into_iter()
        .map(|(id, status)| {
            let id = id.to_string();
            let state = match status.as_str() {
                "done" => Final::Done,
                "dead" => Final::Dead,
                _ => Final::Live,
            };
            (id, state)
        })
        .collect();
    let mut validator = Validator::new();
    validator.replay(events);
    match validator.finish(&finals) {
        Ok(s) => Ok(format!(
            "events={} messages={} claims={} lapsed_leases={} unseen_claims={} fences_lost={} reordered={} killed_workers={}",
            s.events, s.messages, s.claims, s.lapsed_leases, s.unseen_claims, s.fences_lost, s.reordered, s.killed_workers
        )),
        Err(violations) => Err(format!(
            "the protocol trace breaks the model in {} step(s): {}",
            violations.len(),
            sample(&violations.iter().map(ToString::to_string).collect::<Vec<_>>())
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// The final checks

/// (message id, handler, deliveries, attempts, pids) of a message delivered more than once.
type Duplicate = (Uuid, String, i64, Vec<i32>, Vec<i32>);

struct Report {
    failures: Vec<String>,
    duplicates: i64,
    dead: i64,
    stale: i64,
    /// Healthy messages DEAD by crash exhaustion that the kills account for.
    crash_exhausted: usize,
}

/// Lists at most a few rows of a violation.
fn sample<T: std::fmt::Debug>(rows: &[T]) -> String {
    let shown: Vec<String> = rows.iter().take(5).map(|r| format!("{r:?}")).collect();
    let more = if rows.len() > 5 {
        format!(" and {} more", rows.len() - 5)
    } else {
        String::new()
    };
    format!("{}{more}", shown.join("; "))
}

/// The final checks. Their queries read the `soak_messages` view and the soak's tables in SQL
/// that PostgreSQL and MariaDB/MySQL both run.
async fn check(
    pool: &Db,
    s: &Settings,
    chaos: &Chaos,
    explained: &HashSet<(Uuid, i32)>,
    enqueued: i64,
) -> Report {
    let mut failures = Vec::new();

    let counts: BTreeMap<String, i64> = pool
        .rows::<(String, i64)>("SELECT status, count(*) FROM soak_messages GROUP BY status")
        .await
        .expect("count by status")
        .into_iter()
        .collect();
    let (done, dead) = (get(&counts, "done"), get(&counts, "dead"));
    let rows = pool
        .count("SELECT count(*) FROM soak_messages")
        .await
        .expect("count");
    let distinct = pool
        .count("SELECT count(DISTINCT n) FROM soak_messages")
        .await
        .expect("count distinct");
    if enqueued != done + dead || rows != enqueued || distinct != enqueued {
        failures.push(format!(
            "enqueued {enqueued} but the outbox holds {rows} rows ({distinct} distinct) and DONE + DEAD = {done} + {dead} = {}; status counts {counts:?}",
            done + dead
        ));
    }
    let expected_poison = (0..s.messages).filter(|n| s.body(*n).poison).count() as i64;

    let in_flight: Vec<(Uuid, String, String, i32)> = pool
        .rows(
            "SELECT id, topic, status, attempts FROM soak_messages \
             WHERE status IN ('pending', 'running') ORDER BY id",
        )
        .await
        .expect("in flight");
    if !in_flight.is_empty() {
        failures.push(format!(
            "{} message(s) left pending or running (id, topic, status, attempts): {}",
            in_flight.len(),
            sample(&in_flight)
        ));
    }

    let not_done: Vec<(Uuid, String, String, i32, bool, Option<String>)> = pool
        .rows(
            "SELECT id, topic, status, attempts, laggard, last_error \
             FROM soak_messages WHERE status <> 'done' AND NOT poison ORDER BY id",
        )
        .await
        .expect("healthy messages not done");
    let stale_dead: Vec<_> = not_done
        .iter()
        .filter(|m| m.2 == "dead" && m.4 && m.5.as_deref().is_some_and(|e| e.contains("is stale")))
        .collect();
    if !stale_dead.is_empty() {
        failures.push(format!(
            "fencing broken: {} laggard(s) DEAD by the dead-letter order of a claim whose lease had run out \
             and whose message another claim owned; outcome writes must be fenced by the claim token \
             (id, topic, status, attempts, laggard, last_error): {}",
            stale_dead.len(),
            sample(&stale_dead)
        ));
    }
    // With the kills that caught each one in flight: every kill costs an attempt. A healthy
    // message may end DEAD only by crash exhaustion (attempt MAX_ATTEMPTS + 1 finds the earlier
    // ones ended without an outcome), and only when the kills that caught it account for all
    // the attempts no injected fault explains: a laggard's stale first attempt, or the transient
    // failures of the first attempts of the others.
    let other_not_done: Vec<_> = not_done
        .iter()
        .filter(|m| !stale_dead.contains(m))
        .map(|(id, topic, status, attempts, laggard, error)| {
            let kills = chaos.in_flight_at_kills.get(id).copied().unwrap_or(0);
            (id, topic, status, attempts, laggard, kills, error)
        })
        .filter(|(_, _, status, _, laggard, kills, error)| {
            let injected = if **laggard { 1 } else { TRANSIENT_ATTEMPTS };
            let crash_exhausted = *status == "dead"
                && error
                    .as_deref()
                    .is_some_and(|e| e.contains(&format!("past the limit of {MAX_ATTEMPTS}")));
            !(crash_exhausted && *kills + injected >= MAX_ATTEMPTS)
        })
        .collect();
    let crash_exhausted = not_done.len() - stale_dead.len() - other_not_done.len();
    if !other_not_done.is_empty() {
        failures.push(format!(
            "{} healthy message(s) not DONE (id, topic, status, attempts, laggard, kills in flight, last_error): {}",
            other_not_done.len(),
            sample(&other_not_done)
        ));
    }

    let poison: Vec<(Uuid, String, String, i32, Option<String>)> = pool
        .rows(
            "SELECT id, topic, status, attempts, last_error FROM soak_messages \
             WHERE poison ORDER BY id",
        )
        .await
        .expect("poison messages");
    // The last error is the handler's, unless a kill caught the last attempt: then the next
    // claim, past the limit, dead-letters the message with its own explanation.
    let bad_poison: Vec<_> = poison
        .iter()
        .filter(|(id, _, status, _, err)| {
            let explained = err.as_deref().is_some_and(|e| {
                e.contains("injected: poison")
                    || (e.contains("past the limit") && chaos.in_flight_at_kills.contains_key(id))
            });
            status != "dead" || !explained
        })
        .collect();
    if !bad_poison.is_empty() {
        failures.push(format!(
            "{} poison message(s) not DEAD with their last error (id, topic, status, attempts, last_error): {}",
            bad_poison.len(),
            sample(&bad_poison)
        ));
    }
    if poison.len() as i64 != expected_poison {
        failures.push(format!(
            "{} poison messages in the outbox, {expected_poison} enqueued",
            poison.len()
        ));
    }

    // The dedup-wrapped handler: exactly one effect per DONE message, none for poison ones, and
    // never more than one (a healthy message wrongly DEAD is reported above).
    let effects: Vec<(Uuid, i64, String, i64)> = pool
        .rows(
            "SELECT id, n, status, effects FROM ( \
                SELECT m.id, m.n, m.status, m.poison, \
                       (SELECT count(*) FROM soak_effects e WHERE e.message_id = m.id) AS effects \
                FROM soak_messages m WHERE m.topic = 'soak.billing' \
             ) c \
             WHERE effects > 1 OR (status = 'done' AND effects <> 1) OR (poison AND effects <> 0) \
             ORDER BY id",
        )
        .await
        .expect("effects per message");
    if !effects.is_empty() {
        failures.push(format!(
            "the dedup-wrapped handler `ledger` broke exactly-once: {} message(s) of soak.billing without exactly one effect in soak_effects (id, n, status, effects): {}",
            effects.len(),
            sample(&effects)
        ));
    }
    // NOT IN, not a correlated NOT EXISTS: the view's ids are computed on SQLite (no index to
    // look one up by), and NOT IN reads the view once.
    let orphans = pool
        .count(
            "SELECT count(*) FROM soak_effects e \
             WHERE e.message_id NOT IN (SELECT m.id FROM soak_messages m)",
        )
        .await
        .expect("orphan effects");
    if orphans > 0 {
        failures.push(format!("{orphans} effect(s) of no message"));
    }

    // Every handler reached: at least one delivery per DONE message and plain handler.
    let missing: Vec<(Uuid, String, String)> = pool
        .rows(
            "SELECT m.id, m.topic, h.handler FROM soak_messages m \
             JOIN (SELECT 'soak.billing' AS topic, 'audit' AS handler \
                   UNION ALL SELECT 'soak.emails', 'mail' \
                   UNION ALL SELECT 'soak.index', 'index') h ON h.topic = m.topic \
             WHERE m.status = 'done' AND NOT EXISTS ( \
                 SELECT 1 FROM soak_deliveries d WHERE d.message_id = m.id AND d.handler = h.handler) \
             ORDER BY m.id",
        )
        .await
        .expect("missing deliveries");
    if !missing.is_empty() {
        failures.push(format!(
            "{} delivery(ies) never happened (id, topic, handler): {}",
            missing.len(),
            sample(&missing)
        ));
    }

    // Duplicates only where a kill, a staged laggard, or the trace (a failed outcome of the
    // earlier delivery's attempt, or its lease run out: `explained_attempts`) explains them.
    let laggards: HashSet<Uuid> = pool
        .rows::<(Uuid,)>("SELECT id FROM soak_messages WHERE laggard")
        .await
        .expect("laggards")
        .into_iter()
        .map(|(id,)| id)
        .collect();
    // The deliveries of each (message, handler) delivered more than once, in time order.
    let repeated: Vec<(Uuid, String, i32, i32)> = pool
        .rows(
            "SELECT message_id, handler, attempt, pid FROM soak_deliveries \
             WHERE (message_id, handler) IN ( \
                 SELECT message_id, handler FROM soak_deliveries \
                 GROUP BY message_id, handler HAVING count(*) > 1) \
             ORDER BY message_id, handler, at",
        )
        .await
        .expect("duplicate deliveries");
    let mut dups: Vec<Duplicate> = Vec::new();
    for (id, handler, attempt, pid) in repeated {
        match dups.last_mut() {
            Some(d) if d.0 == id && d.1 == handler => {
                d.2 += 1;
                d.3.push(attempt);
                d.4.push(pid);
            }
            _ => dups.push((id, handler, 1, vec![attempt], vec![pid])),
        }
    }
    let duplicates: i64 = dups.iter().map(|d| d.2 - 1).sum();
    let unexplained: Vec<_> = dups
        .iter()
        .filter(|d| {
            // Every delivery's attempt but the last claim's must be explained (a starved
            // process may deliver an older attempt after the newer one).
            let last = d.3.iter().max().copied().unwrap_or_default();
            let by_trace =
                d.3.iter()
                    .filter(|&&attempt| attempt != last)
                    .all(|&attempt| explained.contains(&(d.0, attempt)));
            !chaos.in_flight_at_kills.contains_key(&d.0) && !laggards.contains(&d.0) && !by_trace
        })
        .collect();
    if !unexplained.is_empty() {
        failures.push(format!(
            "{} message(s) delivered more than once to a handler although no kill caught them in flight \
             (id, handler, deliveries, attempts, pids): {}",
            unexplained.len(),
            sample(&unexplained)
        ));
    }

    // The staged stale outcome must really have happened, or the fencing went unchecked.
    let stale = pool
        .count("SELECT count(DISTINCT message_id) FROM soak_preempted")
        .await
        .expect("stale outcomes");
    if stale == 0 && !laggards.is_empty() {
        failures.push(format!(
            "no laggard was claimed again while its stale claim ran ({} laggards): the fencing was not exercised",
            laggards.len()
        ));
    }

    Report {
        failures,
        duplicates,
        dead,
        stale,
        crash_exhausted,
    }
}
