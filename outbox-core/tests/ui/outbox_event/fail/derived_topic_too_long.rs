use outbox::outbox_event;

#[outbox_event]
#[derive(serde::Serialize, serde::Deserialize)]
struct BookingCreatedByTheGuestThroughThePublicWebsiteOnAMobilePhoneInTheMorning {
    booking_id: i64,
}

fn main() {}
