//! Enqueue and migrations on PostgreSQL, where they differ from SQLite: the JSON snapshot,
//! concurrent migrators under an advisory lock. The shared behaviour is in `conformance.rs`.

use outbox::{enqueue, outbox_event, Event};
use outbox_tests::pg;
use serde::{Deserialize, Serialize};
use sqlx::Row;

#[outbox_event]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    guest_email: String,
    nights: u32,
}

fn booking(id: i64) -> BookingCreated {
    BookingCreated {
        booking_id: id,
        guest_email: format!("guest{id}@example.com"),
        nights: 3,
    }
}

#[tokio::test]
async fn commit_stores_one_row_with_the_json_snapshot() {
    let db = pg().await;
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &booking(7)).await.unwrap();
    tx.commit().await.unwrap();

    let row = sqlx::query(
        "SELECT id, topic, payload, attempts, available_at <= now() AS due, locked_until, \
         claim_token, claimed_by, last_error, idempotency_key FROM outbox_messages",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(row.get::<uuid::Uuid, _>("id"), id);
    assert_eq!(id.get_version_num(), 7, "public ids are UUID v7");
    assert_eq!(row.get::<String, _>("topic"), "booking.created");
    assert_eq!(row.get::<String, _>("topic"), BookingCreated::TOPIC);
    let payload: serde_json::Value = row.get("payload");
    assert_eq!(
        payload,
        serde_json::json!({"booking_id": 7, "guest_email": "guest7@example.com", "nights": 3})
    );
    // Pending: no lease, no claim.
    assert!(row
        .get::<Option<chrono::DateTime<chrono::Utc>>, _>("locked_until")
        .is_none());
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert!(row.get::<bool, _>("due"));
    assert!(row.get::<Option<uuid::Uuid>, _>("claim_token").is_none());
    assert!(row.get::<Option<uuid::Uuid>, _>("claimed_by").is_none());
    assert!(row.get::<Option<String>, _>("last_error").is_none());
    assert!(row.get::<Option<String>, _>("idempotency_key").is_none());
    assert_eq!(db.count().await, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn migrate_is_idempotent_and_safe_concurrently() {
    let db = outbox_tests::pg_empty().await;
    let (a, b, c) = tokio::join!(
        outbox::migrate(&db.pool),
        outbox::migrate(&db.pool),
        outbox::migrate(&db.pool)
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
    outbox::migrate(&db.pool).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM outbox_migrations ORDER BY version")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(versions, (1..=15).collect::<Vec<i64>>());

    // The host application's own sqlx migrations table is never touched.
    let sqlx_table: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(sqlx_table, None);
    db.drop_db().await;
}

/// The key of the advisory lock `migrate` takes ("outbox" in ASCII).
const MIGRATION_LOCK: i64 = 0x6f75_7462_6f78;

#[tokio::test]
async fn a_cancelled_migrate_leaves_no_session_holding_the_lock() {
    use sqlx::Connection as _;
    let db = outbox_tests::pg_empty().await;
    // Another process is migrating: it holds the lock, so our migrate waits for it.
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .unwrap();
    let cancelled = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        outbox::migrate(&pool),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "migrate should still be waiting for the lock"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut other)
        .await
        .unwrap();

    // Had the cancelled call's session gone back to the pool with its lock request queued, it
    // would now hold the lock for good, and every later migrate would wait forever.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&mut other)
    .await
    .unwrap();
    assert_eq!(held, 0, "no session holds the migration lock");
    tokio::time::timeout(std::time::Duration::from_secs(10), outbox::migrate(&pool))
        .await
        .expect("migrate after a cancelled one finishes")
        .unwrap();
    other.close().await.unwrap();
    pool.close().await;
    db.drop_db().await;
}
