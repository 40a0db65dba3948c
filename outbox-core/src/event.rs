//! The [`Event`] trait: a payload type with a topic.

use serde::{de::DeserializeOwned, Serialize};

/// A payload type that can be enqueued: a snapshot of what happened, named by a topic.
///
/// Implement it with `#[outbox_event]` (feature `macros`) rather than by hand: the attribute
/// derives the topic from the type name (`BookingCreated` -> `booking.created`), checks it at
/// compile time and registers the event so the worker can warn about events nobody handles.
///
/// The payload is stored as JSON, so the type must also implement [`Serialize`] and
/// [`DeserializeOwned`]. Carry a snapshot of the data plus the ids a handler needs to re-read
/// fresh state; never a database handle or anything that cannot be serialized.
///
/// # Example
///
/// ```
/// use outbox::{outbox_event, Event};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct BookingCreated {
///     booking_id: i64,
///     guest_email: String,
/// }
///
/// assert_eq!(BookingCreated::TOPIC, "booking.created");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    note = "add `#[outbox_event]` above the type, next to `#[derive(Serialize, Deserialize)]`"
)]
pub trait Event: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The topic stored with every message of this type, e.g. `booking.created`.
    ///
    /// Renaming the struct changes a derived topic; pin it with
    /// `#[outbox_event(topic = "...")]` so rows already in the table keep their handlers.
    const TOPIC: &'static str;

    /// The idempotency key handlers send downstream for this event, if the payload carries one.
    ///
    /// When this returns `None` (the default) and no key was given at enqueue time, a key is
    /// derived from the message id and the handler name, stable across every retry.
    fn idempotency_key(&self) -> Option<String> {
        None
    }

    /// The ordering key of this event, if its messages must be handled in enqueue order with
    /// the other messages of the same key (of any topic), e.g. `booking:42`.
    ///
    /// A message with a key is not started while an earlier message of its key is pending,
    /// running, waiting for a retry or delayed, nor while one is dead (unless
    /// [`DEAD_RELEASES_KEY`](Event::DEAD_RELEASES_KEY)). "Earlier" is enqueue order: the order of
    /// the message ids, which strictly increase within one process and follow the clock across
    /// processes. That is commit order when the application serialises the writes of one
    /// aggregate (a row lock on it, as it should take anyway). Messages without a key (the
    /// default `None`) are not ordered and pay nothing for the feature.
    ///
    /// `#[outbox_event(ordering_key = "field")]` implements it from a payload field.
    fn ordering_key(&self) -> Option<String> {
        None
    }

    /// Whether a dead message of this event lets the later messages of its ordering key go on.
    ///
    /// `false` (the default): they wait, reported as blocked in the statistics, the metrics and
    /// the health check, until the dead message is retried or discarded.
    /// `#[outbox_event(ordering_key = "field", dead_releases_key)]` sets it to `true`.
    const DEAD_RELEASES_KEY: bool = false;
}

/// A declared event type, registered at link time by `#[outbox_event]`.
///
/// The registry uses these to name events that no linked handler serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventDescriptor {
    topic: &'static str,
    type_name: &'static str,
}

impl EventDescriptor {
    #[doc(hidden)]
    pub const fn __new(topic: &'static str, type_name: &'static str) -> Self {
        Self { topic, type_name }
    }

    /// The topic of the event, e.g. `booking.created`.
    pub const fn topic(&self) -> &'static str {
        self.topic
    }

    /// The Rust path of the event type, e.g. `stayhub::events::BookingCreated`.
    pub const fn type_name(&self) -> &'static str {
        self.type_name
    }
}

inventory::collect!(EventDescriptor);
