use outbox::{outbox_event, Event};
use serde::{Deserialize, Serialize};

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct BookingCancelled(i64);

#[outbox_event(topic = "cache.flush.requested")]
#[derive(Serialize, Deserialize)]
struct CacheFlushRequested;

#[outbox_event]
#[derive(Serialize, Deserialize)]
pub struct GuestMerged(pub i64, pub i64);

fn assert_event<E: Event>() -> &'static str {
    E::TOPIC
}

fn main() {
    assert_eq!(assert_event::<BookingCancelled>(), "booking.cancelled");
    assert_eq!(
        assert_event::<CacheFlushRequested>(),
        "cache.flush.requested"
    );
    assert_eq!(assert_event::<GuestMerged>(), "guest.merged");
    let _ = (BookingCancelled(1).0, CacheFlushRequested);
}
