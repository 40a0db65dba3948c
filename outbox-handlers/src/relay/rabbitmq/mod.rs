//! The RabbitMQ relay: publishes each event to an exchange with publisher confirms and returns
//! once the broker has confirmed it.
//!
//! - Exchange and routing key come from the topic: the publisher's exchange (`outbox` by default)
//!   and the topic as routing key, or whatever [`RabbitPublisherBuilder::map`] says for that topic.
//!   The relay declares nothing: declare exchanges, queues and bindings where you manage your
//!   broker's topology.
//! - Messages are persistent (`delivery_mode` 2), `message_id` is the message's
//!   [idempotency key](outbox::Context::idempotency_key) (the same on every retry, for consumers
//!   to dedup: RabbitMQ itself does not), `type` is the topic, `timestamp` the enqueue time, and
//!   the headers table carries the names of [`relay::headers`](super::headers).
//! - With [`RabbitPublisherBuilder::cloudevents`], each message is also a CloudEvents 1.0 event
//!   in binary content mode, as the CloudEvents AMQP binding maps it: `cloudEvents_specversion`,
//!   `cloudEvents_id`, `cloudEvents_source`, `cloudEvents_type` and `cloudEvents_time` in the
//!   headers table, `datacontenttype` as the `content-type` property (see
//!   [`cloudevents`]).
//! - Publishes are `mandatory`: a message no queue is bound to receive comes back from the broker
//!   and is a permanent failure naming the exchange and routing key, instead of vanishing.
//!
//! | failure | outcome |
//! |---------|---------|
//! | unroutable (returned by the broker) | permanent |
//! | the exchange does not exist (`NOT_FOUND`) | permanent |
//! | refused as too large (`CONTENT_TOO_LARGE`, `PRECONDITION_FAILED`) | permanent |
//! | connection lost | sent again once it is back; retry if it is not back within [`reconnect_wait`](RabbitPublisherBuilder::reconnect_wait) |
//! | negatively confirmed (`nack`), channel lost, anything else | retry |
//!
//! One connection serves every relay and every concurrent call; each call in flight publishes on
//! a confirm-mode channel of its own, kept open for the next call, because RabbitMQ's confirms
//! and returns can be matched to their publish only on a channel with one publish in flight.
//! At most [`max_channels`](RabbitPublisherBuilder::max_channels) channels are open, 128 unless
//! set; a call beyond them waits for one.
//!
//! # Outages
//!
//! The connection is made on the first publish. Once it is lost, one background task makes it
//! again, at once and then after a pause that doubles up to 5 s. Meanwhile every publish waits
//! for it, both those the loss caught in flight (which may or may not have reached the broker:
//! they are sent again, as a retry by the worker would) and those that come during the outage,
//! up to [`reconnect_wait`](RabbitPublisherBuilder::reconnect_wait) (10 s unless set); then they
//! fail, to be retried by the worker.
//!
//! An outage is logged twice, at WARN, however many publishes it holds up and however many
//! attempts to connect fail meanwhile: once when the connection is lost, and once when the
//! broker confirms a publish on a new one. Connections lost again before that (a network that
//! keeps cutting them) belong to the same outage, and the second line counts them.
//!
//! ```text
//! WARN RabbitMQ connection lost (IO error: connection aborted); 64 publishes in flight will be retried relay="rabbitmq" broker="mq1:5672" error=IO error: connection aborted in_flight=64
//! WARN RabbitMQ connection restored after 1.8s; 212 publishes waited for it relay="rabbitmq" broker="mq1:5672" outage_secs=1.8 losses=1 waited=212
//! ```
//!
//! When the first connection cannot be made, the first line is `cannot connect to RabbitMQ
//! (…); publishes wait for the connection` and the second `RabbitMQ connection made after …`.
//! The counters `outbox_relay_connection_losses_total` (every connection lost) and
//! `outbox_relay_publishes_waited_for_reconnect_total` (label `relay="rabbitmq"`) count the
//! same; see [`metrics`](crate::metrics).
//!
//! The AMQP client, lapin, logs each lost connection and each failed attempt to connect itself,
//! at ERROR, in two or three lines (targets `lapin::io_loop`, `lapin::channels`,
//! `lapin::channel`); it also logs every message the broker returns as unroutable, at WARN
//! (`lapin::returned_messages`), which the relay reports as a permanent failure. It has no
//! setting for it; the relay's own lines say the same, so a relay worker can leave lapin out of
//! its log with the `tracing_subscriber::EnvFilter` (`RUST_LOG`) directive:
//!
//! ```text
//! lapin=off
//! ```
//!
//! e.g. `RUST_LOG=info,lapin=off`.
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Worker};
//! use outbox_handlers::relay::rabbitmq::RabbitPublisher;
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64 }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let rabbit = RabbitPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .exchange("bookings") // routing key booking.created
//!     .build()?;
//! let worker = Worker::builder(&pool)
//!     .handler(rabbit.relay::<BookingCreated>())
//!     .build()?;
//! # Ok(()) }
//! ```

mod builder;
mod channel;
mod link;

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::options::BasicPublishOptions;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation, ErrorKind};
use outbox::{
    Context, Event, FailureKind, FromResources, Handler, HandlerError, RawHandler, ResourceError,
    Resources,
};
use tokio::sync::Semaphore;

pub use builder::RabbitPublisherBuilder;

use super::headers;
use super::outage::Outages;
use crate::cloudevents::{self, CloudEvents};

/// The exchange used when none is set.
pub const DEFAULT_EXCHANGE: &str = "outbox";

/// The channels a publisher opens at most when none is set: as many publishes in flight.
pub const DEFAULT_MAX_CHANNELS: usize = 128;

/// How long a publish waits for a lost connection to come back when nothing else is set.
pub const DEFAULT_RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// Publishes outbox messages to RabbitMQ: the shared connection and the topic-to-route rule.
///
/// Cheap to clone (an `Arc`). It connects on the first publish, and again after the connection
/// is lost.
#[derive(Clone)]
pub struct RabbitPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    uri: String,
    exchange: String,
    map: BTreeMap<String, (String, String)>,
    /// The shared connection, and the task that makes it again once it is lost.
    link: link::Link,
    /// The connection's outages, reported once each.
    outages: Outages,
    /// How long a publish waits for the connection.
    reconnect_wait: Duration,
    /// Open confirm-mode channels with no publish in flight; see [`channel::Lease`].
    idle: channel::Idle,
    /// One permit per channel the publisher may have open: a publish holds one while in flight.
    channels: Semaphore,
    /// The CloudEvents source, when messages go out as CloudEvents.
    cloudevents: Option<CloudEvents>,
}

impl RabbitPublisher {
    /// Starts a publisher on the broker at `uri` (`amqp://user:password@host:5672/%2f`).
    pub fn builder(uri: impl Into<String>) -> RabbitPublisherBuilder {
        RabbitPublisherBuilder::new(uri.into())
    }

    /// The exchange and routing key messages of `topic` are published with.
    ///
    /// ```
    /// use outbox_handlers::relay::rabbitmq::RabbitPublisher;
    /// let rabbit = RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .map("user.deleted", "gdpr", "erase")
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(rabbit.route("booking.created"), ("outbox", "booking.created"));
    /// assert_eq!(rabbit.route("user.deleted"), ("gdpr", "erase"));
    /// ```
    pub fn route<'a>(&'a self, topic: &'a str) -> (&'a str, &'a str) {
        match self.inner.map.get(topic) {
            Some((exchange, key)) => (exchange, key),
            None => (&self.inner.exchange, topic),
        }
    }

    /// A relay of the events of type `E`, sharing this publisher's connection.
    pub fn relay<E: Event>(&self) -> RabbitRelay<E> {
        RabbitRelay {
            publisher: self.clone(),
            _event: PhantomData,
        }
    }
}

impl RabbitPublisher {
    /// Publishes `event` as the delivery `ctx` describes and waits for the broker's confirm: what
    /// [`RabbitRelay`] does, for handlers of your own.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`] classified as the [module](self) describes.
    pub async fn publish<E: Event>(&self, event: &E, ctx: &Context) -> Result<(), HandlerError> {
        let payload = serde_json::to_vec(event).map_err(HandlerError::permanent)?;
        self.publish_payload(&payload, ctx).await
    }

    /// Publishes a payload as stored (the JSON written at enqueue) as the delivery `ctx`
    /// describes, and waits for the broker's confirm: what the publisher does as a
    /// [`RawHandler`].
    ///
    /// # Errors
    ///
    /// A [`HandlerError`] classified as the [module](self) describes.
    pub async fn publish_payload(&self, payload: &[u8], ctx: &Context) -> Result<(), HandlerError> {
        let (exchange, key) = self.route(ctx.topic());
        // Held until the publish ends, after its channel is given back (or closed).
        let Ok(_channel) = self.inner.channels.acquire().await else {
            return Err(HandlerError::retry("the RabbitMQ publisher is shut down"));
        };
        let deadline = Instant::now() + self.inner.reconnect_wait;
        let mut waited = false;
        let confirmation = loop {
            let open = self.connection(deadline, &mut waited).await?;
            let lease = match self.checkout(&open).await {
                Ok(lease) => lease,
                Err(e) if connection_failed(&open, &e) => {
                    self.lost(&open, &e);
                    continue;
                }
                Err(e) => {
                    return Err(HandlerError::retry(format!(
                        "cannot open a RabbitMQ channel: {e}"
                    )))
                }
            };
            let sent = self.inner.outages.sent(open.number);
            let confirm = lease
                .channel
                .basic_publish(
                    ShortString::from(exchange),
                    ShortString::from(key),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    payload,
                    properties(ctx, self.inner.cloudevents.as_ref()),
                )
                .await;
            let confirmation = match confirm {
                Ok(pending) => pending.await,
                Err(e) => Err(e),
            };
            lease.give_back();
            match confirmation {
                // The connection went down under the publish, which may or may not have reached
                // the broker: sent again on the next connection, as the worker would.
                Err(e)
                    if connection_failed(&open, &e)
                        && classify(&e, exchange, key).kind() != FailureKind::Permanent =>
                {
                    self.lost(&open, &e);
                    drop(sent);
                    // Counted among the publishes that wait, with the others the loss caught.
                    waited = true;
                }
                confirmation => {
                    if confirmation.is_ok() {
                        self.inner.outages.answered(open.number);
                    }
                    break confirmation;
                }
            }
        };
        match confirmation {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
                Err(HandlerError::permanent(format!(
                    "RabbitMQ returned the message as unroutable: no queue is bound to exchange \
                     `{exchange}` for routing key `{key}` ({} {})",
                    returned.reply_code, returned.reply_text
                )))
            }
            Ok(Confirmation::Nack(None)) => Err(HandlerError::retry(format!(
                "RabbitMQ did not accept the message for exchange `{exchange}`, routing key \
                 `{key}` (nack)"
            ))),
            Ok(Confirmation::NotRequested) => Err(HandlerError::retry(
                "the channel is not in confirm mode; the publish is unconfirmed",
            )),
            Err(e) => Err(classify(&e, exchange, key)),
        }
    }
}

/// Whether `error` means the connection `open` is lost. lapin may report the socket's failure
/// to the publish before it marks the connection as closed: an IO error is a loss either way.
fn connection_failed(open: &link::Open, error: &lapin::Error) -> bool {
    !open.conn.status().connected()
        || matches!(
            error.kind(),
            ErrorKind::IOError(_)
                | ErrorKind::InvalidConnectionState(_)
                | ErrorKind::MissingHeartbeatError
        )
}

/// A failed publish: permanent when the broker refused this message for good.
fn classify(e: &lapin::Error, exchange: &str, key: &str) -> HandlerError {
    if let ErrorKind::ProtocolError(amqp) = e.kind() {
        let words = amqp.get_message().as_str();
        match amqp.kind() {
            // The broker closes the channel over it: the exchange named must be this publish's.
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)
                if words.contains(&format!("'{exchange}'")) =>
            {
                return HandlerError::permanent(format!(
                    "RabbitMQ has no exchange `{exchange}` (routing key `{key}`): {words}"
                ));
            }
            AMQPErrorKind::Soft(
                AMQPSoftError::CONTENTTOOLARGE | AMQPSoftError::PRECONDITIONFAILED,
            ) if words.contains("size") => {
                return HandlerError::permanent(format!(
                    "RabbitMQ refused the message for exchange `{exchange}`, routing key `{key}`, \
                     as too large: {words}"
                ));
            }
            _ => {}
        }
    }
    HandlerError::retry(format!(
        "publish to exchange `{exchange}`, routing key `{key}` failed: {e}"
    ))
}

/// The AMQP properties of one published message, with the CloudEvents attributes when
/// `cloudevents` is set.
fn properties(ctx: &Context, cloudevents: Option<&CloudEvents>) -> BasicProperties {
    let mut table = FieldTable::default();
    let mut put = |name: &str, value: String| {
        table.insert(name.into(), AMQPValue::LongString(value.into()));
    };
    put(headers::MESSAGE_ID, ctx.message_id().to_string());
    put(headers::TOPIC, ctx.topic().to_string());
    put(headers::ATTEMPT, ctx.attempt().to_string());
    put(headers::CREATED_AT, super::created_at_header(ctx));
    put(headers::IDEMPOTENCY_KEY, ctx.idempotency_key().to_string());
    put(headers::VERSION, ctx.version().to_string());
    if let Some(trace) = ctx.trace_context() {
        put(headers::TRACEPARENT, trace.traceparent().to_string());
        if let Some(state) = trace.tracestate() {
            put(headers::TRACESTATE, state.to_string());
        }
    }
    if let Some(ce) = cloudevents {
        for (name, value) in ce.event(ctx).attributes() {
            put(&format!("{}{name}", cloudevents::AMQP_PREFIX), value);
        }
    }
    BasicProperties::default()
        .with_message_id(ctx.idempotency_key().into())
        .with_delivery_mode(2)
        .with_content_type(headers::JSON.into())
        .with_type(ctx.topic().into())
        .with_timestamp(u64::try_from(ctx.created_at().timestamp()).unwrap_or(0))
        .with_headers(table)
}

impl fmt::Debug for RabbitPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URI may hold a password: not printed.
        f.debug_struct("RabbitPublisher")
            .field("exchange", &self.inner.exchange)
            .field("map", &self.inner.map)
            .field("cloudevents", &self.inner.cloudevents)
            .finish_non_exhaustive()
    }
}

/// Relays the events of type `E` to RabbitMQ: a [`Handler`] named `rabbitmq-relay`.
///
/// Made by [`RabbitPublisher::relay`], or from the worker's resources (which must hold a
/// [`RabbitPublisher`]) when registered with `register_handler!(RabbitRelay<E>)`.
///
/// # About type parameter `E`
///
/// The event type relayed; its topic decides the exchange and routing key.
pub struct RabbitRelay<E> {
    publisher: RabbitPublisher,
    _event: PhantomData<fn() -> E>,
}

impl<E> RabbitRelay<E> {
    /// The publisher this relay uses.
    pub fn publisher(&self) -> &RabbitPublisher {
        &self.publisher
    }
}

impl<E> Clone for RabbitRelay<E> {
    fn clone(&self) -> Self {
        RabbitRelay {
            publisher: self.publisher.clone(),
            _event: PhantomData,
        }
    }
}

impl<E> fmt::Debug for RabbitRelay<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitRelay")
            .field("event", &std::any::type_name::<E>())
            .field("publisher", &self.publisher)
            .finish()
    }
}

#[async_trait]
impl<E: Event> Handler for RabbitRelay<E> {
    type Event = E;
    const NAME: &'static str = "rabbitmq-relay";

    async fn handle(&self, event: E, ctx: &Context) -> Result<(), HandlerError> {
        self.publisher.publish(&event, ctx).await
    }
}

/// The publisher itself relays any topic, payload as stored: add it for every declared event
/// with [`WorkerBuilder::raw_handler_for_declared_events`](outbox::WorkerBuilder::raw_handler_for_declared_events),
/// or per topic with [`WorkerBuilder::raw_handler`](outbox::WorkerBuilder::raw_handler).
/// Named `rabbitmq-relay`, as the typed relay: one topic has one or the other.
#[async_trait]
impl RawHandler for RabbitPublisher {
    const NAME: &'static str = "rabbitmq-relay";

    async fn handle_raw(&self, payload: &str, ctx: &Context) -> Result<(), HandlerError> {
        self.publish_payload(payload.as_bytes(), ctx).await
    }
}

/// Built from the [`RabbitPublisher`] among the worker's resources.
impl<E: Event> FromResources for RabbitRelay<E> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(resources.require::<RabbitPublisher>()?.relay())
    }
}
