use outbox::outbox_event;

#[outbox_event(topic = "booking.created.by.the.guest.through.the.public.website.in.the.morning")]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

fn main() {}
