//! The processed-id dedup wrapper (`outbox_handlers::dedup`) against PostgreSQL, SQLite and
//! MariaDB: a redelivered message whose id is recorded is skipped, an inner failure rolls the
//! record back with the effect, concurrent deliveries of one message serialize, records are
//! purged in batches, and (PostgreSQL) a worker SIGKILLed after the effect committed but before the
//! message was marked done does not repeat the effect after redelivery.
//!
//! The effect of every handler here is an INSERT into an `effects` table of the same database;
//! the tests count its rows. The crash test runs `dedup-worker` (tests/bin/dedup_worker.rs) as a
//! child process.

use std::process::Stdio;
use std::time::{Duration, Instant};

use outbox::{
    enqueue, outbox_event, Context, Event, FailureKind, Handler, HandlerError, Resources,
    RetryPolicy, Worker, WorkerConfig,
};
use outbox_handlers::dedup::{purge_processed, Dedup, DedupConfig, DedupLayer, TxHandler};
use outbox_tests::{mysql, pg, sqlite, MySqlDb, SqliteDb, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::{MySql, MySqlConnection, PgConnection, PgPool, Postgres, Sqlite, SqliteConnection};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// An entry for the in-process tests.
#[outbox_event(topic = "test.ledger")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LedgerEntry {
    n: i64,
    /// Fail after the INSERT on the first attempt.
    #[serde(default)]
    fail_first: bool,
    /// Sleep after the INSERT, inside the transaction.
    #[serde(default)]
    sleep_ms: u64,
}

/// The crash test's event, as `dedup-worker` declares it.
#[outbox_event(topic = "test.dedup")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DedupWork {
    n: i64,
    sleep_after_ms: u64,
}

/// Inserts one row into `effects` on the dedup transaction.
#[derive(Debug)]
struct AddEntry;

#[outbox::async_trait]
impl TxHandler<Postgres> for AddEntry {
    type Event = LedgerEntry;
    const NAME: &'static str = "ledger";

    async fn handle(
        &self,
        e: LedgerEntry,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id, n) VALUES ($1, $2)")
            .bind(ctx.message_id())
            .bind(e.n)
            .execute(&mut *tx)
            .await?;
        if e.sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(e.sleep_ms)).await;
        }
        if e.fail_first && ctx.attempt() == 1 {
            return Err(HandlerError::retry("the ledger is busy"));
        }
        Ok(())
    }
}

async fn effects_table(pool: &PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, message_id UUID NOT NULL, n BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn setup() -> TestDb {
    let db = pg().await;
    effects_table(&db.pool).await;
    // A done message is deleted; keep its last row, to see how often it was attempted.
    db.archive_done().await;
    db
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn effects(db: &TestDb) -> i64 {
    scalar(&db.pool, "SELECT count(*) FROM effects").await
}

async fn records(db: &TestDb) -> i64 {
    scalar(&db.pool, "SELECT count(*) FROM outbox_processed").await
}

async fn put<E: outbox::Event>(db: &TestDb, e: &E) -> Uuid {
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, e).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// (status, attempts) of a message; a done one's as it was deleted (see `setup`).
async fn status(db: &TestDb, id: Uuid) -> (String, i32) {
    let (status, attempts, _) = db.status_archived(id).await;
    (status, attempts)
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(
            RetryPolicy::default()
                .jitter(false)
                .base(Duration::from_millis(100)),
        )
        .handler_timeout(Duration::from_secs(5))
        .lease(Duration::from_secs(10))
}

fn entry(n: i64) -> LedgerEntry {
    LedgerEntry {
        n,
        fail_first: false,
        sleep_ms: 0,
    }
}

#[tokio::test]
async fn a_redelivered_message_whose_id_is_recorded_is_skipped() {
    let db = setup().await;
    let dedup = Dedup::with_pool(AddEntry, db.pool.clone());
    assert_eq!(<Dedup<AddEntry, Postgres> as Handler>::NAME, "ledger");
    let w = Worker::builder(&db.pool)
        .handler(dedup)
        .config(config())
        .build()
        .unwrap();
    let id = put(&db, &entry(1)).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(status(&db, id).await, ("done".to_string(), 1));
    assert_eq!((effects(&db).await, records(&db).await), (1, 1));
    let (handler, message_id): (String, Uuid) =
        sqlx::query_as("SELECT handler, message_id FROM outbox_processed")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!((handler.as_str(), message_id), ("ledger", id));

    // The outcome is lost (as after a crash): the message is still there, claimed by a
    // worker whose lease ran out, and is delivered again.
    db.undo_done(id).await;
    assert_eq!(status(&db, id).await, ("pending".to_string(), 1));
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done), (1, 1), "the redelivery succeeds");
    assert_eq!(status(&db, id).await, ("done".to_string(), 2));
    assert_eq!(effects(&db).await, 1, "the effect is not repeated");
    assert_eq!(records(&db).await, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn an_inner_failure_rolls_the_record_back_with_the_effect() {
    let db = setup().await;
    let w = Worker::builder(&db.pool)
        .handler(DedupLayer::with_pool(db.pool.clone()).layer(AddEntry))
        .config(config())
        .build()
        .unwrap();
    let id = put(
        &db,
        &LedgerEntry {
            fail_first: true,
            ..entry(2)
        },
    )
    .await;
    let r = w.run_once().await.unwrap();
    assert_eq!(r.retried, 1);
    assert_eq!(status(&db, id).await, ("pending".to_string(), 1));
    assert_eq!(
        (effects(&db).await, records(&db).await),
        (0, 0),
        "rolled back together"
    );
    let err: String = sqlx::query_scalar("SELECT last_error FROM outbox_messages WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(err.contains("the ledger is busy"), "{err}");

    db.make_due().await;
    let r = w.run_once().await.unwrap();
    assert_eq!((r.claimed, r.done), (1, 1), "the second attempt succeeds");
    assert_eq!((effects(&db).await, records(&db).await), (1, 1));
    assert_eq!(status(&db, id).await, ("done".to_string(), 2));
    db.drop_db().await;
}

#[tokio::test]
async fn concurrent_deliveries_of_one_message_run_the_effect_once() {
    let db = setup().await;
    let dedup = Dedup::with_pool(AddEntry, db.pool.clone());
    // One message delivered twice at once (the lease of a stalled worker ran out while its handler ran).
    let ctx = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
    let slow = LedgerEntry {
        sleep_ms: 300,
        ..entry(3)
    };
    let (a, b) = tokio::join!(
        dedup.handle(slow.clone(), &ctx),
        dedup.handle(slow.clone(), &ctx)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!((effects(&db).await, records(&db).await), (1, 1));
    // And once more, later.
    dedup.handle(entry(3), &ctx).await.unwrap();
    assert_eq!(effects(&db).await, 1);
    // Another message runs.
    let other = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
    dedup.handle(entry(4), &other).await.unwrap();
    assert_eq!((effects(&db).await, records(&db).await), (2, 2));
    db.drop_db().await;
}

#[tokio::test]
async fn the_pool_comes_from_the_worker_resources_or_the_error_says_how_to_give_it() {
    let db = setup().await;
    let w = Worker::builder(&db.pool)
        .resource(db.pool.clone())
        .handler(Dedup::new(AddEntry))
        .config(config())
        .build()
        .unwrap();
    put(&db, &entry(5)).await;
    assert_eq!(w.run_once().await.unwrap().done, 1);
    assert_eq!(effects(&db).await, 1);

    let bare = Dedup::new(AddEntry);
    let ctx = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
    let err = bare.handle(entry(6), &ctx).await.unwrap_err();
    assert_eq!(err.kind(), FailureKind::Retry);
    assert!(err.to_string().contains("has no database pool"), "{err}");
    assert!(matches!(bare.get_ref(), AddEntry));
    let _inner: AddEntry = bare.into_inner();
    db.drop_db().await;
}

#[tokio::test]
async fn purge_deletes_old_records_in_bounded_batches() {
    let db = pg().await;
    sqlx::query(
        "INSERT INTO outbox_processed (handler, message_id, processed_at) \
         SELECT 'ledger', gen_random_uuid(), now() - interval '10 days' FROM generate_series(1, 2500)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_processed (handler, message_id) \
         SELECT 'ledger', gen_random_uuid() FROM generate_series(1, 10)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(purge_processed(&db.pool, week, 1000).await.unwrap(), 2500);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_processed").await,
        10
    );
    assert_eq!(purge_processed(&db.pool, week, 1000).await.unwrap(), 0);
    let e = purge_processed(&db.pool, week, 0).await.unwrap_err();
    assert!(e.to_string().contains("batch must be at least 1"), "{e}");

    // Exactly one batch's worth, then through the configuration.
    sqlx::query(
        "INSERT INTO outbox_processed (handler, message_id, processed_at) \
         SELECT 'ledger', gen_random_uuid(), now() - interval '2 hours' FROM generate_series(1, 40)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let retention = DedupConfig::from_toml_str("[dedup]\nretention = '1h'\npurge_batch = 20")
        .unwrap()
        .retention()
        .unwrap();
    assert_eq!(retention.purge(&db.pool).await.unwrap(), 40);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_processed").await,
        10
    );
    db.drop_db().await;
}

/// A `dedup-worker` child process on `url`.
fn spawn_worker(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_dedup-worker"))
        .args(["--database-url", url])
        .args([
            "--lease",
            "3",
            "--handler-timeout",
            "2.5",
            "--poll-interval",
            "0.1",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn dedup-worker")
}

async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_worker_killed_after_the_commit_does_not_repeat_the_effect() {
    let db = setup().await;
    let id = put(
        &db,
        &DedupWork {
            n: 7,
            sleep_after_ms: 60_000,
        },
    )
    .await;

    let mut first = spawn_worker(&db.url);
    wait_until(Duration::from_secs(30), "the effect to commit", || async {
        effects(&db).await == 1
    })
    .await;
    // The effect and its record are committed; the handler now sleeps before returning.
    first.start_kill().expect("SIGKILL the worker");
    first.wait().await.expect("reap the worker");
    assert_eq!(
        status(&db, id).await,
        ("running".to_string(), 1),
        "killed between the commit and the outcome write"
    );
    assert_eq!(records(&db).await, 1);

    // The lease runs out; a second worker gets the message again and finds it recorded.
    let mut second = spawn_worker(&db.url);
    wait_until(
        Duration::from_secs(30),
        "the redelivery to finish",
        || async { status(&db, id).await.0 == "done" },
    )
    .await;
    second.start_kill().expect("stop the second worker");
    second.wait().await.expect("reap the second worker");

    assert_eq!(effects(&db).await, 1, "the effect happened once");
    assert_eq!(status(&db, id).await, ("done".to_string(), 2));
    assert_eq!(
        db.count_status("done").await,
        1,
        "done once: by the second delivery"
    );
    assert_eq!(records(&db).await, 1);
    db.drop_db().await;
}

// ---- SQLite and MariaDB: the same wrapper, its record written by outbox's SQLite or MySQL
// backend. One source (`dedup_suite!`), a module per backend with its handler and helpers.

/// The in-process tests on a database other than PostgreSQL. The module that expands it
/// defines `DB` (the sqlx database) and `DB_NAME` (as the wrapper's error names it),
/// `AddEntryOn` (the effect), `runs_here` (whether its server is there), `setup`, `counts`, `put`, `processed` and `insert_processed`.
macro_rules! dedup_suite {
    () => {
        #[tokio::test]
        async fn a_redelivered_message_whose_id_is_recorded_is_skipped() {
            if !runs_here() {
                return;
            }
            let db = setup().await;
            let dedup = Dedup::with_pool(AddEntryOn, db.pool.clone());
            assert_eq!(<Dedup<AddEntryOn, DB> as Handler>::NAME, "ledger");
            let w = Worker::builder(&db.pool)
                .handler(dedup)
                .config(config())
                .build()
                .unwrap();
            let id = put(&db, &entry(1)).await;
            assert_eq!(w.run_once().await.unwrap().done, 1);
            assert_eq!(counts(&db).await, (1, 1));
            let (handler, message_id, at) = processed(&db).await;
            assert_eq!((handler.as_str(), message_id), ("ledger", id));
            let now_ms = chrono::Utc::now().timestamp_millis();
            assert!(
                (now_ms - 60_000..=now_ms).contains(&at),
                "processed_at {at} is in ms, just now"
            );

            // The same message delivered again (its outcome was lost, as after a crash): skipped.
            let again = Dedup::with_pool(AddEntryOn, db.pool.clone());
            let ctx = Context::for_delivery(id, LedgerEntry::TOPIC, "ledger", Resources::new());
            again.handle(entry(1), &ctx).await.unwrap();
            assert_eq!(counts(&db).await, (1, 1), "the effect is not repeated");
            db.drop_db().await;
        }

        #[tokio::test]
        async fn an_inner_failure_rolls_the_record_back_with_the_effect() {
            if !runs_here() {
                return;
            }
            let db = setup().await;
            let w = Worker::builder(&db.pool)
                .handler(DedupLayer::with_pool(db.pool.clone()).layer(AddEntryOn))
                .config(config())
                .build()
                .unwrap();
            put(
                &db,
                &LedgerEntry {
                    fail_first: true,
                    ..entry(2)
                },
            )
            .await;
            let r = w.run_once().await.unwrap();
            assert_eq!(r.retried, 1);
            assert_eq!(counts(&db).await, (0, 0), "rolled back together");
            db.make_due().await;
            let r = w.run_once().await.unwrap();
            assert_eq!((r.claimed, r.done), (1, 1), "the second attempt succeeds");
            assert_eq!(counts(&db).await, (1, 1));
            db.drop_db().await;
        }

        #[tokio::test]
        async fn concurrent_deliveries_of_one_message_run_the_effect_once() {
            if !runs_here() {
                return;
            }
            let db = setup().await;
            let dedup = Dedup::with_pool(AddEntryOn, db.pool.clone());
            let ctx = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
            let slow = LedgerEntry {
                sleep_ms: 300,
                ..entry(3)
            };
            // The second waits for the first's record (SQLite's write lock, InnoDB's lock on
            // the key), then skips.
            let (a, b) = tokio::join!(
                dedup.handle(slow.clone(), &ctx),
                dedup.handle(slow.clone(), &ctx)
            );
            a.unwrap();
            b.unwrap();
            assert_eq!(counts(&db).await, (1, 1));
            let other = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
            dedup.handle(entry(4), &other).await.unwrap();
            assert_eq!(counts(&db).await, (2, 2));
            db.drop_db().await;
        }

        #[tokio::test]
        async fn the_pool_comes_from_the_worker_resources_or_the_error_names_it() {
            if !runs_here() {
                return;
            }
            let db = setup().await;
            let w = Worker::builder(&db.pool)
                .resource(db.pool.clone())
                .handler(Dedup::new(AddEntryOn))
                .config(config())
                .build()
                .unwrap();
            put(&db, &entry(5)).await;
            assert_eq!(w.run_once().await.unwrap().done, 1);
            assert_eq!(counts(&db).await, (1, 1));

            let bare: Dedup<AddEntryOn, DB> = Dedup::new(AddEntryOn);
            let ctx = Context::for_test(LedgerEntry::TOPIC, "ledger", Resources::new());
            let err = bare.handle(entry(6), &ctx).await.unwrap_err();
            assert_eq!(err.kind(), FailureKind::Retry);
            assert!(err.to_string().contains(DB_NAME), "{err}");
            db.drop_db().await;
        }

        #[tokio::test]
        async fn purge_deletes_old_records_in_bounded_batches() {
            if !runs_here() {
                return;
            }
            let db = setup().await;
            let now_ms = chrono::Utc::now().timestamp_millis();
            let day_ms = 24 * 3600 * 1000;
            for (n, age_ms) in [(25, 10 * day_ms), (4, 0), (6, 2 * 3600 * 1000)] {
                for _ in 0..n {
                    insert_processed(&db, now_ms - age_ms).await;
                }
            }
            let count = async || counts(&db).await.1;
            let week = Duration::from_secs(7 * 24 * 3600);
            assert_eq!(purge_processed(&db.pool, week, 10).await.unwrap(), 25);
            assert_eq!(count().await, 10);
            let retention =
                DedupConfig::from_toml_str("[dedup]\nretention = '1h'\npurge_batch = 4")
                    .unwrap()
                    .retention()
                    .unwrap();
            assert_eq!(retention.purge(&db.pool).await.unwrap(), 6);
            assert_eq!(count().await, 4);
            db.drop_db().await;
        }
    };
}

/// (effects, processed records) of a database whose `count(*)` is an `i64`.
macro_rules! counts_of {
    ($pool:expr) => {
        (
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM effects")
                .fetch_one($pool)
                .await
                .unwrap(),
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_processed")
                .fetch_one($pool)
                .await
                .unwrap(),
        )
    };
}

mod sqlite {
    use super::*;

    type DB = Sqlite;
    const DB_NAME: &str = "Sqlite";

    /// [`AddEntry`] on SQLite: one row into `effects` on the dedup transaction.
    #[derive(Debug)]
    struct AddEntryOn;

    #[outbox::async_trait]
    impl TxHandler<Sqlite> for AddEntryOn {
        type Event = LedgerEntry;
        const NAME: &'static str = "ledger";

        async fn handle(
            &self,
            e: LedgerEntry,
            ctx: &Context,
            tx: &mut SqliteConnection,
        ) -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO effects (message_id, n) VALUES (?1, ?2)")
                .bind(ctx.message_id().to_string())
                .bind(e.n)
                .execute(&mut *tx)
                .await?;
            ledger_pause(&e, ctx).await
        }
    }

    fn runs_here() -> bool {
        true
    }

    async fn setup() -> SqliteDb {
        let db = sqlite().await;
        sqlx::raw_sql(
            "CREATE TABLE effects (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL, n INTEGER NOT NULL)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        db
    }

    async fn counts(db: &SqliteDb) -> (i64, i64) {
        counts_of!(&db.pool)
    }

    async fn put(db: &SqliteDb, e: &LedgerEntry) -> Uuid {
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, e).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// (handler, message id, processed at) of the one processed record.
    async fn processed(db: &SqliteDb) -> (String, Uuid, i64) {
        let (handler, id, at): (String, String, i64) =
            sqlx::query_as("SELECT handler, message_id, processed_at FROM outbox_processed")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        (handler, id.parse().unwrap(), at)
    }

    /// A processed record of handler `ledger` for a new message id, processed at `at` (ms).
    async fn insert_processed(db: &SqliteDb, at: i64) {
        sqlx::query(
            "INSERT INTO outbox_processed (handler, message_id, processed_at) VALUES (?1, ?2, ?3)",
        )
        .bind("ledger")
        .bind(Uuid::now_v7().to_string())
        .bind(at)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    dedup_suite!();
}

mod mysql {
    use super::*;

    type DB = MySql;
    const DB_NAME: &str = "MySql";

    /// [`AddEntry`] on MariaDB: one row into `effects` on the dedup transaction.
    #[derive(Debug)]
    struct AddEntryOn;

    #[outbox::async_trait]
    impl TxHandler<MySql> for AddEntryOn {
        type Event = LedgerEntry;
        const NAME: &'static str = "ledger";

        async fn handle(
            &self,
            e: LedgerEntry,
            ctx: &Context,
            tx: &mut MySqlConnection,
        ) -> Result<(), HandlerError> {
            sqlx::query("INSERT INTO effects (message_id, n) VALUES (?, ?)")
                .bind(ctx.message_id())
                .bind(e.n)
                .execute(&mut *tx)
                .await?;
            ledger_pause(&e, ctx).await
        }
    }

    /// Whether the MariaDB server is there (else each test says it is skipped).
    fn runs_here() -> bool {
        outbox_tests::mysql_up(module_path!())
    }

    async fn setup() -> MySqlDb {
        let db = mysql().await;
        sqlx::raw_sql(
            "CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, message_id BINARY(16) NOT NULL, \
             n BIGINT NOT NULL) ENGINE = InnoDB",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        db
    }

    async fn counts(db: &MySqlDb) -> (i64, i64) {
        counts_of!(&db.pool)
    }

    async fn put(db: &MySqlDb, e: &LedgerEntry) -> Uuid {
        let mut tx = db.pool.begin().await.unwrap();
        let id = enqueue(&mut *tx, e).await.unwrap();
        tx.commit().await.unwrap();
        id
    }

    /// (handler, message id, processed at) of the one processed record.
    async fn processed(db: &MySqlDb) -> (String, Uuid, i64) {
        sqlx::query_as("SELECT handler, message_id, processed_at FROM outbox_processed")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    }

    /// A processed record of handler `ledger` for a new message id, processed at `at` (ms).
    async fn insert_processed(db: &MySqlDb, at: i64) {
        sqlx::query(
            "INSERT INTO outbox_processed (handler, message_id, processed_at) VALUES (?, ?, ?)",
        )
        .bind("ledger")
        .bind(Uuid::now_v7())
        .bind(at)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    dedup_suite!();
}

/// The rest of [`AddEntry`]'s work after its INSERT: sleep on request, then fail the first
/// attempt on request.
async fn ledger_pause(e: &LedgerEntry, ctx: &Context) -> Result<(), HandlerError> {
    if e.sleep_ms > 0 {
        tokio::time::sleep(Duration::from_millis(e.sleep_ms)).await;
    }
    if e.fail_first && ctx.attempt() == 1 {
        return Err(HandlerError::retry("the ledger is busy"));
    }
    Ok(())
}
