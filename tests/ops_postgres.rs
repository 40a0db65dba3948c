//! Operations on PostgreSQL: the stats and purge queries never scan the table, the `/metrics`
//! and `/health` endpoints of a running worker, and the `outbox` command line.

use std::process::Output;
use std::time::{Duration, Instant};

use outbox::{
    enqueue_many, outbox_event, register_handler, Context, FromResources, Handler, HandlerError,
    RetryPolicy, Store, Worker, WorkerConfig,
};
use outbox_tests::{http_get, pg, TestDb};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "ops.task")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Task {
    fail: bool,
    #[serde(default)]
    hang_ms: u64,
}

struct TaskHandler;

#[outbox::async_trait]
impl Handler for TaskHandler {
    type Event = Task;
    const NAME: &'static str = "task";
    async fn handle(&self, t: Task, _: &Context) -> Result<(), HandlerError> {
        if t.hang_ms > 0 {
            tokio::time::sleep(Duration::from_millis(t.hang_ms)).await;
        }
        if t.fail {
            return Err(HandlerError::permanent("the task is malformed"));
        }
        Ok(())
    }
}

impl FromResources for TaskHandler {
    fn from_resources(_: &outbox::Resources) -> Result<Self, outbox::ResourceError> {
        Ok(TaskHandler)
    }
}

register_handler!(TaskHandler);

fn task(fail: bool) -> Task {
    Task { fail, hang_ms: 0 }
}

async fn put(db: &TestDb, tasks: &[Task]) -> Vec<uuid::Uuid> {
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, tasks).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

/// Sequential scans of the three history tables so far, counting those of `ops` (a pool of one
/// connection that ran the operations).
async fn seq_scans(db: &TestDb, ops: &sqlx::PgPool) -> (i64, i64, i64) {
    let scans = db
        .seq_scans(
            ops,
            &["outbox_messages", "outbox_dead", "outbox_done_counts"],
        )
        .await;
    (scans[0], scans[1], scans[2])
}

async fn plan(db: &TestDb, sql: &'static str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn stats_dead_letters_and_purge_never_scan_the_history() {
    let db = pg().await;
    // The history of a busy system: 200,000 per-minute done counts from two days ago (one per
    // worker and minute) and 200,000 dead letters of another topic, dead as long; a few dead
    // and pending messages of ops.task; fresh planner statistics.
    sqlx::raw_sql(
        "INSERT INTO outbox_done_counts (topic, minute, worker, done) \
         SELECT 'ops.task', date_trunc('minute', now() - interval '2 days') - (i % 1000) * interval '1 minute', \
                gen_random_uuid(), 50 \
         FROM generate_series(1, 200000) AS i; \
         INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at) \
         SELECT gen_random_uuid(), 'ops.old', '{\"fail\": true}', 8, 'gave up', \
                now() - interval '3 days', now() - interval '2 days' + i * interval '1 ms' \
         FROM generate_series(1, 200000) AS i;",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    put(&db, &[task(true), task(true), task(false)]).await;
    let w = Worker::builder(&db.pool)
        .handler(TaskHandler)
        .build()
        .unwrap();
    w.run_once().await.unwrap();
    put(&db, &[task(false)]).await;
    sqlx::raw_sql("VACUUM ANALYZE outbox_messages, outbox_dead, outbox_done_counts")
        .execute(&db.pool)
        .await
        .unwrap();

    // Operations run on a connection of their own, whose statistics `seq_scans` flushes.
    let ops = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let before = seq_scans(&db, &ops).await;
    let store = Store::from(&ops);
    let stats = store.stats().await.unwrap();
    let task_stats = stats.topics.iter().find(|t| t.topic == "ops.task").unwrap();
    assert_eq!(
        (task_stats.ready, task_stats.dead, task_stats.done_last_5m),
        (1, 2, 1)
    );
    assert_eq!(stats.total.dead, 200_002);
    // Dead letters are counted per topic by a trigger: stats read those counts, never the
    // dead letters themselves.
    let counted = seq_scans(&db, &ops).await;
    assert_eq!(
        counted.2, before.2,
        "stats read the done counts through an index"
    );
    assert_eq!(counted.1, before.1, "stats did not scan the dead letters");
    let listed = store.dead_letters(&Default::default()).await.unwrap();
    assert_eq!(listed.len(), 100, "the newest hundred");
    let task_dead = outbox::DeadLetterFilter::new().topic("ops.task");
    assert_eq!(store.dead_letters(&task_dead).await.unwrap().len(), 2);
    let listing = seq_scans(&db, &ops).await;
    assert_eq!(
        listing.1, counted.1,
        "the dead letters were listed through indexes"
    );
    let purged = store
        .purge_done(Duration::from_secs(86_400), outbox::DEFAULT_PURGE_BATCH)
        .await
        .unwrap();
    assert_eq!(
        purged, 200_000,
        "every old done count, a thousand at a time"
    );
    let after = seq_scans(&db, &ops).await;
    assert_eq!(
        (after.1, after.2),
        (listing.1, listing.2),
        "purge read the history through indexes only"
    );

    // And the plans say so.
    let done = plan(
        &db,
        "SELECT topic, sum(done) FROM outbox_done_counts \
         WHERE minute > now() - interval '5 minutes' GROUP BY topic",
    )
    .await;
    assert!(
        done.iter()
            .any(|l| l.contains("outbox_done_counts_minute_idx")),
        "{done:#?}"
    );
    let dead = plan(
        &db,
        "SELECT id, last_error FROM outbox_dead WHERE topic = 'ops.task' ORDER BY dead_at DESC LIMIT 100",
    )
    .await;
    assert!(
        dead.iter().any(|l| l.contains("outbox_dead_topic_idx")),
        "{dead:#?}"
    );
    let newest = plan(
        &db,
        "SELECT id, last_error FROM outbox_dead ORDER BY dead_at DESC LIMIT 100",
    )
    .await;
    assert!(
        newest.iter().any(|l| l.contains("outbox_dead_dead_at_idx")),
        "{newest:#?}"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.total.dead, 200_002, "purge left dead rows alone");
    assert_eq!(stats.total.done_last_5m, 1, "and the recent done count");
    db.drop_db().await;
}

fn metric(body: &str, prefix: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn metrics_and_health_of_a_running_worker() {
    let db = pg().await;
    put(&db, &[task(false), task(false), task(false), task(true)]).await;
    db.insert_raw("nobody.handles", "{}", 3).await;

    let prometheus = outbox::observe::install_prometheus().unwrap();
    let config = WorkerConfig::default()
        .concurrency(1)
        .stats_interval(Duration::from_millis(100))
        .health_max_tick_age(Duration::from_millis(1500))
        .health_max_oldest_ready(Duration::from_millis(700))
        .retry(RetryPolicy::default().jitter(false));
    let w = Worker::builder(&db.pool)
        .handler(TaskHandler)
        .config(config)
        .build()
        .unwrap();
    let health = w.health();
    // The same pages mounted under a prefix in an app of the user's own.
    let mounted = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mounted_addr = mounted.local_addr().unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the user's app" }))
        .nest(
            "/outbox",
            outbox::observe::router(prometheus.clone(), health.clone()),
        );
    let own_app = tokio::spawn(async move { axum::serve(mounted, app).await });
    let server = outbox::observe::serve("127.0.0.1:0".parse().unwrap(), prometheus, health)
        .await
        .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        w.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });

    until(
        "the worker to drain and the gauges to refresh",
        async || {
            let body = http_get(addr, "/metrics").await.1;
            metric(
                &body,
                "outbox_messages_processed_total{topic=\"ops.task\",outcome=\"done\"}",
            ) == Some(3.0)
                && metric(&body, "outbox_dead_messages{topic=\"ops.task\"}") == Some(1.0)
                && metric(
                    &body,
                    "outbox_unhandled_pending_messages{topic=\"nobody.handles\"}",
                ) == Some(3.0)
        },
    )
    .await;
    let body = http_get(addr, "/metrics").await.1;
    assert_eq!(
        metric(
            &body,
            "outbox_messages_processed_total{topic=\"ops.task\",outcome=\"dead\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &body,
            "outbox_pending_messages{topic=\"nobody.handles\",state=\"ready\"}"
        ),
        Some(3.0)
    );
    assert!(body.contains("outbox_handler_duration_seconds"), "{body}");
    assert!(body.contains("outbox_claim_duration_seconds"), "{body}");
    assert!(
        body.contains("outbox_oldest_ready_age_seconds{topic=\"ops.task\"}"),
        "{body}"
    );
    assert_eq!(http_get(addr, "/health").await, (200, "ok\n".to_string()));
    assert_eq!(
        http_get(mounted_addr, "/outbox/health").await,
        (200, "ok\n".to_string())
    );
    let (status, mounted_body) = http_get(mounted_addr, "/outbox/metrics").await;
    assert_eq!(status, 200);
    assert!(
        mounted_body.contains("outbox_claim_duration_seconds"),
        "{mounted_body}"
    );
    assert_eq!(http_get(mounted_addr, "/").await.1, "the user's app");
    own_app.abort();

    // A slow handler holds the only slot; the next message waits past the threshold.
    put(
        &db,
        &[
            Task {
                fail: false,
                hang_ms: 3000,
            },
            task(false),
        ],
    )
    .await;
    until("health to report the waiting message", async || {
        http_get(addr, "/health").await.0 == 503
    })
    .await;
    let (_, reason) = http_get(addr, "/health").await;
    // The next message is claimed ahead and waits in the worker for the busy slot.
    assert!(
        reason.contains("waited") && reason.contains("for a free handler"),
        "{reason}"
    );

    // A stopped loop stops ticking.
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    until("health to notice the stopped loop", async || {
        http_get(addr, "/health").await.1.contains("not ticked")
    })
    .await;
    server.shutdown();
    db.drop_db().await;
}

fn ops(db: &TestDb, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .expect("run the outbox command line")
}

fn text(o: &Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_outbox_command_line() {
    let db = pg().await;
    let (code, out, _) = text(&ops(&db, &["migrate"]));
    assert_eq!((code, out.trim()), (0, "outbox schema is up to date"));
    let ids = put(&db, &[task(false), task(true), task(true)]).await;
    Worker::builder(&db.pool)
        .handler(TaskHandler)
        .build()
        .unwrap()
        .run_once()
        .await
        .unwrap();

    let (code, out, _) = text(&ops(&db, &["stats"]));
    assert_eq!(code, 0);
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("ops.task"))
        .unwrap()
        .split_whitespace()
        .collect();
    // topic, ready, scheduled, in flight, stalled, dead, done 5m, oldest, live workers,
    // blocked, blocked by dead, oldest blocked, awaiting a version.
    assert_eq!(
        row,
        ["ops.task", "0", "0", "0", "0", "2", "1", "-", "0", "0", "0", "-", "0"],
        "{out}"
    );
    let (code, out, _) = text(&ops(&db, &["stats", "--json"]));
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["total"]["dead"], 2);

    let (code, out, _) = text(&ops(&db, &["dead", "list", "--topic", "ops.task"]));
    assert_eq!((code, out.lines().count()), (0, 2), "{out}");
    assert!(
        out.contains(&ids[1].to_string()) && out.contains("the task is malformed"),
        "{out}"
    );
    let (code, out, _) = text(&ops(&db, &["dead", "show", &ids[1].to_string()]));
    assert_eq!(code, 0);
    assert!(out.contains("status:       dead"), "{out}");
    // The payload as enqueued (stored as JSON text, not re-rendered).
    let payload: serde_json::Value = out
        .lines()
        .find_map(|l| l.strip_prefix("payload:"))
        .map(|p| serde_json::from_str(p.trim()).unwrap())
        .unwrap_or_else(|| panic!("no payload line: {out}"));
    assert_eq!(payload["fail"], true, "{out}");

    let (code, out, _) = text(&ops(&db, &["dead", "retry", &ids[1].to_string()]));
    assert_eq!(
        (code, out.trim()),
        (0, "1 dead letter(s) sent back to pending")
    );
    assert_eq!(
        db.status(ids[1]).await,
        (
            "pending".to_string(),
            0,
            Some("handler `task`: the task is malformed".to_string())
        )
    );
    let (code, out, _) = text(&ops(&db, &["dead", "discard", "--all"]));
    assert_eq!((code, out.trim()), (0, "1 dead letter(s) discarded"));
    let (code, out, _) = text(&ops(&db, &["purge", "--older-than", "1h"]));
    assert_eq!(
        (code, out.trim()),
        (0, "deleted 0 per-minute done count(s) older than 1h")
    );
    let (code, out, _) = text(&ops(&db, &["purge", "--older-than", "0s"]));
    assert_eq!(
        (code, out.trim()),
        (0, "deleted 1 per-minute done count(s) older than 0s")
    );

    // Bad input: one line, a useful exit code, no panic.
    let replay = |extra: &[&'static str]| {
        let mut args = vec!["replay", "--topic", "ops.task", "--handler", "task"];
        args.extend_from_slice(extra);
        args
    };
    let unknown = uuid::Uuid::now_v7().to_string();
    for (args, want) in [
        (vec!["dead", "show", unknown.as_str()], 1),
        (vec!["dead", "retry", unknown.as_str()], 1),
        (vec!["dead", "show", "not-a-uuid"], 2),
        (vec!["purge", "--older-than", "soon"], 2),
        (vec!["dead", "retry"], 2),
        // Every refusal of an argument is a usage error (2), whoever refuses it: clap, the
        // command or the store behind it.
        (vec!["purge", "--older-than", "1d", "--batch", "0"], 2),
        (vec!["dead", "list", "--limit", "none"], 2),
        (vec!["events"], 2),
        (
            vec!["events", "retain", "--topic", "ops.task", "--for", "30s"],
            2,
        ),
        (vec!["events", "retain", "--topic", "", "--for", "30d"], 2),
        (
            vec!["events", "--topic", "ops.task", "--since", "tomorrow"],
            2,
        ),
        (vec!["replay"], 2),
        (replay(&["--rate", "0"]), 2),
        (replay(&["--since", "1h", "--until", "2h"]), 2),
        (vec!["replay", "pause", "not-a-uuid"], 2),
        (vec!["console", "--token", " "], 2),
        (vec!["--database-url", "http://127.0.0.1/none", "stats"], 2),
        (vec!["--database-url", "postgres://[::1", "stats"], 2),
    ] {
        let (code, _, err) = text(&ops(&db, &args));
        assert_eq!(code, want, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
            "stats",
        ])
        .output()
        .unwrap();
    let (code, _, err) = text(&o);
    assert_eq!(code, 4, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // A worker binary's flags out of range are usage errors too, refused before any SQL.
    for flags in [
        &["--batch-size", "0"][..],
        &["--concurrency", "0"],
        &["--lease", "500ms"],
        &["--max-attempts", "0"],
        &["--retry-base", "10s", "--retry-max", "1s"],
        &["--poll-interval", "0s"],
        &["--batch-size", "many"],
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .args(flags)
            .arg("--once")
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
            .output()
            .unwrap();
        let (code, _, err) = text(&o);
        assert_eq!(code, 2, "{flags:?}: {err}");
        assert!(err.starts_with("error:"), "{flags:?}: {err}");
    }
    db.drop_db().await;
}

/// `outbox events` and `outbox replay`: the retained events of a topic, its window set by hand,
/// a dry run and a replay followed to its end, and what is refused, with its exit code.
#[tokio::test]
async fn the_event_log_and_replays_from_the_command_line() {
    let db = pg().await;
    let store = Store::from(&db.pool);
    let (code, _, err) = text(&ops(&db, &["events", "--topic", "ops.task"]));
    assert_eq!(code, 1);
    assert!(err.contains("topic ops.task keeps no events"), "{err}");
    let (code, out, _) = text(&ops(
        &db,
        &["events", "retain", "--topic", "ops.task", "--for", "30d"],
    ));
    assert_eq!(
        (code, out.trim()),
        (0, "topic ops.task keeps its delivered events for 30days")
    );
    let ids = put(&db, &[task(false), task(false), task(false)]).await;
    Worker::builder(&db.pool)
        .handler(TaskHandler)
        .build()
        .unwrap()
        .run_once()
        .await
        .unwrap();

    let (code, out, _) = text(&ops(&db, &["events", "--topic", "ops.task", "--json"]));
    assert_eq!(code, 0);
    let listed: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].to_string())
        .collect();
    let expected: Vec<String> = ids.iter().map(|id| format!("\"{id}\"")).collect();
    assert_eq!(listed, expected, "{out}");
    let (code, out, _) = text(&ops(&db, &["events", "topics"]));
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("ops.task") && l.contains(" 3 ")),
        "{out}"
    );

    let (code, out, _) = text(&ops(
        &db,
        &[
            "replay",
            "--topic",
            "ops.task",
            "--handler",
            "task",
            "--dry-run",
        ],
    ));
    assert_eq!(code, 0);
    assert!(
        out.starts_with("would replay 3 event(s) of topic ops.task to handler task"),
        "{out}"
    );
    let (code, _, err) = text(&ops(
        &db,
        &["replay", "--topic", "ops.task", "--handler", "tsak"],
    ));
    assert_eq!(code, 1);
    assert!(
        err.contains("no worker has run a handler named `tsak`"),
        "{err}"
    );
    let (code, out, _) = text(&ops(
        &db,
        &["replay", "--topic", "ops.task", "--handler", "task"],
    ));
    assert_eq!(code, 0, "{out}");
    let replay = store.replays().await.unwrap()[0].id;
    let running = outbox_tests::start(vec![Worker::builder(&db.pool)
        .handler(TaskHandler)
        .build()
        .unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, out, _) = text(&ops(&db, &["replay", "status", &replay.to_string()]));
        assert_eq!(code, 0);
        if out.contains("done") {
            assert!(out.contains("100%  3/3"), "{out}");
            break;
        }
        assert!(Instant::now() < deadline, "the replay did not end: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    outbox_tests::stop(running).await;
    let (code, _, err) = text(&ops(&db, &["replay", "pause", &replay.to_string()]));
    assert_eq!(code, 1);
    assert!(err.contains("is done; it cannot be paused"), "{err}");
    db.drop_db().await;
}

/// The operations binary's terminal shows its own lines only: no sqlx slow-statement warning
/// (a statement held for 1.5 s behind a lock), no colour codes when stderr is not a terminal,
/// and no server notice from a migration run on a migrated database.
#[tokio::test]
async fn the_command_line_prints_its_own_lines_only() {
    let db = pg().await;
    let run = |args: &[&str], rust_log: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ops"));
        c.args(args)
            .env("DATABASE_URL", &db.url)
            .env_remove("RUST_LOG");
        if let Some(filter) = rust_log {
            c.env("RUST_LOG", filter);
        }
        c.output().expect("run the outbox command line")
    };
    // Every log line shown, as an operator who asks for them: the migrated database's
    // `outbox_migrations` raises no notice.
    let (code, _, err) = text(&run(&["migrate"], Some("info")));
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("already exists"), "{err}");

    // A statistics read held behind a lock for 1.5 s: sqlx finds it slow.
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE outbox_dead_counts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let url = db.url.clone();
    let stats = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
            .arg("stats")
            .env("DATABASE_URL", url)
            .env_remove("RUST_LOG")
            .output()
            .expect("run the outbox command line")
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    holder.rollback().await.unwrap();
    let (code, out, err) = text(&stats.await.unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("topic"), "{out}");
    assert_eq!(err, "", "nothing but our own lines");
    // Where our own warnings do show (sqlx's asked for), no colour codes off a terminal.
    let (_, _, err) = text(&run(&["stats"], Some("debug")));
    assert!(!err.is_empty(), "debug logs something");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    db.drop_db().await;
}
