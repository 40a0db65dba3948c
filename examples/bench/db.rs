//! The database under test: a PostgreSQL or MariaDB/MySQL database or a SQLite file of the
//! bench's own, and the few statements the workloads need beside the outbox API.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result};
use outbox::{enqueue_many, Event, Store};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, MySqlConnection, MySqlPool, PgConnection, PgPool,
    SqliteConnection, SqlitePool,
};

/// Which database a run is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// PostgreSQL at `DATABASE_URL`, in a database created for the run.
    Postgres,
    /// SQLite, in a temporary file.
    Sqlite,
    /// MariaDB (or MySQL) at `MYSQL_URL`, in a database created for the run.
    Mysql,
}

impl Kind {
    /// The name used on the command line and in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "postgres",
            Kind::Sqlite => "sqlite",
            Kind::Mysql => "mysql",
        }
    }
}

/// A pool on any of the databases; [`on_pool!`] runs the same code on each.
#[derive(Clone)]
pub(crate) enum Pool {
    /// PostgreSQL.
    Pg(PgPool),
    /// SQLite.
    Sqlite(SqlitePool),
    /// MariaDB or MySQL.
    My(MySqlPool),
}

/// Runs `$body` with `$p` bound to the pool inside `$pool`, whichever database it is on.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            $crate::db::Pool::Pg($p) => $body,
            $crate::db::Pool::Sqlite($p) => $body,
            $crate::db::Pool::My($p) => $body,
        }
    };
}
pub(crate) use on_pool;

impl Pool {
    /// A store on this pool, for the worker.
    pub(crate) fn store(&self) -> Store {
        match self {
            Pool::Pg(p) => Store::postgres(p.clone()),
            Pool::Sqlite(p) => Store::sqlite(p.clone()),
            Pool::My(p) => Store::mysql(p.clone()),
        }
    }

    /// Closes every connection.
    pub(crate) async fn close(&self) {
        on_pool!(self, p => p.close().await);
    }
}

/// The business table of W2, the same on every database.
const BUSINESS_TABLE_PG: &str = "CREATE TABLE IF NOT EXISTS bench_orders ( \
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, \
    amount BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
const BUSINESS_TABLE_SQLITE: &str = "CREATE TABLE IF NOT EXISTS bench_orders ( \
    id INTEGER PRIMARY KEY AUTOINCREMENT, customer TEXT NOT NULL, amount INTEGER NOT NULL, \
    created_at INTEGER NOT NULL DEFAULT (unixepoch('subsec') * 1000))";
const BUSINESS_TABLE_MYSQL: &str = "CREATE TABLE IF NOT EXISTS bench_orders ( \
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(255) NOT NULL, \
    amount BIGINT NOT NULL, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) \
    ENGINE = InnoDB";

/// The numbers 0..999 (MariaDB/MySQL), which [`Db::insert_done`] crosses with itself to make
/// rows on the server (MySQL has no `generate_series`, and its recursive CTEs stop at 1,000
/// rows by default).
const THOUSAND_TABLE_MYSQL: &str =
    "CREATE TABLE IF NOT EXISTS bench_thousand (n INT NOT NULL PRIMARY KEY) ENGINE = InnoDB";

/// The business INSERT of W2, returning the new order's id, on each database's connection.
pub(crate) trait Orders {
    /// Inserts an order and returns its id.
    async fn insert_order(&mut self, customer: &str, amount: i64) -> Result<i64, sqlx::Error>;
}

impl Orders for PgConnection {
    async fn insert_order(&mut self, customer: &str, amount: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO bench_orders (customer, amount) VALUES ($1, $2) RETURNING id",
        )
        .bind(customer)
        .bind(amount)
        .fetch_one(self)
        .await
    }
}

impl Orders for SqliteConnection {
    async fn insert_order(&mut self, customer: &str, amount: i64) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "INSERT INTO bench_orders (customer, amount) VALUES (?1, ?2) RETURNING id",
        )
        .bind(customer)
        .bind(amount)
        .fetch_one(self)
        .await
    }
}

/// MySQL has no `INSERT ... RETURNING` (MariaDB has): the id comes back with the result, as
/// an application on MySQL reads it.
impl Orders for MySqlConnection {
    async fn insert_order(&mut self, customer: &str, amount: i64) -> Result<i64, sqlx::Error> {
        let done = sqlx::query("INSERT INTO bench_orders (customer, amount) VALUES (?, ?)")
            .bind(customer)
            .bind(amount)
            .execute(self)
            .await?;
        Ok(i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX))
    }
}

/// The database of one run: created at start, dropped (or deleted) by [`Db::drop_all`].
pub(crate) struct Db {
    /// Which database this is.
    pub(crate) kind: Kind,
    /// The main pool: seeding, checks, the in-process worker.
    pub(crate) pool: Pool,
    /// A URL child processes connect with.
    pub(crate) url: String,
    /// PostgreSQL: options of the bench database; the admin URL; the database's name.
    pg: Option<(PgConnectOptions, String, String)>,
    /// MariaDB/MySQL: the same.
    my: Option<(MySqlConnectOptions, String, String)>,
    /// SQLite: the file.
    path: Option<PathBuf>,
    /// PostgreSQL `server_version`, MariaDB/MySQL `VERSION()`, or the SQLite library version.
    pub(crate) server: String,
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// A SQLite file name in the temporary directory that no run has used.
fn new_sqlite_path() -> PathBuf {
    std::env::temp_dir().join(format!(
        "outbox-bench-{}-{}-{}.db",
        unix_secs(),
        std::process::id(),
        next_serial()
    ))
}

/// Opens a pool on the outbox's SQLite settings (WAL, busy timeout) with `max` connections.
async fn sqlite_pool_of(url: &str, max: u32) -> Result<SqlitePool> {
    Ok(SqlitePoolOptions::new()
        .max_connections(max)
        .connect_with(outbox::sqlite_options(url)?)
        .await?)
}

/// A new name for a run's own database: the time, this process and a serial, so runs never
/// meet (a stale one is dropped by the next run on the same server).
fn run_database_name() -> String {
    format!(
        "outbox_bench_{}_{}_{}",
        unix_secs(),
        std::process::id(),
        next_serial()
    )
}

impl Db {
    /// Creates the database of a run and migrates it.
    pub(crate) async fn create(kind: Kind, database_url: &str) -> Result<Db> {
        match kind {
            Kind::Postgres => {
                let shown = outbox::cli::redact_url(database_url);
                let opts: PgConnectOptions = database_url
                    .parse()
                    .with_context(|| format!("DATABASE_URL `{shown}` does not parse"))?;
                let mut admin = PgConnection::connect_with(&opts)
                    .await
                    .with_context(|| format!("cannot connect to PostgreSQL at {shown}"))?;
                drop_stale(&mut admin).await;
                let name = run_database_name();
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await?;
                admin.close().await.ok();
                let db_opts = opts.clone().database(&name);
                let pool = PgPoolOptions::new()
                    .max_connections(16)
                    .connect_with(db_opts.clone())
                    .await?;
                let server: String = sqlx::query_scalar("SHOW server_version")
                    .fetch_one(&pool)
                    .await?;
                let db = Db {
                    kind,
                    pool: Pool::Pg(pool),
                    url: db_opts.to_url_lossy().to_string(),
                    pg: Some((db_opts, database_url.to_string(), name)),
                    my: None,
                    path: None,
                    server: format!("PostgreSQL {server}"),
                };
                db.prepare().await?;
                Ok(db)
            }
            Kind::Sqlite => {
                let path = new_sqlite_path();
                let url = format!("sqlite://{}", path.display());
                let pool = sqlite_pool_of(&url, 8).await?;
                let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                    .fetch_one(&pool)
                    .await?;
                let db = Db {
                    kind,
                    pool: Pool::Sqlite(pool),
                    url,
                    pg: None,
                    my: None,
                    path: Some(path),
                    server: format!("SQLite {version}"),
                };
                db.prepare().await?;
                Ok(db)
            }
            Kind::Mysql => {
                let shown = outbox::cli::redact_url(database_url);
                let opts: MySqlConnectOptions = database_url
                    .parse()
                    .with_context(|| format!("MYSQL_URL `{shown}` does not parse"))?;
                let mut admin = MySqlConnection::connect_with(&opts)
                    .await
                    .with_context(|| format!("cannot connect to MariaDB/MySQL at {shown}"))?;
                drop_stale_mysql(&mut admin).await;
                let name = run_database_name();
                sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await?;
                admin.close().await.ok();
                let db_opts = opts.clone().database(&name);
                let pool = MySqlPoolOptions::new()
                    .max_connections(16)
                    .connect_with(db_opts.clone())
                    .await?;
                let version: String = sqlx::query_scalar("SELECT VERSION()")
                    .fetch_one(&pool)
                    .await?;
                let server = match version.split_once("-MariaDB") {
                    Some((v, _)) => format!("MariaDB {v}"),
                    None => format!("MySQL {version}"),
                };
                let db = Db {
                    kind,
                    pool: Pool::My(pool),
                    url: with_database(database_url, &name),
                    pg: None,
                    my: Some((db_opts, database_url.to_string(), name)),
                    path: None,
                    server,
                };
                db.prepare().await?;
                Ok(db)
            }
        }
    }

    /// Migrates and creates the business table.
    async fn prepare(&self) -> Result<()> {
        outbox::migrate(self.pool.store()).await?;
        match &self.pool {
            Pool::Pg(p) => sqlx::raw_sql(BUSINESS_TABLE_PG)
                .execute(p)
                .await
                .map(drop)?,
            Pool::Sqlite(p) => sqlx::raw_sql(BUSINESS_TABLE_SQLITE)
                .execute(p)
                .await
                .map(drop)?,
            Pool::My(p) => {
                sqlx::raw_sql(BUSINESS_TABLE_MYSQL).execute(p).await?;
                sqlx::raw_sql(THOUSAND_TABLE_MYSQL).execute(p).await?;
                let mut fill = sqlx::QueryBuilder::new("INSERT IGNORE INTO bench_thousand (n) ");
                fill.push_values(0..1000, |mut row, n| {
                    row.push_bind(n);
                });
                fill.build().execute(p).await?;
            }
        }
        Ok(())
    }

    /// Empties every table (PostgreSQL, MariaDB/MySQL) or starts a new file (SQLite), then
    /// checkpoints so the next timed run does not pay for the previous one's writes.
    pub(crate) async fn reset(&mut self) -> Result<()> {
        match self.kind {
            Kind::Postgres => {
                self.exec(
                    "TRUNCATE outbox_messages, outbox_dead, outbox_done_counts, outbox_deliveries, \
                     outbox_workers, outbox_processed, outbox_replays, outbox_replay_failures, \
                     outbox_handlers, bench_orders RESTART IDENTITY",
                )
                .await?;
                // W12-W15 retain the drained topic; every other workload does not. W13 and W14
                // leave replays, and every worker leaves its handlers (which replays name).
                self.exec("SELECT outbox_event_log_forget(topic) FROM outbox_retention")
                    .await?;
            }
            Kind::Sqlite => {
                // A new file each time: a connection of the last workload still closing (a
                // worker's own pool) keeps the old one, and never sees the new one's pages.
                self.pool.close().await;
                if let Some(path) = &self.path {
                    remove_sqlite_files(path);
                }
                let path = new_sqlite_path();
                self.url = format!("sqlite://{}", path.display());
                self.path = Some(path);
                self.pool = Pool::Sqlite(sqlite_pool_of(&self.url, 8).await?);
                self.prepare().await?;
            }
            Kind::Mysql => {
                // Every table but the migrations' and the bench's numbers, whatever the
                // migrations made (the event log's and the replays' tables too); TRUNCATE
                // skips the dead-letter count triggers, so their counts go with them. One
                // session, foreign keys unchecked: a table that a key refers to cannot be
                // truncated otherwise.
                let Pool::My(pool) = &self.pool else {
                    unreachable!("a MySQL database has a MySQL pool");
                };
                let mut conn = pool.acquire().await?;
                let tables: Vec<String> = sqlx::query_scalar(
                    "SELECT table_name FROM information_schema.tables \
                     WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' \
                       AND table_name NOT IN ('outbox_migrations', 'bench_thousand')",
                )
                .fetch_all(&mut *conn)
                .await?;
                sqlx::raw_sql("SET FOREIGN_KEY_CHECKS = 0")
                    .execute(&mut *conn)
                    .await?;
                for t in &tables {
                    let truncated = sqlx::raw_sql(AssertSqlSafe(format!("TRUNCATE TABLE `{t}`")))
                        .execute(&mut *conn)
                        .await;
                    if let Err(e) = truncated {
                        let _ = sqlx::raw_sql("SET FOREIGN_KEY_CHECKS = 1")
                            .execute(&mut *conn)
                            .await;
                        return Err(e).with_context(|| format!("mysql: truncating {t}"));
                    }
                }
                sqlx::raw_sql("SET FOREIGN_KEY_CHECKS = 1")
                    .execute(&mut *conn)
                    .await?;
            }
        }
        self.checkpoint().await
    }

    /// Writes dirty pages out now (PostgreSQL `CHECKPOINT`, SQLite WAL checkpoint). InnoDB has
    /// no statement for it (its page cleaner flushes in the background, adaptively), so on
    /// MariaDB/MySQL this does nothing.
    pub(crate) async fn checkpoint(&self) -> Result<()> {
        match self.kind {
            Kind::Postgres => self.exec("CHECKPOINT").await,
            Kind::Sqlite => self.exec("PRAGMA wal_checkpoint(TRUNCATE)").await,
            Kind::Mysql => Ok(()),
        }
    }

    /// Refreshes the planner statistics of the outbox tables.
    pub(crate) async fn analyze(&self) -> Result<()> {
        match self.kind {
            Kind::Mysql => {
                self.exec("ANALYZE TABLE outbox_messages, outbox_dead, outbox_done_counts")
                    .await
            }
            _ => {
                self.exec(
                    "ANALYZE outbox_messages; ANALYZE outbox_dead; ANALYZE outbox_done_counts",
                )
                .await
            }
        }
    }

    /// Runs one statement without parameters.
    pub(crate) async fn exec(&self, sql: &str) -> Result<()> {
        let safe = AssertSqlSafe(sql.to_string());
        on_pool!(&self.pool, p => sqlx::raw_sql(safe).execute(p).await.map(drop))
            .with_context(|| format!("{}: running `{sql}`", self.kind.name()))
    }

    /// Live messages of `topics`: those not finished yet, whatever their state. A drain is
    /// over when this is 0: a done message is deleted, a dead one moves to `outbox_dead`.
    ///
    /// Unordered and ordered messages are counted apart, each on an index of its own (the
    /// claim index holds unordered messages only), so this count, run every millisecond while
    /// a drain is timed, never scans the table.
    pub(crate) async fn remaining(&self, topics: &[&str]) -> Result<i64> {
        let n = match &self.pool {
            Pool::Pg(p) => {
                sqlx::query_scalar(
                    "SELECT (SELECT count(*) FROM outbox_messages \
                             WHERE topic = ANY($1) AND ordering_key IS NULL) \
                          + (SELECT count(*) FROM outbox_messages \
                             WHERE topic = ANY($1) AND ordering_key IS NOT NULL)",
                )
                .bind(topics)
                .fetch_one(p)
                .await?
            }
            Pool::Sqlite(p) => {
                sqlx::query_scalar(
                    "SELECT (SELECT count(*) FROM outbox_messages \
                             WHERE topic IN (SELECT value FROM json_each(?1)) AND ordering_key IS NULL) \
                          + (SELECT count(*) FROM outbox_messages \
                             WHERE topic IN (SELECT value FROM json_each(?1)) AND ordering_key IS NOT NULL)",
                )
                .bind(serde_json::to_string(topics)?)
                .fetch_one(p)
                .await?
            }
            Pool::My(p) => {
                // One index holds both kinds here (`outbox_messages_ready_idx (topic,
                // ordering_key, available_at)`): the count reads that index alone.
                let sql = format!(
                    "SELECT COUNT(*) FROM outbox_messages WHERE topic IN ({})",
                    vec!["?"; topics.len().max(1)].join(", ")
                );
                let mut q = sqlx::query_scalar(AssertSqlSafe(sql));
                for t in topics {
                    q = q.bind(*t);
                }
                q.fetch_one(p).await?
            }
        };
        Ok(n)
    }

    /// A new pool on the bench database, made the way `outbox::cli::connect` (and so a worker
    /// binary) makes it: one direct connection to check the server, then a lazy pool of
    /// `max` connections (PostgreSQL, MariaDB/MySQL); `outbox::sqlite_pool` on SQLite. Nothing
    /// in it is connected or prepared beforehand, so a run timed from here pays for a cold
    /// start.
    pub(crate) async fn cold_pool(&self, max: u32) -> Result<Pool> {
        match (&self.pg, &self.my) {
            (Some((opts, _, _)), _) => {
                opts.connect().await?.close().await?;
                Ok(Pool::Pg(
                    PgPoolOptions::new()
                        .max_connections(max)
                        .acquire_timeout(Duration::from_secs(10))
                        .connect_lazy_with(opts.clone()),
                ))
            }
            (_, Some((opts, _, _))) => {
                opts.connect().await?.close().await?;
                Ok(Pool::My(
                    MySqlPoolOptions::new()
                        .max_connections(max)
                        .acquire_timeout(Duration::from_secs(10))
                        .connect_lazy_with(opts.clone()),
                ))
            }
            _ => Ok(Pool::Sqlite(outbox::sqlite_pool(&self.url).await?)),
        }
    }

    /// Enqueues `events` with `enqueue_many`, 1,000 per transaction.
    pub(crate) async fn seed<E: Event>(&self, events: &[E]) -> Result<()> {
        for chunk in events.chunks(1000) {
            on_pool!(&self.pool, p => {
                let mut tx = p.begin().await?;
                enqueue_many(&mut *tx, chunk).await?;
                tx.commit().await?;
            });
        }
        Ok(())
    }

    /// Makes every pending message of `topic` due an hour earlier (ahead of all others).
    pub(crate) async fn push_ahead(&self, topic: &str) -> Result<()> {
        match &self.pool {
            Pool::Pg(p) => sqlx::query(
                "UPDATE outbox_messages SET available_at = available_at - interval '1 hour' \
                 WHERE topic = $1 AND locked_until IS NULL",
            )
            .bind(topic)
            .execute(p)
            .await
            .map(drop)?,
            Pool::Sqlite(p) => sqlx::query(
                "UPDATE outbox_messages SET available_at = available_at - 3600000 \
                 WHERE topic = ?1 AND locked_until IS NULL",
            )
            .bind(topic)
            .execute(p)
            .await
            .map(drop)?,
            Pool::My(p) => sqlx::query(
                "UPDATE outbox_messages SET available_at = available_at - 3600000 \
                 WHERE topic = ? AND locked_until IS NULL",
            )
            .bind(topic)
            .execute(p)
            .await
            .map(drop)?,
        }
        Ok(())
    }

    /// Seeds the history of a long-running system beside the live table, which keeps live
    /// messages only: `n` dead letters in `outbox_dead` (time-ordered ids, ~200-byte payloads,
    /// dead two hours ago), and the per-minute counts of `n` done messages (done messages are
    /// deleted; 1,000 a minute in the `n / 1000` minutes before that). With `keys`, dead letter
    /// `i` (from 1) holds the ordering key `{keys}{i}`.
    pub(crate) async fn insert_done(
        &self,
        n: u64,
        topic: &str,
        payload: &str,
        keys: Option<&str>,
    ) -> Result<()> {
        let n = i64::try_from(n)?;
        match &self.pool {
            Pool::Pg(p) => {
                sqlx::query(
                    "INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at, \
                                              ordering_key) \
                     SELECT (lpad(to_hex(t.ms), 12, '0') || '7' || substr(t.h, 1, 3) || '8' \
                             || substr(t.h, 4, 15))::uuid, \
                            $2, $3::json, 8, 'bench: seeded dead letter', t.ts, t.ts, $4 || t.g \
                     FROM (SELECT (extract(epoch FROM now()) * 1000)::bigint - 7200000 + g / 1000 AS ms, \
                                  md5(g::text) AS h, g, \
                                  now() - interval '2 hours' + (g / 1000) * interval '1 millisecond' AS ts \
                           FROM generate_series(1, $1) AS g) AS t",
                )
                .bind(n)
                .bind(topic)
                .bind(payload)
                .bind(keys)
                .execute(p)
                .await?;
                sqlx::query(
                    "INSERT INTO outbox_done_counts (topic, minute, worker, done) \
                     SELECT $2, date_trunc('minute', now() - interval '2 hours') - g * interval '1 minute', \
                            '00000000-0000-7000-8000-000000000001'::uuid, 1000 \
                     FROM generate_series(1, greatest($1 / 1000, 1)) AS g",
                )
                .bind(n)
                .bind(topic)
                .execute(p)
                .await
                .map(drop)?
            }
            Pool::Sqlite(p) => {
                let then = i64::try_from(
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis(),
                )? - 7_200_000;
                sqlx::query(
                    "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?1) \
                     INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at, \
                                              ordering_key) \
                     SELECT printf('%08x-%04x-7000-8000-%012x', (?4 + n / 1000) >> 16, \
                                   (?4 + n / 1000) & 65535, n), ?2, ?3, 8, \
                            'bench: seeded dead letter', ?4 + n / 1000, ?4 + n / 1000, ?5 || n \
                     FROM g",
                )
                .bind(n)
                .bind(topic)
                .bind(payload)
                .bind(then)
                .bind(keys)
                .execute(p)
                .await?;
                let minute = then - then.rem_euclid(60_000);
                sqlx::query(
                    "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < max(?1 / 1000, 1)) \
                     INSERT INTO outbox_done_counts (topic, minute, worker, done) \
                     SELECT ?2, ?3 - n * 60000, '00000000-0000-7000-8000-000000000001', 1000 FROM g",
                )
                .bind(n)
                .bind(topic)
                .bind(minute)
                .execute(p)
                .await
                .map(drop)?
            }
            Pool::My(p) => {
                let then: i64 = sqlx::query_scalar(
                    "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - 7200000",
                )
                .fetch_one(p)
                .await?;
                // Rows 1..=n from the numbers 0..999 crossed with themselves, a chunk of them
                // per statement (each its own transaction: one of two million rows would
                // hold that many row locks and undo records), the third factor bounded so
                // that the join makes no more combinations than the chunk needs.
                for lo in (0..n).step_by(usize::try_from(INSERT_DONE_CHUNK)?) {
                    let hi = (lo + INSERT_DONE_CHUNK).min(n);
                    sqlx::query(
                        "INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, \
                                                  created_at, dead_at, ordering_key) \
                         SELECT UNHEX(CONCAT(LPAD(HEX(? + t.g DIV 1000), 12, '0'), '7', \
                                             SUBSTR(t.h, 1, 3), '8', SUBSTR(t.h, 4, 15))), \
                                ?, ?, 8, 'bench: seeded dead letter', ? + t.g DIV 1000, \
                                ? + t.g DIV 1000, CONCAT(?, t.g) \
                         FROM (SELECT g, MD5(g) AS h \
                               FROM (SELECT a.n + 1000 * k.k + 1 AS g \
                                     FROM (SELECT b.n + 1000 * c.n AS k \
                                           FROM bench_thousand b CROSS JOIN bench_thousand c \
                                           WHERE c.n BETWEEN ? DIV 1000000 \
                                                         AND (? - 1) DIV 1000000) AS k \
                                     CROSS JOIN bench_thousand a \
                                     WHERE k.k BETWEEN ? DIV 1000 AND (? - 1) DIV 1000) AS s \
                               WHERE g > ? AND g <= ?) AS t",
                    )
                    .bind(then)
                    .bind(topic)
                    .bind(payload)
                    .bind(then)
                    .bind(then)
                    .bind(keys)
                    .bind(lo)
                    .bind(hi)
                    .bind(lo)
                    .bind(hi)
                    .bind(lo)
                    .bind(hi)
                    .execute(p)
                    .await?;
                }
                let minute = then - then.rem_euclid(60_000);
                sqlx::query(
                    "INSERT INTO outbox_done_counts (topic, minute, worker, done) \
                     SELECT ?, ? - g * 60000, UNHEX('00000000000070008000000000000001'), 1000 \
                     FROM (SELECT a.n + 1000 * b.n + 1 AS g \
                           FROM bench_thousand a CROSS JOIN bench_thousand b \
                           WHERE b.n <= GREATEST(? DIV 1000, 1) DIV 1000) AS s \
                     WHERE g <= GREATEST(? DIV 1000, 1)",
                )
                .bind(topic)
                .bind(minute)
                .bind(n)
                .bind(n)
                .execute(p)
                .await
                .map(drop)?
            }
        }
        Ok(())
    }

    /// A second pool of `max` connections on the same database, all connected up front (for
    /// producers, so they never wait for the worker's connections or for a connect).
    pub(crate) async fn extra_pool(&self, max: u32) -> Result<Pool> {
        let pool = match (&self.pg, &self.my) {
            (Some((opts, _, _)), _) => Pool::Pg(
                PgPoolOptions::new()
                    .max_connections(max)
                    .min_connections(max)
                    .connect_with(opts.clone())
                    .await?,
            ),
            (_, Some((opts, _, _))) => Pool::My(
                MySqlPoolOptions::new()
                    .max_connections(max)
                    .min_connections(max)
                    .connect_with(opts.clone())
                    .await?,
            ),
            _ => Pool::Sqlite(sqlite_pool_of(&self.url, max).await?),
        };
        // Open every connection now, outside any timed section.
        on_pool!(&pool, p => {
            let mut held = Vec::new();
            for _ in 0..max {
                held.push(p.acquire().await?);
            }
        });
        Ok(pool)
    }

    /// Closes the pools and drops the database (or deletes the file).
    pub(crate) async fn drop_all(self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.pool.close()).await;
        if let Some((_, admin_url, name)) = &self.pg {
            if let Ok(mut admin) = PgConnection::connect(admin_url).await {
                let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await;
            }
        }
        if let Some((_, admin_url, name)) = &self.my {
            if let Ok(mut admin) = MySqlConnection::connect(admin_url).await {
                let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
                    .execute(&mut admin)
                    .await;
                admin.close().await.ok();
            }
        }
        if let Some(path) = &self.path {
            remove_sqlite_files(path);
        }
    }
}

/// An empty database beside the bench's, for the peer (graphile-worker) to install itself in.
/// Its name follows the bench's (`outbox_bench_<secs>_...`), so a killed run's is dropped later.
pub(crate) struct PeerDb {
    /// The URL the peer connects with.
    pub(crate) url: String,
    admin_url: String,
    name: String,
}

impl PeerDb {
    /// Creates the database on the server at `database_url`.
    pub(crate) async fn create(database_url: &str) -> Result<PeerDb> {
        let opts: PgConnectOptions = database_url.parse()?;
        let mut admin = PgConnection::connect_with(&opts).await?;
        let name = format!("{}_peer", run_database_name());
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        admin.close().await.ok();
        Ok(PeerDb {
            url: with_database(database_url, &name),
            admin_url: database_url.to_string(),
            name,
        })
    }

    /// Drops the database.
    pub(crate) async fn drop_all(self) {
        if let Ok(mut admin) = PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::raw_sql(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut admin)
            .await;
        }
    }
}

/// `url` (`postgres://user@host:port/db?params`, or `mysql://...`) naming database `name`
/// instead: the URL as the user wrote it, for a client other than sqlx (sqlx's own rendering
/// adds an `sslmode` that node-postgres reads as "TLS required") and for the bench's child
/// processes on MariaDB/MySQL.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_at(url.find('?').unwrap_or(url.len()));
    let host_start = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[host_start..]
        .find('/')
        .map_or(base.len(), |i| host_start + i);
    format!("{}/{name}{query}", &base[..host_end])
}

fn remove_sqlite_files(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

/// Tells apart the databases one bench process creates (W4 uses a second one).
fn next_serial() -> u64 {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Drops bench databases left behind more than an hour ago by runs that were killed.
async fn drop_stale(admin: &mut PgConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'outbox\\_bench\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for name in stale(names) {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut *admin)
        .await;
    }
}

/// Of the bench databases `names` ([`run_database_name`]), those made more than an hour ago.
fn stale(names: Vec<String>) -> impl Iterator<Item = String> {
    let now = unix_secs();
    names.into_iter().filter(move |name| {
        let created: Option<u64> = name.split('_').nth(2).and_then(|s| s.parse().ok());
        created.is_some_and(|t| t + 3600 < now)
    })
}

/// Dead letters per statement of [`Db::insert_done`] on MariaDB/MySQL.
const INSERT_DONE_CHUNK: i64 = 200_000;

/// Drops bench databases left behind more than an hour ago by runs that were killed, on
/// MariaDB/MySQL.
async fn drop_stale_mysql(admin: &mut MySqlConnection) {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT schema_name FROM information_schema.schemata \
         WHERE schema_name LIKE 'outbox\\_bench\\_%'",
    )
    .fetch_all(&mut *admin)
    .await
    .unwrap_or_default();
    for name in stale(names) {
        let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}")))
            .execute(&mut *admin)
            .await;
    }
}
