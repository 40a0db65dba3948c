//! The JetStream relay (`outbox_handlers::relay::nats`) against the NATS server at `NATS_URL`
//! (default 127.0.0.1:4222, JetStream enabled): an enqueued event lands in the stream on the
//! subject derived from its topic, with the outbox headers and `Nats-Msg-Id`; a redelivery is
//! dropped by the stream's duplicate window; a subject no stream captures and an oversized
//! message are permanent failures.
//!
//! Every test makes a stream of its own, named and prefixed uniquely, and deletes it at the end.
//!
//! One test reads this process's log and metrics: it runs alone, the others side by side.

use std::time::Duration;

use outbox::{
    enqueue, enqueue_with, outbox_event, Context, EnqueueOptions, Event, FailureKind, Handler,
    Resources, Worker,
};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::relay::headers;
use outbox_handlers::relay::nats::{NatsPublisher, NatsRelay};
use outbox_tests::observe::ALONE;
use outbox_tests::outages::{check_reports, relay_through_cuts};
use outbox_tests::pg;
use outbox_tests::proxy::{host_port, Proxy};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "relay.booking.created")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
    note: String,
}

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

async fn jetstream() -> jetstream::Context {
    let client = async_nats::connect(nats_url()).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to NATS at {}: {e}; start nats-server -js or set NATS_URL",
            nats_url()
        )
    });
    jetstream::new(client)
}

/// A memory stream capturing `{prefix}.>`, both unique to one test.
struct TestStream {
    js: jetstream::Context,
    name: String,
    prefix: String,
}

impl TestStream {
    async fn new(js: &jetstream::Context, max_message_size: i32) -> TestStream {
        let id = uuid::Uuid::now_v7().simple().to_string();
        let name = format!("relay_{id}");
        let prefix = format!("t{id}");
        js.create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::Memory,
            duplicate_window: Duration::from_secs(120),
            max_message_size,
            // A backstop for a test that fails before deleting its stream.
            max_age: Duration::from_secs(3600),
            ..Default::default()
        })
        .await
        .expect("create the test stream");
        TestStream {
            js: js.clone(),
            name,
            prefix,
        }
    }

    async fn count(&self) -> u64 {
        let mut stream = self.js.get_stream(&self.name).await.expect("stream exists");
        stream.info().await.expect("stream info").state.messages
    }

    async fn message(&self, sequence: u64) -> jetstream::message::StreamMessage {
        let stream = self.js.get_stream(&self.name).await.expect("stream exists");
        stream
            .get_raw_message(sequence)
            .await
            .expect("message in the stream")
    }

    async fn delete(self) {
        self.js
            .delete_stream(&self.name)
            .await
            .expect("delete the test stream");
    }
}

fn header<'a>(m: &'a jetstream::message::StreamMessage, name: &str) -> &'a str {
    m.headers
        .get(name)
        .unwrap_or_else(|| panic!("header {name} is set"))
        .as_str()
}

#[tokio::test]
async fn an_enqueued_event_lands_in_the_stream_with_its_subject_and_headers() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let stream = TestStream::new(&js, -1).await;
    let db = pg().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(stream.prefix.clone())
        .build()
        .unwrap();

    let event = BookingCreated {
        booking_id: 7,
        note: "sea view".into(),
    };
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &event).await.unwrap();
    let keyed = enqueue_with(
        &mut *tx,
        &BookingCreated {
            booking_id: 8,
            note: String::new(),
        },
        &EnqueueOptions::new().idempotency_key("booking-8"),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let worker = Worker::builder(&db.pool)
        .handler(nats.relay::<BookingCreated>())
        .build()
        .unwrap();
    let report = worker.run_once().await.unwrap();
    assert_eq!(report.done, 2, "{report:?}");
    assert_eq!(stream.count().await, 2);

    // The worker may run the two in either order.
    let (first, second) = (stream.message(1).await, stream.message(2).await);
    let (m, k) = if header(&first, headers::MESSAGE_ID) == id.to_string() {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(
        m.subject.as_str(),
        format!("{}.relay.booking.created", stream.prefix)
    );
    assert_eq!(header(&m, "Nats-Msg-Id"), format!("{id}:nats-relay"));
    assert_eq!(
        header(&m, headers::IDEMPOTENCY_KEY),
        format!("{id}:nats-relay")
    );
    assert_eq!(header(&m, headers::MESSAGE_ID), id.to_string());
    assert_eq!(header(&m, headers::TOPIC), "relay.booking.created");
    assert_eq!(header(&m, headers::ATTEMPT), "1");
    let created = chrono::DateTime::parse_from_rfc3339(header(&m, headers::CREATED_AT))
        .expect("created-at is RFC 3339");
    assert!((chrono::Utc::now() - created.to_utc()).num_seconds().abs() < 60);
    assert_eq!(header(&m, "Content-Type"), "application/json");
    // Enqueued outside any traced span: no trace context to send.
    assert!(m.headers.get(headers::TRACEPARENT).is_none());
    let payload: BookingCreated = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(payload, event);

    // A key given at enqueue time is the Nats-Msg-Id.
    assert_eq!(header(&k, headers::MESSAGE_ID), keyed.to_string());
    assert_eq!(header(&k, "Nats-Msg-Id"), "booking-8");

    stream.delete().await;
    db.drop_db().await;
}

#[outbox_event(topic = "relay.booking.cancelled")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCancelled {
    booking_id: i64,
}

#[tokio::test]
async fn one_line_relays_every_declared_event_with_its_payload_as_stored() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let stream = TestStream::new(&js, -1).await;
    let db = pg().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(stream.prefix.clone())
        .build()
        .unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    let created = enqueue(
        &mut *tx,
        &BookingCreated {
            booking_id: 1,
            note: "late arrival".into(),
        },
    )
    .await
    .unwrap();
    let cancelled = enqueue(&mut *tx, &BookingCancelled { booking_id: 1 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // A producer of a newer version wrote a field this binary's types do not know: a raw relay
    // passes it on.
    sqlx::query(
        "UPDATE outbox_messages SET payload = '{\"booking_id\":1,\"reason\":\"guest\"}' WHERE id = $1",
    )
    .bind(cancelled)
    .execute(&db.pool)
    .await
    .unwrap();

    let worker = Worker::builder(&db.pool)
        .raw_handler_for_declared_events(std::sync::Arc::new(nats))
        .build()
        .expect("every declared event has a handler: the relay");
    let report = worker.run_once().await.unwrap();
    assert_eq!(report.done, 2, "{report:?}");
    assert_eq!(stream.count().await, 2);

    let (first, second) = (stream.message(1).await, stream.message(2).await);
    let (c, x) = if header(&first, headers::MESSAGE_ID) == created.to_string() {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!(
        c.subject.as_str(),
        format!("{}.relay.booking.created", stream.prefix)
    );
    assert_eq!(header(&c, "Nats-Msg-Id"), format!("{created}:nats-relay"));
    let payload: BookingCreated = serde_json::from_slice(&c.payload).unwrap();
    assert_eq!(payload.note, "late arrival");
    assert_eq!(
        x.subject.as_str(),
        format!("{}.relay.booking.cancelled", stream.prefix)
    );
    assert_eq!(header(&x, headers::MESSAGE_ID), cancelled.to_string());
    assert_eq!(header(&x, headers::TOPIC), "relay.booking.cancelled");
    let raw: serde_json::Value = serde_json::from_slice(&x.payload).unwrap();
    assert_eq!(raw, serde_json::json!({"booking_id": 1, "reason": "guest"}));

    stream.delete().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_redelivery_leaves_one_message_in_the_stream() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let stream = TestStream::new(&js, -1).await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(stream.prefix.clone())
        .build()
        .unwrap();
    let event = BookingCreated {
        booking_id: 1,
        note: String::new(),
    };
    let ctx = Context::for_test(BookingCreated::TOPIC, "nats-relay", Resources::new());

    let first = nats.publish(&event, &ctx).await.unwrap();
    assert!(!first.duplicate);
    // The worker retries the same message (a crash after the publish, a lost outcome).
    let again = ctx.clone().with_attempt(2, 8);
    let second = nats.publish(&event, &again).await.unwrap();
    assert!(second.duplicate, "the stream saw the same Nats-Msg-Id");
    assert_eq!(second.sequence, first.sequence);
    // And through the handler, a third time.
    nats.relay::<BookingCreated>()
        .handle(event.clone(), &again.with_attempt(3, 8))
        .await
        .unwrap();
    assert_eq!(stream.count().await, 1);

    // Another message is stored.
    let other = Context::for_test(BookingCreated::TOPIC, "nats-relay", Resources::new());
    nats.publish(&event, &other).await.unwrap();
    assert_eq!(stream.count().await, 2);

    stream.delete().await;
}

#[tokio::test]
async fn a_subject_no_stream_captures_is_a_permanent_error_naming_it() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let prefix = format!("nostream{}", uuid::Uuid::now_v7().simple());
    let relay: NatsRelay<BookingCreated> = NatsPublisher::builder(js)
        .prefix(prefix.clone())
        .build()
        .unwrap()
        .relay();
    let ctx = Context::for_test(BookingCreated::TOPIC, "nats-relay", Resources::new());
    let err = relay
        .handle(
            BookingCreated {
                booking_id: 1,
                note: String::new(),
            },
            &ctx,
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("`{prefix}.relay.booking.created`")),
        "{text}"
    );
    assert!(text.contains("no JetStream stream captures"), "{text}");
}

#[tokio::test]
async fn an_oversized_message_is_a_permanent_error() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let stream = TestStream::new(&js, 1024).await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(stream.prefix.clone())
        .build()
        .unwrap();
    let ctx = Context::for_test(BookingCreated::TOPIC, "nats-relay", Resources::new());

    // Over the stream's max_msg_size: the stream refuses it.
    let big = BookingCreated {
        booking_id: 1,
        note: "x".repeat(4096),
    };
    let err = nats.publish(&big, &ctx).await.unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "{err}");
    assert!(err.to_string().contains("too large"), "{err}");

    // Over the server's max_payload: the client refuses it before sending.
    let huge = BookingCreated {
        booking_id: 2,
        note: "x".repeat(2 * 1024 * 1024),
    };
    let err = nats.publish(&huge, &ctx).await.unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "{err}");
    assert!(err.to_string().contains("too large"), "{err}");

    assert_eq!(stream.count().await, 0);
    stream.delete().await;
}

#[tokio::test]
async fn subjects_come_from_the_prefix_or_the_mapping_and_are_checked() {
    let _shared = ALONE.read().await;
    let js = jetstream().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix("acme.outbox")
        .map("user.deleted", "gdpr.erase")
        .build()
        .unwrap();
    assert_eq!(
        nats.subject("booking.created"),
        "acme.outbox.booking.created"
    );
    assert_eq!(nats.subject("user.deleted"), "gdpr.erase");
    assert_eq!(
        NatsPublisher::new(js.clone()).subject("booking.created"),
        "booking.created"
    );

    let err = NatsPublisher::builder(js.clone())
        .prefix("outbox.")
        .build()
        .unwrap_err();
    assert_eq!(err.key(), Some("nats.prefix"), "{err}");
    let err = NatsPublisher::builder(js)
        .map("user.deleted", "gdpr.*")
        .build()
        .unwrap_err();
    assert_eq!(err.key(), Some("nats.map.user.deleted"), "{err}");
}

#[outbox_event(topic = "relay.outage")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Relayed {
    n: i64,
}

/// A worker relays 3,000 events with 64 publishes in flight while a proxy cuts its NATS
/// connection twice, then cuts every connection made for a second. Each outage is logged once
/// when the connection is lost and once when it is back, at WARN, with the publishes it caught
/// and held up; nothing else is logged at WARN or ERROR but the client's lines for attempts to
/// reconnect cut in their handshake. The publishes caught in flight go out again once the client
/// is back rather than after their acknowledgement's timeout, so no message needs a retry of the
/// worker, the stream holds each event once, and the metrics count the losses and the publishes
/// that waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_is_logged_once_lost_and_once_back_with_counts() {
    const CUTS: usize = 3;
    let _alone = ALONE.write().await;
    let stream = TestStream::new(&jetstream().await, -1).await;
    let db = pg().await;
    let proxy = Proxy::start(host_port(&nats_url())).await;
    let client = async_nats::connect(format!("127.0.0.1:{}", proxy.port))
        .await
        .expect("connect to NATS through the proxy");
    let nats = NatsPublisher::builder(jetstream::new(client))
        .prefix(stream.prefix.clone())
        // Room for the client's pause between attempts to reconnect, which grows during the
        // outage, on a busy machine.
        .reconnect_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let events = (0..3_000).map(|n| Relayed { n }).collect();
    relay_through_cuts(nats.relay::<Relayed>(), events, &db, &proxy, CUTS).await;
    check_reports("NATS", "nats", None, Relayed::TOPIC, &["async_nats"], CUTS);
    assert_eq!(
        stream.count().await,
        3_000,
        "the stream holds each event once"
    );

    drop(proxy);
    stream.delete().await;
    db.drop_db().await;
}
