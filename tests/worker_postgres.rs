//! The worker against PostgreSQL, in process: claims, outcomes, backoff, dead letters,
//! isolation, per-handler progress, unknown topics, fencing and wake-ups.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{
    enqueue, enqueue_many, outbox_event, Context, Handler, HandlerError, RetryPolicy, Worker, WorkerConfig,
};
use outbox_tests::{pg, TestDb};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "test.job")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    n: i64,
    #[serde(default)]
    mode: Mode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
enum Mode {
    #[default]
    Ok,
    Fail,
    Permanent,
    Panic,
    Hang,
    HugeError,
    RetryAfter,
    Slow,
}

#[derive(Default)]
struct Counts {
    calls: AtomicUsize,
}

/// Does what the job's mode says.
struct Runner(Arc<Counts>);

#[outbox_core::async_trait]
impl Handler for Runner {
    type Event = Job;
    const NAME: &'static str = "runner";

    async fn handle(&self, job: Job, _ctx: &Context) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        match job.mode {
            Mode::Ok => Ok(()),
            Mode::Fail => Err(HandlerError::retry(format!("provider unavailable for job {}", job.n))),
            Mode::Permanent => Err(HandlerError::permanent("recipient rejected")),
            Mode::Panic => panic!("job {} exploded", job.n),
            Mode::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
            Mode::HugeError => Err(HandlerError::retry("x".repeat(100_000))),
            Mode::RetryAfter => Err(HandlerError::retry_after(Duration::from_secs(100), "rate limited")),
            Mode::Slow => {
                tokio::time::sleep(Duration::from_millis(600)).await;
                Ok(())
            }
        }
    }
}

/// A handler that gives up after one attempt, overriding the worker's policy.
struct OneShot;

#[outbox_core::async_trait]
impl Handler for OneShot {
    type Event = Single;
    const NAME: &'static str = "one-shot";
    async fn handle(&self, _: Single, _: &Context) -> Result<(), HandlerError> {
        Err(HandlerError::retry("always fails"))
    }
    fn max_attempts(&self) -> Option<u32> {
        Some(1)
    }
}

#[outbox_event]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Single {
    n: i64,
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(RetryPolicy::default().jitter(false))
        .handler_timeout(Duration::from_millis(300))
        .lease(Duration::from_secs(5))
}

fn worker(db: &TestDb) -> (Worker, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let w = Worker::builder(&db.pool).handler(Runner(counts.clone())).config(config()).build().unwrap();
    (w, counts)
}

async fn put(db: &TestDb, jobs: &[Job]) -> Vec<uuid::Uuid> {
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, jobs).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

fn job(n: i64, mode: Mode) -> Job {
    Job { n, mode }
}

async fn status(db: &TestDb, id: uuid::Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, last_error FROM outbox_messages WHERE public_id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

async fn make_due(db: &TestDb) {
    sqlx::query("UPDATE outbox_messages SET available_at = now() WHERE status = 'pending'")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn claim_skips_locked_rows_instead_of_waiting() {
    let db = pg().await;
    let (w, _) = worker(&db);
    put(&db, &(0..20).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await;

    // Another transaction holds 10 of the 20 rows.
    let mut locker = db.pool.begin().await.unwrap();
    let locked: Vec<i64> = sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id LIMIT 10 FOR UPDATE")
        .fetch_all(&mut *locker)
        .await
        .unwrap();
    assert_eq!(locked.len(), 10);

    let start = Instant::now();
    let report = w.run_once().await.unwrap();
    let took = start.elapsed();
    assert_eq!(report.claimed, 10, "the 10 free rows, not the locked ones");
    assert_eq!(report.done, 10);
    assert!(took < Duration::from_secs(1), "skipping, not waiting: took {took:?}");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND id = ANY($1)")
        .bind(&locked)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pending, 10);
    locker.rollback().await.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn backoff_doubles_to_256s_and_the_eighth_failure_is_dead() {
    let db = pg().await;
    let (w, _) = worker(&db);
    let id = put(&db, &[job(1, Mode::Fail)]).await[0];
    for (attempt, expected) in [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0].into_iter().enumerate() {
        make_due(&db).await;
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.retried), (1, 1), "attempt {}", attempt + 1);
        let (state, attempts, delay): (String, i32, f64) = sqlx::query_as(
            "SELECT status, attempts, extract(epoch FROM available_at - now())::float8 FROM outbox_messages WHERE public_id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(state, "pending");
        assert_eq!(attempts, attempt as i32 + 1);
        assert!((delay - expected).abs() < 0.5, "after attempt {attempts} the delay is {delay}s, expected {expected}s");
    }
    make_due(&db).await;
    let r = w.run_once().await.unwrap();
    assert_eq!(r.dead, 1);
    let (state, attempts, err) = status(&db, id).await;
    assert_eq!((state.as_str(), attempts), ("dead", 8));
    assert!(err.unwrap().contains("provider unavailable for job 1"));
    // The cap: attempt 8's delay would have been 256 s.
    assert_eq!(RetryPolicy::default().jitter(false).backoff(8), Duration::from_secs(256));
    db.drop_db().await;
}

#[tokio::test]
async fn a_poison_message_does_not_hold_back_healthy_ones() {
    let db = pg().await;
    let (w, _) = worker(&db);
    let poison = put(&db, &[job(0, Mode::Fail)]).await[0];
    put(&db, &(1..=100).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await;
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done, r.retried), (100, 99, 1), "batch of 100: the poison and 99 healthy");
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done), (1, 1), "the last healthy one; the poison waits for its backoff");
    let done: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE status = 'done'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(done, 100);
    assert_eq!(status(&db, poison).await.0, "pending");
    db.drop_db().await;
}

#[tokio::test]
async fn panic_timeout_and_bad_payload_are_failed_attempts() {
    let db = pg().await;
    let (w, _) = worker(&db);
    let ids = put(&db, &[job(1, Mode::Panic), job(2, Mode::Hang), job(3, Mode::Ok)]).await;
    // A row whose payload does not fit the event type (as after a bad deploy).
    sqlx::query("INSERT INTO outbox_messages (public_id, topic, payload) VALUES ($1, 'test.job', '{\"n\": \"not a number\"}')")
        .bind(uuid::Uuid::now_v7())
        .execute(&db.pool)
        .await
        .unwrap();
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done, r.retried), (4, 1, 3));

    let (s, a, e) = status(&db, ids[0]).await;
    assert_eq!((s.as_str(), a), ("pending", 1));
    assert!(e.as_deref().unwrap().contains("panicked: job 1 exploded"), "{e:?}");
    let (s, _, e) = status(&db, ids[1]).await;
    assert_eq!(s, "pending");
    assert!(e.as_deref().unwrap().contains("timed out after 300ms"), "{e:?}");
    let e: String = sqlx::query_scalar("SELECT last_error FROM outbox_messages WHERE payload->>'n' = 'not a number'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(e.contains("does not deserialize into"), "{e}");
    assert_eq!(status(&db, ids[2]).await.0, "done");

    // The worker is still fine.
    put(&db, &[job(9, Mode::Ok)]).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn last_error_is_bounded() {
    let db = pg().await;
    let (w, _) = worker(&db);
    let id = put(&db, &[job(1, Mode::HugeError)]).await[0];
    w.run_once().await.unwrap();
    let err = status(&db, id).await.2.unwrap();
    assert!(err.len() <= 4096, "{}", err.len());
    assert!(err.contains("[truncated,"), "{}", &err[err.len() - 60..]);
    db.drop_db().await;
}

#[tokio::test]
async fn permanent_failures_retry_after_and_handler_overrides() {
    let db = pg().await;
    let counts = Arc::new(Counts::default());
    let w = Worker::builder(&db.pool).handler(Runner(counts)).handler(OneShot).config(config()).build().unwrap();
    let ids = put(&db, &[job(1, Mode::Permanent), job(2, Mode::RetryAfter)]).await;
    let mut tx = db.pool.begin().await.unwrap();
    let single = enqueue(&mut *tx, &Single { n: 1 }).await.unwrap();
    tx.commit().await.unwrap();
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.dead, r.retried), (3, 2, 1));

    let (s, a, e) = status(&db, ids[0]).await;
    assert_eq!((s.as_str(), a), ("dead", 1), "permanent: dead at once");
    assert!(e.unwrap().contains("recipient rejected"));
    let delay: f64 = sqlx::query_scalar("SELECT extract(epoch FROM available_at - now())::float8 FROM outbox_messages WHERE public_id = $1")
        .bind(ids[1])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!((delay - 100.0).abs() < 1.0, "retry_after(100 s) is honoured, got {delay}");
    assert_eq!(status(&db, single).await.0, "dead", "the handler's own max_attempts = 1");
    db.drop_db().await;
}

#[tokio::test]
async fn unknown_topics_are_never_claimed_nor_dead_lettered() {
    let db = pg().await;
    let (w, _) = worker(&db);
    sqlx::query(
        "INSERT INTO outbox_messages (public_id, topic, payload) \
         SELECT gen_random_uuid(), 'nobody.handles', '{}'::jsonb FROM generate_series(1, 50)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    put(&db, &(0..5).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await;
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done), (5, 5));
    let (pending, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(attempts), 0) FROM outbox_messages WHERE topic = 'nobody.handles' AND status = 'pending'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((pending, attempts), (50, 0));
    assert_eq!(w.unhandled_pending_topics().await.unwrap(), vec![("nobody.handles".to_string(), 50)]);
    db.drop_db().await;
}

struct Always(&'static str, Arc<Counts>);

#[outbox_event]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Fanned {
    fail_b: bool,
}

struct HandlerA(Arc<Counts>);
struct HandlerB(Arc<Counts>);

#[outbox_core::async_trait]
impl Handler for HandlerA {
    type Event = Fanned;
    const NAME: &'static str = "a";
    async fn handle(&self, _: Fanned, _: &Context) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[outbox_core::async_trait]
impl Handler for HandlerB {
    type Event = Fanned;
    const NAME: &'static str = "b";
    async fn handle(&self, _: Fanned, ctx: &Context) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        if ctx.attempt() == 1 {
            return Err(HandlerError::retry("b fails on its first attempt"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_retry_runs_only_the_handlers_that_have_not_succeeded() {
    let db = pg().await;
    let (a, b) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let w = Worker::builder(&db.pool)
        .handler(HandlerA(a.clone()))
        .handler(HandlerB(b.clone()))
        .config(config())
        .build()
        .unwrap();
    let _ = Always("unused", a.clone());
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &Fanned { fail_b: true }).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(w.run_once().await.unwrap().retried, 1);
    let recorded: Vec<String> = sqlx::query_scalar(
        "SELECT d.handler FROM outbox_deliveries d JOIN outbox_messages m ON m.id = d.message_id WHERE m.public_id = $1",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(recorded, vec!["a".to_string()]);

    make_due(&db).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(a.calls.load(Ordering::SeqCst), 1, "a succeeded once and was not run again");
    assert_eq!(b.calls.load(Ordering::SeqCst), 2);
    assert_eq!(status(&db, id).await.0, "done");
    db.drop_db().await;
}

/// Runs one slow job while the test steals its claim, then checks the old worker's outcome
/// (done when `timeout` is long, failed when it is short) was not written.
async fn stale_outcome_is_dropped(timeout: Duration) -> outbox_core::BatchReport {
    let db = pg().await;
    let w = Worker::builder(&db.pool)
        .handler(Runner(Arc::new(Counts::default())))
        .config(config().handler_timeout(timeout))
        .build()
        .unwrap();
    let ids = put(&db, &[job(1, Mode::Slow)]).await;
    let runner = tokio::spawn(async move { w.run_once().await.unwrap() });
    // While the handler runs, the lease "expires" and another claim takes the message.
    let new_token = uuid::Uuid::now_v7();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = sqlx::query(
            "UPDATE outbox_messages SET claim_token = $1, attempts = attempts + 1 WHERE public_id = $2 AND status = 'running'",
        )
        .bind(new_token)
        .bind(ids[0])
        .execute(&db.pool)
        .await
        .unwrap()
        .rows_affected();
        if n == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the message was never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = runner.await.unwrap();
    let (state, token, err): (String, Option<uuid::Uuid>, Option<String>) =
        sqlx::query_as("SELECT status, claim_token, last_error FROM outbox_messages WHERE public_id = $1")
            .bind(ids[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), token, err), ("running", Some(new_token), None), "the stale outcome was not written");
    db.drop_db().await;
    report
}

#[tokio::test]
async fn a_success_outcome_is_fenced_by_its_claim_token() {
    let report = stale_outcome_is_dropped(Duration::from_secs(3)).await;
    assert_eq!(report.done, 1, "the old worker's handler succeeded");
}

#[tokio::test]
async fn a_failure_outcome_is_fenced_by_its_claim_token() {
    let report = stale_outcome_is_dropped(Duration::from_millis(300)).await;
    assert_eq!(report.retried, 1, "the old worker's handler timed out");
}

#[tokio::test]
async fn an_idle_worker_wakes_long_before_its_poll_interval() {
    let db = pg().await;
    let counts = Arc::new(Counts::default());
    let w = Worker::builder(&db.pool)
        .handler(Runner(counts.clone()))
        .config(config().poll_interval(Duration::from_secs(30)))
        .build()
        .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        w.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });
    // Let it go idle and wait on its wake-up channel.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_workers WHERE waiting)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if waiting {
            break;
        }
        assert!(Instant::now() < deadline, "the worker never went idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    put(&db, &[job(1, Mode::Ok)]).await;
    while counts.calls.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < Duration::from_secs(5), "not woken: the poll interval is 30 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    let (state, _, _) = sqlx::query_as::<_, (String, i32, Option<String>)>(
        "SELECT status, attempts, last_error FROM outbox_messages LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(state, "done", "the outcome was written before run_until returned");
    db.drop_db().await;
}

#[tokio::test]
async fn build_refuses_a_lease_shorter_than_the_handler_timeout() {
    let db = pg().await;
    let err = Worker::builder(&db.pool)
        .handler(Runner(Arc::new(Counts::default())))
        .config(WorkerConfig::default().lease(Duration::from_secs(10)).handler_timeout(Duration::from_secs(30)))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    let err = Worker::builder(&db.pool).build().unwrap_err();
    assert!(err.to_string().contains("no handlers"), "{err}");
    db.drop_db().await;
}
