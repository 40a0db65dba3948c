use outbox::outbox_event;

#[outbox_event]
#[repr(C)]
union PaymentAmount {
    cents: u64,
    millis: u64,
}

fn main() {}
