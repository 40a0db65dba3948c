use outbox::outbox_event;

#[outbox_event]
fn booking_created() {}

fn main() {
    booking_created();
}
