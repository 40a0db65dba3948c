//! StayHub's events: snapshots plus the ids a handler needs.

use chrono::NaiveDate;
use outbox::outbox_event;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A booking was made; topic `booking.created`. Its delivered events stay in the event log for
/// 180 days: a handler added later catches up on them, and derived data can be rebuilt.
#[outbox_event(retain = "180d")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BookingCreated {
    pub(crate) booking_id: Uuid,
    pub(crate) property_id: i64,
    pub(crate) guest_email: String,
    pub(crate) check_in: NaiveDate,
    pub(crate) check_out: NaiveDate,
}

/// A property changed and the inline index update failed; topic `property.changed`.
///
/// It carries the row's version, so the index never lets an older change overwrite a newer one.
#[outbox_event]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PropertyChanged {
    pub(crate) property_id: i64,
    pub(crate) version: i64,
    pub(crate) name: String,
    pub(crate) city: String,
    pub(crate) nightly_price: i64,
}
