//! The worker as it is deployed: several worker processes on one topic, one SIGKILLed, an idle
//! one, a handler that blocks its thread or outlives the shutdown deadline, and producers that
//! must not pay for wake-ups meant for nobody.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{enqueue, outbox_event, Context, Handler, HandlerError, Worker, WorkerConfig};
use outbox_tests::events::Work;
use outbox_tests::{pg, wait_until, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::process::{Child, Command};
use uuid::Uuid;

/// A `test-worker` child process with default settings and extra `flags`.
fn spawn_worker(url: &str, flags: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_test-worker"))
        .arg("--database-url")
        .arg(url)
        .args(flags)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn test-worker")
}

fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("the worker is running");
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}: {status}");
}

async fn effects_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE effects (message_id UUID NOT NULL, handler TEXT NOT NULL, n BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("create effects");
}

async fn enqueue_work(db: &TestDb, n: i64, sleep_ms: u64) -> Vec<Uuid> {
    let mut tx = db.pool.begin().await.expect("begin");
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(
            enqueue(&mut *tx, &Work { n: i, sleep_ms })
                .await
                .expect("enqueue"),
        );
    }
    tx.commit().await.expect("commit");
    ids
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

/// With default settings (no `--lease`), the messages of a SIGKILLed worker run again on
/// another, idle worker within 10 s, and while they wait the statistics show them as held by a
/// worker that stopped renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_workers_messages_run_again_elsewhere_within_10_s() {
    let db = pg().await;
    effects_table(&db.pool).await;
    let mut victim = spawn_worker(&db.url, &[]);
    // The victim takes every message and sits in its handlers.
    enqueue_work(&db, 32, 30_000).await;
    wait_until(
        Duration::from_secs(20),
        "the victim claims all 32",
        async || {
            scalar(
                &db.pool,
                "SELECT count(*) FROM outbox_messages WHERE locked_until > now()",
            )
            .await
                == 32
        },
    )
    .await;
    // The idle worker starts only now, so it cannot have taken any of them.
    let mut idle = spawn_worker(&db.url, &[]);
    signal(&victim, "-KILL");
    let killed = Instant::now();
    let _ = victim.wait().await;
    // Make the second runs quick: the payload is what the handler reads.
    sqlx::query("UPDATE outbox_messages SET payload = json_build_object('n', 0, 'sleep_ms', 0)")
        .execute(&db.pool)
        .await
        .expect("shorten the handlers");
    let mut saw_stalled = false;
    wait_until(
        Duration::from_secs(15),
        "the killed worker's messages are done elsewhere",
        async || {
            let stats = outbox::Store::from(&db.pool).stats().await.expect("stats");
            saw_stalled |= stats.total.stalled > 0;
            stats.total.pending() == 0
        },
    )
    .await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} after the kill"
    );
    assert_eq!(scalar(&db.pool, "SELECT count(*) FROM effects").await, 32);
    assert!(
        saw_stalled,
        "stats showed the messages held by the dead worker while they waited"
    );
    signal(&idle, "-TERM");
    let _ = idle.wait().await;
    db.drop_db().await;
}

/// With `--shutdown-timeout 2` and a handler of 20 s, the process exits within the
/// grace period plus a second, the message is ready again at once with its attempt not
/// counted, and the log says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_deadline_holds_and_hands_the_message_back() {
    let db = pg().await;
    effects_table(&db.pool).await;
    let mut w = spawn_worker(&db.url, &["--shutdown-timeout", "2"]);
    let ids = enqueue_work(&db, 1, 20_000).await;
    wait_until(Duration::from_secs(20), "the handler runs", async || {
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_messages WHERE locked_until > now()",
        )
        .await
            == 1
    })
    .await;
    let mut stderr = w.stderr.take().expect("stderr");
    signal(&w, "-TERM");
    let asked = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(10), w.wait())
        .await
        .expect("the worker exits")
        .expect("wait");
    let took = asked.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        took < Duration::from_secs(3),
        "exited {took:?} after SIGTERM"
    );
    let mut log = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut log)
        .await
        .expect("read log");
    assert!(
        log.contains("handed back") && log.contains(&ids[0].to_string()),
        "{log}"
    );
    let (attempts, locked): (i32, bool) = sqlx::query_as(
        "SELECT attempts, locked_until IS NOT NULL FROM outbox_messages WHERE id = $1",
    )
    .bind(ids[0])
    .fetch_one(&db.pool)
    .await
    .expect("the message is still there");
    assert_eq!(
        (attempts, locked),
        (0, false),
        "ready at once, attempt not counted"
    );
    db.drop_db().await;
}

/// An event whose handler blocks its thread when asked to.
#[outbox_event(topic = "deploy.block")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Blocky {
    n: i64,
    block_ms: u64,
}

struct BlockyHandler {
    runs: Arc<AtomicUsize>,
    done: Arc<std::sync::Mutex<Vec<i64>>>,
}

#[outbox::async_trait]
impl Handler for BlockyHandler {
    type Event = Blocky;
    const NAME: &'static str = "blocky";

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(500))
    }

    fn backoff(&self, _attempt: u32) -> Option<Duration> {
        Some(Duration::from_secs(60)) // not again during the test
    }

    async fn handle(&self, e: Blocky, _ctx: &Context) -> Result<(), HandlerError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if e.block_ms > 0 {
            // The mistake under test: blocking the runtime's thread.
            std::thread::sleep(Duration::from_millis(e.block_ms));
        }
        self.done.lock().unwrap().push(e.n);
        Ok(())
    }
}

/// One handler blocking its thread for 5 s beside 100 quick messages. Each quick
/// message is delivered exactly once without waiting for the blocked one, and the blocked one
/// is failed as timed out (naming the thread it held) long before it returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_handler_stalls_nothing_and_is_reported_as_timed_out() {
    let db = pg().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tx = db.pool.begin().await.expect("begin");
    let blocked = enqueue(
        &mut *tx,
        &Blocky {
            n: -1,
            block_ms: 5_000,
        },
    )
    .await
    .expect("enqueue");
    tx.commit().await.expect("commit");
    let worker = Worker::builder(&db.pool)
        .handler(BlockyHandler {
            runs: runs.clone(),
            done: done.clone(),
        })
        .config(WorkerConfig::default().concurrency(8))
        .build()
        .expect("worker");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let w = worker.clone();
    let running = tokio::spawn(async move {
        w.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });
    wait_until(
        Duration::from_secs(10),
        "the blocking handler starts",
        async || runs.load(Ordering::SeqCst) == 1,
    )
    .await;
    let started = Instant::now();
    let mut tx = db.pool.begin().await.expect("begin");
    for n in 0..100 {
        enqueue(&mut *tx, &Blocky { n, block_ms: 0 })
            .await
            .expect("enqueue");
    }
    tx.commit().await.expect("commit");
    wait_until(
        Duration::from_secs(4),
        "100 quick messages done while one handler blocks",
        async || done.lock().unwrap().iter().filter(|n| **n >= 0).count() == 100,
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(4));
    // The blocked message is failed as timed out while it still blocks.
    let store = outbox::Store::from(&db.pool);
    let mut error = String::new();
    wait_until(
        Duration::from_secs(3),
        "the blocked message fails as timed out",
        async || {
            let info = store
                .message(blocked)
                .await
                .expect("read")
                .expect("not done");
            error = info.last_error.unwrap_or_default();
            !error.is_empty()
        },
    )
    .await;
    assert!(
        error.contains("timed out")
            && error.contains("held its thread")
            && error.contains("blocky"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "reported before the handler returned"
    );
    let _ = stop_tx.send(());
    running.await.expect("join").expect("run");
    let quick: Vec<i64> = done
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|n| *n >= 0)
        .collect();
    let mut sorted = quick.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        (quick.len(), sorted.len()),
        (100, 100),
        "each quick message exactly once"
    );
    db.drop_db().await;
}

/// A producer notifies only a waiting, live worker of its own topic; a crashed
/// worker's waiting row stops counting within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_notify_only_a_live_waiting_worker_of_their_topic() {
    let db = pg().await;
    let mut listener = PgListener::connect(&db.url).await.expect("listen");
    listener.listen("outbox_wakeup").await.expect("listen");
    let count = async |l: &mut PgListener| {
        let mut n = 0;
        while let Ok(Ok(Some(_))) =
            tokio::time::timeout(Duration::from_millis(300), l.try_recv()).await
        {
            n += 1;
        }
        n
    };
    // A worker of test.work, idle: it waits.
    let mut w = spawn_worker(&db.url, &[]);
    wait_until(Duration::from_secs(20), "the worker waits", async || {
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_workers WHERE waiting",
        )
        .await
            == 1
    })
    .await;
    // Another topic: nobody of that topic waits, no NOTIFY.
    outbox::enqueue_many(
        &mut *db.pool.acquire().await.expect("conn"),
        &[Blocky { n: 1, block_ms: 0 }],
    )
    .await
    .expect("enqueue");
    let mut tx = db.pool.begin().await.expect("begin");
    enqueue(&mut *tx, &Blocky { n: 2, block_ms: 0 })
        .await
        .expect("enqueue");
    tx.commit().await.expect("commit");
    assert_eq!(
        count(&mut listener).await,
        0,
        "no wake-up for a topic the waiting worker does not serve"
    );
    // Its own topic: one NOTIFY, naming it.
    enqueue_work(&db, 1, 0).await;
    assert_eq!(count(&mut listener).await, 1);
    // Killed while waiting: its row says `waiting`, but its heartbeat stops.
    wait_until(
        Duration::from_secs(20),
        "the worker waits again",
        async || {
            scalar(
                &db.pool,
                "SELECT count(*) FROM outbox_workers WHERE waiting",
            )
            .await
                == 1
        },
    )
    .await;
    signal(&w, "-KILL");
    let _ = w.wait().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_workers WHERE waiting"
        )
        .await,
        1
    );
    enqueue_work(&db, 5, 0).await;
    for _ in 0..5 {
        enqueue_work(&db, 1, 0).await;
    }
    assert_eq!(
        count(&mut listener).await,
        0,
        "no wake-ups for a dead worker's row"
    );
    db.drop_db().await;
}

#[outbox_event(topic = "deploy.later")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Later {
    n: i64,
}

struct AskForever;

#[outbox::async_trait]
impl Handler for AskForever {
    type Event = Later;
    const NAME: &'static str = "ask-forever";

    async fn handle(&self, _: Later, _: &Context) -> Result<(), HandlerError> {
        Err(HandlerError::retry_after(
            Duration::MAX,
            "come back at the end of time",
        ))
    }
}

/// A huge `retry_after` is capped in core (a week), so the outcome is written instead
/// of failing until the lease runs out.
#[tokio::test]
async fn a_huge_retry_after_is_capped_and_written() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.expect("begin");
    let id = enqueue(&mut *tx, &Later { n: 1 }).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let worker = Worker::builder(&db.pool)
        .handler(AskForever)
        .build()
        .expect("worker");
    let report = worker.run_once().await.expect("the outcome is written");
    assert_eq!(report.retried, 1);
    let (secs, error): (f64, String) = sqlx::query_as(
        "SELECT extract(epoch FROM available_at - now())::float8, last_error FROM outbox_messages WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("the message waits");
    let week = 7.0 * 24.0 * 3600.0;
    assert!(secs > week - 60.0 && secs <= week + 1.0, "due in {secs} s");
    assert!(error.contains("come back at the end of time"), "{error}");
    db.drop_db().await;
}

/// A worker SIGKILLed in the middle of a replay's batch of 1,000 events leaves only the events
/// after its replay's last checkpoint to be handled again: the cursor moves every 100 events
/// (or every second), not once a batch. Measured: the events redelivered after the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_killed_mid_batch_redelivers_at_most_about_a_checkpoint() {
    const EVENTS: i64 = 3_000;
    let db = pg().await;
    effects_table(&db.pool).await;
    let store = outbox::Store::from(&db.pool);
    store
        .set_retention("test.work", Some(Duration::from_secs(30 * 86_400)))
        .await
        .expect("retain test.work");
    // Handled once live (each 10 ms in the handler), and so logged.
    enqueue_work(&db, EVENTS, 10).await;
    let mut victim = spawn_worker(&db.url, &[]);
    wait_until(
        Duration::from_secs(60),
        "the live messages are done",
        async || store.stats().await.expect("stats").total.pending() == 0,
    )
    .await;
    sqlx::query("DELETE FROM effects")
        .execute(&db.pool)
        .await
        .expect("clear the live run's effects");

    // The replay: unpaced, batches of 1,000; the kill lands half way through the second.
    let replay = store
        .start_replay(&outbox::ReplayRequest::new("test.work", "record"))
        .await
        .expect("the replay starts");
    assert_eq!(replay.total, EVENTS);
    wait_until(
        Duration::from_secs(60),
        "the replay is half way",
        async || scalar(&db.pool, "SELECT count(*) FROM effects").await >= EVENTS / 2,
    )
    .await;
    signal(&victim, "-KILL");
    let _ = victim.wait().await;
    let handled = scalar(&db.pool, "SELECT count(*) FROM effects").await;
    let recorded = store.replay(replay.id).await.unwrap().unwrap().delivered;

    let mut heir = spawn_worker(&db.url, &[]);
    wait_until(
        Duration::from_secs(60),
        "the replay ends on the heir",
        async || {
            store.replay(replay.id).await.unwrap().unwrap().state != outbox::ReplayState::Running
        },
    )
    .await;
    let ended = store.replay(replay.id).await.unwrap().unwrap();
    assert_eq!(ended.state, outbox::ReplayState::Done, "{ended:?}");
    let calls = scalar(&db.pool, "SELECT count(*) FROM effects").await;
    let distinct = scalar(&db.pool, "SELECT count(DISTINCT message_id) FROM effects").await;
    assert_eq!(distinct, EVENTS, "every event at least once");
    let redelivered = calls - distinct;
    println!(
        "replay kill: {handled} events handled by the victim, its cursor at {recorded}, \
         {redelivered} redelivered after the SIGKILL"
    );
    // 100 events a checkpoint, plus those running at the kill (8 replay slots of 32) and
    // those handled while the checkpoint's write was in flight.
    assert!(
        redelivered <= 150,
        "{redelivered} events redelivered after the kill (cursor at {recorded} of {handled} handled)"
    );
    signal(&heir, "-TERM");
    let _ = heir.wait().await;
    db.drop_db().await;
}
