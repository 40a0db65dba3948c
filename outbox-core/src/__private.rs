//! Items the code that `#[outbox_event]` and `register_handler!` generate names. Not public
//! API: no stability guarantees.

pub use crate::event::{decode_current, same_topic, EventDescriptor};
pub use crate::registry::HandlerRegistration;
pub use inventory;
