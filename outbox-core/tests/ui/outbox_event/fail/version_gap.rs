use outbox::outbox_event;
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "booking.created")]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV1 {
    guest: String,
}

// Version 2 is missing: a stored version 2 would have no type to decode it.
#[outbox_event(topic = "booking.created", version = 3, previous = BookingCreatedV1)]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    guest_name: String,
}

impl From<BookingCreatedV1> for BookingCreated {
    fn from(v1: BookingCreatedV1) -> Self {
        Self { guest_name: v1.guest }
    }
}

fn main() {}
