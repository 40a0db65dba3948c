// Crates that forbid unsafe code can declare events: the registration uses none of theirs.
#![forbid(unsafe_code)]

use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    guest_email: String,
}

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct HTTPCallFailed {
    url: String,
    status: u16,
}

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct PropertyIndexRequested {
    property_id: i64,
}

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct UserV2Created {
    user_id: i64,
}

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct r#Booking {
    booking_id: i64,
}

fn main() {
    assert_eq!(BookingCreated::TOPIC, "booking.created");
    assert_eq!(HTTPCallFailed::TOPIC, "http.call.failed");
    assert_eq!(PropertyIndexRequested::TOPIC, "property.index.requested");
    assert_eq!(UserV2Created::TOPIC, "user.v2.created");
    assert_eq!(Booking::TOPIC, "booking");

    // Every event type is registered for the worker, under its topic and its Rust path.
    let registered: Vec<_> =
        outbox::__private::inventory::iter::<outbox::__private::EventDescriptor>
            .into_iter()
            .map(|event| (event.topic(), event.type_name()))
            .collect();
    assert_eq!(registered.len(), 5, "{registered:?}");
    assert!(registered
        .iter()
        .any(|&(topic, type_name)| topic == "booking.created"
            && type_name.ends_with("::BookingCreated")));
    assert!(registered
        .iter()
        .any(|&(topic, type_name)| topic == "booking" && type_name.ends_with("::Booking")));

    let event = BookingCreated {
        booking_id: 7,
        guest_email: "guest@example.com".to_owned(),
    };
    assert_eq!(event.idempotency_key(), None);
    let _ = (event.booking_id, event.guest_email);
    let _ = HTTPCallFailed {
        url: String::new(),
        status: 500,
    };
    let _ = PropertyIndexRequested { property_id: 1 }.property_id;
    let _ = UserV2Created { user_id: 1 }.user_id;
    let _ = Booking { booking_id: 1 }.booking_id;
}
