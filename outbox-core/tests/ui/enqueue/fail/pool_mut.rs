// A first-time mistake: enqueue given the pool, mutably, instead of `&mut *tx`.
use outbox::{enqueue, outbox_event};

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

async fn book(mut pool: outbox::sqlx::PgPool) -> Result<(), outbox::Error> {
    enqueue(&mut pool, &BookingCreated { booking_id: 1 }).await?;
    Ok(())
}

fn main() {
    let _ = book;
}
