//! Relays: handlers that publish each event to a real broker, which then takes over
//! distribution (fan-out to many consumers, replay, other services).
//!
//! A relay is an ordinary [`Handler`](outbox::Handler) for one event type. Enqueue the event in
//! your transaction as usual; the worker calls the relay, which publishes the payload and returns
//! only once the broker has taken responsibility for it (a JetStream publish acknowledgement, an
//! AMQP publisher confirm). A failed or unconfirmed publish is retried by the worker, so the
//! broker receives every committed event at least once; the relays send the message's
//! [idempotency key](outbox::Context::idempotency_key) (the same on every retry) so that the
//! broker or the consumer can drop the duplicates.
//!
//! | module | feature | broker | dedup on the broker |
//! |--------|---------|--------|---------------------|
//! | [`nats`] | `nats` | NATS JetStream | `Nats-Msg-Id` = idempotency key: the stream drops redeliveries within its duplicate window |
//! | [`rabbitmq`] | `rabbitmq` | RabbitMQ (AMQP 0-9-1) | none: `message_id` = idempotency key, for the consumer to dedup |
//!
//! Both put the same metadata beside the payload (the JSON of the event), under the names in
//! [`headers`]; the [`inbox`](crate::inbox) reads them back. That includes the W3C trace
//! context (`traceparent`, `tracestate`) of the delivery when there is one (see
//! [`outbox::trace`]), so that a tracing backend shows the producer, the relay and the inbox in
//! one trace.
//!
//! # Broker outages
//!
//! A lost broker connection costs a pause, not a failed attempt per message: the publishes it
//! caught in flight, and those that come while it is down, wait for the reconnect (up to the
//! publisher's `reconnect_wait`, 10 s unless set) and go out on the new connection. Each outage
//! is logged twice, at WARN, whatever the number of publishes or channels it touches: when the
//! connection is lost (with the publishes caught in flight) and when publishing works again
//! (with how long it did not and the publishes that waited). The
//! [metrics](crate::metrics) `outbox_relay_connection_losses_total` and
//! `outbox_relay_publishes_waited_for_reconnect_total` count the same, by `relay`.
//!
//! The AMQP client the RabbitMQ relay is built on logs every lost connection and every failed
//! attempt to connect itself, at ERROR; the relay's lines say the same. A relay worker leaves
//! them out of its log with the `RUST_LOG` (`tracing_subscriber::EnvFilter`) directive
//! `lapin=off`, e.g. `RUST_LOG=info,lapin=off`; see [`rabbitmq`] for what it covers.
//!
//! # Every event, or one type at a time
//!
//! The publishers are [`RawHandler`](outbox::RawHandler)s: one line relays every event declared
//! in the binary, each payload exactly as the producer stored it (fields this binary's types do
//! not know included):
//!
//! ```no_run
//! # #[cfg(feature = "nats")]
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_handlers::relay::nats::NatsPublisher;
//! let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! let nats = std::sync::Arc::new(NatsPublisher::builder(js).prefix("outbox").build()?);
//! let worker = outbox::Worker::builder(&pool)
//!     .raw_handler_for_declared_events(nats) // or .raw_handler("booking.created", nats) per topic
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! Typed relays serve one event type each: `NatsRelay<BookingCreated>` relays
//! `booking.created`, its payload serialized again from the type. Add one per event type you
//! publish (`.handler(nats.relay::<A>())`), or register them at link time with
//! `register_handler!(NatsRelay<A>)`. A topic has one relay or the other: both are named alike.

#[cfg(feature = "nats")]
pub mod nats;
mod outage;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

/// The header names the relays write beside the payload (NATS headers, AMQP headers table).
pub mod headers {
    /// The outbox message id (a UUID), stable across retries: the inbox's dedup key.
    pub const MESSAGE_ID: &str = "Outbox-Message-Id";
    /// The message's topic, e.g. `booking.created`: the inbox decodes by it.
    pub const TOPIC: &str = "Outbox-Topic";
    /// The relay's attempt number for this message, starting at 1.
    pub const ATTEMPT: &str = "Outbox-Attempt";
    /// When the message was enqueued, RFC 3339 with microseconds, UTC.
    pub const CREATED_AT: &str = "Outbox-Created-At";
    /// The idempotency key ([`Context::idempotency_key`](outbox::Context::idempotency_key));
    /// NATS also carries it as `Nats-Msg-Id`, AMQP as the `message_id` property.
    pub const IDEMPOTENCY_KEY: &str = "Outbox-Idempotency-Key";
    /// The version of the event type the payload was written with
    /// ([`Context::version`](outbox::Context::version)): the inbox decodes by it (1 when
    /// absent).
    pub const VERSION: &str = "Outbox-Version";
    /// The content type of every payload: the event as JSON.
    pub const JSON: &str = "application/json";
    /// The W3C trace context of the relay's span
    /// ([`Context::trace_context`](outbox::Context::trace_context)), when there is one: the
    /// inbox continues that trace.
    pub const TRACEPARENT: &str = "traceparent";
    /// The W3C `tracestate` that goes with [`TRACEPARENT`], when it has vendor data.
    pub const TRACESTATE: &str = "tracestate";
}

/// The enqueue time as the [`headers::CREATED_AT`] value.
pub(crate) fn created_at_header(ctx: &outbox::Context) -> String {
    ctx.created_at()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
