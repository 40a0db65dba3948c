//! The inbox: the consuming side of a relay. Pulls messages from a durable JetStream consumer,
//! decodes them by topic into the same `#[outbox_event]` types, and runs [`TxHandler`]s with the
//! processed-id record in the effect's transaction, so each effect happens once per outbox
//! message however often the broker delivers it.
//!
//! For each message:
//!
//! 1. the topic and the outbox message id are read from the headers the relay wrote
//!    ([`relay::headers`](crate::relay::headers)); a message without them, or of a topic no
//!    handler serves, is terminated (`Term`, JetStream stops redelivering it) with a warning;
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
//! # The context handlers see
//!
//! Handlers get a [`Context`] that describes the original outbox message:
//! [`message_id`](Context::message_id) and [`created_at`](Context::created_at) are the
//! producer's (from the relay's headers), [`topic`](Context::topic), [`attempt`](Context::attempt)
//! (JetStream's delivery count), [`max_attempts`](Context::max_attempts) and
//! [`resources`](Context::resources) those of the delivery, and the
//! [`idempotency_key`](Context::idempotency_key) is `"{message_id}:{handler name}"`, stable
//! across redeliveries. The rest of what the relay sent (subject, stream sequence, the
//! producer's key) is in the [`InboxMessage`] among the resources (`InboxMessage::of(ctx)`).
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

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use outbox::{BoxError, Context, Event, FailureKind, HandlerError, Resources};
use sqlx::{PgPool, Postgres};
use tracing::Instrument;
use uuid::Uuid;

use crate::dedup::{record, TxHandler};
use crate::relay::headers;
use crate::ConfigError;

/// The attempts a message gets when not set: as many as the outbox worker's default.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;

/// Messages handled at once when not set.
pub const DEFAULT_CONCURRENCY: usize = 16;

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

/// What [`Inbox::process`] did with a message whose handlers all succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Processed {
    /// Handlers that ran and committed their effect.
    pub ran: usize,
    /// Handlers skipped because their record says they already did.
    pub skipped: usize,
}

/// A handler of the inbox, its event type erased.
#[async_trait]
trait Route: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn type_name(&self) -> &'static str;
    fn backoff(&self, attempt: u32) -> Option<Duration>;
    /// Runs the handler once for `message` unless recorded; true when it ran.
    async fn run(
        &self,
        payload: &[u8],
        message: &InboxMessage,
        pool: &PgPool,
        resources: &Resources,
        max_attempts: u32,
    ) -> Result<bool, HandlerError>;
}

struct Typed<H>(H);

#[async_trait]
impl<H: TxHandler<Postgres>> Route for Typed<H> {
    fn name(&self) -> &'static str {
        H::NAME
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<H>()
    }

    fn backoff(&self, attempt: u32) -> Option<Duration> {
        self.0.backoff(attempt)
    }

    async fn run(
        &self,
        payload: &[u8],
        message: &InboxMessage,
        pool: &PgPool,
        resources: &Resources,
        max_attempts: u32,
    ) -> Result<bool, HandlerError> {
        let event: H::Event = serde_json::from_slice(payload).map_err(|e| {
            HandlerError::retry(format!(
                "payload does not deserialize into `{}`: {e}",
                std::any::type_name::<H::Event>()
            ))
        })?;
        let mut tx = pool.begin().await?;
        if !record(&mut tx, H::NAME, message.message_id).await? {
            tx.rollback().await?;
            tracing::debug!(handler = H::NAME, message_id = %message.message_id,
                "message already processed by this handler; skipped");
            return Ok(false);
        }
        let mut resources = resources.clone();
        resources.insert(message.clone());
        let trace = outbox::trace::TraceContext::current().or_else(|| message.trace.clone());
        let mut ctx = Context::for_delivery(message.message_id, &message.topic, H::NAME, resources)
            .with_attempt(message.delivered, max_attempts)
            .with_trace_context(trace);
        if let Some(created_at) = message.created_at {
            ctx = ctx.with_created_at(created_at);
        }
        let call = self.0.handle(event, &ctx, &mut tx);
        let result = match self.0.timeout() {
            Some(limit) => tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
                Err(HandlerError::retry(format!(
                    "handler `{}` timed out after {limit:?}",
                    H::NAME
                )))
            }),
            None => call.await,
        };
        if let Err(e) = result {
            if let Err(rollback) = tx.rollback().await {
                tracing::debug!(error = %rollback, "rollback after a failed handler did not complete");
            }
            return Err(e);
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// Consumes relayed outbox messages from a JetStream pull consumer; see the [module](self).
///
/// Cheap to clone.
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    consumer: PullConsumer,
    pool: PgPool,
    routes: BTreeMap<&'static str, Vec<Box<dyn Route>>>,
    resources: Resources,
    concurrency: usize,
    max_attempts: u32,
}

impl fmt::Debug for Inbox {
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

impl Inbox {
    /// Starts an inbox on `consumer` (a durable pull consumer of the stream the relay publishes
    /// to), recording processed messages in `pool`'s `outbox_processed` table
    /// (`outbox::migrate` creates it).
    pub fn builder(consumer: PullConsumer, pool: PgPool) -> InboxBuilder {
        InboxBuilder {
            consumer,
            pool,
            routes: Vec::new(),
            resources: Resources::new(),
            concurrency: DEFAULT_CONCURRENCY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Runs every handler of `message`'s topic that has not yet processed it, each in its own
    /// transaction with its record. Does not acknowledge: [`handle`](Self::handle) does.
    ///
    /// # Errors
    ///
    /// The first handler failure (the handlers after it do not run), or a permanent error when
    /// the message has no outbox headers or no handler serves its topic.
    pub async fn process(&self, message: &Message) -> Result<Processed, HandlerError> {
        let meta = InboxMessage::from_message(message).map_err(HandlerError::permanent)?;
        self.process_with(message, &meta).await
    }

    async fn process_with(
        &self,
        message: &Message,
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
                    &message.payload,
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
        let meta = match InboxMessage::from_message(&message) {
            Ok(meta) => meta,
            Err(why) => {
                tracing::warn!(subject = %message.subject, "inbox message terminated: {why}");
                answer(&message, AckKind::Term).await;
                return;
            }
        };
        match self.process_with(&message, &meta).await {
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

/// The delay the worker would use: 1 s doubling, at most 60 s.
fn default_backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
}

/// A handler failure with the handler named and its own backoff attached.
#[derive(Debug)]
struct Failed {
    handler: &'static str,
    type_name: &'static str,
    backoff: Option<Duration>,
    message: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "handler `{}` ({}): {}",
            self.handler, self.type_name, self.message
        )
    }
}

impl std::error::Error for Failed {}

fn tag(
    e: HandlerError,
    handler: &'static str,
    type_name: &'static str,
    backoff: Option<Duration>,
) -> HandlerError {
    let failed = Failed {
        handler,
        type_name,
        backoff,
        message: e.chain_string(),
    };
    match e.kind() {
        FailureKind::Permanent => HandlerError::permanent(failed),
        FailureKind::RetryAfter(d) => HandlerError::retry_after(d, failed),
        _ => HandlerError::retry(failed),
    }
}

fn retry_delay(e: &HandlerError) -> Option<Duration> {
    let source: &(dyn std::error::Error + 'static) = e.source();
    source.downcast_ref::<Failed>().and_then(|f| f.backoff)
}

/// Builds an [`Inbox`]; see [`Inbox::builder`].
pub struct InboxBuilder {
    consumer: PullConsumer,
    pool: PgPool,
    routes: Vec<(&'static str, Box<dyn Route>)>,
    resources: Resources,
    concurrency: usize,
    max_attempts: u32,
}

impl fmt::Debug for InboxBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxBuilder")
            .field(
                "handlers",
                &self
                    .routes
                    .iter()
                    .map(|(t, r)| (*t, r.name()))
                    .collect::<Vec<_>>(),
            )
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl InboxBuilder {
    /// Adds a handler: it receives the messages of its event's topic.
    pub fn handler<H: TxHandler<Postgres>>(mut self, handler: H) -> Self {
        self.routes
            .push((<H::Event as Event>::TOPIC, Box::new(Typed(handler))));
        self
    }

    /// Adds a shared value handlers can read through [`Context::resources`].
    pub fn resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.resources.insert(value);
        self
    }

    /// Messages handled at once (default [`DEFAULT_CONCURRENCY`]).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The delivery after which a retryable failure terminates the message (default
    /// [`DEFAULT_MAX_ATTEMPTS`]). Keep the consumer's `max_deliver` unlimited or above it.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Checks the handlers and builds the inbox.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `inbox.handlers` when there are none or two of a topic share a
    /// name, `inbox.concurrency` or `inbox.max_attempts` when zero.
    pub fn build(self) -> Result<Inbox, ConfigError> {
        if self.routes.is_empty() {
            return Err(ConfigError::Rejected {
                key: "inbox.handlers".into(),
                reason: "the inbox has no handlers; add them with InboxBuilder::handler".into(),
            });
        }
        if self.concurrency == 0 {
            return Err(ConfigError::Invalid {
                key: "inbox.concurrency".into(),
                reason: "must be at least 1".into(),
                got: "0".into(),
            });
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::Invalid {
                key: "inbox.max_attempts".into(),
                reason: "must be at least 1".into(),
                got: "0".into(),
            });
        }
        let mut routes: BTreeMap<&'static str, Vec<Box<dyn Route>>> = BTreeMap::new();
        for (topic, route) in self.routes {
            let same = routes.entry(topic).or_default();
            if let Some(other) = same.iter().find(|r| r.name() == route.name()) {
                return Err(ConfigError::Rejected {
                    key: "inbox.handlers".into(),
                    reason: format!(
                        "handlers `{}` and `{}` of topic `{topic}` share the name `{}`: their \
                         processed records would collide; give each a unique TxHandler::NAME",
                        other.type_name(),
                        route.type_name(),
                        route.name()
                    ),
                });
            }
            same.push(route);
        }
        Ok(Inbox {
            inner: Arc::new(Inner {
                consumer: self.consumer,
                pool: self.pool,
                routes,
                resources: self.resources,
                concurrency: self.concurrency,
                max_attempts: self.max_attempts,
            }),
        })
    }
}
