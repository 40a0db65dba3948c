use outbox::Event;

// Serializable, but `#[outbox_event]` was forgotten.
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

fn enqueue<E: Event>(event: E) -> &'static str {
    let _ = event;
    E::TOPIC
}

fn main() {
    enqueue(BookingCreated { booking_id: 1 });
}
