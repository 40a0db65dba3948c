//! Trace context with OpenTelemetry (feature `opentelemetry`), on PostgreSQL, SQLite and MariaDB, with
//! the JetStream relay and the inbox against the NATS server at `NATS_URL` (default
//! 127.0.0.1:4222):
//!
//! - one booking is one trace: the span around the producer's transaction, the worker's two
//!   delivery spans (the second a retry) as its children, one span per handler below each
//!   delivery, and across the broker the inbox's span below the relay's handler span; the failed
//!   attempt's delivery and handler spans have an error status, the retry's stay unset;
//! - a message past its attempts is dead-lettered with an error status on its delivery span;
//! - an attempt the worker ends because its handler held its thread past the deadline has an
//!   error status on its delivery and handler spans;
//! - a message enqueued outside any traced span has NULL trace columns.
//!
//! Spans go to an in-memory exporter through a `tracing-opentelemetry` layer; each test reads
//! back only the spans of its own trace.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox::{
    enqueue, enqueue_many, outbox_event, Context, DeadSelection, Event, Handler, HandlerError,
    RetryPolicy, Store, Worker, WorkerConfig,
};
use outbox_handlers::async_nats::jetstream;
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::{Inbox, InboxMessage};
use outbox_handlers::relay::headers;
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_tests::{mysql, pg, sqlite, MySqlDb, SqliteDb, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use uuid::Uuid;

#[outbox_event(topic = "trace.booking.created")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

/// The in-memory exporter every span of this test binary goes to (one global subscriber: the
/// worker's and the NATS client's tasks may run on any thread).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("outbox-tests");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber).expect("no other global subscriber");
        exporter
    })
}

/// The finished spans of trace `trace_id`.
fn spans_of(trace_id: TraceId) -> Vec<SpanData> {
    exporter()
        .get_finished_spans()
        .expect("the exporter is up")
        .into_iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .collect()
}

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn attr_str(span: &SpanData, key: &str) -> String {
    attr(span, key)
        .unwrap_or_else(|| panic!("span `{}` has no attribute {key}", span.name))
        .as_str()
        .into_owned()
}

fn id_of(span: &SpanData) -> SpanId {
    span.span_context.span_id()
}

/// Checks that `span` ended with an error status whose description contains `text`.
fn assert_error(span: &SpanData, text: &str) {
    match &span.status {
        Status::Error { description } => assert!(
            description.contains(text),
            "`{}`: no {text:?} in the error status {description:?}",
            span.name
        ),
        other => panic!("`{}` has status {other:?}, not an error", span.name),
    }
}

/// Sends the confirmation email; the provider is busy on the first attempt.
struct SendEmail;

#[outbox::async_trait]
impl Handler for SendEmail {
    type Event = BookingCreated;
    const NAME: &'static str = "send-email";

    async fn handle(&self, _: BookingCreated, ctx: &Context) -> Result<(), HandlerError> {
        tracing::info_span!("email.provider.call")
            .in_scope(|| tracing::info!("sending the confirmation"));
        if ctx.attempt() == 1 {
            return Err(HandlerError::retry_after(
                Duration::from_millis(1),
                "the email provider is busy",
            ));
        }
        Ok(())
    }
}

/// Writes the booking to the search index.
struct IndexBooking;

#[outbox::async_trait]
impl Handler for IndexBooking {
    type Event = BookingCreated;
    const NAME: &'static str = "index-booking";

    async fn handle(&self, _: BookingCreated, _: &Context) -> Result<(), HandlerError> {
        tracing::info_span!("search.index.write").in_scope(|| ());
        Ok(())
    }
}

/// The consuming service's handler, behind the inbox.
struct CountBooking;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for CountBooking {
    type Event = BookingCreated;
    const NAME: &'static str = "count-booking";

    async fn handle(
        &self,
        _: BookingCreated,
        ctx: &Context,
        _: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        // The context to pass further on is this handler's own span's.
        let own = outbox::trace::TraceContext::current();
        if ctx.trace_context() != own.as_ref() || own.is_none() {
            return Err(HandlerError::permanent(format!(
                "the context carries {:?}, the handler's span is {own:?}",
                ctx.trace_context()
            )));
        }
        Ok(())
    }
}

/// The producer's database, either backend.
enum Db {
    Pg(TestDb),
    Lite(SqliteDb),
    My(MySqlDb),
}

impl Db {
    fn store(&self) -> Store {
        match self {
            Db::Pg(db) => Store::from(&db.pool),
            Db::Lite(db) => Store::from(&db.pool),
            Db::My(db) => Store::from(&db.pool),
        }
    }

    async fn enqueue(&self, event: &BookingCreated) -> Uuid {
        match self {
            Db::Pg(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let id = enqueue(&mut *tx, event).await.unwrap();
                tx.commit().await.unwrap();
                id
            }
            Db::Lite(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let id = enqueue(&mut *tx, event).await.unwrap();
                tx.commit().await.unwrap();
                id
            }
            Db::My(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let id = enqueue(&mut *tx, event).await.unwrap();
                tx.commit().await.unwrap();
                id
            }
        }
    }

    /// Enqueues `event` in the request span `request`, then ends that span: the message's id
    /// and the request's trace.
    async fn enqueue_in(&self, request: tracing::Span, event: &BookingCreated) -> (Uuid, TraceId) {
        let id = self.enqueue(event).instrument(request.clone()).await;
        (id, request_trace(&request))
    }

    /// Enqueues booking `booking_id` in a request span of its own: the message's id and the
    /// request's trace.
    async fn booking_in_request(&self, booking_id: i64) -> (Uuid, TraceId) {
        let request = tracing::info_span!("POST /bookings");
        self.enqueue_in(request, &BookingCreated { booking_id })
            .await
    }

    async fn enqueue_many(&self, events: &[BookingCreated]) -> Vec<Uuid> {
        match self {
            Db::Pg(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let ids = enqueue_many(&mut *tx, events).await.unwrap();
                tx.commit().await.unwrap();
                ids
            }
            Db::Lite(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let ids = enqueue_many(&mut *tx, events).await.unwrap();
                tx.commit().await.unwrap();
                ids
            }
            Db::My(db) => {
                let mut tx = db.pool.begin().await.unwrap();
                let ids = enqueue_many(&mut *tx, events).await.unwrap();
                tx.commit().await.unwrap();
                ids
            }
        }
    }

    /// The stored `(traceparent, tracestate)` of a dead letter.
    async fn stored_dead(&self, id: Uuid) -> (Option<String>, Option<String>) {
        match self {
            Db::Pg(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_dead WHERE id = $1")
                    .bind(id)
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is dead")
            }
            Db::Lite(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_dead WHERE id = ?1")
                    .bind(id.to_string())
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is dead")
            }
            Db::My(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_dead WHERE id = ?")
                    .bind(id)
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is dead")
            }
        }
    }

    /// The stored `(traceparent, tracestate)` of a live message.
    async fn stored(&self, id: Uuid) -> (Option<String>, Option<String>) {
        match self {
            Db::Pg(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_messages WHERE id = $1")
                    .bind(id)
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is live")
            }
            Db::Lite(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_messages WHERE id = ?1")
                    .bind(id.to_string())
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is live")
            }
            Db::My(db) => {
                sqlx::query_as("SELECT traceparent, tracestate FROM outbox_messages WHERE id = ?")
                    .bind(id)
                    .fetch_one(&db.pool)
                    .await
                    .expect("the message is live")
            }
        }
    }

    /// Makes the message look claimed and lost `attempts` times, the last error `last_error`.
    async fn crash_claims(&self, attempts: i32, last_error: &str) {
        match self {
            Db::Pg(db) => db.crash_claims(attempts, last_error).await,
            Db::Lite(db) => db.crash_claims(attempts, last_error).await,
            Db::My(db) => db.crash_claims(attempts, last_error).await,
        }
    }

    async fn drop_db(self) {
        match self {
            Db::Pg(db) => db.drop_db().await,
            Db::Lite(db) => db.drop_db().await,
            Db::My(db) => db.drop_db().await,
        }
    }
}

/// A memory stream capturing `{prefix}.>`, unique to one test.
struct TestStream {
    js: jetstream::Context,
    name: String,
    prefix: String,
}

impl TestStream {
    async fn new() -> TestStream {
        let js = outbox_tests::nats::jetstream().await;
        let (name, prefix) = outbox_tests::nats::memory_stream(&js, "trace").await;
        TestStream { js, name, prefix }
    }

    async fn consumer(&self) -> jetstream::consumer::PullConsumer {
        self.js
            .get_stream(&self.name)
            .await
            .unwrap()
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some("inbox".into()),
                ack_wait: Duration::from_secs(5),
                ..Default::default()
            })
            .await
            .expect("create the durable consumer")
    }

    async fn delete(self) {
        self.js
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

/// One booking through enqueue, two deliveries (a retry), two handlers and the relay, then
/// the inbox of the consuming service (on PostgreSQL, the inbox's only backend); checks that
/// every span is in the request's trace, under the right parent.
async fn one_booking_is_one_trace(db: Db) {
    exporter();
    let stream = TestStream::new().await;
    let consumer_db = pg().await;
    let nats = Arc::new(
        NatsPublisher::builder(stream.js.clone())
            .prefix(stream.prefix.clone())
            .build()
            .unwrap(),
    );

    // The producer: an HTTP request whose span covers the transaction.
    let request = tracing::info_span!("POST /bookings", otel.kind = "server");
    let (id, trace_id) = db
        .enqueue_in(request, &BookingCreated { booking_id: 42 })
        .await;

    let (traceparent, tracestate) = db.stored(id).await;
    let traceparent = traceparent.expect("the request's context is stored");
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "{traceparent}"
    );
    assert_eq!(tracestate, None);

    let worker = Worker::builder(db.store())
        .handler(SendEmail)
        .handler(IndexBooking)
        .raw_handler(BookingCreated::TOPIC, nats.clone())
        .config(WorkerConfig::default().retry(RetryPolicy::default().jitter(false)))
        .build()
        .unwrap();
    let first = worker.run_once().await.unwrap();
    assert_eq!(first.retried, 1, "{first:?}");
    // The retry is due a millisecond later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = worker.run_once().await.unwrap();
    assert_eq!(second.done, 1, "{second:?}");

    // Across the broker: the relay's message carries its span's context.
    let consumer = stream.consumer().await;
    let inbox = Inbox::builder(consumer.clone(), consumer_db.pool.clone())
        .handler(CountBooking)
        .build()
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .unwrap();
    let message = futures_util::StreamExt::next(&mut batch)
        .await
        .expect("the relayed message")
        .unwrap();
    let sent = message
        .headers
        .as_ref()
        .and_then(|h| h.get(headers::TRACEPARENT))
        .expect("a traceparent header")
        .as_str()
        .to_string();
    assert_eq!(
        InboxMessage::from_message(&message)
            .unwrap()
            .trace
            .map(|t| t.traceparent().to_string()),
        Some(sent.clone())
    );
    let processed = inbox.process(&message).await.unwrap();
    assert_eq!(processed.ran, 1);
    message.ack().await.unwrap();

    // Every span, by name.
    let spans = spans_of(trace_id);
    let mut by_name: HashMap<&str, Vec<&SpanData>> = HashMap::new();
    for s in &spans {
        by_name.entry(&s.name).or_default().push(s);
    }
    let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
    let one = |name: &str| -> &SpanData {
        let found = by_name.get(name).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(found.len(), 1, "one `{name}` span in {names:?}");
        found[0]
    };

    let root = one("POST /bookings");
    assert_eq!(
        root.parent_span_id,
        SpanId::INVALID,
        "the request is the root"
    );

    // Two deliveries (attempt 1 and its retry), consumer spans, children of the request.
    let mut deliveries: Vec<&SpanData> = by_name
        .get("process trace.booking.created")
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| attr(s, "messaging.system").map(|v| v.as_str()) == Some("outbox".into()))
        .collect();
    assert_eq!(deliveries.len(), 2, "two deliveries in {names:?}");
    deliveries.sort_by_key(|s| attr_str(s, "attempt"));
    for (n, d) in deliveries.iter().enumerate() {
        assert_eq!(
            d.parent_span_id,
            id_of(root),
            "delivery {n} is the request's child"
        );
        assert_eq!(d.span_kind, SpanKind::Consumer);
        assert_eq!(attr_str(d, "attempt"), (n + 1).to_string());
        assert_eq!(
            attr_str(d, "messaging.destination.name"),
            BookingCreated::TOPIC
        );
        assert_eq!(attr_str(d, "messaging.message.id"), id.to_string());
        assert_ne!(d.span_context.span_id(), SpanId::INVALID);
    }
    assert_ne!(id_of(deliveries[0]), id_of(deliveries[1]));

    // One span per handler call, below its delivery: three in the first, the email again in
    // the retry.
    let handlers_of = |delivery: &SpanData| -> Vec<String> {
        let mut h: Vec<String> = by_name
            .get("outbox.handler")
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|s| s.parent_span_id == id_of(delivery))
            .map(|s| attr_str(s, "handler"))
            .collect();
        h.sort();
        h
    };
    assert_eq!(
        handlers_of(deliveries[0]),
        ["index-booking", "nats-relay", "send-email"]
    );
    assert_eq!(handlers_of(deliveries[1]), ["send-email"]);
    let email_calls = by_name
        .get("email.provider.call")
        .cloned()
        .unwrap_or_default();
    assert_eq!(email_calls.len(), 2, "the provider was called twice");
    let index = one("search.index.write");
    let handler_spans = by_name.get("outbox.handler").cloned().unwrap_or_default();
    let parent_handler = |s: &SpanData| -> String {
        let parent = handler_spans
            .iter()
            .find(|h| id_of(h) == s.parent_span_id)
            .unwrap_or_else(|| panic!("`{}` is below a handler span", s.name));
        attr_str(parent, "handler")
    };
    assert_eq!(parent_handler(index), "index-booking");
    for call in email_calls {
        assert_eq!(parent_handler(call), "send-email");
    }

    // The failed attempt is an error in the trace, with the handler's error: its delivery and
    // the span of the handler that failed; the handlers that succeeded in it and the whole
    // successful retry keep the status unset.
    let handler_in = |delivery: &SpanData, handler: &str| -> &SpanData {
        handler_spans
            .iter()
            .find(|s| s.parent_span_id == id_of(delivery) && attr_str(s, "handler") == handler)
            .unwrap_or_else(|| panic!("no `{handler}` span below the delivery"))
    };
    for failed in [deliveries[0], handler_in(deliveries[0], "send-email")] {
        assert_error(failed, "the email provider is busy");
    }
    for fine in [
        handler_in(deliveries[0], "index-booking"),
        handler_in(deliveries[0], "nats-relay"),
        deliveries[1],
        handler_in(deliveries[1], "send-email"),
    ] {
        assert_eq!(fine.status, Status::Unset, "`{}` succeeded", fine.name);
    }

    // The relay sent its handler span's context; the inbox continued it.
    let relay = handler_spans
        .iter()
        .find(|s| attr_str(s, "handler") == "nats-relay")
        .expect("the relay's span");
    assert_eq!(
        sent,
        format!("00-{trace_id}-{}-01", id_of(relay)),
        "the header names the relay's span"
    );
    let inbox_process = by_name
        .get("process trace.booking.created")
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .find(|s| attr(s, "messaging.system").map(|v| v.as_str()) == Some("nats".into()))
        .expect("the inbox's consumer span");
    assert_eq!(inbox_process.parent_span_id, id_of(relay));
    assert_eq!(inbox_process.span_kind, SpanKind::Consumer);
    let inbox_handler = one("outbox.inbox.handler");
    assert_eq!(inbox_handler.parent_span_id, id_of(inbox_process));
    assert_eq!(attr_str(inbox_handler, "handler"), "count-booking");

    stream.delete().await;
    consumer_db.drop_db().await;
    db.drop_db().await;
}

/// The trace id of `span` (started by reading its context).
fn request_trace(span: &tracing::Span) -> TraceId {
    let cx = outbox::trace::TraceContext::of_span(span).expect("the request span is traced");
    TraceId::from_hex(cx.trace_id().expect("a well-formed traceparent")).unwrap()
}

/// A message enqueued outside any span stores no trace context: both columns are NULL.
async fn no_context_writes_no_trace_columns(db: Db) {
    exporter();
    let id = db.enqueue(&BookingCreated { booking_id: 1 }).await;
    assert_eq!(db.stored(id).await, (None, None));
    db.drop_db().await;
}

/// Refuses every booking for good, with a reason longer than a span's error status keeps.
struct Refuse;

#[outbox::async_trait]
impl Handler for Refuse {
    type Event = BookingCreated;
    const NAME: &'static str = "refuse";

    async fn handle(&self, _: BookingCreated, _: &Context) -> Result<(), HandlerError> {
        Err(HandlerError::permanent(format!(
            "refused: {}",
            "é".repeat(2000)
        )))
    }
}

/// `enqueue_many` stores the context on every row, a dead letter keeps it, and a retried dead
/// letter is delivered in the original trace; the error status of the failed spans is cut to
/// 1 KiB on a character boundary.
async fn batches_and_dead_letters_keep_the_trace(db: Db) {
    exporter();
    let request = tracing::info_span!("POST /bookings/batch");
    let ids = db
        .enqueue_many(&[
            BookingCreated { booking_id: 1 },
            BookingCreated { booking_id: 2 },
        ])
        .instrument(request.clone())
        .await;
    let trace_id = request_trace(&request);
    drop(request);
    let mut stored = Vec::new();
    for id in &ids {
        let (parent, _) = db.stored(*id).await;
        let parent = parent.expect("each row of the batch has the context");
        assert!(parent.starts_with(&format!("00-{trace_id}-")), "{parent}");
        stored.push(parent);
    }

    let worker = Worker::builder(db.store()).handler(Refuse).build().unwrap();
    assert_eq!(worker.run_once().await.unwrap().dead, 2);
    assert_eq!(
        db.stored_dead(ids[0]).await,
        (Some(stored[0].clone()), None)
    );
    assert_eq!(
        db.store()
            .retry_dead(&DeadSelection::One(ids[0]))
            .await
            .unwrap(),
        1
    );
    assert_eq!(db.stored(ids[0]).await, (Some(stored[0].clone()), None));
    assert_eq!(worker.run_once().await.unwrap().dead, 1);
    let deliveries: Vec<SpanData> = spans_of(trace_id)
        .into_iter()
        .filter(|s| s.name == "process trace.booking.created")
        .filter(|s| attr_str(s, "messaging.message.id") == ids[0].to_string())
        .collect();
    assert_eq!(
        deliveries.len(),
        2,
        "the retried dead letter is in the trace"
    );
    let failed = spans_of(trace_id)
        .into_iter()
        .filter(|s| s.name == "process trace.booking.created" || s.name == "outbox.handler");
    for span in failed {
        assert_error(&span, "refused: éé");
        let Status::Error { description } = &span.status else {
            unreachable!()
        };
        assert!(description.len() <= 1024, "{}", description.len());
        assert!(description.ends_with("bytes in all]"), "{description}");
    }
    db.drop_db().await;
}

/// A message whose attempts all ended without an outcome is dead-lettered without running: that
/// attempt has no handler span, and its delivery span is an error with why.
async fn an_exhausted_message_is_an_error_in_the_trace(db: Db) {
    exporter();
    let (id, trace_id) = db.booking_in_request(7).await;
    db.crash_claims(8, "handler `send-email`: the email provider is busy")
        .await;
    let worker = Worker::builder(db.store())
        .handler(SendEmail)
        .config(WorkerConfig::default().retry(RetryPolicy::default().max_attempts(8)))
        .build()
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap().dead, 1);
    let spans = spans_of(trace_id);
    let delivery = spans
        .iter()
        .find(|s| s.name == "process trace.booking.created")
        .expect("the delivery span");
    assert_eq!(attr_str(delivery, "messaging.message.id"), id.to_string());
    assert_eq!(attr_str(delivery, "attempt"), "9");
    assert!(
        spans.iter().all(|s| s.name != "outbox.handler"),
        "no handler ran"
    );
    assert_error(delivery, "past the limit of 8");
    assert_error(delivery, "the email provider is busy");
    db.drop_db().await;
}

/// Holds its thread past its timeout on the first attempt, so the engine, not the handler's own
/// timeout, ends that attempt.
struct HoldsItsThread;

#[outbox::async_trait]
impl Handler for HoldsItsThread {
    type Event = BookingCreated;
    const NAME: &'static str = "holds-its-thread";

    async fn handle(&self, _: BookingCreated, ctx: &Context) -> Result<(), HandlerError> {
        if ctx.attempt() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        Ok(())
    }

    fn timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(200))
    }
}

/// An attempt whose handler never returned by its deadline is ended by the worker, and its
/// delivery span and its handler's span are errors that say so.
async fn a_handler_past_its_deadline_is_an_error_in_the_trace(db: Db) {
    exporter();
    let (id, trace_id) = db.booking_in_request(9).await;
    let worker = Worker::builder(db.store())
        .handler(HoldsItsThread)
        .build()
        .unwrap();
    // Attempt 1's delivery span and its handler's span, once both ended: they end when the
    // attempt's task is dropped, after the handler lets its thread go.
    let first_attempt = || {
        let spans = spans_of(trace_id);
        let delivery = spans
            .iter()
            .find(|s| s.name == "process trace.booking.created" && attr_str(s, "attempt") == "1")?;
        let handler = spans
            .iter()
            .find(|s| s.name == "outbox.handler" && s.parent_span_id == id_of(delivery))?;
        Some((delivery.clone(), handler.clone()))
    };
    worker
        .run_until(async {
            let give_up = std::time::Instant::now() + Duration::from_secs(20);
            while first_attempt().is_none() && std::time::Instant::now() < give_up {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
    let (delivery, handler) = first_attempt().expect("attempt 1's delivery and handler spans");
    assert_eq!(attr_str(&delivery, "messaging.message.id"), id.to_string());
    assert_error(&delivery, "timed out after 200ms");
    assert_error(&delivery, "held its thread");
    assert_eq!(attr_str(&handler, "handler"), "holds-its-thread");
    assert_error(&handler, "timed out after 200ms");
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_deadline_is_an_error_in_the_trace_on_postgres() {
    a_handler_past_its_deadline_is_an_error_in_the_trace(Db::Pg(pg().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_deadline_is_an_error_in_the_trace_on_sqlite() {
    a_handler_past_its_deadline_is_an_error_in_the_trace(Db::Lite(sqlite().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_deadline_is_an_error_in_the_trace_on_mysql() {
    outbox_tests::skip_without_mysql!();
    a_handler_past_its_deadline_is_an_error_in_the_trace(Db::My(mysql().await)).await;
}

/// Each scenario's three tests: on PostgreSQL, on SQLite and on MariaDB.
macro_rules! on_all_backends {
    ($($scenario:ident: $on_postgres:ident, $on_sqlite:ident, $on_mysql:ident;)*) => {$(
        #[tokio::test]
        async fn $on_postgres() {
            $scenario(Db::Pg(pg().await)).await;
        }

        #[tokio::test]
        async fn $on_sqlite() {
            $scenario(Db::Lite(sqlite().await)).await;
        }

        #[tokio::test]
        async fn $on_mysql() {
            outbox_tests::skip_without_mysql!();
            $scenario(Db::My(mysql().await)).await;
        }
    )*};
}

on_all_backends! {
    an_exhausted_message_is_an_error_in_the_trace:
        an_exhausted_message_is_an_error_in_the_trace_on_postgres,
        an_exhausted_message_is_an_error_in_the_trace_on_sqlite,
        an_exhausted_message_is_an_error_in_the_trace_on_mysql;
    batches_and_dead_letters_keep_the_trace:
        batches_and_dead_letters_keep_the_trace_on_postgres,
        batches_and_dead_letters_keep_the_trace_on_sqlite,
        batches_and_dead_letters_keep_the_trace_on_mysql;
    one_booking_is_one_trace:
        one_booking_is_one_trace_on_postgres,
        one_booking_is_one_trace_on_sqlite,
        one_booking_is_one_trace_on_mysql;
    no_context_writes_no_trace_columns:
        no_context_writes_no_trace_columns_on_postgres,
        no_context_writes_no_trace_columns_on_sqlite,
        no_context_writes_no_trace_columns_on_mysql;
}
