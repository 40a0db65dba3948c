use outbox::{outbox_event, Event};

#[outbox_event(idempotency_key = "booking_ref")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_ref: String,
    nights: u32,
}

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct Unkeyed {
    id: u64,
}

fn main() {
    let e = BookingCreated { booking_ref: "booking-created:42".into(), nights: 2 };
    assert_eq!(e.idempotency_key().as_deref(), Some("booking-created:42"));
    assert_eq!(Unkeyed { id: 1 }.idempotency_key(), None);
}
