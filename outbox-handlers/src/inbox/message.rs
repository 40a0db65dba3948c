//! [`InboxMessage`]: the original message behind a delivery, read from the relay's headers or
//! from the CloudEvents attributes of a producer that is not an outbox relay.

use async_nats::jetstream::Message;
use chrono::{DateTime, Utc};
use outbox::Context;
use uuid::Uuid;

use crate::cloudevents::read;
use crate::cloudevents::{CloudEvent, CloudEventError};
use crate::relay::headers;

/// The original message behind a delivery, as the relay's headers (or the CloudEvent's
/// attributes) describe it; in the resources of the [`Context`] an inbox handler gets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxMessage {
    /// The dedup key: the outbox message id (`Outbox-Message-Id`), or for a CloudEvent from
    /// another producer the [identity](CloudEvent::identity) of its `source` and `id`.
    pub message_id: Uuid,
    /// The topic (`Outbox-Topic`, or the CloudEvent's `type`).
    pub topic: String,
    /// The idempotency key the producer's relay used (`Nats-Msg-Id`), if any.
    pub idempotency_key: Option<String>,
    /// When the producer enqueued the message (`Outbox-Created-At`, or the CloudEvent's `time`),
    /// if known.
    pub created_at: Option<DateTime<Utc>>,
    /// The NATS subject it arrived on.
    pub subject: String,
    /// Its sequence in the stream.
    pub stream_sequence: u64,
    /// JetStream's delivery count for it, starting at 1: the attempt.
    pub delivered: u32,
    /// The version of the event type the payload was written with (`Outbox-Version`, or the
    /// CloudEvent's `dataversion`), 1 when the producer sent none: the handler's event type
    /// decodes it through its chain of previous versions.
    pub version: u32,
    /// The W3C trace context the relay sent (`traceparent`, `tracestate`), if any.
    pub trace: Option<outbox::trace::TraceContext>,
    /// The CloudEvent's attributes, when the message came from a producer that is not an outbox
    /// relay; `None` for a relay's message, with or without CloudEvents headers.
    pub cloudevent: Option<CloudEvent>,
}

/// Why a message cannot be read: the inbox terminates it.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unreadable {
    /// Neither a relay's message nor a CloudEvent, or without delivery info.
    #[error("{0}")]
    Message(String),
    /// A CloudEvent that lacks or garbles an attribute.
    #[error(transparent)]
    CloudEvent(#[from] CloudEventError),
}

impl Unreadable {
    /// A permanent failure whose source is the [`CloudEventError`] itself, for callers to
    /// downcast.
    pub(super) fn into_handler_error(self) -> outbox::HandlerError {
        match self {
            Unreadable::Message(why) => outbox::HandlerError::permanent(why),
            Unreadable::CloudEvent(e) => outbox::HandlerError::permanent(e),
        }
    }
}

impl InboxMessage {
    /// The original message of the delivery `ctx` describes, when the handler runs in an inbox.
    pub fn of(ctx: &Context) -> Option<&InboxMessage> {
        ctx.resources().get::<InboxMessage>()
    }

    /// Reads the relay's headers, or the CloudEvents attributes, and JetStream's delivery info
    /// of `message`. A message with the relay's topic and message id headers is read by them,
    /// whether or not it also carries CloudEvents headers.
    ///
    /// # Errors
    ///
    /// A sentence naming what is missing: the topic or message id header of a message that is
    /// not a CloudEvent, a required attribute of a CloudEvent, or the delivery info (a message
    /// that did not come from a JetStream consumer).
    pub fn from_message(message: &Message) -> Result<InboxMessage, String> {
        read_message(message)
            .map(|(meta, _)| meta)
            .map_err(|e| e.to_string())
    }
}

/// The message's [`InboxMessage`], and its data when that is not the payload as received (a
/// structured-mode CloudEvent).
pub(super) fn read_message(
    message: &Message,
) -> Result<(InboxMessage, Option<Vec<u8>>), Unreadable> {
    let get = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    let info = message
        .info()
        .map_err(|e| Unreadable::Message(format!("no JetStream delivery info: {e}")))?;
    let mut meta = InboxMessage {
        message_id: Uuid::nil(),
        topic: String::new(),
        idempotency_key: get("Nats-Msg-Id"),
        created_at: None,
        subject: message.subject.to_string(),
        stream_sequence: info.stream_sequence,
        delivered: u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX),
        version: 1,
        trace: get(headers::TRACEPARENT)
            .map(|p| outbox::trace::TraceContext::new(p, get(headers::TRACESTATE))),
        cloudevent: None,
    };
    let relayed = (get(headers::TOPIC), get(headers::MESSAGE_ID));
    if let (Some(topic), Some(id)) = relayed {
        meta.message_id = Uuid::parse_str(&id).map_err(|e| {
            Unreadable::Message(format!(
                "`{}` is not a UUID ({e}): `{id}`",
                headers::MESSAGE_ID
            ))
        })?;
        meta.topic = topic;
        meta.created_at = get(headers::CREATED_AT)
            .and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
            .map(|t| t.to_utc());
        if let Some(version) = get(headers::VERSION) {
            meta.version = version.parse().ok().filter(|v| *v >= 1).ok_or_else(|| {
                Unreadable::Message(format!(
                    "`{}` is not a version (an integer from 1): `{}`",
                    headers::VERSION,
                    version.chars().take(100).collect::<String>()
                ))
            })?;
        }
        return Ok((meta, None));
    }
    let Some(received) = read::from_nats(message.headers.as_ref(), &message.payload) else {
        let missing = match relayed {
            (None, _) => headers::TOPIC,
            (_, _) => headers::MESSAGE_ID,
        };
        return Err(Unreadable::Message(format!(
            "no `{missing}` header and no CloudEvents attributes: not published by an outbox \
             relay nor a CloudEvents producer"
        )));
    };
    let received = received?;
    meta.message_id = received.event.identity();
    meta.topic.clone_from(&received.event.ty);
    meta.created_at = received.event.time;
    meta.version = received.event.dataversion.unwrap_or(1);
    if meta.trace.is_none() {
        meta.trace = received
            .traceparent
            .map(|p| outbox::trace::TraceContext::new(p, received.tracestate));
    }
    meta.cloudevent = Some(received.event);
    Ok((meta, received.data))
}
