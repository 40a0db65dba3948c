//! The relays with CloudEvents on (`.cloudevents(source)`), against the NATS server at `NATS_URL`
//! (default 127.0.0.1:4222) and the RabbitMQ broker at `AMQP_URL` (default
//! amqp://guest:guest@127.0.0.1:5672/%2f): every message read back from the stream or the queue
//! carries the CloudEvents 1.0 binary-mode attributes of its outbox message, beside the outbox's
//! own headers and broker dedup id, which stay as they are; a relay without the setting sends no
//! CloudEvents attribute.
//!
//! Every test makes a stream, or an exchange and a queue, of its own and deletes them at the end.

use outbox::{enqueue, outbox_event, Context, Event, Handler, Resources, Worker};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::lapin::options::BasicGetOptions;
use outbox_handlers::relay::headers;
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_handlers::relay::rabbitmq::RabbitPublisher;
use outbox_tests::nats::{jetstream, memory_stream};
use outbox_tests::pg;
use outbox_tests::rabbitmq::{amqp_url, header as amqp_header, Topology};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "ce.room.booked")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RoomBooked {
    room: i64,
}

/// A source with a character outside ASCII: NATS carries it percent-encoded.
const SOURCE: &str = "/hotels/zürich";
const SOURCE_ON_NATS: &str = "/hotels/z%C3%BCrich";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn traced_ctx() -> Context {
    Context::for_test(RoomBooked::TOPIC, "relay", Resources::new()).with_trace_context(Some(
        outbox::trace::TraceContext::new(TRACEPARENT, Some("vendor=opaque".into())),
    ))
}

async fn stored(js: &jetstream::Context, stream: &str, seq: u64) -> async_nats::HeaderMap {
    let stream = js.get_stream(stream).await.unwrap();
    stream.get_raw_message(seq).await.unwrap().headers
}

fn nats_header<'a>(h: &'a async_nats::HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("header {name} is set"))
        .as_str()
}

#[tokio::test]
async fn the_nats_relay_sends_every_attribute_as_a_ce_header() {
    let js = jetstream().await;
    let (name, prefix) = memory_stream(&js, "ce").await;
    let db = pg().await;
    let nats = NatsPublisher::builder(js.clone())
        .prefix(prefix.clone())
        .cloudevents(SOURCE)
        .build()
        .unwrap();

    // Through the worker: the id and the time are those of the stored message.
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &RoomBooked { room: 12 }).await.unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::builder(&db.pool)
        .handler(nats.relay::<RoomBooked>())
        .build()
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap().done, 1);

    let h = stored(&js, &name, 1).await;
    assert_eq!(nats_header(&h, "ce-specversion"), "1.0");
    assert_eq!(nats_header(&h, "ce-id"), id.to_string());
    assert_eq!(nats_header(&h, "ce-source"), SOURCE_ON_NATS);
    assert_eq!(nats_header(&h, "ce-type"), "ce.room.booked");
    let time = chrono::DateTime::parse_from_rfc3339(nats_header(&h, "ce-time"))
        .expect("ce-time is RFC 3339");
    let created = chrono::DateTime::parse_from_rfc3339(nats_header(&h, headers::CREATED_AT))
        .expect("the outbox's created-at");
    assert_eq!(time, created, "the enqueue time");
    assert_eq!(nats_header(&h, "ce-datacontenttype"), "application/json");
    assert_eq!(nats_header(&h, "Content-Type"), "application/json");
    // The version of the event type the message was stored with, as an extension attribute
    // and as the outbox's own header.
    assert_eq!(nats_header(&h, "ce-dataversion"), "1");
    assert_eq!(nats_header(&h, headers::VERSION), "1");
    // Enqueued outside any traced span: no trace context.
    assert!(h.get(headers::TRACEPARENT).is_none());
    // The outbox's own headers and the dedup id, unchanged.
    assert_eq!(nats_header(&h, "Nats-Msg-Id"), format!("{id}:nats-relay"));
    assert_eq!(nats_header(&h, headers::MESSAGE_ID), id.to_string());
    assert_eq!(nats_header(&h, headers::TOPIC), "ce.room.booked");

    // A delivery with a trace context carries it as `traceparent` and `tracestate`.
    let ctx = traced_ctx();
    nats.publish(&RoomBooked { room: 13 }, &ctx).await.unwrap();
    let h = stored(&js, &name, 2).await;
    assert_eq!(nats_header(&h, "ce-id"), ctx.message_id().to_string());
    assert_eq!(nats_header(&h, headers::TRACEPARENT), TRACEPARENT);
    assert_eq!(nats_header(&h, headers::TRACESTATE), "vendor=opaque");

    // Off unless set: the same message from a relay without the setting has no ce- header.
    let plain = NatsPublisher::builder(js.clone())
        .prefix(prefix.clone())
        .build()
        .unwrap();
    plain
        .publish(&RoomBooked { room: 14 }, &traced_ctx())
        .await
        .unwrap();
    let h = stored(&js, &name, 3).await;
    let ce: Vec<String> = h
        .iter()
        .map(|(n, _)| n.to_string())
        .filter(|n| n.to_ascii_lowercase().starts_with("ce-"))
        .collect();
    assert!(ce.is_empty(), "{ce:?}");

    js.delete_stream(&name).await.unwrap();
    db.drop_db().await;
}

#[test]
fn a_source_that_is_no_uri_reference_is_refused_at_build() {
    let rabbit = RabbitPublisher::builder(amqp_url())
        .cloudevents("my service")
        .build()
        .unwrap_err();
    assert!(
        rabbit.to_string().contains("rabbitmq.cloudevents"),
        "{rabbit}"
    );
    assert!(RabbitPublisher::builder(amqp_url())
        .cloudevents("")
        .build()
        .is_err());
}

#[tokio::test]
async fn the_rabbitmq_relay_sends_every_attribute_as_a_cloudevents_property() {
    let topology = Topology::new(RoomBooked::TOPIC).await;
    let db = pg().await;
    let rabbit = RabbitPublisher::builder(amqp_url())
        .exchange(topology.exchange.clone())
        .cloudevents(SOURCE)
        .build()
        .unwrap();
    let get = || async {
        topology
            .channel
            .basic_get(
                topology.queue.as_str().into(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
            .expect("the queue holds the message")
    };

    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &RoomBooked { room: 21 }).await.unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::builder(&db.pool)
        .handler(rabbit.relay::<RoomBooked>())
        .build()
        .unwrap();
    assert_eq!(worker.run_once().await.unwrap().done, 1);

    let got = get().await;
    let props = &got.delivery.properties;
    let table = props.headers().as_ref().expect("headers");
    assert_eq!(amqp_header(table, "cloudEvents_specversion"), "1.0");
    assert_eq!(amqp_header(table, "cloudEvents_id"), id.to_string());
    // AMQP strings are UTF-8: the source as configured.
    assert_eq!(amqp_header(table, "cloudEvents_source"), SOURCE);
    assert_eq!(amqp_header(table, "cloudEvents_type"), "ce.room.booked");
    assert_eq!(
        amqp_header(table, "cloudEvents_time"),
        amqp_header(table, headers::CREATED_AT),
        "the enqueue time"
    );
    // The binding maps datacontenttype to the content-type property, not to a header.
    assert!(table.inner().get("cloudEvents_datacontenttype").is_none());
    assert_eq!(
        props.content_type().as_ref().map(|s| s.to_string()),
        Some("application/json".to_string())
    );
    assert_eq!(amqp_header(table, "cloudEvents_dataversion"), "1");
    assert_eq!(amqp_header(table, headers::VERSION), "1");
    assert!(table.inner().get(headers::TRACEPARENT).is_none());
    // The dedup id and the outbox's headers, unchanged.
    assert_eq!(
        props.message_id().as_ref().map(|s| s.to_string()),
        Some(format!("{id}:rabbitmq-relay"))
    );
    assert_eq!(amqp_header(table, headers::MESSAGE_ID), id.to_string());
    let payload: RoomBooked = serde_json::from_slice(&got.delivery.data).unwrap();
    assert_eq!(payload, RoomBooked { room: 21 });

    // A traced delivery carries its trace context.
    let ctx = traced_ctx();
    rabbit
        .relay::<RoomBooked>()
        .handle(RoomBooked { room: 22 }, &ctx)
        .await
        .unwrap();
    let got = get().await;
    let table = got.delivery.properties.headers().as_ref().expect("headers");
    assert_eq!(
        amqp_header(table, "cloudEvents_id"),
        ctx.message_id().to_string()
    );
    assert_eq!(amqp_header(table, headers::TRACEPARENT), TRACEPARENT);
    assert_eq!(amqp_header(table, headers::TRACESTATE), "vendor=opaque");

    // Off unless set.
    let plain = RabbitPublisher::builder(amqp_url())
        .exchange(topology.exchange.clone())
        .build()
        .unwrap();
    plain.publish(&RoomBooked { room: 23 }, &ctx).await.unwrap();
    let got = get().await;
    let table = got.delivery.properties.headers().as_ref().expect("headers");
    let ce: Vec<String> = table
        .inner()
        .keys()
        .map(|k| k.to_string())
        .filter(|k| k.starts_with("cloudEvents"))
        .collect();
    assert!(ce.is_empty(), "{ce:?}");

    topology.delete().await;
    db.drop_db().await;
}
