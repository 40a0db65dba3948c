//! Atomic enqueue on PostgreSQL: the event exists if and only if the caller's transaction commits.

use outbox_core::{
    enqueue, enqueue_many, enqueue_with, outbox_event, EnqueueOptions, Error, Event,
};
use outbox_tests::pg;
use serde::{Deserialize, Serialize};
use sqlx::{Acquire, Row};
use std::time::Duration;

#[outbox_event]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    guest_email: String,
    nights: u32,
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
        nights: 3,
    }
}

async fn bookings_table(pool: &sqlx::PgPool) {
    sqlx::query("CREATE TABLE bookings (id BIGINT PRIMARY KEY, room TEXT NOT NULL UNIQUE)")
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn rollback_leaves_no_row() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(&mut *tx, &booking(1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count().await, 0);
    db.drop_db().await;
}

#[tokio::test]
async fn commit_stores_one_row_with_the_json_snapshot() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &booking(7)).await.unwrap();
    tx.commit().await.unwrap();

    let row = sqlx::query(
        "SELECT public_id, topic, payload, status, attempts, available_at <= now() AS due, \
         claim_token, processed_at, last_error, idempotency_key FROM outbox_messages",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<uuid::Uuid, _>("public_id"), id);
    assert_eq!(id.get_version_num(), 7, "public ids are UUID v7");
    assert_eq!(row.get::<String, _>("topic"), "booking.created");
    assert_eq!(row.get::<String, _>("topic"), BookingCreated::TOPIC);
    let payload: serde_json::Value = row.get("payload");
    assert_eq!(
        payload,
        serde_json::json!({"booking_id": 7, "guest_email": "guest7@example.com", "nights": 3})
    );
    assert_eq!(row.get::<String, _>("status"), "pending");
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert!(row.get::<bool, _>("due"));
    assert!(row.get::<Option<uuid::Uuid>, _>("claim_token").is_none());
    assert!(row
        .get::<Option<chrono::DateTime<chrono::Utc>>, _>("processed_at")
        .is_none());
    assert!(row.get::<Option<String>, _>("last_error").is_none());
    assert!(row.get::<Option<String>, _>("idempotency_key").is_none());
    assert_eq!(db.count().await, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn constraint_violation_after_enqueue_rolls_the_event_back() {
    let db = pg().await;
    bookings_table(&db.pool).await;
    sqlx::query("INSERT INTO bookings VALUES (1, 'room-101')")
        .execute(&db.pool)
        .await
        .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    enqueue(&mut *tx, &booking(2)).await.unwrap();
    let clash = sqlx::query("INSERT INTO bookings VALUES (2, 'room-101')")
        .execute(&mut *tx)
        .await;
    let err = clash.expect_err("the second booking of room-101 violates the unique constraint");
    assert!(err
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation()));
    tx.rollback().await.unwrap();

    assert_eq!(
        db.count().await,
        0,
        "the event of the booking that lost is gone with it"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn savepoint_rollback_drops_only_its_own_enqueue() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    let kept = enqueue(&mut *tx, &booking(1)).await.unwrap();
    {
        let mut sp = tx.begin().await.unwrap(); // SAVEPOINT
        enqueue(&mut *sp, &booking(2)).await.unwrap();
        sp.rollback().await.unwrap(); // ROLLBACK TO SAVEPOINT
    }
    tx.commit().await.unwrap();

    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT public_id FROM outbox_messages")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(ids, vec![kept]);
    db.drop_db().await;
}

#[tokio::test]
async fn enqueue_many_inserts_ten_thousand_rows_in_one_transaction() {
    let db = pg().await;
    let events: Vec<_> = (0..10_000).map(booking).collect();
    let mut tx = db.pool.begin().await.unwrap();
    let ids = enqueue_many(&mut *tx, &events).await.unwrap();
    assert_eq!(ids.len(), 10_000);
    assert_eq!(db.count().await, 0, "nothing is visible before the commit");
    tx.commit().await.unwrap();
    assert_eq!(db.count().await, 10_000);

    // Ids come back in the order of the slice, each with its own payload.
    let stored: i64 = sqlx::query_scalar(
        "SELECT (payload->>'booking_id')::bigint FROM outbox_messages WHERE public_id = $1",
    )
    .bind(ids[4242])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, 4242);
    db.drop_db().await;
}

#[tokio::test]
async fn enqueue_many_of_nothing_writes_nothing() {
    let db = pg().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let ids = enqueue_many::<_, BookingCreated>(&mut *conn, &[])
        .await
        .unwrap();
    assert!(ids.is_empty());
    assert_eq!(db.count().await, 0);
    db.drop_db().await;
}

#[tokio::test]
async fn oversized_payload_is_refused_and_nothing_is_written() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    let big = Blob {
        data: "x".repeat(2 * 1024 * 1024),
    };
    let err = enqueue(&mut *tx, &big).await.unwrap_err();
    assert!(err.is_payload_too_large(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("1048576"), "the error names the limit: {msg}");
    assert!(
        msg.contains("blob.stored"),
        "the error names the topic: {msg}"
    );

    // A custom limit applies too, and the transaction is still usable afterwards.
    let small = Blob {
        data: "y".repeat(200),
    };
    let err = enqueue_with(
        &mut *tx,
        &small,
        &EnqueueOptions::new().max_payload_bytes(100),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::PayloadTooLarge { limit: 100, .. }),
        "{err}"
    );
    tx.commit().await.unwrap();
    assert_eq!(db.count().await, 0);
    db.drop_db().await;
}

#[tokio::test]
async fn delay_and_idempotency_key_are_stored() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    let opts = EnqueueOptions::new()
        .delay(Duration::from_secs(3600))
        .idempotency_key("booking-created:9");
    let id = enqueue_with(&mut *tx, &booking(9), &opts).await.unwrap();
    tx.commit().await.unwrap();
    let (key, wait): (Option<String>, f64) = sqlx::query_as(
        "SELECT idempotency_key, extract(epoch FROM available_at - created_at)::float8 FROM outbox_messages WHERE public_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(key.as_deref(), Some("booking-created:9"));
    assert!(
        (wait - 3600.0).abs() < 1.0,
        "available one hour later, got {wait}s"
    );

    let mut conn = db.pool.acquire().await.unwrap();
    let err = enqueue_with(
        &mut *conn,
        &booking(10),
        &EnqueueOptions::new().idempotency_key(""),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InvalidIdempotencyKey { .. }), "{err}");
    db.drop_db().await;
}

#[tokio::test]
async fn migrate_is_idempotent_and_safe_concurrently() {
    let db = outbox_tests::pg_empty().await;
    let (a, b, c) = tokio::join!(
        outbox_core::migrate(&db.pool),
        outbox_core::migrate(&db.pool),
        outbox_core::migrate(&db.pool)
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
    outbox_core::migrate(&db.pool).await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM outbox_migrations")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(versions, vec![1]);

    // The host application's own sqlx migrations table is never touched.
    let sqlx_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(sqlx_table, None);
    db.drop_db().await;
}

#[tokio::test]
async fn a_changed_migration_is_refused() {
    let db = pg().await;
    sqlx::query("UPDATE outbox_migrations SET checksum = checksum + 1 WHERE version = 1")
        .execute(&db.pool)
        .await
        .unwrap();
    let err = outbox_core::migrate(&db.pool).await.unwrap_err();
    assert!(
        matches!(err, Error::MigrationChanged { version: 1 }),
        "{err}"
    );
    db.drop_db().await;
}
