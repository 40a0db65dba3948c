use outbox::outbox_event;

#[outbox_event(topic = "Booking.Created")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

#[outbox_event(topic = "booking created")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCancelled {
    booking_id: i64,
}

fn main() {}
