// A first-time mistake: enqueue given the transaction itself instead of `&mut *tx`.
use outbox::{enqueue, outbox_event};

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

async fn book(pool: outbox::sqlx::PgPool) -> Result<(), outbox::Error> {
    let mut tx = pool.begin().await?;
    enqueue(&mut tx, &BookingCreated { booking_id: 1 }).await?;
    tx.commit().await?;
    Ok(())
}

fn main() {
    let _ = book;
}
