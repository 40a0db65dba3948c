//! The worker keeps its word under pressure, on PostgreSQL, SQLite and MariaDB:
//! - the shutdown deadline holds whatever the worker holds: with 100 messages claimed at
//!   concurrency 8, the 92 waiting for a handler go back at the stop request and never start,
//!   the 8 running go back at the deadline, and the process exits within the grace period plus
//!   a second, also when the database stops answering at that moment;
//! - a handler that blocks its thread costs its neighbours latency, not attempts.

use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::{enqueue, outbox_event, Context, Event, Handler, HandlerError, Store, Worker};
use outbox::{MessageStatus, WorkerConfig};
use outbox_tests::events::Work;
use outbox_tests::proxy::{host_port, Proxy};
use outbox_tests::{sigterm, wait_until, MySqlDb, SqliteDb, TestDb};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// The database of one test, on either backend.
enum Db {
    Pg(TestDb),
    Sqlite(SqliteDb),
    MySql(MySqlDb),
}

impl Db {
    async fn pg() -> Db {
        Db::Pg(outbox_tests::pg().await)
    }

    async fn sqlite() -> Db {
        Db::Sqlite(outbox_tests::sqlite().await)
    }

    async fn mysql() -> Db {
        Db::MySql(outbox_tests::mysql().await)
    }

    fn url(&self) -> String {
        match self {
            Db::Pg(db) => db.url.clone(),
            Db::Sqlite(db) => db.url.clone(),
            Db::MySql(db) => db.url.clone(),
        }
    }

    fn store(&self) -> Store {
        match self {
            Db::Pg(db) => Store::from(&db.pool),
            Db::Sqlite(db) => Store::from(&db.pool),
            Db::MySql(db) => Store::from(&db.pool),
        }
    }

    /// The test worker's `effects` table, typed as it binds the message id.
    async fn effects_table(&self) {
        match self {
            Db::Pg(_) => {
                self.exec("CREATE TABLE effects (message_id UUID NOT NULL, handler TEXT NOT NULL, n BIGINT NOT NULL)")
                    .await
            }
            Db::Sqlite(_) => {
                self.exec("CREATE TABLE effects (message_id TEXT NOT NULL, handler TEXT NOT NULL, n INTEGER NOT NULL)")
                    .await
            }
            Db::MySql(_) => {
                self.exec("CREATE TABLE effects (message_id BINARY(16) NOT NULL, handler TEXT NOT NULL, n BIGINT NOT NULL)")
                    .await
            }
        }
    }

    async fn exec(&self, sql: &'static str) {
        match self {
            Db::Pg(db) => sqlx::query(sql).execute(&db.pool).await.map(drop),
            Db::Sqlite(db) => sqlx::query(sql).execute(&db.pool).await.map(drop),
            Db::MySql(db) => sqlx::query(sql).execute(&db.pool).await.map(drop),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn scalar(&self, sql: &'static str) -> i64 {
        match self {
            Db::Pg(db) => sqlx::query_scalar(sql).fetch_one(&db.pool).await,
            Db::Sqlite(db) => sqlx::query_scalar(sql).fetch_one(&db.pool).await,
            Db::MySql(db) => sqlx::query_scalar(sql).fetch_one(&db.pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Enqueues `events` in one transaction.
    async fn enqueue<E: Event>(&self, events: &[E]) -> Vec<Uuid> {
        let mut ids = Vec::new();
        match self {
            Db::Pg(db) => {
                let mut tx = db.pool.begin().await.expect("begin");
                for e in events {
                    ids.push(enqueue(&mut *tx, e).await.expect("enqueue"));
                }
                tx.commit().await.expect("commit");
            }
            Db::Sqlite(db) => {
                let mut tx = db.pool.begin().await.expect("begin");
                for e in events {
                    ids.push(enqueue(&mut *tx, e).await.expect("enqueue"));
                }
                tx.commit().await.expect("commit");
            }
            Db::MySql(db) => {
                let mut tx = db.pool.begin().await.expect("begin");
                for e in events {
                    ids.push(enqueue(&mut *tx, e).await.expect("enqueue"));
                }
                tx.commit().await.expect("commit");
            }
        }
        ids
    }

    async fn drop_db(self) {
        match self {
            Db::Pg(db) => db.drop_db().await,
            Db::Sqlite(db) => db.drop_db().await,
            Db::MySql(db) => db.drop_db().await,
        }
    }
}

/// A `test-worker` process on `url` with `flags`; it prints a line as each handler starts.
fn spawn_worker(url: &str, flags: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .arg("--database-url")
        .arg(url)
        .args(flags)
        .env("RUST_LOG", "info")
        .env("OUTBOX_TEST_LOG_STARTS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn test-worker")
}

/// The message ids whose handlers a worker process started, as it prints them.
fn record_starts(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let starts = Arc::new(Mutex::new(Vec::new()));
    let seen = starts.clone();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("started ") {
                let id = rest.split_whitespace().next().unwrap_or_default();
                seen.lock().unwrap().push(id.to_string());
            }
        }
    });
    starts
}

/// How the database behaves once the stop is requested.
#[derive(Clone, Copy, PartialEq)]
enum AtStop {
    /// It answers as usual.
    Answers,
    /// It stops answering: a network partition on PostgreSQL and MariaDB, a write lock held
    /// by another connection on SQLite.
    Unreachable,
}

const GRACE: Duration = Duration::from_secs(2);

/// 100 messages of 20 s handlers at concurrency 8 and a 2 s grace; SIGTERM once 8 run.
async fn the_deadline_holds_with_messages_claimed_ahead(db: Db, at_stop: AtStop) {
    db.effects_table().await;
    let work: Vec<Work> = (0..100)
        .map(|n| Work {
            n,
            sleep_ms: 20_000,
        })
        .collect();
    let ids = db.enqueue(&work).await;
    // On a server the worker goes through a proxy that can black-hole its connections.
    let proxy = match &db {
        Db::Pg(_) | Db::MySql(_) if at_stop == AtStop::Unreachable => {
            Some(Proxy::start(host_port(&db.url())).await)
        }
        _ => None,
    };
    let url = match &proxy {
        Some(p) => db
            .url()
            .replacen(&host_port(&db.url()), &format!("127.0.0.1:{}", p.port), 1),
        None => db.url(),
    };
    let mut w = spawn_worker(
        &url,
        &[
            "--concurrency",
            "8",
            "--shutdown-timeout",
            "2",
            "--lease",
            "5s",
        ],
    );
    let starts = record_starts(&mut w);
    let mut stderr = w.stderr.take().expect("stderr");
    let log = tokio::spawn(async move {
        let mut log = String::new();
        let _ = stderr.read_to_string(&mut log).await;
        log
    });
    wait_until(
        Duration::from_secs(30),
        "8 handlers run and all 100 messages are claimed",
        async || {
            starts.lock().unwrap().len() == 8
                && db
                    .scalar("SELECT count(*) FROM outbox_messages WHERE locked_until IS NOT NULL")
                    .await
                    == 100
        },
    )
    .await;

    // The database stops answering the worker just before the stop request.
    let mut lock = None;
    match (&db, at_stop) {
        (Db::Pg(_) | Db::MySql(_), AtStop::Unreachable) => {
            proxy.as_ref().expect("proxy").black_hole()
        }
        (Db::Sqlite(s), AtStop::Unreachable) => {
            let mut conn = s.pool.acquire().await.expect("connection");
            sqlx::query("BEGIN EXCLUSIVE")
                .execute(&mut *conn)
                .await
                .expect("take the write lock");
            lock = Some(conn);
        }
        (_, AtStop::Answers) => {}
    }
    sigterm(&w);
    let asked = Instant::now();

    if at_stop == AtStop::Answers {
        // At the stop request: the 92 waiting for a handler are ready again, their attempt not
        // counted, while the 8 running still hold their lease.
        wait_until(
            GRACE / 2,
            "the messages waiting for a handler are handed back at the stop request",
            async || {
                db.scalar(
                    "SELECT count(*) FROM outbox_messages WHERE locked_until IS NULL AND attempts = 0",
                )
                .await
                    == 92
            },
        )
        .await;
        assert_eq!(
            db.scalar("SELECT count(*) FROM outbox_messages WHERE locked_until IS NOT NULL")
                .await,
            8,
            "the running ones are still running"
        );
    }

    let status = tokio::time::timeout(Duration::from_secs(30), w.wait())
        .await
        .expect("the worker exits")
        .expect("wait");
    let took = asked.elapsed();
    eprintln!("the worker exited {took:?} after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(
        took < GRACE + Duration::from_secs(1),
        "exited {took:?} after SIGTERM with a grace of {GRACE:?}"
    );
    let log = log.await.expect("log");
    if let Some(mut conn) = lock.take() {
        sqlx::query("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("release the write lock");
    }
    drop(proxy);
    // Nothing started after the stop request: only the 8 that ran before it.
    assert_eq!(starts.lock().unwrap().len(), 8, "{log}");

    if at_stop == AtStop::Answers {
        // The running ones went back at the deadline: all 100 ready, no attempt counted.
        assert_eq!(
            db.scalar(
                "SELECT count(*) FROM outbox_messages WHERE locked_until IS NULL AND attempts = 0"
            )
            .await,
            100,
            "{log}"
        );
        assert!(log.contains("handed back"), "{log}");
    }

    // A second worker drains them all: at once when they were handed back, after their
    // leases otherwise.
    db.exec(r#"UPDATE outbox_messages SET payload = '{"n":0,"sleep_ms":0}'"#)
        .await;
    let mut second = spawn_worker(&db.url(), &[]);
    let _ = record_starts(&mut second);
    wait_until(
        Duration::from_secs(30),
        "a second worker drains all 100",
        async || {
            db.scalar("SELECT count(*) FROM outbox_messages").await == 0
                && db.scalar("SELECT count(*) FROM effects").await == 100
        },
    )
    .await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox_dead").await,
        0,
        "nothing dead-lettered"
    );
    assert_eq!(ids.len(), 100);
    sigterm(&second);
    let _ = second.wait().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_deadline_holds_with_messages_claimed_ahead() {
    the_deadline_holds_with_messages_claimed_ahead(Db::pg().await, AtStop::Answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_deadline_holds_with_messages_claimed_ahead() {
    the_deadline_holds_with_messages_claimed_ahead(Db::sqlite().await, AtStop::Answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_the_deadline_holds_with_messages_claimed_ahead() {
    outbox_tests::skip_without_mysql!();
    the_deadline_holds_with_messages_claimed_ahead(Db::mysql().await, AtStop::Answers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_the_deadline_holds_with_the_database_unreachable() {
    the_deadline_holds_with_messages_claimed_ahead(Db::pg().await, AtStop::Unreachable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_the_deadline_holds_with_the_database_unreachable() {
    the_deadline_holds_with_messages_claimed_ahead(Db::sqlite().await, AtStop::Unreachable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_the_deadline_holds_with_the_database_unreachable() {
    outbox_tests::skip_without_mysql!();
    the_deadline_holds_with_messages_claimed_ahead(Db::mysql().await, AtStop::Unreachable).await;
}

/// A message whose handler blocks its thread for `block_ms` on every attempt.
#[outbox_event(topic = "pressure.block")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blocks {
    block_ms: u64,
}

/// An ordinary message.
#[outbox_event(topic = "pressure.good")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Good {
    n: i64,
}

/// The mistake under test: `std::thread::sleep` on the runtime's thread.
struct Blocker {
    runs: Arc<AtomicU32>,
}

#[outbox::async_trait]
impl Handler for Blocker {
    type Event = Blocks;
    const NAME: &'static str = "blocker";

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(500))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    fn backoff(&self, _attempt: u32) -> Option<Duration> {
        Some(Duration::from_millis(100))
    }

    async fn handle(&self, e: Blocks, _ctx: &Context) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(e.block_ms));
        Ok(())
    }
}

/// Records the attempt at which each ordinary message ran.
struct Recorder {
    attempts: Arc<Mutex<Vec<(i64, u32)>>>,
}

#[outbox::async_trait]
impl Handler for Recorder {
    type Event = Good;
    const NAME: &'static str = "recorder";

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(500))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(3)
    }

    async fn handle(&self, e: Good, ctx: &Context) -> Result<(), HandlerError> {
        self.attempts.lock().unwrap().push((e.n, ctx.attempt()));
        Ok(())
    }
}

/// Two handlers block both threads of the handlers' 2-thread runtime for 3 s on each attempt,
/// beside 20 ordinary messages enqueued (from the test's own runtime) while they block.
async fn a_blocked_thread_costs_only_the_handler_that_blocks_it(db: Db) {
    let runs = Arc::new(AtomicU32::new(0));
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::builder(db.store())
        .handler(Blocker { runs: runs.clone() })
        .handler(Recorder {
            attempts: attempts.clone(),
        })
        .config(WorkerConfig::default().lease(Duration::from_secs(5)))
        .build()
        .expect("worker");
    let handlers_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the handlers' runtime");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let w = worker.clone();
    let running = handlers_rt.spawn(async move {
        w.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });
    let blocking = db
        .enqueue(&[Blocks { block_ms: 3_000 }, Blocks { block_ms: 3_000 }])
        .await;
    wait_until(
        Duration::from_secs(10),
        "both blocking handlers hold a thread",
        async || runs.load(Ordering::SeqCst) >= 2,
    )
    .await;
    let good: Vec<Good> = (0..20).map(|n| Good { n }).collect();
    db.enqueue(&good).await;
    assert!(
        attempts.lock().unwrap().is_empty(),
        "enqueued while both threads are blocked"
    );

    let store = db.store();
    wait_until(
        Duration::from_secs(60),
        "the ordinary messages are done and the blocking ones dead",
        async || {
            if attempts.lock().unwrap().len() < 20 {
                return false;
            }
            for id in &blocking {
                let info = store.message(*id).await.expect("read");
                if info.is_none_or(|i| i.status != MessageStatus::Dead) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let _ = stop_tx.send(());
    running.await.expect("join").expect("run");
    handlers_rt.shutdown_background();

    let mut ran = attempts.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(
        ran,
        (0..20).map(|n| (n, 1)).collect::<Vec<_>>(),
        "every ordinary message ran once, at attempt 1"
    );
    for id in &blocking {
        let info = store.message(*id).await.expect("read").expect("dead");
        let error = info.last_error.unwrap_or_default();
        assert_eq!(info.attempts, 3, "dead at its limit: {error}");
        assert!(
            error.contains("handler `blocker`")
                && error.contains("held its thread past its deadline"),
            "{error}"
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox_messages").await,
        0,
        "nothing left"
    );
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_blocked_thread_costs_only_the_handler_that_blocks_it() {
    a_blocked_thread_costs_only_the_handler_that_blocks_it(Db::pg().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_blocked_thread_costs_only_the_handler_that_blocks_it() {
    a_blocked_thread_costs_only_the_handler_that_blocks_it(Db::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_blocked_thread_costs_only_the_handler_that_blocks_it() {
    outbox_tests::skip_without_mysql!();
    a_blocked_thread_costs_only_the_handler_that_blocks_it(Db::mysql().await).await;
}
