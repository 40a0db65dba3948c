use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

// Renamed from `BookingCreated`: the pinned topic keeps rows already enqueued routed.
#[outbox_event(topic = "booking.created")]
#[derive(Serialize, Deserialize)]
struct BookingConfirmed {
    booking_id: i64,
}

#[outbox_event(topic = "billing-v2.invoice_paid")]
#[derive(Serialize, Deserialize)]
struct InvoicePaid {
    invoice_id: i64,
}

// Exactly the longest topic allowed: 64 characters.
#[outbox_event(topic = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")]
#[derive(Serialize, Deserialize)]
struct Longest;

// A type name that would not derive a valid topic is fine once the topic is pinned.
#[outbox_event(topic = "unicode.renamed")]
#[derive(Serialize, Deserialize)]
struct Ünïcode;

fn main() {
    assert_eq!(BookingConfirmed::TOPIC, "booking.created");
    assert_eq!(InvoicePaid::TOPIC, "billing-v2.invoice_paid");
    assert_eq!(Longest::TOPIC.len(), 64);
    assert_eq!(Ünïcode::TOPIC, "unicode.renamed");
    let _ = BookingConfirmed { booking_id: 1 }.booking_id;
    let _ = InvoicePaid { invoice_id: 1 }.invoice_id;
    let _ = (Longest, Ünïcode);
}
