use outbox::outbox_event;

#[outbox_event(name = "booking.created")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

fn main() {}
