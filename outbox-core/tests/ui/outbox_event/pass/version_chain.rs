use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "booking.created")]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV1 {
    guest: String,
}

#[outbox_event(topic = "booking.created", version = 2, previous = BookingCreatedV1)]
#[derive(Serialize, Deserialize)]
struct BookingCreatedV2 {
    guest_name: String,
}

#[outbox_event(topic = "booking.created", version = 3, previous = BookingCreatedV2)]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    guest_name: String,
    nights: u32,
}

impl From<BookingCreatedV1> for BookingCreatedV2 {
    fn from(v1: BookingCreatedV1) -> Self {
        Self { guest_name: v1.guest }
    }
}

impl From<BookingCreatedV2> for BookingCreated {
    fn from(v2: BookingCreatedV2) -> Self {
        Self { guest_name: v2.guest_name, nights: 1 }
    }
}

fn main() {
    let event = BookingCreated::decode_versioned(1, r#"{"guest":"Ada"}"#).unwrap();
    assert_eq!((event.guest_name.as_str(), event.nights), ("Ada", 1));
    assert_eq!(BookingCreated::VERSION, 3);
}
