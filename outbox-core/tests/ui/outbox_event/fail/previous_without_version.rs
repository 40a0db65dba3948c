use outbox::outbox_event;
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "booking.created")]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV1 {
    guest: String,
}

#[outbox_event(topic = "booking.created", previous = BookingCreatedV1)]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    guest_name: String,
}

fn main() {}
