//! The inbox reading CloudEvents, against the NATS server at `NATS_URL` (default 127.0.0.1:4222)
//! and PostgreSQL: a binary-mode event published by a plain NATS client, a structured-mode one,
//! and the output of our relay with CloudEvents on each reach the handler of their type exactly
//! once although each is delivered twice; the same id from another source is another event; a
//! CloudEvent without `source` is refused with an error naming it, terminated, and holds up
//! nothing behind it.

use std::time::Duration;

use outbox::{outbox_event, Context, Event, FailureKind, HandlerError, Resources};
use outbox_handlers::async_nats::{jetstream, HeaderMap};
use outbox_handlers::cloudevents::{self, CloudEventError, ContentMode};
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::{Inbox, InboxMessage};
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_tests::nats::{fetch_one, jetstream, memory_stream};
use outbox_tests::{pg, wait_until, TestDb};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

#[outbox_event(topic = "ce.order.placed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    n: i64,
}

/// Records each event it runs for: the message id, its n, and the CloudEvent's source and id
/// when it came from another producer.
struct Record;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for Record {
    type Event = OrderPlaced;
    const NAME: &'static str = "record-order";

    async fn handle(
        &self,
        e: OrderPlaced,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let meta = InboxMessage::of(ctx).expect("inbox metadata");
        if ctx.message_id() != meta.message_id {
            return Err(HandlerError::permanent(
                "the context and the inbox message disagree",
            ));
        }
        let ce = meta.cloudevent.as_ref();
        sqlx::query("INSERT INTO effects (message_id, n, source, ce_id) VALUES ($1, $2, $3, $4)")
            .bind(ctx.message_id())
            .bind(e.n)
            .bind(ce.map(|c| c.source.clone()))
            .bind(ce.map(|c| c.id.clone()))
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

struct Setup {
    js: jetstream::Context,
    stream: String,
    subject: String,
    prefix: String,
    db: TestDb,
}

async fn setup() -> Setup {
    let js = jetstream().await;
    let (stream, prefix) = memory_stream(&js, "inbox_ce").await;
    let db = pg().await;
    sqlx::raw_sql(
        "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, message_id UUID NOT NULL, \
         n BIGINT NOT NULL, source TEXT, ce_id TEXT)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    Setup {
        js,
        stream,
        subject: format!("{prefix}.{}", OrderPlaced::TOPIC),
        prefix,
        db,
    }
}

impl Setup {
    async fn consumer(&self, name: &str) -> jetstream::consumer::PullConsumer {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .create_consumer(jetstream::consumer::pull::Config {
                durable_name: Some(name.into()),
                ack_wait: Duration::from_secs(2),
                ..Default::default()
            })
            .await
            .expect("create the durable consumer")
    }

    /// Runs `inbox` (on the durable consumer `durable`) until it has answered every message.
    async fn drain(&self, inbox: &Inbox, durable: &str) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn({
            let inbox = inbox.clone();
            async move {
                inbox
                    .run_until(async {
                        let _ = stopped.await;
                    })
                    .await
            }
        });
        let watch = self.consumer(durable).await;
        wait_until(
            Duration::from_secs(20),
            "the inbox answers every message",
            async || {
                let info = watch.get_info().await.unwrap();
                info.num_pending == 0 && info.num_ack_pending == 0
            },
        )
        .await;
        stop.send(()).unwrap();
        running.await.unwrap().unwrap();
    }

    /// Publishes `payload` with `headers` and a fresh `Nats-Msg-Id`, as a producer that is not
    /// ours would; returns the stream sequence.
    async fn publish(&self, mut headers: HeaderMap, payload: Vec<u8>) -> u64 {
        headers.insert("Nats-Msg-Id", Uuid::now_v7().to_string().as_str());
        self.js
            .publish_with_headers(self.subject.clone(), headers, payload.into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence
    }

    /// Publishes the message at `seq` again, headers and payload as stored, past the stream's
    /// duplicate window (another `Nats-Msg-Id`): the same event delivered twice.
    async fn publish_again(&self, seq: u64) {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        let stored = stream.get_raw_message(seq).await.unwrap();
        let mut headers = HeaderMap::new();
        for (name, values) in stored.headers.iter() {
            if !name.to_string().eq_ignore_ascii_case("Nats-Msg-Id") {
                for v in values {
                    headers.append(name.clone(), v.as_str());
                }
            }
        }
        self.publish(headers, stored.payload.to_vec()).await;
    }
}

fn binary(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.insert(*name, *value);
    }
    h
}

fn structured() -> HeaderMap {
    binary(&[(
        "Content-Type",
        "application/cloudevents+json; charset=utf-8",
    )])
}

#[tokio::test]
async fn cloudevents_of_any_producer_reach_their_handler_once_each() {
    let s = setup().await;

    // A CloudEvent without `source`, first in the stream: refused, and nothing waits behind it.
    s.publish(
        binary(&[
            ("ce-specversion", "1.0"),
            ("ce-id", "no-source"),
            ("ce-type", OrderPlaced::TOPIC),
        ]),
        br#"{"n":0}"#.to_vec(),
    )
    .await;
    // (a) Binary mode from a plain NATS client.
    let a = s
        .publish(
            binary(&[
                ("ce-specversion", "1.0"),
                ("ce-id", "order-1"),
                ("ce-source", "/shop/eu"),
                ("ce-type", OrderPlaced::TOPIC),
                ("ce-time", "2024-05-01T10:00:00Z"),
                ("content-type", "application/json"),
            ]),
            br#"{"n":1}"#.to_vec(),
        )
        .await;
    // The same id from another source: another event.
    s.publish(
        binary(&[
            ("ce-specversion", "1.0"),
            ("ce-id", "order-1"),
            ("ce-source", "/shop/us"),
            ("ce-type", OrderPlaced::TOPIC),
        ]),
        br#"{"n":4}"#.to_vec(),
    )
    .await;
    // (b) Structured mode.
    let b = s
        .publish(
            structured(),
            br#"{"specversion":"1.0","id":"order-2","source":"/shop/eu","type":"ce.order.placed",
                "datacontenttype":"application/json","data":{"n":2}}"#
                .to_vec(),
        )
        .await;
    // (c) Our relay with CloudEvents on.
    let ours = NatsPublisher::builder(s.js.clone())
        .prefix(s.prefix.clone())
        .cloudevents("/bookings")
        .build()
        .unwrap();
    let ctx = Context::for_test(OrderPlaced::TOPIC, "nats-relay", Resources::new());
    let c = ours
        .publish(&OrderPlaced { n: 3 }, &ctx)
        .await
        .unwrap()
        .sequence;
    for seq in [a, b, c] {
        s.publish_again(seq).await;
    }

    let inbox = Inbox::builder(s.consumer("inbox").await, s.db.pool.clone())
        .handler(Record)
        .build()
        .unwrap();

    // (d) What the inbox says of the event without a source, read through a consumer of its own.
    let probe = s.consumer("probe").await;
    let first = fetch_one(&probe).await;
    let refused = inbox.process(&first).await.unwrap_err();
    assert_eq!(refused.kind(), FailureKind::Permanent);
    assert!(refused.to_string().contains("`source`"), "{refused}");
    let why = refused
        .source()
        .downcast_ref::<CloudEventError>()
        .unwrap_or_else(|| panic!("a CloudEventError: {refused:?}"));
    assert!(
        matches!(why, CloudEventError::MissingAttribute { attribute } if *attribute == "source"),
        "{why:?}"
    );
    let said = InboxMessage::from_message(&first).unwrap_err();
    assert!(said.contains("`source`"), "{said}");

    s.drain(&inbox, "inbox").await;

    let mut stream = s.js.get_stream(&s.stream).await.unwrap();
    let held = stream.info().await.unwrap().state.messages;
    assert_eq!(held, 8, "the refused one, four events, three of them twice");
    let records: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_processed WHERE handler = 'record-order'")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(records, 4);
    let rows: Vec<(Uuid, i64, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT message_id, n, source, ce_id FROM effects ORDER BY n")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    let ns: Vec<i64> = rows.iter().map(|r| r.1).collect();
    // Each once although a, b and c were delivered twice; nothing for the refused one.
    assert_eq!(ns, vec![1, 2, 3, 4], "{rows:?}");
    let eu = Some("/shop/eu".to_string());
    assert_eq!(
        rows[0],
        (
            cloudevents::identity("/shop/eu", "order-1"),
            1,
            eu.clone(),
            Some("order-1".into())
        )
    );
    assert_eq!(
        rows[1],
        (
            cloudevents::identity("/shop/eu", "order-2"),
            2,
            eu,
            Some("order-2".into())
        )
    );
    // Our relay's message is keyed by its outbox message id, as without CloudEvents.
    assert_eq!(rows[2], (ctx.message_id(), 3, None, None));
    assert_eq!(rows[3].0, cloudevents::identity("/shop/us", "order-1"));

    s.js.delete_stream(&s.stream).await.unwrap();
    s.db.drop_db().await;
}

#[tokio::test]
async fn the_inbox_message_describes_the_cloudevent() {
    let s = setup().await;
    s.publish(
        structured(),
        br#"{"specversion":"1.0","id":"x-9","source":"urn:shop","type":"ce.order.placed",
            "time":"2024-05-01T10:00:00.5Z","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "data":{"n":9}}"#
            .to_vec(),
    )
    .await;
    let message = fetch_one(&s.consumer("probe").await).await;
    let meta = InboxMessage::from_message(&message).unwrap();
    assert_eq!(meta.topic, OrderPlaced::TOPIC);
    assert_eq!(meta.message_id, cloudevents::identity("urn:shop", "x-9"));
    assert_eq!(
        meta.created_at.map(|t| t.to_rfc3339()),
        Some("2024-05-01T10:00:00.500+00:00".to_string())
    );
    assert_eq!(
        meta.trace.as_ref().map(|t| t.traceparent().to_string()),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string())
    );
    let ce = meta.cloudevent.expect("the CloudEvent's attributes");
    assert_eq!((ce.id.as_str(), ce.source.as_str()), ("x-9", "urn:shop"));
    assert_eq!(ce.mode, ContentMode::Structured);

    s.js.delete_stream(&s.stream).await.unwrap();
    s.db.drop_db().await;
}

/// Version 1 of a guest's registration: one name.
#[outbox_event(topic = "ce.guest.registered")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GuestRegisteredV1 {
    name: String,
}

/// Version 2: the name split in two.
#[outbox_event(topic = "ce.guest.registered", version = 2, previous = GuestRegisteredV1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GuestRegistered {
    first_name: String,
    last_name: String,
}

impl From<GuestRegisteredV1> for GuestRegistered {
    fn from(v1: GuestRegisteredV1) -> Self {
        let (first, last) = v1.name.split_once(' ').unwrap_or((&v1.name, ""));
        GuestRegistered {
            first_name: first.into(),
            last_name: last.into(),
        }
    }
}

/// Records each guest as its handler received it, with the version it was written with.
struct RecordGuest;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for RecordGuest {
    type Event = GuestRegistered;
    const NAME: &'static str = "record-guest";

    async fn handle(
        &self,
        e: GuestRegistered,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO guests (first_name, last_name, version) VALUES ($1, $2, $3)")
            .bind(e.first_name)
            .bind(e.last_name)
            .bind(i64::from(ctx.version()))
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Events of an older version reach the inbox's handler upcast to its type: the version comes
/// from the relay's `Outbox-Version` header or a CloudEvent's `dataversion`, 1 when absent; a
/// `dataversion` that is no version is refused, naming the attribute.
#[tokio::test]
async fn older_versions_are_upcast_across_the_broker() {
    let s = setup().await;
    sqlx::raw_sql("CREATE TABLE guests (first_name TEXT, last_name TEXT, version BIGINT)")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let subject = format!("{}.{}", s.prefix, GuestRegistered::TOPIC);
    let publish = async |headers: &[(&str, &str)], payload: &[u8]| {
        let mut h = binary(headers);
        h.insert("Nats-Msg-Id", Uuid::now_v7().to_string().as_str());
        s.js.publish_with_headers(subject.clone(), h, payload.to_vec().into())
            .await
            .unwrap()
            .await
            .unwrap()
            .sequence
    };
    let ce = |id: &'static str, version: &'static str| {
        [
            ("ce-specversion", "1.0"),
            ("ce-id", id),
            ("ce-source", "/guests"),
            ("ce-type", GuestRegistered::TOPIC),
            ("ce-dataversion", version),
        ]
    };
    publish(&ce("g-1", "1"), br#"{"name":"Ada Lovelace"}"#).await;
    publish(
        &ce("g-2", "2"),
        br#"{"first_name":"Alan","last_name":"Turing"}"#,
    )
    .await;
    publish(&ce("g-3", "two"), br#"{"name":"Nobody"}"#).await;
    // Our relay, from a producer still writing version 1.
    let ours = NatsPublisher::builder(s.js.clone())
        .prefix(s.prefix.clone())
        .cloudevents("/bookings")
        .build()
        .unwrap();
    let ctx = Context::for_test(GuestRegistered::TOPIC, "nats-relay", Resources::new());
    let relayed = ours
        .publish(
            &GuestRegisteredV1 {
                name: "Grace Hopper".into(),
            },
            &ctx,
        )
        .await
        .unwrap()
        .sequence;
    let stored =
        s.js.get_stream(&s.stream)
            .await
            .unwrap()
            .get_raw_message(relayed)
            .await
            .unwrap();
    for name in ["Outbox-Version", "ce-dataversion"] {
        assert_eq!(
            stored.headers.get(name).map(|v| v.as_str().to_string()),
            Some("1".to_string()),
            "{name}"
        );
    }

    let inbox = Inbox::builder(s.consumer("guests").await, s.db.pool.clone())
        .handler(RecordGuest)
        .build()
        .unwrap();
    let probe = s.consumer("probe").await;
    for _ in 0..2 {
        fetch_one(&probe).await;
    }
    let refused = inbox.process(&fetch_one(&probe).await).await.unwrap_err();
    assert_eq!(refused.kind(), FailureKind::Permanent);
    assert!(refused.to_string().contains("`dataversion`"), "{refused}");

    s.drain(&inbox, "guests").await;

    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT first_name, last_name, version FROM guests ORDER BY first_name")
            .fetch_all(&s.db.pool)
            .await
            .unwrap();
    let want = [
        ("Ada", "Lovelace", 1),
        ("Alan", "Turing", 2),
        ("Grace", "Hopper", 1),
    ];
    let got: Vec<(&str, &str, i64)> = rows
        .iter()
        .map(|(f, l, v)| (f.as_str(), l.as_str(), *v))
        .collect();
    assert_eq!(got, want);

    s.js.delete_stream(&s.stream).await.unwrap();
    s.db.drop_db().await;
}
