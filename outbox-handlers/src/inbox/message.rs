//! [`InboxMessage`]: the original outbox message behind a delivery, read from the relay's
//! headers.

use async_nats::jetstream::Message;
use chrono::{DateTime, Utc};
use outbox::Context;
use uuid::Uuid;

use crate::relay::headers;

/// The original outbox message behind a delivery, as the relay's headers describe it; in the
/// resources of the [`Context`] an inbox handler gets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InboxMessage {
    /// The outbox message id (`Outbox-Message-Id`): the dedup key.
    pub message_id: Uuid,
    /// The topic (`Outbox-Topic`).
    pub topic: String,
    /// The idempotency key the producer's relay used (`Nats-Msg-Id`), if any.
    pub idempotency_key: Option<String>,
    /// When the producer enqueued the message (`Outbox-Created-At`), if the header parses.
    pub created_at: Option<DateTime<Utc>>,
    /// The NATS subject it arrived on.
    pub subject: String,
    /// Its sequence in the stream.
    pub stream_sequence: u64,
    /// JetStream's delivery count for it, starting at 1: the attempt.
    pub delivered: u32,
    /// The W3C trace context the relay sent (`traceparent`, `tracestate`), if any.
    pub trace: Option<outbox::trace::TraceContext>,
}

impl InboxMessage {
    /// The original message of the delivery `ctx` describes, when the handler runs in an inbox.
    pub fn of(ctx: &Context) -> Option<&InboxMessage> {
        ctx.resources().get::<InboxMessage>()
    }

    /// Reads the relay's headers and JetStream's delivery info of `message`.
    ///
    /// # Errors
    ///
    /// A sentence naming what is missing: the topic or message id header, or the delivery info
    /// (a message that did not come from a JetStream consumer).
    pub fn from_message(message: &Message) -> Result<InboxMessage, String> {
        let get = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_string())
        };
        let topic = get(headers::TOPIC).ok_or_else(|| {
            format!(
                "no `{}` header: not published by an outbox relay",
                headers::TOPIC
            )
        })?;
        let id = get(headers::MESSAGE_ID).ok_or_else(|| {
            format!(
                "no `{}` header: not published by an outbox relay",
                headers::MESSAGE_ID
            )
        })?;
        let message_id = Uuid::parse_str(&id)
            .map_err(|e| format!("`{}` is not a UUID ({e}): `{id}`", headers::MESSAGE_ID))?;
        let info = message
            .info()
            .map_err(|e| format!("no JetStream delivery info: {e}"))?;
        Ok(InboxMessage {
            message_id,
            topic,
            idempotency_key: get("Nats-Msg-Id"),
            created_at: get(headers::CREATED_AT)
                .and_then(|s| DateTime::parse_from_rfc3339(&s).ok())
                .map(|t| t.to_utc()),
            subject: message.subject.to_string(),
            stream_sequence: info.stream_sequence,
            delivered: u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX),
            trace: get(headers::TRACEPARENT)
                .map(|p| outbox::trace::TraceContext::new(p, get(headers::TRACESTATE))),
        })
    }
}
