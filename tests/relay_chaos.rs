//! The relays under chaos: 20,000 events relayed to NATS JetStream and to RabbitMQ by three
//! relay worker processes (`relay-worker`), one of them SIGKILLed and replaced every 1-3 s, while
//! a loopback proxy between the workers and both brokers drops every connection every 1.5 s.
//!
//! Afterwards the JetStream stream holds each message exactly once (its `Nats-Msg-Id` is the
//! idempotency key, so a publish repeated after a kill or a lost acknowledgement falls in the
//! stream's duplicate window), RabbitMQ received each message at least once with its
//! `message_id`, and nothing is dead.
//!
//! Needs NATS with JetStream at `NATS_URL` (default 127.0.0.1:4222) and RabbitMQ at `AMQP_URL`
//! (default amqp://guest:guest@127.0.0.1:5672/%2f).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use outbox::{enqueue_many, outbox_event};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::relay::headers;
use outbox_tests::proxy::{host_port, Proxy};
use outbox_tests::rabbitmq::{amqp_url, Topology};
use outbox_tests::{pg, random_ms, sigkill, TestDb};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// The event the `relay-worker` binary relays, under the same topic.
#[outbox_event(topic = "chaos.relayed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Relayed {
    n: i64,
}

const MESSAGES: i64 = 20_000;
const WORKERS: usize = 3;
/// The whole run stops here even if the relay never finishes, and the test fails.
const LIMIT: Duration = Duration::from_secs(240);

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

struct Brokers {
    js: jetstream::Context,
    stream: String,
    prefix: String,
    rabbit: Topology,
}

impl Brokers {
    async fn new() -> Brokers {
        let client = async_nats::connect(nats_url()).await.unwrap_or_else(|e| {
            panic!(
                "cannot connect to NATS at {}: {e}; start nats-server -js or set NATS_URL",
                nats_url()
            )
        });
        let js = jetstream::new(client);
        let id = Uuid::now_v7().simple().to_string();
        let (stream, prefix) = (format!("chaos_{id}"), format!("c{id}"));
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::Memory,
            // Longer than the run: every repeated publish falls inside it.
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::from_secs(3600),
            ..Default::default()
        })
        .await
        .expect("create the stream");

        let rabbit = Topology::new("chaos.relayed").await;
        Brokers {
            js,
            stream,
            prefix,
            rabbit,
        }
    }

    /// The `Outbox-Message-Id` of every message in the stream, with how often each occurs.
    async fn stream_ids(&self) -> HashMap<Uuid, usize> {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
            .await
            .unwrap();
        let total = stream.cached_info().state.messages;
        let mut messages = consumer.messages().await.unwrap();
        let mut ids: HashMap<Uuid, usize> = HashMap::new();
        for _ in 0..total {
            let m = tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .expect("the stream delivers its messages")
                .expect("a message")
                .expect("no error");
            let id = m
                .headers
                .as_ref()
                .and_then(|h| h.get(headers::MESSAGE_ID))
                .expect("the message id header")
                .as_str()
                .parse::<Uuid>()
                .unwrap();
            *ids.entry(id).or_default() += 1;
        }
        ids
    }

    async fn delete(self) {
        let _ = self.js.delete_stream(&self.stream).await;
        self.rabbit.delete().await;
    }
}

fn spawn_worker(db: &TestDb, brokers: &Brokers, nats: &Proxy, amqp: &Proxy) -> Child {
    Command::new(env!("CARGO_BIN_EXE_relay-worker"))
        .arg("--database-url")
        .arg(&db.url)
        .env("NATS_URL", format!("127.0.0.1:{}", nats.port))
        .env("RELAY_PREFIX", &brokers.prefix)
        .env(
            "AMQP_URL",
            format!("amqp://guest:guest@127.0.0.1:{}/%2f", amqp.port),
        )
        .env("RELAY_EXCHANGE", &brokers.rabbit.exchange)
        // Failed publishes and dropped connections are expected here by the thousand: only the
        // outbox's errors are shown.
        .env("RUST_LOG", "error,lapin=off")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn relay-worker")
}

async fn live(db: &TestDb) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM outbox_messages), (SELECT count(*) FROM outbox_dead)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_exactly_once_into_jetstream_and_at_least_once_into_rabbitmq_through_kills_and_drops(
) {
    let db = pg().await;
    let brokers = Brokers::new().await;
    let nats = Proxy::start(host_port(&nats_url())).await;
    let amqp = Proxy::start(host_port(&amqp_url())).await;

    let mut enqueued = HashSet::new();
    for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(1000) {
        let events: Vec<Relayed> = chunk.iter().map(|&n| Relayed { n }).collect();
        let mut tx = db.pool.begin().await.unwrap();
        enqueued.extend(enqueue_many(&mut *tx, &events).await.unwrap());
        tx.commit().await.unwrap();
    }

    let mut workers: Vec<Child> = (0..WORKERS)
        .map(|_| spawn_worker(&db, &brokers, &nats, &amqp))
        .collect();
    let started = Instant::now();
    let (mut kills, mut drops) = (0usize, 0usize);
    let mut next_kill = started + Duration::from_millis(1000 + random_ms(2000));
    let mut next_drop = started + Duration::from_millis(1500);
    let mut left = (MESSAGES, 0);
    while started.elapsed() < LIMIT {
        left = live(&db).await;
        if left.0 == 0 {
            break;
        }
        let now = Instant::now();
        if now >= next_kill {
            let victim = (kills * 7 + 1) % workers.len();
            sigkill(&workers[victim]);
            let _ = workers[victim].wait().await;
            workers[victim] = spawn_worker(&db, &brokers, &nats, &amqp);
            kills += 1;
            next_kill = now + Duration::from_millis(1000 + random_ms(2000));
        }
        if now >= next_drop {
            if nats.drop_all() + amqp.drop_all() > 0 {
                drops += 1;
            }
            next_drop = now + Duration::from_millis(1500);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    for w in &mut workers {
        let _ = w.kill().await;
    }
    eprintln!(
        "relayed {MESSAGES} messages in {took:.1?} through {kills} SIGKILLs and {drops} connection drops"
    );
    assert_eq!(left, (0, 0), "(live, dead) messages left after {took:?}");
    assert!(
        kills >= 2 && drops >= 2,
        "the chaos must happen during the relay: {kills} kills, {drops} drops"
    );

    let in_stream = brokers.stream_ids().await;
    let repeated: Vec<_> = in_stream.iter().filter(|(_, &n)| n > 1).collect();
    assert!(
        repeated.is_empty(),
        "in the stream more than once: {repeated:?}"
    );
    let stream_set: HashSet<Uuid> = in_stream.keys().copied().collect();
    assert_eq!(
        stream_set.len(),
        enqueued.len(),
        "one stream message per event"
    );
    assert_eq!(
        stream_set, enqueued,
        "the stream holds exactly the enqueued events"
    );

    let in_queue = brokers.rabbit.message_ids().await;
    let missing: Vec<&Uuid> = enqueued
        .iter()
        .filter(|id| !in_queue.contains_key(id))
        .collect();
    assert!(
        missing.is_empty(),
        "{} events never reached RabbitMQ, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let extra = in_queue.values().map(|&n| n - 1).sum::<usize>();
    eprintln!("RabbitMQ received {extra} repeated deliveries (at least once, as documented)");

    drop((nats, amqp));
    brokers.delete().await;
    db.drop_db().await;
}
