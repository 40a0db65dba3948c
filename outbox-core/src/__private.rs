//! Items used by generated code and by the backend seam. Not public API: no stability guarantees.

use std::time::Duration;

pub use crate::event::EventDescriptor;
pub use crate::registry::HandlerRegistration;
pub use inventory;

/// One message about to be inserted.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Its id (UUID v7).
    pub id: uuid::Uuid,
    /// Its topic.
    pub topic: &'static str,
    /// Its payload as JSON text.
    pub payload: String,
    /// The idempotency key, if one was given.
    pub idempotency_key: Option<String>,
    /// The delay before it is available.
    pub delay: Duration,
    /// The ordering key, if the message is ordered.
    pub ordering_key: Option<String>,
    /// Whether the message, once dead, lets later messages of its key go on.
    pub releases_key: bool,
}
