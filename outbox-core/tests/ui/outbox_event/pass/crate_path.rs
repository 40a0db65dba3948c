// A crate that reaches `outbox` only through a re-export, e.g. an in-house facade crate.
mod reexport {
    pub use outbox;
}

mod events {
    use crate::reexport::outbox::outbox_event;
    use serde::{Deserialize, Serialize};

    #[outbox_event(crate = "crate::reexport::outbox")]
    #[derive(Serialize, Deserialize)]
    pub struct BookingCreated {
        pub booking_id: i64,
    }

    #[outbox_event(topic = "booking.cancelled", crate = "crate::reexport::outbox")]
    #[derive(Serialize, Deserialize)]
    pub struct BookingCancelled {
        pub booking_id: i64,
    }
}

use reexport::outbox::Event;

fn main() {
    assert_eq!(events::BookingCreated::TOPIC, "booking.created");
    assert_eq!(events::BookingCancelled::TOPIC, "booking.cancelled");
    let _ = events::BookingCreated { booking_id: 1 }.booking_id;
    let _ = events::BookingCancelled { booking_id: 1 }.booking_id;
}
