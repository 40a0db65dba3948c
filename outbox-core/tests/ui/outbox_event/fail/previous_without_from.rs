use outbox::outbox_event;
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "booking.created")]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV1 {
    guest: String,
}

// No `impl From<BookingCreatedV1> for BookingCreated`: stored v1 payloads could not be upcast.
#[outbox_event(topic = "booking.created", version = 2, previous = BookingCreatedV1)]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    guest_name: String,
}

fn main() {}
