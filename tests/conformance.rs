//! The conformance suite: every behaviour of enqueue and the worker, from one source, against
//! every backend (PostgreSQL, SQLite and MariaDB/MySQL). Backend-specific tests live in `*_postgres.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox::{
    enqueue, enqueue_many, enqueue_with, outbox_event, Context, EnqueueOptions, Error, Handler,
    HandlerError, Store, Worker,
};
use outbox_tests::jobs::{config, job, worker, Counts, Job, Mode, Runner};
use serde::{Deserialize, Serialize};
use sqlx::Acquire;

#[outbox_event]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    guest_email: String,
}

#[outbox_event(topic = "blob.stored")]
#[derive(Debug, Serialize, Deserialize)]
struct Blob {
    data: String,
}

fn booking(id: i64) -> BookingCreated {
    BookingCreated {
        booking_id: id,
        guest_email: format!("guest{id}@example.com"),
    }
}

/// Gives up after one attempt, overriding the worker's policy.
struct OneShot;

#[outbox_event]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Single {
    n: i64,
}

#[outbox::async_trait]
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
struct Fanned {
    n: i64,
}

struct HandlerA(Arc<Counts>);
struct HandlerB(Arc<Counts>);

#[outbox::async_trait]
impl Handler for HandlerA {
    type Event = Fanned;
    const NAME: &'static str = "a";
    async fn handle(&self, _: Fanned, _: &Context) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[outbox::async_trait]
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

/// A second handler on the job topic that always succeeds at once, so that a failed attempt of
/// the runner carries a succeeded handler with it.
struct JobEcho;

#[outbox::async_trait]
impl Handler for JobEcho {
    type Event = Job;
    const NAME: &'static str = "echo";
    async fn handle(&self, _: Job, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A topic that sorts after `test.job`, to show it is not starved by a backlog of those.
#[outbox_event(topic = "zz.late")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Late {
    n: i64,
}

struct LateHandler(Arc<Counts>);

#[outbox::async_trait]
impl Handler for LateHandler {
    type Event = Late;
    const NAME: &'static str = "late";
    async fn handle(&self, _: Late, _: &Context) -> Result<(), HandlerError> {
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Writes each test once and runs it on every backend: `$db` is a fresh, migrated database
/// (`outbox_tests::TestDb`, `outbox_tests::SqliteDb` or `outbox_tests::MySqlDb`, which share
/// their helper methods).
macro_rules! conformance {
    ($(async fn $name:ident($db:ident) $body:block)*) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $db = outbox_tests::pg().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $db = outbox_tests::sqlite().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    outbox_tests::skip_without_mysql!();
                    let $db = outbox_tests::mysql().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
    };
}

conformance! {
    async fn rollback_leaves_no_row(db) {
        let mut tx = db.pool.begin().await.unwrap();
        enqueue(&mut *tx, &booking(1)).await.unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(db.count().await, 0);
    }

    async fn commit_stores_one_pending_row(db) {
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &booking(7)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(id.get_version_num(), 7, "public ids are UUID v7");
        assert_eq!(db.count().await, 1);
        assert_eq!(db.status(id).await, ("pending".to_string(), 0, None));
        assert!(db.delay_secs(id).await <= 0.0, "due at once");
    }

    async fn constraint_violation_after_enqueue_rolls_the_event_back(db) {
        // VARCHAR, not TEXT: MySQL indexes (so makes UNIQUE) only a text of bounded length.
        sqlx::query("CREATE TABLE bookings (id BIGINT PRIMARY KEY, room VARCHAR(64) NOT NULL UNIQUE)")
            .execute(&db.pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO bookings VALUES (1, 'room-101')").execute(&db.pool).await.unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        enqueue(&mut *tx, &booking(2)).await.unwrap();
        let err = sqlx::query("INSERT INTO bookings VALUES (2, 'room-101')")
            .execute(&mut *tx)
            .await
            .expect_err("the second booking of room-101 violates the unique constraint");
        assert!(err.as_database_error().is_some_and(|e| e.is_unique_violation()), "{err}");
        tx.rollback().await.unwrap();
        assert_eq!(db.count().await, 0, "the event of the booking that lost is gone with it");
    }

    async fn savepoint_rollback_drops_only_its_own_enqueue(db) {
        let mut tx = db.pool.begin().await.unwrap();
        let kept = enqueue(&mut *tx, &booking(1)).await.unwrap();
        {
            let mut sp = tx.begin().await.unwrap(); // SAVEPOINT
            let gone = enqueue(&mut *sp, &booking(2)).await.unwrap();
            assert_ne!(gone, kept);
            sp.rollback().await.unwrap(); // ROLLBACK TO SAVEPOINT
        }
        tx.commit().await.unwrap();
        assert_eq!(db.count().await, 1);
        assert_eq!(db.status(kept).await.0, "pending");
    }

    async fn enqueue_many_inserts_ten_thousand_rows_in_one_transaction(db) {
        let events: Vec<_> = (0..10_000).map(booking).collect();
        let mut tx = db.pool.begin().await.unwrap();
        let ids = enqueue_many(&mut *tx, &events).await.unwrap();
        assert_eq!(ids.len(), 10_000);
        tx.commit().await.unwrap();
        assert_eq!(db.count().await, 10_000);
        assert_eq!(db.count_status("pending").await, 10_000);
        let mut conn = db.pool.acquire().await.unwrap();
        assert!(enqueue_many::<_, BookingCreated>(&mut *conn, &[]).await.unwrap().is_empty());
    }

    async fn oversized_payload_is_refused_and_nothing_is_written(db) {
        let mut tx = db.pool.begin().await.unwrap();
        let err = enqueue(&mut *tx, &Blob { data: "x".repeat(2 * 1024 * 1024) }).await.unwrap_err();
        assert!(err.is_payload_too_large(), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("1048576") && msg.contains("blob.stored"), "names the limit and the topic: {msg}");
        let small = Blob { data: "y".repeat(200) };
        let err = enqueue_with(&mut *tx, &small, &EnqueueOptions::new().max_payload_bytes(100)).await.unwrap_err();
        assert!(matches!(err, Error::PayloadTooLarge { limit: 100, .. }), "{err}");
        tx.commit().await.unwrap();
        assert_eq!(db.count().await, 0);
    }

    async fn delay_and_idempotency_key_are_kept(db) {
        let mut tx = db.pool.begin().await.unwrap();
        let opts = EnqueueOptions::new().delay(Duration::from_secs(3600)).idempotency_key("booking-created:9");
        let id = enqueue_with(&mut *tx, &booking(9), &opts).await.unwrap();
        tx.commit().await.unwrap();
        let wait = db.scheduled_secs(id).await;
        assert!((wait - 3600.0).abs() < 1.0, "available one hour later, got {wait}s");
        let mut conn = db.pool.acquire().await.unwrap();
        let err = enqueue_with(&mut *conn, &booking(10), &EnqueueOptions::new().idempotency_key("")).await.unwrap_err();
        assert!(matches!(err, Error::InvalidIdempotencyKey { .. }), "{err}");
        // The worker does not see it before its time.
        let (w, counts) = worker(&db.pool);
        assert_eq!(w.run_once().await.unwrap().claimed, 0);
        assert_eq!(counts.calls.load(Ordering::SeqCst), 0);
    }

    async fn migrate_is_idempotent_and_refuses_a_changed_migration(db) {
        let (a, b) = tokio::join!(outbox::migrate(&db.pool), outbox::migrate(&db.pool));
        a.unwrap();
        b.unwrap();
        assert_eq!(db.migration_versions().await, (1..=15).collect::<Vec<i64>>());
        sqlx::query("UPDATE outbox_migrations SET checksum = checksum + 1 WHERE version = 1")
            .execute(&db.pool)
            .await
            .unwrap();
        let err = outbox::migrate(&db.pool).await.unwrap_err();
        assert!(matches!(err, Error::MigrationChanged { version: 1 }), "{err}");
    }

    async fn backoff_doubles_to_256s_and_the_eighth_failure_is_dead(db) {
        let (w, _) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job(1, Mode::Fail)).await.unwrap();
        tx.commit().await.unwrap();
        for (i, expected) in [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0].into_iter().enumerate() {
            db.make_due().await;
            let r = w.run_once().await.unwrap();
            assert_eq!((r.claimed, r.retried), (1, 1), "attempt {}", i + 1);
            let (state, attempts, _) = db.status(id).await;
            assert_eq!((state.as_str(), attempts), ("pending", i as i32 + 1));
            let delay = db.delay_secs(id).await;
            assert!((delay - expected).abs() < 0.5, "after attempt {attempts} the delay is {delay}s, expected {expected}s");
        }
        db.make_due().await;
        assert_eq!(w.run_once().await.unwrap().dead, 1);
        let (state, attempts, err) = db.status(id).await;
        assert_eq!((state.as_str(), attempts), ("dead", 8));
        assert!(err.unwrap().contains("provider unavailable for job 1"));
    }

    async fn a_poison_message_does_not_hold_back_healthy_ones(db) {
        let (w, _) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        let poison = enqueue(&mut *tx, &job(0, Mode::Fail)).await.unwrap();
        enqueue_many(&mut *tx, &(1..=100).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await.unwrap();
        tx.commit().await.unwrap();
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.done, r.retried), (100, 99, 1), "a batch of 100: the poison and 99 healthy");
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.done), (1, 1), "the last healthy one; the poison waits for its backoff");
        assert_eq!(db.count_status("done").await, 100);
        assert_eq!(db.status(poison).await.0, "pending");
    }

    async fn panic_timeout_and_bad_payload_are_failed_attempts(db) {
        let (w, _) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        let ids = enqueue_many(&mut *tx, &[job(1, Mode::Panic), job(2, Mode::Hang), job(3, Mode::Ok)]).await.unwrap();
        tx.commit().await.unwrap();
        db.insert_raw("test.job", r#"{"n": "not a number"}"#, 1).await;
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.done, r.retried), (4, 1, 3));
        let (s, a, e) = db.status(ids[0]).await;
        assert_eq!((s.as_str(), a), ("pending", 1));
        assert!(e.as_deref().unwrap().contains("panicked: job 1 exploded"), "{e:?}");
        let (s, _, e) = db.status(ids[1]).await;
        assert_eq!(s, "pending");
        assert!(e.as_deref().unwrap().contains("timed out after 300ms"), "{e:?}");
        assert_eq!(db.state(ids[2]).await, None, "done: deleted");
        let errors: Vec<Option<String>> = sqlx::query_scalar("SELECT last_error FROM outbox_messages WHERE locked_until IS NULL")
            .fetch_all(&db.pool)
            .await
            .unwrap();
        assert!(errors.iter().flatten().any(|e| e.contains("does not deserialize into")), "{errors:?}");
        // The worker is still fine.
        let mut tx = db.pool.begin().await.unwrap();
        enqueue(&mut *tx, &job(9, Mode::Ok)).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(w.run_once().await.unwrap().done, 1);
    }

    async fn a_bad_payload_names_its_cause_once(db) {
        let (w, _) = worker(&db.pool);
        db.insert_raw("test.job", r#"{"n": "not a number"}"#, 1).await;
        assert_eq!(w.run_once().await.unwrap().retried, 1);
        let error: Option<String> = sqlx::query_scalar("SELECT last_error FROM outbox_messages")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(
            error.as_deref(),
            Some(
                "handler `runner`: payload of version 1 does not deserialize into `outbox_tests::jobs::Job`: \
                 invalid type: string \"not a number\", expected i64 at line 1 column 20; fix the \
                 payload or make the type accept it (e.g. #[serde(default)] on new fields)"
            ),
            "serde's words appear once"
        );
    }

    async fn last_error_is_bounded(db) {
        let (w, _) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job(1, Mode::HugeError)).await.unwrap();
        tx.commit().await.unwrap();
        w.run_once().await.unwrap();
        let err = db.status(id).await.2.unwrap();
        assert!(err.len() <= 4096, "{}", err.len());
        assert!(err.contains("[truncated,"), "{}", &err[err.len() - 60..]);
    }

    async fn permanent_failures_retry_after_and_handler_overrides(db) {
        let w = Worker::builder(&db.pool)
            .handler(Runner(Arc::new(Counts::default())))
            .handler(OneShot)
            .config(config())
            .build()
            .unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        let ids = enqueue_many(&mut *tx, &[job(1, Mode::Permanent), job(2, Mode::RetryAfter)]).await.unwrap();
        let single = enqueue(&mut *tx, &Single { n: 1 }).await.unwrap();
        tx.commit().await.unwrap();
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.dead, r.retried), (3, 2, 1));
        let (s, a, e) = db.status(ids[0]).await;
        assert_eq!((s.as_str(), a), ("dead", 1), "permanent: dead at once");
        assert!(e.unwrap().contains("recipient rejected"));
        let delay = db.delay_secs(ids[1]).await;
        assert!((delay - 100.0).abs() < 1.0, "retry_after(100 s) is honoured, got {delay}");
        assert_eq!(db.status(single).await.0, "dead", "the handler's own max_attempts = 1");
    }

    async fn unknown_topics_are_never_claimed_nor_dead_lettered(db) {
        let (w, _) = worker(&db.pool);
        db.insert_raw("nobody.handles", "{}", 50).await;
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &(0..5).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await.unwrap();
        tx.commit().await.unwrap();
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.done), (5, 5));
        assert_eq!(db.count_status("pending").await, 50);
        // A count, not a sum: one SQL for every backend (a sum is DECIMAL on MySQL).
        let attempted: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE topic = 'nobody.handles' AND attempts > 0")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(attempted, 0);
        assert_eq!(w.unhandled_pending_topics().await.unwrap(), vec![("nobody.handles".to_string(), 50)]);
    }

    async fn a_retry_runs_only_the_handlers_that_have_not_succeeded(db) {
        let (a, b) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
        let w = Worker::builder(&db.pool)
            .handler(HandlerA(a.clone()))
            .handler(HandlerB(b.clone()))
            .config(config())
            .build()
            .unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &Fanned { n: 1 }).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(w.run_once().await.unwrap().retried, 1);
        assert_eq!(db.deliveries(id).await, vec!["a".to_string()]);
        db.make_due().await;
        assert_eq!(w.run_once().await.unwrap().done, 1);
        assert_eq!(a.calls.load(Ordering::SeqCst), 1, "a succeeded once and was not run again");
        assert_eq!(b.calls.load(Ordering::SeqCst), 2);
        assert_eq!(db.state(id).await, None, "done: deleted");
    }

    async fn stats_dead_letters_and_purge(db) {
        let (w, _) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &(0..5).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await.unwrap();
        let retried = enqueue(&mut *tx, &job(10, Mode::Fail)).await.unwrap();
        let dead = enqueue_many(&mut *tx, &[job(11, Mode::Permanent), job(12, Mode::Permanent)]).await.unwrap();
        tx.commit().await.unwrap();
        db.insert_raw("nobody.handles", "{}", 3).await;
        w.run_once().await.unwrap();

        let stats = Store::from(&db.pool).stats().await.unwrap();
        let topics: Vec<&str> = stats.topics.iter().map(|t| t.topic.as_str()).collect();
        assert_eq!(topics, ["nobody.handles", "test.job"]);
        let job_stats = &stats.topics[1];
        assert_eq!(
            (job_stats.ready, job_stats.scheduled, job_stats.in_flight, job_stats.stalled, job_stats.dead, job_stats.done_last_5m),
            (0, 1, 0, 0, 2, 5)
        );
        assert_eq!(job_stats.oldest_ready_age, None);
        let unknown = &stats.topics[0];
        assert_eq!((unknown.ready, unknown.pending()), (3, 3));
        assert!(unknown.oldest_ready_age.is_some());
        assert_eq!((stats.total.ready, stats.total.scheduled, stats.total.dead, stats.total.done_last_5m), (3, 1, 2, 5));

        let store = Store::from(&db.pool);
        let per_minute = store.done_per_minute(60).await.unwrap();
        assert_eq!(per_minute.iter().map(|(_, n)| n).sum::<i64>(), 5, "the done of the last hour, by minute: {per_minute:?}");
        let listed = store.dead_letters(&outbox::DeadLetterFilter::default()).await.unwrap();
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|m| m.status == outbox::MessageStatus::Dead && m.last_error.as_deref().unwrap().contains("recipient rejected")));
        // Keyset paging: one at a time from the newest, each page after the last row of the one before.
        let first = outbox::DeadLetterFilter::new().limit(1);
        let page1 = store.dead_letters(&first).await.unwrap();
        let after = outbox::DeadCursor::of(&page1[0]).expect("a dead letter has a place");
        let page2 = store.dead_letters(&first.clone().after(after)).await.unwrap();
        assert_eq!(page2.len(), 1);
        assert_eq!(vec![page1[0].id, page2[0].id], listed.iter().map(|m| m.id).collect::<Vec<_>>(), "the pages are the listing in order");
        let after = outbox::DeadCursor::of(&page2[0]).unwrap();
        assert!(store.dead_letters(&first.after(after)).await.unwrap().is_empty());
        let filtered = outbox::DeadLetterFilter::new().topic("other");
        assert!(store.dead_letters(&filtered).await.unwrap().is_empty());
        let old = outbox::DeadLetterFilter::new().older_than(Duration::from_secs(3600));
        assert!(store.dead_letters(&old).await.unwrap().is_empty(), "none has been dead for an hour");
        let shown = store.message(dead[0]).await.unwrap().unwrap();
        assert_eq!((shown.topic.as_str(), shown.attempts), ("test.job", 1));
        assert!(shown.payload.contains("Permanent") && shown.processed_at.is_some());
        assert!(store.message(uuid::Uuid::now_v7()).await.unwrap().is_none());

        assert_eq!(store.retry_dead(&outbox::DeadSelection::One(dead[0])).await.unwrap(), 1);
        assert_eq!(db.status(dead[0]).await.0, "pending");
        assert_eq!(db.status(dead[0]).await.1, 0, "attempts reset");
        assert_eq!(store.discard_dead(&outbox::DeadSelection::Topic("test.job".into())).await.unwrap(), 1);
        assert_eq!(store.retry_dead(&outbox::DeadSelection::All).await.unwrap(), 0);

        // Purge: the five done messages were deleted when done; what stays of them is one
        // per-minute count (one topic, one worker, one minute). Nothing is old enough yet; with
        // a zero retention the count goes (in batches of one: a full batch, then an empty one),
        // and pending rows stay.
        assert_eq!(db.count_status("done").await, 5);
        assert_eq!(store.purge_done(Duration::from_secs(3600), 1).await.unwrap(), 0);
        assert_eq!(db.count_status("done").await, 5);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(store.purge_done(Duration::from_millis(1), 1).await.unwrap(), 1);
        assert_eq!(db.count_status("done").await, 0);
        assert_eq!(store.stats().await.unwrap().total.done_last_5m, 0);
        assert_eq!(db.count_status("pending").await, 5, "3 unhandled, the retried one, the revived one");
        assert_eq!(db.status(retried).await.0, "pending");
        assert!(store.purge_done(Duration::ZERO, 0).await.is_err(), "a zero batch is refused");
    }

    async fn a_message_whose_attempts_all_crashed_ends_dead_without_running(db) {
        let (w, counts) = worker(&db.pool);
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job(1, Mode::Ok)).await.unwrap();
        tx.commit().await.unwrap();
        // Eight claims: one failed with an error, the seven after it died with their worker
        // (attempts counted, no outcome, lease over).
        db.crash_claims(8, "handler `runner`: the provider answered 503").await;
        let r = w.run_once().await.unwrap();
        assert_eq!((r.claimed, r.dead), (1, 1));
        assert_eq!(counts.calls.load(Ordering::SeqCst), 0, "not run a ninth time");
        let (state, attempts, err) = db.status(id).await;
        assert_eq!((state.as_str(), attempts), ("dead", 9));
        let err = err.unwrap();
        assert!(err.contains("ended without an outcome"), "{err}");
        assert!(
            err.contains("the last error recorded before: handler `runner`: the provider answered 503"),
            "the error of the attempt that finished is kept: {err}"
        );
    }

    async fn a_backlog_of_one_topic_does_not_starve_another(db) {
        let late = Arc::new(Counts::default());
        let w = Worker::builder(&db.pool)
            .handler(Runner(Arc::new(Counts::default())))
            .handler(LateHandler(late.clone()))
            .config(config().batch_size(100))
            .build()
            .unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &(0..300).map(|n| job(n, Mode::Ok)).collect::<Vec<_>>()).await.unwrap();
        enqueue_many(&mut *tx, &(0..5).map(|n| Late { n }).collect::<Vec<_>>()).await.unwrap();
        tx.commit().await.unwrap();
        let first = w.run_once().await.unwrap();
        let second = w.run_once().await.unwrap();
        assert_eq!((first.claimed, second.claimed), (100, 100));
        assert_eq!(late.get(), 5, "the small topic got its turn within two claims");
    }

    async fn a_success_outcome_is_fenced_by_its_claim_token(db) {
        let report = stale_outcome(&db, Duration::from_secs(3)).await;
        assert_eq!(report.done, 1, "the old worker's handler succeeded");
    }

    async fn a_failure_outcome_is_fenced_by_its_claim_token(db) {
        let report = stale_outcome(&db, Duration::from_millis(300)).await;
        assert_eq!(report.retried, 1, "the old worker's handler timed out");
    }

    async fn an_idle_worker_picks_up_each_message_long_before_its_poll_interval(db) {
        // PostgreSQL wakes it with NOTIFY; SQLite, which has none, from the producer in the
        // same process. Either way nothing waits for the 30 s poll.
        let (counts, stop_tx, running) =
            outbox_tests::jobs::start(&db.pool, config().poll_interval(Duration::from_secs(30)));
        for n in 1..=3 {
            // Idle before each message: past the worker's fast polling after the last one.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let start = Instant::now();
            let mut tx = db.pool.begin().await.unwrap();
            enqueue(&mut *tx, &job(n, Mode::Ok)).await.unwrap();
            tx.commit().await.unwrap();
            outbox_tests::wait_until(
                Duration::from_secs(5).saturating_sub(start.elapsed()),
                &format!("message {n} was not picked up: the poll interval is 30 s"),
                async || counts.get() >= usize::try_from(n).unwrap(),
            )
            .await;
        }
        let _ = stop_tx.send(());
        running.await.unwrap().unwrap();
        assert_eq!(db.count_status("done").await, 3);
    }
}

/// The helper methods the test databases share, so one test body serves every backend.
trait Db {
    fn store(&self) -> Store;
    async fn steal_claim(&self, id: uuid::Uuid, token: uuid::Uuid) -> bool;
    async fn claim_state(&self, id: uuid::Uuid) -> (String, Option<uuid::Uuid>, Option<String>);
    async fn enqueue_job(&self, job: Job) -> uuid::Uuid;
    async fn deliveries(&self, id: uuid::Uuid) -> Vec<String>;
}

impl Db for outbox_tests::TestDb {
    fn store(&self) -> Store {
        Store::from(&self.pool)
    }
    async fn steal_claim(&self, id: uuid::Uuid, token: uuid::Uuid) -> bool {
        self.steal_claim(id, token).await
    }
    async fn claim_state(&self, id: uuid::Uuid) -> (String, Option<uuid::Uuid>, Option<String>) {
        self.claim_state(id).await
    }
    async fn enqueue_job(&self, job: Job) -> uuid::Uuid {
        let mut tx = self.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job).await.unwrap();
        tx.commit().await.unwrap();
        id
    }
    async fn deliveries(&self, id: uuid::Uuid) -> Vec<String> {
        self.deliveries(id).await
    }
}

impl Db for outbox_tests::SqliteDb {
    fn store(&self) -> Store {
        Store::from(&self.pool)
    }
    async fn steal_claim(&self, id: uuid::Uuid, token: uuid::Uuid) -> bool {
        self.steal_claim(id, token).await
    }
    async fn claim_state(&self, id: uuid::Uuid) -> (String, Option<uuid::Uuid>, Option<String>) {
        self.claim_state(id).await
    }
    async fn enqueue_job(&self, job: Job) -> uuid::Uuid {
        let mut tx = self.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job).await.unwrap();
        tx.commit().await.unwrap();
        id
    }
    async fn deliveries(&self, id: uuid::Uuid) -> Vec<String> {
        self.deliveries(id).await
    }
}

impl Db for outbox_tests::MySqlDb {
    fn store(&self) -> Store {
        Store::from(&self.pool)
    }
    async fn steal_claim(&self, id: uuid::Uuid, token: uuid::Uuid) -> bool {
        self.steal_claim(id, token).await
    }
    async fn claim_state(&self, id: uuid::Uuid) -> (String, Option<uuid::Uuid>, Option<String>) {
        self.claim_state(id).await
    }
    async fn enqueue_job(&self, job: Job) -> uuid::Uuid {
        let mut tx = self.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, &job).await.unwrap();
        tx.commit().await.unwrap();
        id
    }
    async fn deliveries(&self, id: uuid::Uuid) -> Vec<String> {
        self.deliveries(id).await
    }
}

/// Runs one slow job while the test takes its claim away (as a newer claim after lease expiry
/// would), then checks the old worker's outcome was not written: neither the message's state
/// nor the success of the job's second handler.
async fn stale_outcome(db: &impl Db, timeout: Duration) -> outbox::BatchReport {
    let w = Worker::builder(db.store())
        .handler(Runner(Arc::new(Counts::default())))
        .handler(JobEcho)
        .config(config().handler_timeout(timeout))
        .build()
        .unwrap();
    let id = db.enqueue_job(job(1, Mode::Slow)).await;
    let runner = tokio::spawn(async move { w.run_once().await.unwrap() });
    let new_token = uuid::Uuid::now_v7();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !db.steal_claim(id, new_token).await {
        assert!(Instant::now() < deadline, "the message was never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let report = runner.await.unwrap();
    assert_eq!(
        db.claim_state(id).await,
        ("running".to_string(), Some(new_token), None),
        "the stale outcome was not written"
    );
    assert_eq!(
        db.deliveries(id).await,
        Vec::<String>::new(),
        "the stale attempt recorded no handler as delivered"
    );
    report
}
