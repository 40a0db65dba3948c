use outbox::outbox_event;

// Every mistake is reported at once, not one per build.
#[outbox_event(topik = "payment.amount")]
union PaymentAmount {
    cents: u64,
}

fn main() {}
