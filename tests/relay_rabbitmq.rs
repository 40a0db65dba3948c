//! The RabbitMQ relay (`outbox_handlers::relay::rabbitmq`) against the broker at `AMQP_URL`
//! (default amqp://guest:guest@127.0.0.1:5672/%2f): a bound queue receives an enqueued event,
//! persistent, with the idempotency key as `message_id` and the outbox headers; an unroutable
//! message and a missing exchange are permanent failures naming the exchange and routing key;
//! with many publishes in flight each gets its own confirm or return, and none confirmed is lost
//! when the connection drops.
//!
//! Every test declares an exchange and a queue of its own and deletes them at the end.
//!
//! One test reads this process's log and metrics: it runs alone, the others side by side.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::{enqueue, outbox_event, Context, Event, FailureKind, Handler, Resources, Worker};
use outbox_handlers::lapin::options::BasicGetOptions;
use outbox_handlers::relay::headers;
use outbox_handlers::relay::rabbitmq::{RabbitPublisher, RabbitPublisherBuilder};
use outbox_tests::observe::ALONE;
use outbox_tests::outages::{check_reports, relay_through_cuts};
use outbox_tests::proxy::{host_port, Proxy};
use outbox_tests::rabbitmq::{amqp_url, header, Topology};
use outbox_tests::{pg, random_ms};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "relay.booking.created")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct BookingCreated {
    booking_id: i64,
}

#[tokio::test]
async fn a_bound_queue_receives_the_event_with_its_message_id() {
    let _shared = ALONE.read().await;
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
    let _shared = ALONE.read().await;
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
    let _shared = ALONE.read().await;
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

/// Every publish the relay reports as confirmed is in the queue, while 64 publishes at a time
/// share the channel and a proxy cuts the connection every 100-300 ms.
///
/// The broker numbers a channel's publishes in the order their frames arrive and confirms them
/// by that number; a confirm matched to another publish in flight would report a message the
/// broker never received as delivered, and the outbox would forget it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_confirmed_publish_is_in_the_queue_through_connection_drops() {
    let _shared = ALONE.read().await;
    const TOPIC: &str = "relay.confirmed";
    // Enough for about 100 drops: before each publish had a channel of its own, a run this long
    // lost a confirmed publish in each of three tries.
    const CONFIRMED: usize = 150_000;
    const TASKS: usize = 64;
    let topology = Topology::new(TOPIC).await;
    let proxy = Proxy::start(host_port(&amqp_url())).await;
    let rabbit =
        RabbitPublisher::builder(format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port))
            .exchange(topology.exchange.clone())
            .build()
            .unwrap();

    let confirmed = Arc::new(Mutex::new(HashSet::new()));
    let failed = Arc::new(AtomicUsize::new(0));
    let publishers: Vec<_> = (0..TASKS)
        .map(|_| {
            let (rabbit, confirmed, failed) = (rabbit.clone(), confirmed.clone(), failed.clone());
            tokio::spawn(async move {
                while confirmed.lock().unwrap().len() < CONFIRMED {
                    let ctx = Context::for_test(TOPIC, "rabbitmq-relay", Resources::new());
                    let published = tokio::time::timeout(
                        Duration::from_secs(10),
                        rabbit.publish_payload(b"{}", &ctx),
                    )
                    .await;
                    match published {
                        Ok(Ok(())) => {
                            confirmed.lock().unwrap().insert(ctx.message_id());
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut drops = 0;
    while publishers.iter().any(|p| !p.is_finished()) {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{} of {CONFIRMED} publishes confirmed in 180 s",
            confirmed.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(100 + random_ms(200))).await;
        drops += proxy.drop_all().min(1);
    }
    for p in publishers {
        p.await.unwrap();
    }
    let confirmed = std::mem::take(&mut *confirmed.lock().unwrap());
    eprintln!(
        "{} publishes confirmed, {} failed, through {drops} connection drops",
        confirmed.len(),
        failed.load(Ordering::Relaxed)
    );
    assert!(
        drops >= 20,
        "the connection must drop during the run: {drops} drops"
    );

    let in_queue = topology.message_ids().await;
    let lost: Vec<_> = confirmed
        .iter()
        .filter(|id| !in_queue.contains_key(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} confirmed publishes are not in the queue, e.g. {:?}",
        lost.len(),
        confirmed.len(),
        &lost[..lost.len().min(10)]
    );
    drop(proxy);
    topology.delete().await;
}

/// With 64 publishes in flight, half of them unroutable, each call gets its own outcome: every
/// routable message is confirmed, every unroutable one is a permanent error naming it, and the
/// queue holds exactly the routable ones.
///
/// RabbitMQ returns an unroutable message before its confirm without naming the publish; on a
/// channel shared by calls in flight the return could be handed to another call, dead-lettering
/// a routable message and reporting the unroutable one as delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_concurrent_publish_gets_its_own_return_or_confirm() {
    let _shared = ALONE.read().await;
    let rabbit = |uri| RabbitPublisher::builder(uri);
    concurrent_outcomes(rabbit, 500, false).await;
}

/// With two channels at most, 64 concurrent calls wait for one in turn: none fails for want of a
/// channel, and each still gets its own outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_beyond_max_channels_wait_for_a_channel() {
    let _shared = ALONE.read().await;
    let rabbit = |uri| RabbitPublisher::builder(uri).max_channels(2);
    concurrent_outcomes(rabbit, 20, false).await;
}

/// Calls abandoned mid-publish, as a handler cut off by its deadline is, neither keep their
/// channel (the 8 allowed would run out and every later call hang) nor disturb another call's
/// outcome: every third call of 64 tasks is dropped after 0-6 ms, and the others still get
/// their own confirm or return.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abandoned_publishes_give_their_channel_back_and_leave_no_confirm_behind() {
    let _shared = ALONE.read().await;
    let rabbit = |uri| RabbitPublisher::builder(uri).max_channels(8);
    concurrent_outcomes(rabbit, 150, true).await;
}

/// 64 tasks publish `each` messages on one publisher, alternately to a bound routing key and to
/// one nobody listens to, and check every call's outcome and the queue. With `abandon`, every
/// third call runs under a timeout of 0-6 ms and is dropped when it expires.
async fn concurrent_outcomes(
    builder: impl Fn(String) -> RabbitPublisherBuilder,
    each: usize,
    abandon: bool,
) {
    const TOPIC: &str = "relay.routed";
    const UNROUTED: &str = "relay.unrouted";
    const TASKS: usize = 64;
    let topology = Topology::new(TOPIC).await;
    let rabbit = builder(amqp_url())
        .exchange(topology.exchange.clone())
        .map(UNROUTED, topology.exchange.clone(), "nobody.listens")
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let rabbit = rabbit.clone();
            tokio::spawn(async move {
                let mut routed = HashSet::new();
                let (mut dropped, mut wrong) = (HashSet::new(), Vec::new());
                for i in 0..each {
                    let topic = if (i + t) % 2 == 0 { TOPIC } else { UNROUTED };
                    let ctx = Context::for_test(topic, "rabbitmq-relay", Resources::new());
                    let publish = rabbit.publish_payload(b"{}", &ctx);
                    let outcome = if abandon && i % 3 == 2 {
                        let limit = Duration::from_micros(random_ms(6_000));
                        match tokio::time::timeout(limit, publish).await {
                            Ok(outcome) => outcome,
                            Err(_) => {
                                dropped.insert(ctx.message_id());
                                continue;
                            }
                        }
                    } else {
                        publish.await
                    };
                    match (topic, outcome) {
                        (TOPIC, Ok(())) => {
                            routed.insert(ctx.message_id());
                        }
                        (UNROUTED, Err(e))
                            if e.kind() == FailureKind::Permanent
                                && e.to_string().contains("`nobody.listens`") => {}
                        (topic, outcome) => wrong.push(format!("{topic}: {outcome:?}")),
                    }
                }
                (routed, dropped, wrong)
            })
        })
        .collect();
    let (mut routed, mut dropped, mut wrong) = (HashSet::new(), HashSet::new(), Vec::new());
    for task in tasks {
        let (r, d, w) = tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every call ends: no channel is kept by an abandoned call")
            .unwrap();
        routed.extend(r);
        dropped.extend(d);
        wrong.extend(w);
    }
    let calls = TASKS * each;
    assert!(
        wrong.is_empty(),
        "{} of {calls} publishes got another's outcome, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    let in_queue = topology.message_ids().await;
    let missing = routed
        .iter()
        .filter(|id| !in_queue.contains_key(id))
        .count();
    assert_eq!(missing, 0, "confirmed publishes missing from the queue");
    assert!(
        in_queue
            .iter()
            .all(|(id, &n)| n == 1 && (routed.contains(id) || dropped.contains(id))),
        "the queue holds only routable publishes, once each"
    );
    if !abandon {
        assert_eq!(routed.len(), calls / 2, "every routable publish confirmed");
    } else {
        eprintln!("{} of {calls} calls abandoned", dropped.len());
    }
    topology.delete().await;
}

#[outbox_event(topic = "relay.outage")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Relayed {
    n: i64,
}

/// A worker relays 3,000 events with 64 publishes in flight while a proxy cuts its broker
/// connection twice, then cuts every connection made for a second, as a broker restarting
/// behind a load balancer would. Each outage is logged once when the connection is lost and
/// once when it is back, at WARN, with the publishes it caught and held up, however many
/// attempts to connect fail meanwhile; nothing else is logged at WARN or ERROR but lapin's own
/// lines, which the documented `lapin=off` leaves out. The publishes caught in flight wait for
/// the reconnect and go out again, so no message needs a retry of the worker, and the metrics
/// count the losses and the publishes that waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_connection_is_logged_once_lost_and_once_back_with_counts() {
    const CUTS: usize = 3;
    let _alone = ALONE.write().await;
    let topology = Topology::new(Relayed::TOPIC).await;
    let db = pg().await;
    let proxy = Proxy::start(host_port(&amqp_url())).await;
    let rabbit =
        RabbitPublisher::builder(format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port))
            .exchange(topology.exchange.clone())
            // Room for an attempt to connect that the outage leaves hanging until it times out,
            // on a busy machine.
            .reconnect_wait(Duration::from_secs(30))
            .build()
            .unwrap();
    let events = (0..3_000).map(|n| Relayed { n }).collect();
    relay_through_cuts(rabbit.relay::<Relayed>(), events, &db, &proxy, CUTS).await;
    let broker = format!("127.0.0.1:{}", proxy.port);
    check_reports(
        "RabbitMQ",
        "rabbitmq",
        Some(&broker),
        Relayed::TOPIC,
        &["lapin"],
        CUTS,
    );
    assert_eq!(
        topology.message_ids().await.len(),
        3_000,
        "every event reached the queue"
    );

    drop(proxy);
    topology.delete().await;
    db.drop_db().await;
}
