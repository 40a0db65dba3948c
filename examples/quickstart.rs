//! The quick start: a booking and its event written in one transaction.
//!
//! Run with `cargo run -p outbox-examples --example quickstart` (needs PostgreSQL at
//! `DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`).

use outbox::{enqueue, outbox_event};
use serde::{Deserialize, Serialize};

/// Stored with topic `booking.created`.
#[outbox_event]
#[derive(Debug, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    guest_email: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    outbox::migrate(&pool).await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS quickstart_bookings (id BIGSERIAL PRIMARY KEY, guest_email TEXT NOT NULL)")
        .execute(&pool)
        .await?;

    // The booking and its event commit together...
    let mut tx = pool.begin().await?;
    let booking_id: i64 = sqlx::query_scalar(
        "INSERT INTO quickstart_bookings (guest_email) VALUES ($1) RETURNING id",
    )
    .bind("guest@example.com")
    .fetch_one(&mut *tx)
    .await?;
    let event = BookingCreated {
        booking_id,
        guest_email: "guest@example.com".into(),
    };
    let message_id = enqueue(&mut *tx, &event).await?;
    tx.commit().await?;
    println!("booking {booking_id} committed with message {message_id}");

    // ...or roll back together.
    let mut tx = pool.begin().await?;
    let lost = enqueue(
        &mut *tx,
        &BookingCreated {
            booking_id: -1,
            guest_email: "nobody@example.com".into(),
        },
    )
    .await?;
    tx.rollback().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE id = $1)")
            .bind(lost)
            .fetch_one(&pool)
            .await?;
    println!("rolled-back message {lost} exists: {exists}");
    Ok(())
}
