//! The worker on PostgreSQL, where it differs from SQLite: skipping locked rows, and waking an
//! idle worker through LISTEN. The shared behaviour is in `conformance.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{enqueue_many, Worker, WorkerConfig};
use outbox_tests::jobs::{config, job, start, Counts, Job, Mode, Runner};
use outbox_tests::{pg, wait_until, TestDb};
use sqlx::Connection;

async fn put(db: &TestDb, jobs: &[Job]) -> Vec<uuid::Uuid> {
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, jobs).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

/// Waits until a worker has set its `waiting` flag: idle, asleep on LISTEN.
async fn until_idle(db: &TestDb) {
    wait_until(
        Duration::from_secs(10),
        "the worker never went idle",
        async || {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_workers WHERE waiting)")
                .fetch_one(&db.pool)
                .await
                .unwrap()
        },
    )
    .await;
}

/// Waits until the worker is idle and past the looks it takes just after going idle: from
/// then on only a wake-up or its poll interval brings it back.
async fn until_asleep(db: &TestDb) {
    until_idle(db).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Waits until `n` messages are dead.
async fn until_dead(db: &TestDb, n: i64) {
    wait_until(Duration::from_secs(10), "the job never died", async || {
        db.count_status("dead").await == n
    })
    .await;
}

#[tokio::test]
async fn claim_skips_locked_rows_instead_of_waiting() {
    let db = pg().await;
    let (w, _) = outbox_tests::jobs::worker(&db.pool);
    put(&db, &(0..20).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await;

    // Another transaction holds 10 of the 20 rows.
    let mut locker = db.pool.begin().await.unwrap();
    let locked: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id LIMIT 10 FOR UPDATE")
            .fetch_all(&mut *locker)
            .await
            .unwrap();
    assert_eq!(locked.len(), 10);

    let start = Instant::now();
    let report = w.run_once().await.unwrap();
    let took = start.elapsed();
    assert_eq!(report.claimed, 10, "the 10 free rows, not the locked ones");
    assert_eq!(report.done, 10);
    assert!(
        took < Duration::from_secs(1),
        "skipping, not waiting: took {took:?}"
    );
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox_messages \
         WHERE locked_until IS NULL AND attempts = 0 AND id = ANY($1)",
    )
    .bind(&locked)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, 10, "the locked rows are untouched: never claimed");
    locker.rollback().await.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn an_idle_worker_wakes_long_before_its_poll_interval() {
    let db = pg().await;
    let (counts, stop_tx, running) =
        start(&db.pool, config().poll_interval(Duration::from_secs(30)));
    // Let it go idle and wait on its wake-up channel.
    until_idle(&db).await;
    let ids = put(&db, &[job(1, Mode::Ok)]).await;
    wait_until(
        Duration::from_secs(5),
        "not woken: the poll interval is 30 s",
        async || counts.calls.load(Ordering::SeqCst) > 0,
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    // Done: deleted from the live table, counted as done.
    assert_eq!(
        (db.state(ids[0]).await, db.count_status("done").await),
        (None, 1),
        "the outcome was written before run_until returned"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn dead_letters_retried_from_another_process_wake_an_idle_worker() {
    let db = pg().await;
    let (counts, stop_tx, running) =
        start(&db.pool, config().poll_interval(Duration::from_secs(30)));
    put(&db, &[job(1, Mode::Permanent)]).await;
    until_dead(&db, 1).await;
    assert_eq!(counts.get(), 1);
    until_asleep(&db).await;

    // The operator's `outbox dead retry`: another pool, as another process would have.
    let operator = sqlx::PgPool::connect(&db.url).await.unwrap();
    let retried = outbox::Store::from(&operator)
        .retry_dead(&outbox::DeadSelection::All)
        .await
        .unwrap();
    assert_eq!(retried, 1);
    wait_until(
        Duration::from_secs(5),
        "the retried job waits for the worker's next poll (30 s): the worker was not woken",
        async || counts.get() == 2,
    )
    .await;
    operator.close().await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn discarding_a_dead_letter_wakes_an_idle_worker_for_the_messages_of_its_key() {
    let db = pg().await;
    let (counts, stop_tx, running) =
        start(&db.pool, config().poll_interval(Duration::from_secs(30)));
    let key = outbox::EnqueueOptions::new().ordering_key("booking:42");
    let mut tx = db.pool.begin().await.unwrap();
    outbox::enqueue_with(&mut *tx, &job(1, Mode::Permanent), &key)
        .await
        .unwrap();
    let blocked = outbox::enqueue_with(&mut *tx, &job(2, Mode::Ok), &key)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    until_dead(&db, 1).await;
    until_asleep(&db).await;
    assert_eq!(counts.get(), 1, "the second job waits behind the dead one");

    let operator = sqlx::PgPool::connect(&db.url).await.unwrap();
    let discarded = outbox::Store::from(&operator)
        .discard_dead(&outbox::DeadSelection::All)
        .await
        .unwrap();
    assert_eq!(discarded, 1);
    wait_until(
        Duration::from_secs(5),
        "the unblocked job waits for the worker's next poll (30 s): the worker was not woken",
        async || counts.get() == 2,
    )
    .await;
    wait_until(
        Duration::from_secs(5),
        "the unblocked job is done",
        async || db.state(blocked).await.is_none(),
    )
    .await;
    operator.close().await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn build_refuses_a_lease_it_cannot_renew_in_time() {
    // The lease is renewed every fifth of it while a handler runs, so it need not outlast the
    // handler timeout any more (see the next test); but under 1 s it is refused.
    let db = pg().await;
    let err = Worker::builder(&db.pool)
        .handler(Runner(Arc::new(Counts::default())))
        .config(
            WorkerConfig::default()
                .lease(Duration::from_millis(500))
                .handler_timeout(Duration::from_secs(30)),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    Worker::builder(&db.pool)
        .handler(Runner(Arc::new(Counts::default())))
        .config(
            WorkerConfig::default()
                .lease(Duration::from_secs(10))
                .handler_timeout(Duration::from_secs(30)),
        )
        .build()
        .expect("a lease shorter than the handler timeout is renewed, so accepted");
    let err = Worker::builder(&db.pool).build().unwrap_err();
    assert!(err.to_string().contains("no handlers"), "{err}");
    db.drop_db().await;
}

/// A job whose handler runs 2.5 s.
#[outbox::outbox_event(topic = "test.long")]
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Long {
    n: i64,
}

/// Sleeps 2.5 s, then succeeds; counts its calls.
struct LongHandler(Arc<Counts>);

#[outbox::async_trait]
impl outbox::Handler for LongHandler {
    type Event = Long;
    const NAME: &'static str = "long";
    async fn handle(&self, _: Long, _: &outbox::Context) -> Result<(), outbox::HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2500)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_running_longer_than_the_lease_keeps_its_message() {
    // A 1 s lease, a handler of 2.5 s (within its 5 s timeout), and a second worker polling all
    // along: the renewed lease keeps the message from it, so it runs exactly once.
    let db = pg().await;
    let counts = Arc::new(Counts::default());
    let mut workers = Vec::new();
    for _ in 0..2 {
        let w = Worker::builder(&db.pool)
            .handler(LongHandler(counts.clone()))
            .config(
                config()
                    .lease(Duration::from_secs(1))
                    .handler_timeout(Duration::from_secs(5))
                    .poll_interval(Duration::from_millis(50)),
            )
            .build()
            .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn(async move {
            w.run_until(async {
                let _ = stop_rx.await;
            })
            .await
        });
        workers.push((stop_tx, running));
    }
    let mut tx = db.pool.begin().await.unwrap();
    let id = outbox::enqueue(&mut *tx, &Long { n: 1 }).await.unwrap();
    tx.commit().await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the long message was not done",
        async || db.state(id).await.is_none(),
    )
    .await;
    // Longer than a lease more, for a second delivery to show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (stop_tx, running) in workers {
        let _ = stop_tx.send(());
        running.await.unwrap().unwrap();
    }
    assert_eq!(
        counts.get(),
        1,
        "run once: its lease was renewed while it ran"
    );
    assert_eq!(db.count_status("done").await, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn a_killed_listener_reconnects_and_wakes_the_worker_again() {
    let db = pg().await;
    let (counts, stop_tx, running) =
        start(&db.pool, config().poll_interval(Duration::from_secs(30)));
    until_idle(&db).await;
    // Kill every connection of the worker, its listener included.
    let mut admin = sqlx::PgConnection::connect(&outbox_tests::database_url())
        .await
        .unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(&db.name)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(
        killed.len() >= 2,
        "the listener and at least one pool connection: {killed:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;

    let start = Instant::now();
    let mut tx = loop {
        // Our own pool lost its connections too; the first tries may fail.
        match db.pool.begin().await {
            Ok(tx) => break tx,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    enqueue_many(
        &mut *tx,
        &[Job {
            n: 1,
            mode: Mode::Ok,
        }],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    wait_until(
        Duration::from_secs(5).saturating_sub(start.elapsed()),
        "not woken after the reconnect: the poll interval is 30 s",
        async || counts.calls.load(Ordering::SeqCst) > 0,
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn an_idle_worker_rewrites_its_waiting_flag_before_it_counts_as_gone() {
    // Rows of workers not written for a minute are deleted as dead, and producers stop waking
    // them; an idle worker must rewrite its row well within that, even with a poll interval of
    // two minutes.
    let db = pg().await;
    let (_counts, stop_tx, running) =
        start(&db.pool, config().poll_interval(Duration::from_secs(120)));
    until_idle(&db).await;
    // As if the flag had been written 50 s ago: 10 s from counting as gone.
    sqlx::query("UPDATE outbox_workers SET heartbeat_at = now() - interval '50 seconds'")
        .execute(&db.pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (waiting, age): (bool, f64) = sqlx::query_as(
            "SELECT waiting, extract(epoch FROM now() - heartbeat_at)::float8 FROM outbox_workers",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if age < 30.0 {
            assert!(waiting, "the rewritten row still says the worker waits");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle worker's row is {age:.0} s old: it was not rewritten"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_steady_trickle_is_claimed_several_messages_at_a_time() {
    // One message committed every 2 ms: with a 50 ms claim interval, each claim after the first
    // takes the messages that came in meanwhile, instead of one claim per message.
    let db = pg().await;
    let (counts, stop_tx, running) = start(
        &db.pool,
        config()
            .poll_interval(Duration::from_secs(30))
            .claim_interval(Duration::from_millis(50)),
    );
    // Every claim gives its rows one claim token: record each token a claim writes.
    sqlx::raw_sql(
        "CREATE TABLE test_claims (token UUID NOT NULL, message UUID NOT NULL); \
         CREATE FUNCTION test_record_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token THEN \
                 INSERT INTO test_claims VALUES (NEW.claim_token, NEW.id); \
             END IF; \
             RETURN NEW; \
         END $$; \
         CREATE TRIGGER test_record_claim AFTER UPDATE ON outbox_messages \
             FOR EACH ROW EXECUTE FUNCTION test_record_claim();",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let total = 200;
    // On a schedule, not a sleep after each commit: with the commit's own time added, a loaded
    // machine made the trickle slower than the stream rate above which a worker batches by the
    // claim interval (it then waits for each message's NOTIFY instead, as it should).
    let mut every = tokio::time::interval(Duration::from_millis(2));
    for n in 0..total {
        every.tick().await;
        put(&db, &[job(n, Mode::Ok)]).await;
    }
    wait_until(
        Duration::from_secs(20),
        "the trickle was not drained",
        async || db.count_status("done").await >= total,
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    // One claim token per claim statement.
    let (claims, claimed): (i64, i64) =
        sqlx::query_as("SELECT count(DISTINCT token), count(DISTINCT message) FROM test_claims")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        claimed, total,
        "every message was claimed (the trigger saw the claims)"
    );
    assert!(
        claims <= total / 4,
        "{claims} claims for {total} messages: the claim interval did not batch the trickle"
    );
    assert_eq!(counts.get(), usize::try_from(total).unwrap());
    db.drop_db().await;
}
