use outbox::outbox_event;

#[outbox_event(idempotency_key = "booking ref")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_ref: String,
}

fn main() {}
