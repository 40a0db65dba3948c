use outbox::outbox_event;
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "booking.created", version = 2)]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV2 {
    guest: String,
}

#[outbox_event(topic = "booking.created", version = 2, previous = BookingCreatedV2)]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    guest_name: String,
}

impl From<BookingCreatedV2> for BookingCreated {
    fn from(v2: BookingCreatedV2) -> Self {
        Self { guest_name: v2.guest }
    }
}

fn main() {}
