//! CloudEvents 1.0 on the broker: the attribute names, the mapping of an outbox message to a
//! CloudEvent (what the relays send with [`NatsPublisherBuilder::cloudevents`] or
//! [`RabbitPublisherBuilder::cloudevents`]), and the CloudEvent the [`inbox`] reads from a
//! producer that is not an outbox relay.
//!
//! The relays use the *binary* content mode: the payload stays the event's JSON, unchanged, and
//! the attributes travel beside it.
//!
//! | attribute | value | NATS header | AMQP |
//! |-----------|-------|-------------|------|
//! | `specversion` | `1.0` | `ce-specversion` | `cloudEvents_specversion` |
//! | `id` | the outbox message id (a UUID) | `ce-id` | `cloudEvents_id` |
//! | `source` | the URI-reference configured on the relay | `ce-source` | `cloudEvents_source` |
//! | `type` | the topic, e.g. `booking.created` | `ce-type` | `cloudEvents_type` |
//! | `time` | the enqueue time, RFC 3339, UTC | `ce-time` | `cloudEvents_time` |
//! | `datacontenttype` | `application/json` | `ce-datacontenttype` and `Content-Type` | the `content-type` property |
//!
//! NATS header values are percent-encoded as the CloudEvents NATS binding says; AMQP values are
//! strings in the headers table (the application properties of the CloudEvents AMQP binding,
//! with the `cloudEvents_` prefix the binding prefers). The W3C trace context goes as
//! `traceparent` and `tracestate`, as without CloudEvents, and the relays' own headers
//! ([`relay::headers`]) and broker dedup ids (`Nats-Msg-Id`, `message_id`) stay as they are.
//!
//! [`NatsPublisherBuilder::cloudevents`]: crate::relay::nats::NatsPublisherBuilder::cloudevents
//! [`RabbitPublisherBuilder::cloudevents`]: crate::relay::rabbitmq::RabbitPublisherBuilder::cloudevents
//! [`relay::headers`]: crate::relay::headers
//! [`inbox`]: crate::inbox

#[cfg(feature = "nats")]
mod percent;
#[cfg(feature = "nats")]
pub(crate) mod read;

use chrono::{DateTime, Utc};
use outbox::Context;
use uuid::Uuid;

use crate::ConfigError;

#[cfg(feature = "nats")]
pub(crate) use percent::encode as percent_encode;

/// The CloudEvents version the relays write, and the major version the inbox reads.
pub const SPEC_VERSION: &str = "1.0";

/// The prefix of a CloudEvents attribute's NATS header: `ce-id`, `ce-source`, ….
pub const NATS_PREFIX: &str = "ce-";

/// The prefix of a CloudEvents attribute in the AMQP headers table, as the CloudEvents AMQP
/// binding prefers it: `cloudEvents_id`, `cloudEvents_source`, ….
pub const AMQP_PREFIX: &str = "cloudEvents_";

/// The media type of a structured-mode CloudEvent in the JSON event format.
pub const STRUCTURED_JSON: &str = "application/cloudevents+json";

/// The attribute names.
pub mod attributes {
    /// The CloudEvents version, `1.0`. Required.
    pub const SPECVERSION: &str = "specversion";
    /// The event's id, unique within its source. Required.
    pub const ID: &str = "id";
    /// Where the event comes from, a URI-reference. Required.
    pub const SOURCE: &str = "source";
    /// The kind of event; the outbox topic. Required.
    pub const TYPE: &str = "type";
    /// When the event happened, RFC 3339.
    pub const TIME: &str = "time";
    /// The media type of the data.
    pub const DATACONTENTTYPE: &str = "datacontenttype";
    /// The version of the event's schema: an extension attribute, written when the message
    /// carries a version ([`Outgoing::version`](super::Outgoing::version)); the inbox decodes
    /// the data by it (1 when absent).
    pub const DATAVERSION: &str = "dataversion";
    /// The W3C trace context (the distributed tracing extension).
    pub const TRACEPARENT: &str = "traceparent";
    /// The W3C `tracestate` that goes with [`TRACEPARENT`].
    pub const TRACESTATE: &str = "tracestate";
    /// The attributes every CloudEvent must have, in the order they are checked.
    pub const REQUIRED: [&str; 4] = [SPECVERSION, ID, SOURCE, TYPE];
}

/// A relay's CloudEvents setting: the `source` of the events it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    source: String,
}

impl CloudEvents {
    /// Checks `source`, which becomes the `source` attribute of every event: a URI-reference
    /// naming the producer, e.g. `https://bookings.example.com` or `/bookings`.
    ///
    /// ```
    /// use outbox_handlers::cloudevents::CloudEvents;
    /// assert_eq!(CloudEvents::new("nats.cloudevents", "/bookings").unwrap().source(), "/bookings");
    /// assert!(CloudEvents::new("nats.cloudevents", "").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `key` when `source` is empty or holds whitespace or
    /// control characters, which a URI-reference cannot.
    pub fn new(key: &str, source: impl Into<String>) -> Result<Self, ConfigError> {
        let source = source.into();
        let bad = |reason: &str| ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.to_string(),
            got: source.chars().take(100).collect(),
        };
        if source.is_empty() {
            return Err(bad(
                "the CloudEvents source must not be empty; give a URI-reference naming the \
                 producer, e.g. `/bookings` or `https://bookings.example.com`",
            ));
        }
        if source.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(
                "the CloudEvents source is a URI-reference, which takes no whitespace or control \
                 characters; percent-encode them",
            ));
        }
        Ok(CloudEvents { source })
    }

    /// The `source` attribute of the events.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The CloudEvent of the delivery `ctx` describes, with the stored version of its event
    /// ([`Context::version`]) as `dataversion`.
    pub fn event<'a>(&'a self, ctx: &'a Context) -> Outgoing<'a> {
        Outgoing {
            id: ctx.message_id(),
            source: &self.source,
            ty: ctx.topic(),
            time: ctx.created_at(),
            version: Some(ctx.version()),
        }
    }
}

/// The attributes of one event a relay sends; see the [module](self) for the mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Outgoing<'a> {
    /// `id`: the outbox message id.
    pub id: Uuid,
    /// `source`: the relay's configured source.
    pub source: &'a str,
    /// `type`: the topic.
    pub ty: &'a str,
    /// `time`: when the message was enqueued.
    pub time: DateTime<Utc>,
    /// The extension attribute [`dataversion`](attributes::DATAVERSION): the version of the
    /// event type the data was written with ([`Context::version`] for the relays); left out
    /// when `None`. Set it with [`with_version`](Self::with_version).
    pub version: Option<u32>,
}

impl Outgoing<'_> {
    /// The same event with `version` as its [`dataversion`](attributes::DATAVERSION).
    ///
    /// ```
    /// # use outbox_handlers::cloudevents::{attributes, CloudEvents};
    /// # let ctx = outbox::Context::for_delivery(uuid::Uuid::nil(), "booking.created", "relay",
    /// #     outbox::Resources::new());
    /// let ce = CloudEvents::new("nats.cloudevents", "/bookings").unwrap();
    /// let event = ce.event(&ctx).with_version(Some(2));
    /// assert!(event.attributes().contains(&(attributes::DATAVERSION, "2".to_string())));
    /// ```
    #[must_use]
    pub fn with_version(mut self, version: Option<u32>) -> Self {
        self.version = version;
        self
    }

    /// The attributes as `(name, canonical string)`, `datacontenttype` aside (each binding
    /// places it its own way).
    ///
    /// ```
    /// # use outbox_handlers::cloudevents::{attributes, CloudEvents};
    /// # let ctx = outbox::Context::for_delivery(uuid::Uuid::nil(), "booking.created", "relay",
    /// #     outbox::Resources::new());
    /// let ce = CloudEvents::new("nats.cloudevents", "/bookings").unwrap();
    /// let attrs = ce.event(&ctx).attributes();
    /// assert_eq!(attrs[0], (attributes::SPECVERSION, "1.0".to_string()));
    /// assert!(attrs.contains(&(attributes::TYPE, "booking.created".to_string())));
    /// ```
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut out = vec![
            (attributes::SPECVERSION, SPEC_VERSION.to_string()),
            (attributes::ID, self.id.to_string()),
            (attributes::SOURCE, self.source.to_string()),
            (attributes::TYPE, self.ty.to_string()),
            (
                attributes::TIME,
                self.time
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
        ];
        if let Some(version) = self.version {
            out.push((attributes::DATAVERSION, version.to_string()));
        }
        out
    }
}

/// How a CloudEvent travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContentMode {
    /// Attributes in headers (`ce-…`), the data as the payload.
    Binary,
    /// Attributes and data in one JSON document (`application/cloudevents+json`).
    Structured,
}

/// A CloudEvent the inbox received from a producer that is not an outbox relay: its context
/// attributes. Among the [`InboxMessage`](crate::inbox::InboxMessage)'s fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudEvent {
    /// `specversion`, `1.` something.
    pub specversion: String,
    /// `id`, unique within its source.
    pub id: String,
    /// `source`.
    pub source: String,
    /// `type`: the topic the inbox routes it by.
    pub ty: String,
    /// `time`, when present.
    pub time: Option<DateTime<Utc>>,
    /// `datacontenttype`, when present.
    pub datacontenttype: Option<String>,
    /// The [`dataversion`](attributes::DATAVERSION) extension, when present: the version of
    /// the event type its data was written with.
    pub dataversion: Option<u32>,
    /// The content mode it arrived in.
    pub mode: ContentMode,
}

/// The namespace of the UUIDs [`CloudEvent::identity`] derives.
const IDENTITY_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2a4e_93d7_4b8a_a5e2_0c7d_41f9_b3e6);

impl CloudEvent {
    /// The event's identity, the key of its processed-id records: [`identity`] of its `source`
    /// and `id`.
    pub fn identity(&self) -> Uuid {
        identity(&self.source, &self.id)
    }
}

/// The identity of the CloudEvent `id` from `source` as a UUID: a name-based UUID (version 5) of
/// both, since an id is unique only within its source. The same event delivered again has the
/// same identity; the same id from another source has another.
///
/// ```
/// use outbox_handlers::cloudevents::identity;
/// assert_eq!(identity("/a", "1"), identity("/a", "1"));
/// assert_ne!(identity("/a", "1"), identity("/b", "1"));
/// assert_ne!(identity("/a", "1"), identity("/a1", ""));
/// ```
pub fn identity(source: &str, id: &str) -> Uuid {
    // The source's length first, so that no other (source, id) pair has the same name.
    let mut name = Vec::with_capacity(8 + source.len() + id.len());
    name.extend_from_slice(&(source.len() as u64).to_be_bytes());
    name.extend_from_slice(source.as_bytes());
    name.extend_from_slice(id.as_bytes());
    Uuid::new_v5(&IDENTITY_NAMESPACE, &name)
}

/// Why a message that claims to be a CloudEvent cannot be read: the inbox terminates it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloudEventError {
    /// A required attribute is absent or empty.
    #[error(
        "the CloudEvent has no `{attribute}` attribute, which CloudEvents 1.0 requires (header \
         `ce-{attribute}` in binary mode, member `{attribute}` in structured mode); the producer \
         must set it"
    )]
    MissingAttribute {
        /// The attribute, one of [`attributes::REQUIRED`].
        attribute: &'static str,
    },
    /// `specversion` is not 1.x.
    #[error(
        "the CloudEvent has specversion `{got}`; this inbox reads CloudEvents 1.x only, so the \
         producer must send version 1.0"
    )]
    UnsupportedSpecVersion {
        /// The specversion received (cut to 100 characters).
        got: String,
    },
    /// An attribute is present but unreadable.
    #[error("the CloudEvent's `{attribute}` attribute is invalid: {reason}")]
    InvalidAttribute {
        /// The attribute's name.
        attribute: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A structured-mode event that is not a JSON object.
    #[error(
        "the structured-mode CloudEvent (content type `{STRUCTURED_JSON}`) is not a JSON object: \
         {0}"
    )]
    NotJson(#[source] serde_json::Error),
    /// A structured mode in an event format other than JSON.
    #[error(
        "the CloudEvent's content type `{content_type}` is an event format this inbox does not \
         read; send `{STRUCTURED_JSON}` or binary mode"
    )]
    UnsupportedFormat {
        /// The content type received.
        content_type: String,
    },
    /// Binary data (`data_base64`) in a structured-mode event.
    #[error(
        "the structured-mode CloudEvent carries `data_base64`; the inbox decodes JSON data only, \
         so send the data as JSON in `data`"
    )]
    BinaryData,
}
