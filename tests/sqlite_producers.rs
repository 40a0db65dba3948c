//! SQLite producers whose transaction reads before it writes: with a plain `pool.begin()` they
//! fail with "database is locked" while other producers write (a deferred transaction cannot
//! upgrade a stale read snapshot); with `outbox::sqlite_begin_immediate` they all succeed.

use std::time::Duration;

use outbox::{enqueue, outbox_event, sqlite_begin_immediate};
use serde::{Deserialize, Serialize};
use sqlx::{Sqlite, SqlitePool, Transaction};

#[outbox_event(topic = "test.room_booked")]
#[derive(Debug, Serialize, Deserialize)]
struct RoomBooked {
    room: i64,
    nth: i64,
}

const PRODUCERS: i64 = 8;
const EACH: i64 = 20;

/// One producer's transaction: count the room's bookings, then book it and enqueue the event.
async fn book(mut tx: Transaction<'static, Sqlite>, room: i64) -> Result<(), String> {
    let nth: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings WHERE room = ?1")
        .bind(room)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    // Give the other producers time to commit between this read and the write below.
    tokio::time::sleep(Duration::from_millis(1)).await;
    sqlx::query("INSERT INTO bookings (room, nth) VALUES (?1, ?2)")
        .bind(room)
        .bind(nth + 1)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    enqueue(&mut *tx, &RoomBooked { room, nth: nth + 1 })
        .await
        .map_err(|e| outbox::cli::error_line(&e))?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// Runs `PRODUCERS` concurrent producers of `EACH` bookings; returns their errors.
async fn run(pool: &SqlitePool, immediate: bool) -> Vec<String> {
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..EACH {
                let tx = if immediate {
                    sqlite_begin_immediate(&pool)
                        .await
                        .map_err(|e| outbox::cli::error_line(&e))
                } else {
                    pool.begin().await.map_err(|e| e.to_string())
                };
                if let Err(e) = async { book(tx?, p % 2).await }.await {
                    errors.push(e);
                }
            }
            errors
        }));
    }
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    errors
}

async fn setup() -> outbox_tests::SqliteDb {
    let db = outbox_tests::sqlite().await;
    sqlx::query("CREATE TABLE bookings (id INTEGER PRIMARY KEY, room INTEGER NOT NULL, nth INTEGER NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    db
}

async fn counts(pool: &SqlitePool) -> (i64, i64) {
    (
        sqlx::query_scalar("SELECT count(*) FROM bookings")
            .fetch_one(pool)
            .await
            .unwrap(),
        sqlx::query_scalar("SELECT count(*) FROM outbox_messages")
            .fetch_one(pool)
            .await
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_that_read_first_all_succeed_with_begin_immediate() {
    let db = setup().await;
    let errors = run(&db.pool, true).await;
    assert!(errors.is_empty(), "{} failed: {errors:?}", errors.len());
    assert_eq!(counts(&db.pool).await, (PRODUCERS * EACH, PRODUCERS * EACH));
    // Each read saw every earlier commit: the counts per room run 1, 2, 3, ... without a gap.
    let max: Vec<(i64, i64)> =
        sqlx::query_as("SELECT max(nth), count(DISTINCT nth) FROM bookings GROUP BY room")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(max, vec![(PRODUCERS * EACH / 2, PRODUCERS * EACH / 2); 2]);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_producers_with_a_plain_begin_hit_database_is_locked() {
    let db = setup().await;
    let errors = run(&db.pool, false).await;
    assert!(
        errors.iter().any(|e| e.contains("database is locked")),
        "a deferred transaction that reads first should fail to upgrade while others write; \
         errors: {errors:?}"
    );
    let (bookings, messages) = counts(&db.pool).await;
    assert_eq!(
        bookings, messages,
        "a failed transaction leaves neither the booking nor the event"
    );
    assert_eq!(bookings + errors.len() as i64, PRODUCERS * EACH);
    db.drop_db().await;
}
