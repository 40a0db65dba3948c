//! The inbox: the consuming side of a relay. Pulls messages from a durable JetStream consumer,
//! decodes them by topic into the same `#[outbox_event]` types, and runs [`TxHandler`]s with the
//! processed-id record in the effect's transaction, so each effect happens once per outbox
//! message however often the broker delivers it. The records and the effects are in the
//! database of the inbox's pool: PostgreSQL, MariaDB/MySQL or SQLite (see
//! [Databases](#databases)).
//!
//! For each message:
//!
//! 1. the topic and the outbox message id are read from the headers the relay wrote
//!    ([`relay::headers`](crate::relay::headers)), or from the CloudEvent of a producer that is
//!    not an outbox relay (see below); a message without them, or of a topic no handler serves,
//!    is terminated (`Term`, JetStream stops redelivering it) with a warning;
//! 2. for each handler of the topic: begin a transaction, record `(handler name, message id)` in
//!    `outbox_processed` (the table of [`dedup`](crate::dedup)), run the handler on the
//!    transaction, commit. A message already recorded for that handler is skipped;
//! 3. only after every commit, the message is acknowledged (a double ack: the call returns once
//!    JetStream has recorded it).
//!
//! A crash between the commit and the ack leads to a redelivery after the consumer's `ack_wait`;
//! it finds the record and is acknowledged without running the effect again. Failures follow the
//! handler's [`HandlerError`]: a retryable one is a `Nak` with a delay (the handler's backoff,
//! else 1 s doubling to 60 s, or the delay of [`HandlerError::retry_after`]); a permanent one,
//! and a retryable one at the last attempt ([`InboxBuilder::max_attempts`]), is terminated and
//! logged at error level with the handler's message. JetStream's delivery count is the attempt.
//!
//! Set the consumer's `ack_wait` above the longest handler call: a call still running when it
//! runs out is delivered again, and the second delivery waits on the first one's record.
//!
//! # CloudEvents from other producers
//!
//! A message without the relay's headers that is a CloudEvent, in binary content mode (`ce-…`
//! headers, the payload is the data) or in structured mode (`Content-Type:
//! application/cloudevents+json`, the data in its `data` member), is handled like a relay's
//! message: its `type` is the topic, its `data` the payload, and its identity, the key of the
//! processed-id records, is a UUID derived from its `source` and `id`
//! ([`cloudevents::identity`](crate::cloudevents::identity)), so a redelivery of the same event
//! runs no handler twice. [`InboxMessage::cloudevent`] holds its attributes. A CloudEvent that
//! lacks `specversion`, `id`, `source` or `type`, has a specversion other than 1.x, or carries
//! binary `data_base64` is terminated with a warning naming what is wrong
//! ([`CloudEventError`](crate::cloudevents::CloudEventError)), as any unreadable message.
//!
//! A relay's message that also carries CloudEvents headers (a relay with
//! [`cloudevents`](crate::relay::nats::NatsPublisherBuilder::cloudevents) on) is read by the
//! relay's headers, so its records are keyed by the outbox message id whether the relay sends
//! CloudEvents or not.
//!
//! # The context handlers see
//!
//! Handlers get a [`Context`] that describes the original outbox message: [`message_id`] and
//! [`created_at`] are the producer's (from the relay's headers), [`topic`], [`attempt`]
//! (JetStream's delivery count), [`max_attempts`] and [`resources`] those of the delivery, and
//! the [`idempotency_key`] is `"{message_id}:{handler name}"`, stable across redeliveries. The
//! rest of what the relay sent (subject, stream sequence, the producer's key) is in the
//! [`InboxMessage`] among the resources (`InboxMessage::of(ctx)`).
//!
//! # Tracing
//!
//! Each message is processed in an `outbox.inbox` span (an OpenTelemetry consumer span with the
//! messaging attributes), each handler in an `outbox.inbox.handler` span below it. When the
//! relay sent a W3C trace context (`traceparent`, see [`outbox::trace`]) and `outbox` is built
//! with its `opentelemetry` feature, the `outbox.inbox` span continues that trace: the
//! producer's request, its outbox delivery, the relay and this inbox are one trace.
//! [`Context::trace_context`] gives handlers the context of their span, to pass on further.
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Context, HandlerError};
//! use outbox_handlers::async_nats::jetstream::{self, consumer::pull};
//! use outbox_handlers::dedup::TxHandler;
//! use outbox_handlers::inbox::{Inbox, InboxMessage};
//! use serde::{Deserialize, Serialize};
//! use sqlx::{PgConnection, Postgres};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64 }
//!
//! struct CountBooking;
//!
//! #[outbox::async_trait]
//! impl TxHandler<Postgres> for CountBooking {
//!     type Event = BookingCreated;
//!     const NAME: &'static str = "count-booking";
//!     async fn handle(&self, e: BookingCreated, ctx: &Context, tx: &mut PgConnection)
//!         -> Result<(), HandlerError>
//!     {
//!         let origin = InboxMessage::of(ctx).map(|m| m.message_id);
//!         sqlx::query("INSERT INTO bookings_seen (booking_id, origin) VALUES ($1, $2)")
//!             .bind(e.booking_id)
//!             .bind(origin)
//!             .execute(&mut *tx)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let js = jetstream::new(outbox_handlers::async_nats::connect("127.0.0.1:4222").await?);
//! let consumer = js
//!     .get_stream("OUTBOX")
//!     .await?
//!     .get_or_create_consumer("billing", pull::Config {
//!         durable_name: Some("billing".into()),
//!         filter_subject: "outbox.booking.created".into(),
//!         ..Default::default()
//!     })
//!     .await?;
//! let inbox = Inbox::builder(consumer, pool).handler(CountBooking).build()?;
//! # let shutdown = std::future::pending::<()>();
//! inbox.run_until(shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! # Databases
//!
//! The inbox's database is the one of the pool given to [`Inbox::builder`], that of the outbox
//! tables (`outbox::migrate` creates `outbox_processed` in it): PostgreSQL (a `PgPool`, feature
//! `dedup`, which `nats` turns on), MariaDB or MySQL (a `MySqlPool`, feature `dedup-mysql`), or
//! SQLite (a `SqlitePool`, feature `dedup-sqlite`). It is the type parameter of [`Inbox`] and
//! [`InboxBuilder`], `sqlx::Postgres` unless named, inferred from the pool; the handlers are
//! [`TxHandler`]s for it and get its connection. On MariaDB or MySQL:
//!
#![cfg_attr(feature = "dedup-mysql", doc = "```no_run")]
#![cfg_attr(not(feature = "dedup-mysql"), doc = "```ignore")]
//! use outbox::{outbox_event, Context, HandlerError};
//! use outbox_handlers::async_nats::jetstream::consumer::PullConsumer;
//! use outbox_handlers::dedup::TxHandler;
//! use outbox_handlers::inbox::Inbox;
//! use sqlx::{MySql, MySqlConnection, MySqlPool};
//! # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)]
//! # struct BookingCreated { booking_id: i64 }
//!
//! struct CountBooking;
//!
//! #[outbox::async_trait]
//! impl TxHandler<MySql> for CountBooking {
//!     type Event = BookingCreated;
//!     const NAME: &'static str = "count-booking";
//!     async fn handle(&self, e: BookingCreated, _ctx: &Context, tx: &mut MySqlConnection)
//!         -> Result<(), HandlerError>
//!     {
//!         sqlx::query("INSERT INTO bookings_seen (booking_id) VALUES (?)")
//!             .bind(e.booking_id)
//!             .execute(&mut *tx)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(consumer: PullConsumer, pool: MySqlPool)
//! #     -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // An `Inbox<MySql>`: the records in `outbox_processed` of the pool's database.
//! let inbox = Inbox::builder(consumer, pool).handler(CountBooking).build()?;
//! # let shutdown = std::future::pending::<()>();
//! inbox.run_until(shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! [`Context`]: outbox::Context
//! [`Context::trace_context`]: outbox::Context::trace_context
//! [`TxHandler`]: crate::dedup::TxHandler
//! [`message_id`]: outbox::Context::message_id
//! [`created_at`]: outbox::Context::created_at
//! [`topic`]: outbox::Context::topic
//! [`attempt`]: outbox::Context::attempt
//! [`max_attempts`]: outbox::Context::max_attempts
//! [`resources`]: outbox::Context::resources
//! [`idempotency_key`]: outbox::Context::idempotency_key

mod builder;
mod message;
mod route;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use outbox::{BoxError, Connection, FailureKind, HandlerError, Resources};
use sqlx::{Database, Pool, Postgres};
use tracing::Instrument;

pub use builder::InboxBuilder;
pub use message::InboxMessage;
use message::{read_message, Unreadable};
use route::{default_backoff, retry_delay, tag, Route};

/// The attempts a message gets when not set: as many as the outbox worker's default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// Messages handled at once when not set.
pub const DEFAULT_CONCURRENCY: usize = 16;

/// What [`Inbox::process`] did with a message whose handlers all succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Processed {
    /// Handlers that ran and committed their effect.
    pub ran: usize,
    /// Handlers skipped because their record says they already did.
    pub skipped: usize,
}

/// Consumes relayed outbox messages from a JetStream pull consumer; see the [module](self).
///
/// Cheap to clone.
///
/// # About type parameter `DB`
///
/// The database of the processed records and of the handlers' transactions: `sqlx::Postgres`
/// (the default; feature `dedup`, which `nats` turns on), `sqlx::MySql` (feature `dedup-mysql`)
/// or `sqlx::Sqlite` (feature `dedup-sqlite`). Rust infers it from the pool given to
/// [`Inbox::builder`]; the handlers are [`TxHandler`](crate::dedup::TxHandler)s for it.
pub struct Inbox<DB: Database = Postgres> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Database> Clone for Inbox<DB> {
    fn clone(&self) -> Self {
        Inbox {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<DB: Database> {
    consumer: PullConsumer,
    pool: Pool<DB>,
    routes: BTreeMap<&'static str, Vec<Box<dyn Route<DB>>>>,
    resources: Resources,
    concurrency: usize,
    max_attempts: u32,
}

impl<DB: Database> fmt::Debug for Inbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topics: BTreeMap<_, Vec<_>> = self
            .inner
            .routes
            .iter()
            .map(|(t, r)| (*t, r.iter().map(|r| r.name()).collect()))
            .collect();
        f.debug_struct("Inbox")
            .field("topics", &topics)
            .field("concurrency", &self.inner.concurrency)
            .field("max_attempts", &self.inner.max_attempts)
            .finish_non_exhaustive()
    }
}

impl<DB> Inbox<DB>
where
    DB: Database,
    DB::Connection: Connection,
{
    /// Starts an inbox on `consumer` (a durable pull consumer of the stream the relay publishes
    /// to), recording processed messages in `pool`'s `outbox_processed` table
    /// (`outbox::migrate` creates it). The pool's database is the inbox's: a `PgPool` makes an
    /// `Inbox<sqlx::Postgres>`, a `MySqlPool` an `Inbox<sqlx::MySql>`.
    pub fn builder(consumer: PullConsumer, pool: Pool<DB>) -> InboxBuilder<DB> {
        InboxBuilder::new(consumer, pool)
    }

    /// Runs every handler of `message`'s topic that has not yet processed it, each in its own
    /// transaction with its record. Does not acknowledge: [`handle`](Self::handle) does.
    ///
    /// # Errors
    ///
    /// The first handler failure (the handlers after it do not run), or a permanent error when
    /// the message has neither outbox headers nor CloudEvents attributes, is a CloudEvent that
    /// lacks a required attribute (its source a
    /// [`CloudEventError`](crate::cloudevents::CloudEventError)), or no handler serves its topic.
    pub async fn process(&self, message: &Message) -> Result<Processed, HandlerError> {
        let (meta, data) = read_message(message).map_err(Unreadable::into_handler_error)?;
        self.process_with(data.as_deref().unwrap_or(&message.payload), &meta)
            .await
    }

    async fn process_with(
        &self,
        payload: &[u8],
        meta: &InboxMessage,
    ) -> Result<Processed, HandlerError> {
        let routes = self.inner.routes.get(meta.topic.as_str()).ok_or_else(|| {
            HandlerError::permanent(format!(
                "no inbox handler serves topic `{}`; filter the consumer to the subjects this \
                 inbox handles",
                meta.topic
            ))
        })?;
        let span = inbox_span(meta);
        let mut done = Processed::default();
        for route in routes {
            let handler_span =
                tracing::info_span!(parent: &span, "outbox.inbox.handler", handler = route.name());
            let ran = route
                .run(
                    payload,
                    meta,
                    &self.inner.pool,
                    &self.inner.resources,
                    self.inner.max_attempts,
                )
                .instrument(handler_span)
                .await
                .map_err(|e| {
                    let backoff = route.backoff(meta.delivered);
                    tag(e, route.name(), route.type_name(), backoff)
                })?;
            if ran {
                done.ran += 1;
            } else {
                done.skipped += 1;
            }
        }
        Ok(done)
    }

    /// Processes `message` and answers JetStream: ack after the commits, `Nak` with a delay to
    /// retry, `Term` when it failed for good (logged at error level).
    pub async fn handle(&self, message: Message) {
        let (meta, data) = match read_message(&message) {
            Ok(read) => read,
            Err(why) => {
                tracing::warn!(subject = %message.subject, "inbox message terminated: {why}");
                answer(&message, AckKind::Term).await;
                return;
            }
        };
        let payload = data.as_deref().unwrap_or(&message.payload);
        match self.process_with(payload, &meta).await {
            Ok(_) => {
                if let Err(e) = message.double_ack().await {
                    // The effects are committed: the redelivery will be skipped by the records.
                    tracing::warn!(message_id = %meta.message_id, error = %e,
                        "inbox ack failed; the message will be redelivered and skipped");
                }
            }
            Err(e) => {
                let last = meta.delivered >= self.inner.max_attempts;
                let delay = match e.kind() {
                    FailureKind::Permanent => None,
                    FailureKind::RetryAfter(d) => Some(d),
                    _ => Some(retry_delay(&e).unwrap_or_else(|| default_backoff(meta.delivered))),
                };
                match delay {
                    Some(d) if !last => {
                        tracing::warn!(message_id = %meta.message_id, topic = %meta.topic,
                            attempt = meta.delivered, error = %e, "inbox handler failed; retrying in {d:?}");
                        answer(&message, AckKind::Nak(Some(d))).await;
                    }
                    _ => {
                        tracing::error!(message_id = %meta.message_id, topic = %meta.topic,
                            subject = %meta.subject, stream_sequence = meta.stream_sequence,
                            attempt = meta.delivered, error = %e,
                            "inbox message failed for good; terminated");
                        answer(&message, AckKind::Term).await;
                    }
                }
            }
        }
    }

    /// Pulls and handles messages, up to the concurrency at once, until `shutdown` completes;
    /// then stops pulling and returns once the messages in hand are answered.
    ///
    /// # Errors
    ///
    /// When the pull subscription cannot be set up (the consumer was deleted, no connection).
    /// Errors of single pulls are logged and the loop goes on.
    pub async fn run_until(
        &self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), BoxError> {
        let messages = self.inner.consumer.messages().await?;
        messages
            .take_until(shutdown)
            .for_each_concurrent(self.inner.concurrency, |next| async move {
                match next {
                    Ok(message) => self.handle(message).await,
                    Err(e) => tracing::warn!(error = %e, "inbox pull failed; pulling on"),
                }
            })
            .await;
        Ok(())
    }

    /// The topics this inbox serves, with their handlers' names.
    pub fn topics(&self) -> BTreeMap<&'static str, Vec<&'static str>> {
        self.inner
            .routes
            .iter()
            .map(|(t, r)| (*t, r.iter().map(|r| r.name()).collect()))
            .collect()
    }
}

/// The span of processing one message: a consumer span with OpenTelemetry's messaging
/// attributes, continuing the trace the relay sent.
fn inbox_span(meta: &InboxMessage) -> tracing::Span {
    let name = format!("process {}", meta.topic);
    let span = tracing::info_span!(
        "outbox.inbox",
        message_id = %meta.message_id,
        topic = %meta.topic,
        attempt = meta.delivered,
        otel.name = name.as_str(),
        otel.kind = "consumer",
        messaging.system = "nats",
        messaging.operation.type = "process",
        messaging.destination.name = %meta.subject,
        messaging.message.id = %meta.message_id,
    );
    if let Some(trace) = &meta.trace {
        trace.set_parent_of(&span);
    }
    span
}

/// Sends `kind` for `message`, logging a failure (JetStream redelivers after `ack_wait`).
async fn answer(message: &Message, kind: AckKind) {
    if let Err(e) = message.ack_with(kind).await {
        tracing::warn!(subject = %message.subject, error = %e, "inbox answer failed");
    }
}
