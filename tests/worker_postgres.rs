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

#[tokio::test]
async fn claim_skips_locked_rows_instead_of_waiting() {
    let db = pg().await;
    let (w, _) = outbox_tests::jobs::worker(&db.pool);
    put(&db, &(0..20).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await;

    // Another transaction holds 10 of the 20 rows.
    let mut locker = db.pool.begin().await.unwrap();
    let locked: Vec<i64> =
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
        "SELECT count(*) FROM outbox_messages WHERE status = 'pending' AND id = ANY($1)",
    )
    .bind(&locked)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, 10);
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
    put(&db, &[job(1, Mode::Ok)]).await;
    wait_until(
        Duration::from_secs(5),
        "not woken: the poll interval is 30 s",
        async || counts.calls.load(Ordering::SeqCst) > 0,
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    let (state, _, _) = sqlx::query_as::<_, (String, i32, Option<String>)>(
        "SELECT status, attempts, last_error FROM outbox_messages LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        state, "done",
        "the outcome was written before run_until returned"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn build_refuses_a_lease_shorter_than_the_handler_timeout() {
    let db = pg().await;
    let err = Worker::builder(&db.pool)
        .handler(Runner(Arc::new(Counts::default())))
        .config(
            WorkerConfig::default()
                .lease(Duration::from_secs(10))
                .handler_timeout(Duration::from_secs(30)),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lease"), "{err}");
    let err = Worker::builder(&db.pool).build().unwrap_err();
    assert!(err.to_string().contains("no handlers"), "{err}");
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    let total = 200;
    for n in 0..total {
        put(&db, &[job(n, Mode::Ok)]).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    wait_until(
        Duration::from_secs(20),
        "the trickle was not drained",
        async || db.count_status("done").await >= total,
    )
    .await;
    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    // claimed_at is the claim transaction's start time: one value per claim.
    let claims: i64 = sqlx::query_scalar("SELECT count(DISTINCT claimed_at) FROM outbox_messages")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        claims <= total / 4,
        "{claims} claims for {total} messages: the claim interval did not batch the trickle"
    );
    assert_eq!(counts.get(), usize::try_from(total).unwrap());
    db.drop_db().await;
}
