//! The NATS JetStream relay: publishes each event to a JetStream subject derived from its topic
//! and waits for the stream's acknowledgement.
//!
//! - The subject is `{prefix}.{topic}` (`outbox.booking.created`), or the topic alone without a
//!   prefix, or whatever [`NatsPublisherBuilder::map`] says for that topic.
//! - `Nats-Msg-Id` is the message's [idempotency key](outbox::Context::idempotency_key), the same
//!   on every retry: a stream drops a second publish of the same id within its duplicate window
//!   (`duplicate_window`, two minutes by default), so a relay that crashed after the publish but
//!   before the outbox recorded it leaves one message in the stream, not two.
//! - The headers of [`relay::headers`](super::headers) carry the message id, topic, attempt,
//!   enqueue time and idempotency key; the payload is the event as JSON.
//! - With [`NatsPublisherBuilder::cloudevents`], each message is also a CloudEvents 1.0 event in
//!   binary content mode: `ce-specversion`, `ce-id`, `ce-source`, `ce-type`, `ce-time` and
//!   `ce-datacontenttype` headers beside the others (see [`cloudevents`]).
//! - The handler returns once the stream has acknowledged the message (stored it, or found it a
//!   duplicate). Failures are classified:
//!
//! | failure | outcome |
//! |---------|---------|
//! | no stream captures the subject (confirmed by asking JetStream) | permanent |
//! | the message is larger than the server's `max_payload` or the stream's `max_msg_size` | permanent |
//! | the connection lost | sent again once the client has reconnected; retry if it has not within [`reconnect_wait`](NatsPublisherBuilder::reconnect_wait) |
//! | no answer in time, no responders while JetStream cannot say whether a stream exists | retry |
//! | any other error the stream reports | retry |
//!
//! One [`async_nats::Client`] (and its `jetstream::Context`, cheap to clone) serves every relay
//! and every concurrent call: the worker's concurrency is the number of publishes in flight, each
//! call waiting for its own acknowledgement.
//!
//! # Outages
//!
//! The client reconnects by itself. Meanwhile publishes wait for it, both those whose
//! acknowledgement the lost connection took with it (sent again as soon as the client is back,
//! rather than after the JetStream timeout: the stream drops the copy if the first one reached
//! it) and those that come while it is away, up to
//! [`reconnect_wait`](NatsPublisherBuilder::reconnect_wait) (10 s unless set); then they fail, to
//! be retried by the worker.
//!
//! An outage is logged twice, at WARN, however many publishes it holds up: once when a publish
//! finds the connection lost, and once when the stream acknowledges a publish on a new one.
//! Connections lost again before that (a network that keeps cutting them) belong to the same
//! outage, and the second line counts them.
//!
//! ```text
//! WARN NATS connection lost (the client is disconnected); 64 publishes in flight will be retried relay="nats" error=the client is disconnected in_flight=64
//! WARN NATS connection restored after 1.2s; 80 publishes waited for it relay="nats" outage_secs=1.2 losses=1 waited=80
//! ```
//!
//! The counters `outbox_relay_connection_losses_total` (every connection lost) and
//! `outbox_relay_publishes_waited_for_reconnect_total` (label `relay="nats"`) count the same; see
//! [`metrics`](crate::metrics). The client itself logs each disconnect and reconnect at INFO
//! (target `async_nats`), and an attempt to reconnect that is cut during its handshake at ERROR
//! (`async_nats::connector`: "connection closed unexpectedly"): once per attempt, which its own
//! pause between attempts spaces out, never per publish.
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Worker};
//! use outbox_handlers::relay::nats::NatsPublisher;
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64 }
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCancelled { booking_id: i64 }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let client = async_nats::connect("127.0.0.1:4222").await?;
//! let nats = NatsPublisher::builder(async_nats::jetstream::new(client))
//!     .prefix("outbox") // outbox.booking.created, outbox.booking.cancelled
//!     .build()?;
//! let worker = Worker::builder(&pool)
//!     .handler(nats.relay::<BookingCreated>())
//!     .handler(nats.relay::<BookingCancelled>())
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! To register relays at link time instead, add the [`NatsPublisher`] to the worker's resources
//! and write `outbox::register_handler!(NatsRelay<BookingCreated>);`.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::jetstream::context::{
    GetStreamByNameErrorKind, PublishAckFuture, PublishError, PublishErrorKind,
};
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{Client, HeaderMap};
use async_trait::async_trait;
use outbox::{
    Context, Event, FromResources, Handler, HandlerError, RawHandler, ResourceError, Resources,
};

use super::headers;
use super::outage::Outages;
use crate::cloudevents::{self, CloudEvents};

mod builder;

pub use builder::NatsPublisherBuilder;

/// How long a publish waits for a lost connection to come back when nothing else is set.
pub const DEFAULT_RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// How often a waiting publish looks at the client's connection: the client tells no one.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Publishes outbox messages to JetStream: the shared connection and the topic-to-subject rule.
///
/// Cheap to clone (one `jetstream::Context` and an `Arc`); build it once and hand out relays with
/// [`relay`](Self::relay), or put it in the worker's resources for relays registered with
/// `register_handler!`.
#[derive(Clone)]
pub struct NatsPublisher {
    js: jetstream::Context,
    subjects: Arc<Subjects>,
    /// The connection's outages, reported once each.
    outages: Arc<Outages>,
    /// How long a publish waits for the connection.
    reconnect_wait: Duration,
    /// The CloudEvents source, when messages go out as CloudEvents.
    cloudevents: Option<Arc<CloudEvents>>,
}

#[derive(Debug)]
struct Subjects {
    prefix: Option<String>,
    map: BTreeMap<String, String>,
}

impl NatsPublisher {
    /// Starts a publisher on `js`, a JetStream context (`async_nats::jetstream::new(client)`).
    /// Its publish timeout (5 s by default, `jetstream::ContextBuilder::timeout`) bounds the wait
    /// for each acknowledgement.
    pub fn builder(js: jetstream::Context) -> NatsPublisherBuilder {
        NatsPublisherBuilder {
            js,
            prefix: None,
            map: Vec::new(),
            reconnect_wait: DEFAULT_RECONNECT_WAIT,
            cloudevents: None,
        }
    }

    /// A publisher with no prefix: each topic is its own subject.
    pub fn new(js: jetstream::Context) -> Self {
        NatsPublisher {
            js,
            subjects: Arc::new(Subjects {
                prefix: None,
                map: BTreeMap::new(),
            }),
            outages: Arc::new(Outages::new("NATS", "nats", None)),
            reconnect_wait: DEFAULT_RECONNECT_WAIT,
            cloudevents: None,
        }
    }

    /// The subject messages of `topic` are published to.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use outbox_handlers::relay::nats::NatsPublisher;
    /// # let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
    /// let nats = NatsPublisher::builder(js).prefix("outbox").map("user.deleted", "gdpr.erase").build()?;
    /// assert_eq!(nats.subject("booking.created"), "outbox.booking.created");
    /// assert_eq!(nats.subject("user.deleted"), "gdpr.erase");
    /// # Ok(()) }
    /// ```
    pub fn subject(&self, topic: &str) -> String {
        if let Some(s) = self.subjects.map.get(topic) {
            return s.clone();
        }
        match &self.subjects.prefix {
            Some(p) => format!("{p}.{topic}"),
            None => topic.to_string(),
        }
    }

    /// The JetStream context publishes go through.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// A relay of the events of type `E`, sharing this publisher's connection.
    pub fn relay<E: Event>(&self) -> NatsRelay<E> {
        NatsRelay {
            publisher: self.clone(),
            _event: PhantomData,
        }
    }

    /// Publishes `event` as the delivery `ctx` describes and waits for the stream's
    /// acknowledgement: what [`NatsRelay`] does, for handlers of your own that publish more than
    /// one message or decide whether to publish.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`] classified as the [module](self) describes.
    pub async fn publish<E: Event>(
        &self,
        event: &E,
        ctx: &Context,
    ) -> Result<PublishAck, HandlerError> {
        let payload = serde_json::to_vec(event).map_err(HandlerError::permanent)?;
        self.publish_payload(payload, ctx).await
    }

    /// Publishes a payload as stored (the JSON written at enqueue) as the delivery `ctx`
    /// describes, and waits for the stream's acknowledgement: what the publisher does as a
    /// [`RawHandler`].
    ///
    /// # Errors
    ///
    /// A [`HandlerError`] classified as the [module](self) describes.
    pub async fn publish_payload(
        &self,
        payload: Vec<u8>,
        ctx: &Context,
    ) -> Result<PublishAck, HandlerError> {
        let subject = self.subject(ctx.topic());
        let payload = bytes::Bytes::from(payload);
        let header_map = message_headers(ctx, self.cloudevents.as_deref());
        let client = self.js.client();
        let deadline = Instant::now() + self.reconnect_wait;
        let mut waited = false;
        loop {
            let connection = self.connected(&client, deadline, &mut waited).await?;
            let sent = self.outages.sent(connection);
            let answer = match self
                .js
                .publish_with_headers(subject.clone(), header_map.clone(), payload.clone())
                .await
            {
                Ok(pending) => self.answer(pending, &client, connection).await,
                Err(e) => Answer::Failed(e),
            };
            let lost = match answer {
                Answer::Acked(ack) => {
                    self.outages.answered(connection);
                    if ack.duplicate {
                        tracing::debug!(
                            stream = %ack.stream,
                            sequence = ack.sequence,
                            "the stream already held this message (a redelivery); not stored again"
                        );
                    }
                    return Ok(ack);
                }
                Answer::Lost(why) => why,
                Answer::Failed(e)
                    if matches!(
                        e.kind(),
                        PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe
                    ) && connection_changed(&client, connection) =>
                {
                    e.to_string()
                }
                Answer::Failed(e) => return Err(self.classify(e, &subject).await),
            };
            // Sent again once the client is back: the stream drops the copy if the first
            // reached it.
            self.outages.lost(connection, &lost);
            drop(sent);
            waited = true;
        }
    }

    /// The number of the client's connection (how many it has made) once it is connected,
    /// waiting for it until `deadline`; `waited` records that this publish waited.
    async fn connected(
        &self,
        client: &Client,
        deadline: Instant,
        waited: &mut bool,
    ) -> Result<u64, HandlerError> {
        loop {
            let connection = client.statistics().connects.load(Ordering::Relaxed);
            if client.connection_state() == State::Connected {
                return Ok(connection);
            }
            self.outages.lost(connection, &"the client is disconnected");
            self.outages.waits(waited);
            if Instant::now() >= deadline {
                return Err(HandlerError::retry(format!(
                    "NATS is unreachable ({}); waited {:?} for the client to reconnect",
                    self.outages
                        .error()
                        .as_deref()
                        .unwrap_or("the client is disconnected"),
                    self.reconnect_wait,
                )));
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// The stream's answer to a publish sent on connection `connection`, unless the client
    /// reconnects first: the answer may then never come.
    async fn answer(&self, pending: PublishAckFuture, client: &Client, connection: u64) -> Answer {
        let mut ack = std::pin::pin!(std::future::IntoFuture::into_future(pending));
        loop {
            tokio::select! {
                answer = &mut ack => return match answer {
                    Ok(ack) => Answer::Acked(ack),
                    Err(e) => Answer::Failed(e),
                },
                () = tokio::time::sleep(LOOK_EVERY) => {
                    if client.connection_state() != State::Connected {
                        self.outages.lost(connection, &"the client is disconnected");
                    } else if connection_changed(client, connection) {
                        return Answer::Lost(
                            "the client reconnected before the stream answered".to_string(),
                        );
                    }
                }
            }
        }
    }

    /// Turns a failed publish into the worker's next step.
    async fn classify(&self, e: PublishError, subject: &str) -> HandlerError {
        match e.kind() {
            PublishErrorKind::MaxPayloadExceeded => HandlerError::permanent(format!(
                "NATS refused the message for subject `{subject}` as too large: {e}"
            )),
            // No responders: either no stream captures the subject, or JetStream is not up.
            // Only JetStream itself can tell which; ask it.
            PublishErrorKind::StreamNotFound => {
                match self.js.stream_by_subject(subject.to_string()).await {
                    Err(lookup) if lookup.kind() == GetStreamByNameErrorKind::NotFound => {
                        HandlerError::permanent(format!(
                            "no JetStream stream captures subject `{subject}` ({e}); create a \
                             stream whose subjects include it, or change the relay's prefix or \
                             mapping"
                        ))
                    }
                    Err(lookup) => HandlerError::retry(format!(
                        "publish to `{subject}` had no responders ({e}), and JetStream did not \
                         say whether a stream exists ({lookup})"
                    )),
                    Ok(stream) => HandlerError::retry(format!(
                        "publish to `{subject}` had no responders ({e}) although stream \
                         `{stream}` captures it"
                    )),
                }
            }
            PublishErrorKind::Other => {
                let code = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<jetstream::Error>())
                    .map(|j| j.error_code());
                match code {
                    Some(ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM) => HandlerError::permanent(
                        format!("the stream refused the message for `{subject}` as too large: {e}"),
                    ),
                    Some(ErrorCode::STREAM_NOT_FOUND) => HandlerError::permanent(format!(
                        "no JetStream stream for subject `{subject}`: {e}"
                    )),
                    _ => HandlerError::retry(format!("publish to `{subject}` failed: {e}")),
                }
            }
            _ => HandlerError::retry(format!("publish to `{subject}` failed: {e}")),
        }
    }
}

/// How a publish ended.
enum Answer {
    Acked(PublishAck),
    Failed(PublishError),
    /// The connection it went out on is lost, as the text says.
    Lost(String),
}

/// Whether the client is no longer on connection `connection`: disconnected, or reconnected.
fn connection_changed(client: &Client, connection: u64) -> bool {
    client.connection_state() != State::Connected
        || client.statistics().connects.load(Ordering::Relaxed) != connection
}

impl fmt::Debug for NatsPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsPublisher")
            .field("prefix", &self.subjects.prefix)
            .field("map", &self.subjects.map)
            .field("cloudevents", &self.cloudevents)
            .finish_non_exhaustive()
    }
}

/// The headers of one published message, with the CloudEvents attributes when `cloudevents` is
/// set.
fn message_headers(ctx: &Context, cloudevents: Option<&CloudEvents>) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(async_nats::header::NATS_MESSAGE_ID, ctx.idempotency_key());
    h.insert(headers::MESSAGE_ID, ctx.message_id().to_string().as_str());
    h.insert(headers::TOPIC, ctx.topic());
    h.insert(headers::ATTEMPT, ctx.attempt().to_string().as_str());
    h.insert(headers::CREATED_AT, super::created_at_header(ctx).as_str());
    h.insert(headers::IDEMPOTENCY_KEY, ctx.idempotency_key());
    h.insert(headers::VERSION, ctx.version().to_string().as_str());
    h.insert("Content-Type", headers::JSON);
    if let Some(trace) = ctx.trace_context() {
        h.insert(headers::TRACEPARENT, trace.traceparent());
        if let Some(state) = trace.tracestate() {
            h.insert(headers::TRACESTATE, state);
        }
    }
    if let Some(ce) = cloudevents {
        for (name, value) in ce.event(ctx).attributes() {
            let header = format!("{}{name}", cloudevents::NATS_PREFIX);
            h.insert(
                header.as_str(),
                cloudevents::percent_encode(&value).as_str(),
            );
        }
        let content_type = format!(
            "{}{}",
            cloudevents::NATS_PREFIX,
            cloudevents::attributes::DATACONTENTTYPE
        );
        h.insert(content_type.as_str(), headers::JSON);
    }
    h
}

/// Relays the events of type `E` to JetStream: a [`Handler`] named `nats-relay`.
///
/// Made by [`NatsPublisher::relay`], or from the worker's resources (which must hold a
/// [`NatsPublisher`]) when registered with `register_handler!(NatsRelay<E>)`.
///
/// # About type parameter `E`
///
/// The event type relayed; its topic decides the subject.
pub struct NatsRelay<E> {
    publisher: NatsPublisher,
    _event: PhantomData<fn() -> E>,
}

impl<E> NatsRelay<E> {
    /// The publisher this relay uses.
    pub fn publisher(&self) -> &NatsPublisher {
        &self.publisher
    }
}

impl<E> Clone for NatsRelay<E> {
    fn clone(&self) -> Self {
        NatsRelay {
            publisher: self.publisher.clone(),
            _event: PhantomData,
        }
    }
}

impl<E> fmt::Debug for NatsRelay<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsRelay")
            .field("event", &std::any::type_name::<E>())
            .field("publisher", &self.publisher)
            .finish()
    }
}

#[async_trait]
impl<E: Event> Handler for NatsRelay<E> {
    type Event = E;
    const NAME: &'static str = "nats-relay";

    async fn handle(&self, event: E, ctx: &Context) -> Result<(), HandlerError> {
        self.publisher.publish(&event, ctx).await.map(|_| ())
    }
}

/// The publisher itself relays any topic, payload as stored: add it for every declared event
/// with [`WorkerBuilder::raw_handler_for_declared_events`](outbox::WorkerBuilder::raw_handler_for_declared_events)
/// (the JSON the producer wrote reaches the stream unchanged, fields no type knows included),
/// or per topic with [`WorkerBuilder::raw_handler`](outbox::WorkerBuilder::raw_handler).
/// Named `nats-relay`, as the typed relay: one topic has one or the other.
#[async_trait]
impl RawHandler for NatsPublisher {
    const NAME: &'static str = "nats-relay";

    async fn handle_raw(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError> {
        self.publish_payload(payload.as_bytes().to_vec(), ctx)
            .await
            .map(drop)
    }
}

/// Built from the [`NatsPublisher`] among the worker's resources.
impl<E: Event> FromResources for NatsRelay<E> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(resources.require::<NatsPublisher>()?.relay())
    }
}
