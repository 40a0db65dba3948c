//! The RabbitMQ relay (`outbox_handlers::relay::rabbitmq`) against the broker at `AMQP_URL`
//! (default amqp://guest:guest@127.0.0.1:5672/%2f): a bound queue receives an enqueued event,
//! persistent, with the idempotency key as `message_id` and the outbox headers; an unroutable
//! message and a missing exchange are permanent failures naming the exchange and routing key.
//!
//! Every test declares an exchange and a queue of its own and deletes them at the end.

use outbox::{enqueue, outbox_event, Context, Event, FailureKind, Handler, Resources, Worker};
use outbox_handlers::lapin::options::BasicGetOptions;
use outbox_handlers::lapin::types::{AMQPValue, FieldTable};
use outbox_handlers::relay::headers;
use outbox_handlers::relay::rabbitmq::RabbitPublisher;
use outbox_tests::pg;
use outbox_tests::rabbitmq::{amqp_url, Topology};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "relay.booking.created")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

fn header(table: &FieldTable, name: &str) -> String {
    match table.inner().get(name) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("header {name}: {other:?}"),
    }
}

#[tokio::test]
async fn a_bound_queue_receives_the_event_with_its_message_id() {
    let topology = Topology::new(BookingCreated::TOPIC).await;
    let db = pg().await;
    let rabbit = RabbitPublisher::builder(amqp_url())
        .exchange(topology.exchange.clone())
        .build()
        .unwrap();

    let event = BookingCreated { booking_id: 5 };
    let mut tx = db.pool.begin().await.unwrap();
    let id = enqueue(&mut *tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    let worker = Worker::builder(&db.pool)
        .handler(rabbit.relay::<BookingCreated>())
        .build()
        .unwrap();
    let report = worker.run_once().await.unwrap();
    assert_eq!(report.done, 1, "{report:?}");

    let got = topology
        .channel
        .basic_get(
            topology.queue.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the queue holds the message");
    let props = &got.delivery.properties;
    let key = format!("{id}:rabbitmq-relay");
    assert_eq!(
        props.message_id().as_ref().map(|s| s.to_string()),
        Some(key.clone())
    );
    assert_eq!(*props.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        props.kind().as_ref().map(|s| s.to_string()).as_deref(),
        Some("relay.booking.created")
    );
    assert_eq!(
        props
            .content_type()
            .as_ref()
            .map(|s| s.to_string())
            .as_deref(),
        Some("application/json")
    );
    let table = props.headers().as_ref().expect("headers");
    assert_eq!(header(table, headers::MESSAGE_ID), id.to_string());
    assert_eq!(header(table, headers::TOPIC), "relay.booking.created");
    assert_eq!(header(table, headers::ATTEMPT), "1");
    assert_eq!(header(table, headers::IDEMPOTENCY_KEY), key);
    // Enqueued outside any traced span: no trace context to send.
    assert!(table.inner().get(headers::TRACEPARENT).is_none());
    assert_eq!(got.delivery.routing_key.as_str(), "relay.booking.created");
    let payload: BookingCreated = serde_json::from_slice(&got.delivery.data).unwrap();
    assert_eq!(payload, event);

    topology.delete().await;
    db.drop_db().await;
}

#[tokio::test]
async fn the_trace_context_goes_in_the_headers() {
    let topology = Topology::new(BookingCreated::TOPIC).await;
    let rabbit = RabbitPublisher::builder(amqp_url())
        .exchange(topology.exchange.clone())
        .build()
        .unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ctx = Context::for_test(BookingCreated::TOPIC, "rabbitmq-relay", Resources::new())
        .with_trace_context(Some(outbox::trace::TraceContext::new(
            traceparent,
            Some("vendor=opaque".into()),
        )));
    rabbit
        .relay::<BookingCreated>()
        .handle(BookingCreated { booking_id: 9 }, &ctx)
        .await
        .expect("published");
    let got = topology
        .channel
        .basic_get(
            topology.queue.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
        .expect("the queue holds the message");
    let table = got.delivery.properties.headers().as_ref().expect("headers");
    assert_eq!(header(table, headers::TRACEPARENT), traceparent);
    assert_eq!(header(table, headers::TRACESTATE), "vendor=opaque");
    topology.delete().await;
}

#[tokio::test]
async fn an_unroutable_message_is_a_permanent_error_naming_exchange_and_key() {
    let topology = Topology::new(BookingCreated::TOPIC).await;
    let rabbit = RabbitPublisher::builder(amqp_url())
        .map(
            BookingCreated::TOPIC,
            topology.exchange.clone(),
            "nobody.listens",
        )
        .build()
        .unwrap();
    let relay = rabbit.relay::<BookingCreated>();
    let ctx = Context::for_test(BookingCreated::TOPIC, "rabbitmq-relay", Resources::new());
    let err = relay
        .handle(BookingCreated { booking_id: 1 }, &ctx)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "{err}");
    let text = err.to_string();
    assert!(text.contains(&format!("`{}`", topology.exchange)), "{text}");
    assert!(text.contains("`nobody.listens`"), "{text}");
    assert!(text.contains("NO_ROUTE"), "{text}");

    // A missing exchange is permanent too, and the publisher recovers its channel after it.
    let missing = RabbitPublisher::builder(amqp_url())
        .exchange(format!("{}-missing", topology.exchange))
        .build()
        .unwrap();
    let err = missing
        .relay::<BookingCreated>()
        .handle(BookingCreated { booking_id: 2 }, &ctx)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("`{}-missing`", topology.exchange)),
        "{err}"
    );
    let routed = RabbitPublisher::builder(amqp_url())
        .exchange(topology.exchange.clone())
        .build()
        .unwrap();
    routed
        .relay::<BookingCreated>()
        .handle(BookingCreated { booking_id: 3 }, &ctx)
        .await
        .expect("a routable message is confirmed");
    let err = missing
        .relay::<BookingCreated>()
        .handle(BookingCreated { booking_id: 4 }, &ctx)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), FailureKind::Permanent, "after reopening: {err}");

    topology.delete().await;
}
