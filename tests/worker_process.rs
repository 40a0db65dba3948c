//! The worker as a real process: several workers sharing a queue, SIGKILL in the middle of a
//! handler, SIGTERM with handlers in flight, database connections killed under a running
//! worker, and the `--once` / `--list-topics` / bad-URL / `--help` paths of the command line
//! (and the `--help` of the `outbox` command line beside it).
//!
//! Every test runs `test-worker` (tests/bin/test_worker.rs) as child processes on a fresh
//! database of its own; its handler `record` sleeps `sleep_ms` and then inserts a row into
//! `effects`, a table each test creates.
//!
//! A done message is deleted; each test keeps a copy of every deleted row (`archive_done`, a
//! trigger of the tests), to check how often each message was attempted and who finished it.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use outbox::enqueue_many;
use outbox_tests::events::Work;
use outbox_tests::{pg, TestDb};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::process::{Child, Command};
use uuid::Uuid;

const POLL: Duration = Duration::from_millis(50);

/// A `test-worker` child process on `url`, logging warnings to the test's stderr.
fn spawn_worker(url: &str, flags: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .arg("--database-url")
        .arg(url)
        .args(flags)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn test-worker")
}

fn pid(child: &Child) -> u32 {
    child.id().expect("the worker is still running")
}

/// Sends SIGTERM with the `kill` command.
fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -TERM {pid} failed: {status}");
}

/// Waits for `child` to exit, at most `limit`.
async fn wait_exit(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status.expect("wait for the worker"),
        Err(_) => panic!("{what}: the worker did not exit within {limit:?}"),
    }
}

/// Runs a query again while the database refuses it (connections killed under the pool).
async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Message counts by status: `pending` and `running` (lease running) in the live table, `dead`
/// in the dead letters, `done` deleted (archived, and in neither table).
async fn counts(pool: &PgPool) -> BTreeMap<String, i64> {
    let rows: Vec<(String, i64)> = retry("count by status", || {
        sqlx::query_as(
            "SELECT status, count(*) FROM ( \
                SELECT CASE WHEN locked_until >= now() THEN 'running' ELSE 'pending' END AS status \
                FROM outbox_messages \
                UNION ALL SELECT 'dead' FROM outbox_dead \
                UNION ALL SELECT 'done' FROM (SELECT DISTINCT id FROM test_deleted) d \
                WHERE NOT EXISTS (SELECT 1 FROM outbox_messages m WHERE m.id = d.id) \
                  AND NOT EXISTS (SELECT 1 FROM outbox_dead x WHERE x.id = d.id) \
             ) s GROUP BY status",
        )
        .fetch_all(pool)
    })
    .await;
    rows.into_iter().collect()
}

/// A fresh database with an `effects` table that archives deleted message rows.
async fn setup(unique: bool) -> TestDb {
    let db = pg().await;
    effects_table(&db.pool, unique).await;
    db.archive_done().await;
    db
}

/// The done messages as they were deleted, with the name of the worker that claimed them last
/// (while its row is still in `outbox_workers`): (id, attempts, last_error, worker name).
async fn done_rows(pool: &PgPool) -> Vec<(Uuid, i32, Option<String>, String)> {
    sqlx::query_as(
        "SELECT d.id, d.attempts, d.last_error, coalesce(w.name, d.claimed_by::text, '-') \
         FROM test_deleted d LEFT JOIN outbox_workers w ON w.id = d.claimed_by \
         WHERE NOT EXISTS (SELECT 1 FROM outbox_dead x WHERE x.id = d.id) ORDER BY d.seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

fn get(c: &BTreeMap<String, i64>, status: &str) -> i64 {
    c.get(status).copied().unwrap_or(0)
}

/// Polls the status counts until `done` holds, or panics after `limit` with the counts.
async fn wait_for(
    pool: &PgPool,
    limit: Duration,
    what: &str,
    done: impl Fn(&BTreeMap<String, i64>) -> bool,
) -> BTreeMap<String, i64> {
    let deadline = Instant::now() + limit;
    loop {
        let c = counts(pool).await;
        if done(&c) {
            return c;
        }
        if Instant::now() > deadline {
            panic!("timed out after {limit:?} waiting for {what}; status counts: {c:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    retry(sql, || sqlx::query_scalar(sql).fetch_one(pool)).await
}

async fn effects_table(pool: &PgPool, unique: bool) {
    let key = if unique { ", UNIQUE (message_id)" } else { "" };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE effects (message_id uuid NOT NULL, handler text NOT NULL, n bigint NOT NULL{key})"
    )))
    .execute(pool)
    .await
    .unwrap();
}

/// Enqueues `n` Work events in one transaction and returns their public ids.
async fn enqueue_work(db: &TestDb, n: i64, sleep_ms: impl Fn(i64) -> u64) -> Vec<Uuid> {
    let events: Vec<Work> = (0..n)
        .map(|i| Work {
            n: i,
            sleep_ms: sleep_ms(i),
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

/// (id, attempts, claim_token) of the rows now claimed (lease running or not).
async fn running_rows(pool: &PgPool) -> Vec<(Uuid, i32, Option<Uuid>)> {
    sqlx::query_as(
        "SELECT id, attempts, claim_token FROM outbox_messages \
         WHERE claim_token IS NOT NULL ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn two_workers_drain_2000_messages_exactly_once() {
    let db = setup(true).await;

    // Both workers are up and asleep on LISTEN before the burst, so both take part.
    let flags = ["--batch-size", "10"];
    let mut a = spawn_worker(&db.url, &flags);
    let mut b = spawn_worker(&db.url, &flags);
    let (pid_a, pid_b) = (pid(&a), pid(&b));
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalar(
        &db.pool,
        "SELECT count(*) FROM outbox_workers WHERE waiting",
    )
    .await
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "the two workers did not both register as waiting within 20 s"
        );
        tokio::time::sleep(POLL).await;
    }

    let started = Instant::now();
    enqueue_work(&db, 2000, |i| (i % 3) as u64).await;
    let c = wait_for(&db.pool, Duration::from_secs(60), "2000 done", |c| {
        get(c, "done") == 2000
    })
    .await;
    eprintln!(
        "two workers drained 2000 messages in {:?}",
        started.elapsed()
    );
    assert_eq!(c.len(), 1, "only done messages are left: {c:?}");
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT coalesce(sum(done), 0)::bigint FROM outbox_done_counts"
        )
        .await,
        2000,
        "the done counts agree"
    );

    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM effects").await, 2000);
    assert_eq!(
        scalar(&db.pool, "SELECT count(DISTINCT message_id) FROM effects").await,
        2000
    );
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM effects e WHERE EXISTS (SELECT 1 FROM test_deleted d WHERE d.id = e.message_id)"
        )
        .await,
        2000,
        "every effect belongs to a message"
    );
    // A second run of any message would have hit the unique key, failed, and been retried.
    let done = done_rows(&db.pool).await;
    assert_eq!(done.len(), 2000, "each message deleted once, as done");
    let over: Vec<_> = done
        .iter()
        .filter(|(_, attempts, err, _)| *attempts != 1 || err.is_some())
        .take(5)
        .collect();
    assert!(over.is_empty(), "messages run more than once: {over:?}");

    let mut by_worker: BTreeMap<String, i64> = BTreeMap::new();
    for (_, _, _, name) in &done {
        *by_worker.entry(name.clone()).or_default() += 1;
    }
    eprintln!("claims per worker: {by_worker:?}");
    assert_eq!(by_worker.len(), 2, "both workers claimed: {by_worker:?}");
    for suffix in [format!(":{pid_a}"), format!(":{pid_b}")] {
        assert!(
            by_worker.iter().any(|(name, _)| name.ends_with(&suffix)),
            "no claims by the worker with pid {suffix}: {by_worker:?}"
        );
    }

    sigterm(pid_a);
    sigterm(pid_b);
    let sa = wait_exit(&mut a, Duration::from_secs(15), "worker a after SIGTERM").await;
    let sb = wait_exit(&mut b, Duration::from_secs(15), "worker b after SIGTERM").await;
    assert_eq!(sa.code(), Some(0), "worker a: {sa}");
    assert_eq!(sb.code(), Some(0), "worker b: {sb}");
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_workers").await,
        0,
        "stopped workers deregister"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn sigkill_mid_handler_redelivers_after_lease() {
    let db = setup(false).await;
    let ids = enqueue_work(&db, 50, |_| 1500).await;
    let flags = [
        "--lease",
        "3",
        "--handler-timeout",
        "2",
        "--concurrency",
        "50",
    ];

    let mut first = spawn_worker(&db.url, &flags);
    wait_for(&db.pool, Duration::from_secs(20), "running messages", |c| {
        get(c, "running") > 0
    })
    .await;
    first.start_kill().unwrap();
    let status = wait_exit(&mut first, Duration::from_secs(5), "SIGKILLed worker").await;
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");

    // What was in flight at the kill stays claimed: nothing is lost, nothing is marked.
    let in_flight = running_rows(&db.pool).await;
    assert!(!in_flight.is_empty(), "messages were running at the kill");
    assert!(in_flight.iter().all(|(_, attempts, _)| *attempts == 1));
    let c = counts(&db.pool).await;
    assert_eq!(c.values().sum::<i64>(), 50, "no message lost: {c:?}");
    assert_eq!(get(&c, "dead"), 0, "{c:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        running_rows(&db.pool).await,
        in_flight,
        "the rows of the dead worker stay running, same claim"
    );
    eprintln!("{} message(s) in flight at the SIGKILL", in_flight.len());

    let mut second = spawn_worker(&db.url, &flags);
    let pid2 = pid(&second);
    wait_for(&db.pool, Duration::from_secs(30), "50 done", |c| {
        get(c, "done") == 50
    })
    .await;

    let mut per_message: Vec<(Uuid, i32, String, i64)> = Vec::new();
    for (id, attempts, _, claimed_by) in done_rows(&db.pool).await {
        let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects WHERE message_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        per_message.push((id, attempts, claimed_by, effects));
    }
    assert_eq!(per_message.len(), ids.len());
    let killed: HashSet<Uuid> = in_flight.iter().map(|(id, _, _)| *id).collect();
    let mut total = 0;
    for (id, attempts, claimed_by, effects) in &per_message {
        total += effects;
        assert!(*effects >= 1, "message {id} has no effect");
        if killed.contains(id) {
            assert_eq!(
                *attempts, 2,
                "message {id} was in flight at the kill and ran again"
            );
            assert!(
                claimed_by.ends_with(&format!(":{pid2}")),
                "message {id} was finished by the second worker, not {claimed_by}"
            );
        } else {
            assert_eq!(*attempts, 1, "message {id} was done before the kill");
        }
    }
    assert!(total >= 50, "{total} effects for 50 messages");
    eprintln!("{total} effects for 50 messages after the SIGKILL");

    sigterm(pid2);
    let status = wait_exit(&mut second, Duration::from_secs(15), "second worker").await;
    assert_eq!(status.code(), Some(0), "second worker: {status}");
    db.drop_db().await;
}

#[tokio::test]
async fn sigterm_lets_in_flight_handlers_finish() {
    let db = setup(true).await;
    enqueue_work(&db, 20, |_| 1000).await;

    let mut worker = spawn_worker(
        &db.url,
        &["--concurrency", "20", "--shutdown-timeout", "10"],
    );
    wait_for(&db.pool, Duration::from_secs(20), "running messages", |c| {
        get(c, "running") > 0
    })
    .await;
    let running: Vec<Uuid> = running_rows(&db.pool)
        .await
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let stop = Instant::now();
    sigterm(pid(&worker));
    let status = wait_exit(&mut worker, Duration::from_secs(15), "worker after SIGTERM").await;
    eprintln!(
        "worker exited {:?} after SIGTERM with {} message(s) in flight",
        stop.elapsed(),
        running.len()
    );
    assert_eq!(status.code(), Some(0), "exit after SIGTERM: {status}");

    let c = counts(&db.pool).await;
    assert_eq!(get(&c, "running"), 0, "nothing left running: {c:?}");
    assert_eq!(get(&c, "dead"), 0, "{c:?}");
    let left: Vec<(Uuid, String, i32, i64)> = sqlx::query_as(
        "SELECT r.id, \
                CASE WHEN EXISTS (SELECT 1 FROM outbox_messages m WHERE m.id = r.id) THEN 'live' \
                     WHEN EXISTS (SELECT 1 FROM outbox_dead x WHERE x.id = r.id) THEN 'dead' \
                     ELSE 'done' END, \
                coalesce((SELECT d.attempts FROM test_deleted d WHERE d.id = r.id ORDER BY d.seq DESC LIMIT 1), 0), \
                (SELECT count(*) FROM effects e WHERE e.message_id = r.id) \
         FROM unnest($1::uuid[]) AS r(id)",
    )
    .bind(&running)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(left.len(), running.len());
    for (id, status, attempts, effects) in left {
        assert_eq!(status, "done", "message {id} in flight at SIGTERM");
        assert_eq!(attempts, 1, "message {id}");
        assert_eq!(effects, 1, "message {id} has its effect");
    }
    // The stopped worker claimed nothing after the signal.
    assert_eq!(
        get(&c, "done"),
        i64::try_from(running.len()).unwrap(),
        "{c:?}"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn pg_terminate_backend_mid_drain_still_completes() {
    let db = setup(false).await;
    enqueue_work(&db, 3000, |i| (i % 6) as u64).await;

    // A short lease: a claim whose reply is lost with its connection is retried in seconds.
    let mut worker = spawn_worker(&db.url, &["--lease", "10", "--handler-timeout", "5"]);
    let started = Instant::now();
    wait_for(&db.pool, Duration::from_secs(30), "300 done", |c| {
        get(c, "done") >= 300
    })
    .await;

    let mut admin = PgConnection::connect(&db.url).await.unwrap();
    for round in 1..=2 {
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&db.name)
        .fetch_all(&mut admin)
        .await
        .unwrap();
        let c = counts(&db.pool).await;
        eprintln!(
            "terminate round {round} after {:?}: {} backend(s) killed; counts {c:?}",
            started.elapsed(),
            killed.len()
        );
        assert!(
            !killed.is_empty(),
            "round {round}: the worker had connections"
        );
        if round == 1 {
            assert!(
                get(&c, "done") < 3000,
                "the drain ended before the first kill"
            );
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }
    admin.close().await.ok();

    let c = wait_for(&db.pool, Duration::from_secs(60), "3000 done", |c| {
        get(c, "done") == 3000
    })
    .await;
    eprintln!(
        "drained 3000 messages through two kills in {:?}",
        started.elapsed()
    );
    assert_eq!(c.len(), 1, "only done messages are left: {c:?}");
    assert_eq!(
        scalar(&db.pool, "SELECT count(DISTINCT message_id) FROM effects").await,
        3000,
        "every message has an effect"
    );
    let retried = scalar(
        &db.pool,
        "SELECT count(*) FROM test_deleted WHERE attempts > 1",
    )
    .await;
    let effects = scalar(&db.pool, "SELECT count(*) FROM effects").await;
    eprintln!("{retried} message(s) ran more than once; {effects} effects");

    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker survived the killed connections"
    );
    sigterm(pid(&worker));
    let status = wait_exit(&mut worker, Duration::from_secs(15), "worker after SIGTERM").await;
    assert_eq!(status.code(), Some(0), "exit after SIGTERM: {status}");
    db.drop_db().await;
}

/// Runs `test-worker` to completion with captured output.
async fn run_to_end(args: &[&str]) -> (ExitStatus, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .unwrap_or_else(|_| panic!("test-worker {args:?} did not finish within 30 s"))
        .expect("run test-worker");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprint!("{stderr}");
    (out.status, stdout, stderr)
}

#[tokio::test]
async fn once_runs_one_batch_and_list_topics_lists() {
    let db = setup(true).await;
    enqueue_work(&db, 12, |_| 0).await;

    let (status, stdout, _) =
        run_to_end(&["--database-url", &db.url, "--once", "--batch-size", "5"]).await;
    assert_eq!(status.code(), Some(0), "--once: {status}\n{stdout}");
    assert!(
        stdout.contains("claimed 5 done 5 retried 0 dead 0"),
        "--once output: {stdout}"
    );
    let c = counts(&db.pool).await;
    assert_eq!(get(&c, "done"), 5, "{c:?}");
    assert_eq!(get(&c, "pending"), 7, "{c:?}");
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM effects").await, 5);

    let (status, stdout, _) = run_to_end(&["--database-url", &db.url, "--list-topics"]).await;
    assert_eq!(status.code(), Some(0), "--list-topics: {status}\n{stdout}");
    assert!(
        stdout.lines().any(|l| l == "test.work: record"),
        "--list-topics output: {stdout}"
    );
    assert_eq!(
        get(&counts(&db.pool).await, "done"),
        5,
        "--list-topics runs nothing"
    );

    let started = Instant::now();
    let (status, stdout, stderr) =
        run_to_end(&["--database-url", "postgres://127.0.0.1:1/none"]).await;
    eprintln!("bad database URL failed after {:?}", started.elapsed());
    assert_eq!(
        status.code(),
        Some(i32::from(outbox::cli::exit::DATABASE)),
        "unreachable database: {status}\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line of error: {stderr}");
    assert!(lines[0].starts_with("error: "), "an error line: {stderr}");
    assert!(
        lines[0].to_lowercase().contains("connect"),
        "says it could not connect: {stderr}"
    );
    db.drop_db().await;
}

/// A SQLite or MariaDB database for the tests that run on either (the PostgreSQL ones above
/// use its own SQL throughout).
enum OtherDb {
    Sqlite(outbox_tests::SqliteDb),
    MySql(outbox_tests::MySqlDb),
}

impl OtherDb {
    fn url(&self) -> &str {
        match self {
            OtherDb::Sqlite(db) => &db.url,
            OtherDb::MySql(db) => &db.url,
        }
    }

    /// The `effects` table of `test-worker`, one row per message at most, and the archive of
    /// deleted message rows.
    async fn setup(&self) {
        match self {
            OtherDb::Sqlite(db) => {
                sqlx::query("CREATE TABLE effects (message_id TEXT NOT NULL UNIQUE, handler TEXT NOT NULL, n INTEGER NOT NULL)")
                    .execute(&db.pool)
                    .await
                    .unwrap();
                db.archive_done().await;
            }
            OtherDb::MySql(db) => {
                sqlx::query("CREATE TABLE effects (message_id BINARY(16) NOT NULL UNIQUE, handler TEXT NOT NULL, n BIGINT NOT NULL)")
                    .execute(&db.pool)
                    .await
                    .unwrap();
                db.archive_done().await;
            }
        }
    }

    async fn scalar(&self, sql: &'static str) -> i64 {
        match self {
            OtherDb::Sqlite(db) => sqlx::query_scalar(sql).fetch_one(&db.pool).await,
            OtherDb::MySql(db) => sqlx::query_scalar(sql).fetch_one(&db.pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn count_status(&self, status: &str) -> i64 {
        match self {
            OtherDb::Sqlite(db) => db.count_status(status).await,
            OtherDb::MySql(db) => db.count_status(status).await,
        }
    }

    async fn enqueue(&self, events: &[Work]) {
        match self {
            OtherDb::Sqlite(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, events).await.unwrap();
                tx.commit().await.unwrap();
            }
            OtherDb::MySql(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, events).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
    }

    async fn drop_db(self) {
        match self {
            OtherDb::Sqlite(db) => db.drop_db().await,
            OtherDb::MySql(db) => db.drop_db().await,
        }
    }
}

/// Two worker processes on one database drain 1,000 messages, each handled and deleted once,
/// both taking part.
async fn two_workers_take_different_messages(db: OtherDb) {
    db.setup().await;
    let flags = ["--batch-size", "10", "--poll-interval", "0.05"];
    let mut workers = [
        spawn_worker(db.url(), &flags),
        spawn_worker(db.url(), &flags),
    ];
    let pids: Vec<u32> = workers.iter().map(pid).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let events: Vec<Work> = (0..1000).map(|n| Work { n, sleep_ms: 0 }).collect();
    db.enqueue(&events).await;

    let deadline = Instant::now() + Duration::from_secs(60);
    while db.count_status("done").await < 1000 {
        assert!(
            Instant::now() < deadline,
            "not drained: {} done",
            db.count_status("done").await
        );
        tokio::time::sleep(POLL).await;
    }
    let effects = db.scalar("SELECT count(*) FROM effects").await;
    let distinct = db
        .scalar("SELECT count(DISTINCT message_id) FROM effects")
        .await;
    assert_eq!(
        (effects, distinct),
        (1000, 1000),
        "every message handled exactly once"
    );
    let deleted = db
        .scalar("SELECT count(DISTINCT id) FROM test_deleted")
        .await;
    let retried = db
        .scalar("SELECT count(*) FROM test_deleted WHERE attempts <> 1")
        .await;
    assert_eq!(deleted, 1000, "each message deleted as done");
    assert_eq!(retried, 0, "no message was claimed twice");
    let claimers = db
        .scalar("SELECT count(DISTINCT claimed_by) FROM test_deleted")
        .await;
    assert_eq!(claimers, 2, "both workers took part");
    for (w, p) in workers.iter_mut().zip(&pids) {
        sigterm(*p);
        assert_eq!(
            wait_exit(w, Duration::from_secs(15), "sigterm")
                .await
                .code(),
            Some(0)
        );
    }
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_one_sqlite_file_take_different_messages() {
    two_workers_take_different_messages(OtherDb::Sqlite(outbox_tests::sqlite().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_on_one_mysql_database_take_different_messages() {
    outbox_tests::skip_without_mysql!();
    two_workers_take_different_messages(OtherDb::MySql(outbox_tests::mysql().await)).await;
}

// Not on MariaDB: the next test checks that a SQLite worker sees other processes' commits in
// the file's write-ahead log; the MySQL backend has no such signal and, by its design
// (backend/mysql/wake.rs), finds them at the poll interval when idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_worker_sees_the_commits_of_another_process_long_before_its_poll_interval() {
    // SQLite has no NOTIFY, and `enqueue` in this process cannot wake a worker in another one:
    // the worker has to notice the commit itself, not wait 30 s for its next poll.
    let db = outbox_tests::sqlite().await;
    sqlx::query("CREATE TABLE effects (message_id TEXT NOT NULL UNIQUE, handler TEXT NOT NULL, n INTEGER NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut worker = spawn_worker(&db.url, &["--poll-interval", "30"]);
    let worker_pid = pid(&worker);
    // The first message also waits for the worker to start; the second comes when it is idle.
    for (n, limit) in [(0, Duration::from_secs(20)), (1, Duration::from_secs(5))] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let start = Instant::now();
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &[Work { n, sleep_ms: 0 }])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        outbox_tests::wait_until(
            limit.saturating_sub(start.elapsed()),
            &format!("message {n} not picked up within {limit:?}: the poll interval is 30 s"),
            async || db.count_status("done").await > n,
        )
        .await;
    }
    sigterm(worker_pid);
    let status = wait_exit(&mut worker, Duration::from_secs(15), "sigterm").await;
    assert_eq!(status.code(), Some(0));
    db.drop_db().await;
}

/// The `--help` of `bin` with `args`, with the environment variables `vars` either all unset
/// or all set to a value that must not show.
fn help(bin: &str, args: &[&str], vars: &[&str], set: bool) -> String {
    let mut command = std::process::Command::new(bin);
    command.args(args).arg("--help");
    for var in vars {
        if set {
            command.env(var, "value-that-help-must-not-show");
        } else {
            command.env_remove(var);
        }
    }
    let out = command.output().expect("run --help");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{help}");
    assert!(!help.contains("value-that-help-must-not-show"), "{help}");
    help
}

/// The names in the `[env: ...]` notes of a `--help`, as written, sorted.
fn env_notes(help: &str) -> Vec<&str> {
    let mut notes: Vec<&str> = help
        .split("[env: ")
        .skip(1)
        .filter_map(|rest| rest.split(']').next())
        .collect();
    notes.sort_unstable();
    notes
}

#[test]
fn help_names_environment_variables_without_their_values() {
    let worker = env!("CARGO_BIN_EXE_test-worker");
    let ops = env!("CARGO_BIN_EXE_ops");
    for set in [false, true] {
        let vars = ["DATABASE_URL", "OUTBOX_SERVED_ELSEWHERE"];
        let text = help(worker, &[], &vars, set);
        assert_eq!(env_notes(&text), vars, "{text}");
        // What the binary does, not the rustdoc of the type behind its arguments.
        assert!(
            text.starts_with("Runs outbox handlers until stopped"),
            "{text}"
        );
        assert!(!text.contains("redact_url"), "{text}");

        let vars = [
            "DATABASE_URL",
            "OUTBOX_CONSOLE_PASSWORD",
            "OUTBOX_CONSOLE_TOKEN",
            "OUTBOX_CONSOLE_USER",
        ];
        let text = help(ops, &["console"], &vars, set);
        assert_eq!(env_notes(&text), vars, "{text}");
        assert!(!text.contains("(feature"), "{text}");
        let text = help(ops, &[], &vars, set);
        assert_eq!(env_notes(&text), ["DATABASE_URL"], "{text}");
    }
}
