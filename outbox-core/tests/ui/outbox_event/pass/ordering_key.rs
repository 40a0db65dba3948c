use outbox::{outbox_event, Event};

#[outbox_event(ordering_key = "booking_id", idempotency_key = "booking_id")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: u64,
}

#[outbox_event(ordering_key = "booking_id", dead_releases_key)]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingViewed {
    booking_id: u64,
}

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct Unordered {
    id: u64,
}

fn main() {
    let e = BookingCreated { booking_id: 42 };
    assert_eq!(e.ordering_key().as_deref(), Some("42"));
    assert!(!BookingCreated::DEAD_RELEASES_KEY);
    assert!(BookingViewed::DEAD_RELEASES_KEY);
    assert_eq!(Unordered { id: 1 }.ordering_key(), None);
    assert!(!Unordered::DEAD_RELEASES_KEY);
}
