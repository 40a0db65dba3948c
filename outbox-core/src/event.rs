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
    /// [`DEAD_RELEASES_KEY`](Event::DEAD_RELEASES_KEY)). "Earlier" is the order in which the
    /// database inserted the messages (a number it gives each keyed row), whatever the
    /// producers' clocks say. That is commit order when the application serialises the writes
    /// of one aggregate (a row lock on it, as it should take anyway). Messages without a key (the
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

    /// The version of this type's shape, stored with every message (default 1).
    ///
    /// Adding a field with `#[serde(default)]` needs no new version. A change that old payloads
    /// do not deserialize into (a renamed or split field) does: keep the old type, and give the
    /// new one `#[outbox_event(version = 2, previous = OldType)]` and `impl From<OldType> for
    /// NewType`. The topic stays the same across versions. A worker takes only messages whose
    /// version it knows: newer ones wait for a worker built with the newer type.
    const VERSION: u32 = 1;

    /// How long delivered events of this topic stay in the event log, where they can be
    /// listed and replayed; `None` (the default) deletes a message once delivered.
    ///
    /// `#[outbox_event(retain = "180d")]` sets it. Each worker records the windows of the
    /// events it links in the database at start, and a recorded window only grows that way:
    /// a worker of an older build, or one that does not link the type, never shortens it.
    /// [`Store::set_retention`](crate::Store::set_retention) sets it on purpose, after which
    /// the declarations leave it alone.
    const RETAIN: Option<std::time::Duration> = None;

    /// Decodes a stored payload of version `version` into this type.
    ///
    /// The default reads version [`VERSION`](Event::VERSION) only. `#[outbox_event(previous =
    /// ...)]` implements it for older versions too: a payload of an older version is read as
    /// the type of that version and converted, `From` after `From`, up to this type. A payload
    /// of the current version is parsed once, as without versions.
    ///
    /// # Errors
    ///
    /// [`DecodeError::Payload`] when the JSON does not fit the type of its version,
    /// [`DecodeError::UnknownVersion`] when no type of the chain has that version.
    ///
    /// # Example
    ///
    /// ```
    /// use outbox::{outbox_event, Event};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[outbox_event(topic = "guest.registered")]
    /// #[derive(Serialize, Deserialize)]
    /// struct GuestRegisteredV1 { name: String }
    ///
    /// #[outbox_event(topic = "guest.registered", version = 2, previous = GuestRegisteredV1)]
    /// #[derive(Serialize, Deserialize)]
    /// struct GuestRegistered { first_name: String, last_name: String }
    ///
    /// impl From<GuestRegisteredV1> for GuestRegistered {
    ///     fn from(v1: GuestRegisteredV1) -> Self {
    ///         let (first, last) = v1.name.split_once(' ').unwrap_or((&v1.name, ""));
    ///         Self { first_name: first.into(), last_name: last.into() }
    ///     }
    /// }
    ///
    /// let guest = GuestRegistered::decode_versioned(1, r#"{"name":"Ada Lovelace"}"#).unwrap();
    /// assert_eq!(guest.last_name, "Lovelace");
    /// assert!(GuestRegistered::decode_versioned(3, "{}").is_err());
    /// ```
    fn decode_versioned(version: u32, json: &str) -> Result<Self, DecodeError> {
        decode_current(version, json)
    }

    /// Adds `(version, type name)` of this type and of its previous versions to `out`.
    #[doc(hidden)]
    fn __versions(out: &mut Vec<(u32, &'static str)>) {
        out.push((Self::VERSION, std::any::type_name::<Self>()));
    }
}

/// Decodes `json` as `E` if `version` is `E`'s own version.
#[doc(hidden)]
pub fn decode_current<E: Event>(version: u32, json: &str) -> Result<E, DecodeError> {
    if version == E::VERSION {
        serde_json::from_str(json).map_err(|source| DecodeError::Payload {
            type_name: std::any::type_name::<E>(),
            version,
            source,
        })
    } else {
        Err(DecodeError::UnknownVersion {
            topic: E::TOPIC,
            type_name: std::any::type_name::<E>(),
            version,
            current: E::VERSION,
        })
    }
}

/// Whether two topics are the same, in a constant (the check that `previous` shares the topic).
#[doc(hidden)]
pub const fn same_topic(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A stored payload could not be decoded into a handler's event type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The JSON does not deserialize into the type of its stored version.
    #[error(
        "payload of version {version} does not deserialize into `{type_name}`: {source}; fix \
         the payload or make the type accept it (e.g. #[serde(default)] on new fields)"
    )]
    Payload {
        /// The Rust type of the stored version.
        type_name: &'static str,
        /// The stored version.
        version: u32,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// No type of the event's chain of versions has the stored version.
    #[error(
        "version {version} of topic `{topic}` has no type here: `{type_name}` is version \
         {current}; name the type of version {version} with `#[outbox_event(previous = ...)]`"
    )]
    UnknownVersion {
        /// The topic of the message.
        topic: &'static str,
        /// The handler's event type, the newest of its chain.
        type_name: &'static str,
        /// The stored version.
        version: u32,
        /// The version of `type_name`.
        current: u32,
    },
}

/// A declared event type, registered at link time by `#[outbox_event]`.
///
/// The registry uses these to name events that no linked handler serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventDescriptor {
    topic: &'static str,
    version: u32,
    type_name: &'static str,
    retain_secs: u64,
}

impl EventDescriptor {
    #[doc(hidden)]
    pub const fn __new(topic: &'static str, version: u32, type_name: &'static str) -> Self {
        Self {
            topic,
            version,
            type_name,
            retain_secs: 0,
        }
    }

    #[doc(hidden)]
    #[must_use]
    pub const fn __retain(mut self, secs: u64) -> Self {
        self.retain_secs = secs;
        self
    }

    /// How long delivered events of this topic stay in the event log ([`Event::RETAIN`]).
    pub const fn retain(&self) -> Option<std::time::Duration> {
        if self.retain_secs == 0 {
            None
        } else {
            Some(std::time::Duration::from_secs(self.retain_secs))
        }
    }

    /// The version of the event's shape ([`Event::VERSION`]).
    pub const fn version(&self) -> u32 {
        self.version
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
