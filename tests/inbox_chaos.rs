//! The inbox under chaos: 10,000 events in a JetStream stream, consumed by two inbox processes
//! (`inbox-worker`), one of them SIGKILLed and replaced every 0.3-0.9 s. A kill lands between a
//! message's effect, its commit and its acknowledgement; what was not acknowledged comes again
//! after the consumer's ack wait, to whichever process pulls it.
//!
//! Afterwards each effect row exists exactly once: the redeliveries (counted by the consumer's
//! delivery sequence) were skipped by the processed-id record committed with the effect.
//!
//! Needs NATS with JetStream at `NATS_URL` (default 127.0.0.1:4222).

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use outbox::{outbox_event, Context, Event, Resources};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::relay::nats::NatsPublisher;
use outbox_tests::{pg, random_ms, sigkill, TestDb};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// The event the `inbox-worker` binary consumes, under the same topic.
#[outbox_event(topic = "chaos.inboxed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Inboxed {
    n: i64,
}

const MESSAGES: i64 = 10_000;
const INBOXES: usize = 2;
/// Kills stop after this many, so the run always ends.
const MAX_KILLS: usize = 15;
/// The whole run stops here even if the inbox never finishes, and the test fails.
const LIMIT: Duration = Duration::from_secs(180);

fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

fn spawn_inbox(db: &TestDb, stream: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_inbox-worker"))
        .env("NATS_URL", nats_url())
        .env("INBOX_STREAM", stream)
        .env("INBOX_CONSUMER", "inbox")
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "error")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn inbox-worker")
}

async fn effect_counts(db: &TestDb) -> (i64, i64, i64) {
    sqlx::query_as("SELECT count(*), count(DISTINCT message_id), count(DISTINCT n) FROM effects")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_effect_exactly_once_while_inbox_processes_are_killed() {
    let client = async_nats::connect(nats_url())
        .await
        .unwrap_or_else(|e| panic!("cannot connect to NATS at {}: {e}", nats_url()));
    let js = jetstream::new(client);
    let id = Uuid::now_v7().simple().to_string();
    let stream = format!("inboxchaos_{id}");
    let prefix = format!("t{id}");
    js.create_stream(jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: jetstream::stream::StorageType::File,
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .expect("create the test stream");
    let consumer = js
        .get_stream(&stream)
        .await
        .unwrap()
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("inbox".into()),
            ack_wait: Duration::from_secs(2),
            ..Default::default()
        })
        .await
        .expect("create the durable consumer");
    let db = pg().await;
    sqlx::raw_sql(
        "CREATE TABLE effects (id BIGSERIAL PRIMARY KEY, message_id UUID NOT NULL, n BIGINT NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();

    // The stream filled as a relay would fill it: one outbox message id per event.
    let nats = NatsPublisher::builder(js.clone())
        .prefix(prefix.clone())
        .build()
        .unwrap();
    let published = futures_util::stream::iter(0..MESSAGES)
        .map(|n| {
            let nats = &nats;
            async move {
                let ctx = Context::for_test(Inboxed::TOPIC, "nats-relay", Resources::new());
                nats.publish(&Inboxed { n }, &ctx).await
            }
        })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    assert_eq!(published, 0, "every publish acknowledged");

    let started = Instant::now();
    let mut inboxes: Vec<Child> = (0..INBOXES).map(|_| spawn_inbox(&db, &stream)).collect();
    let mut kills = 0usize;
    let mut next_kill = started + Duration::from_millis(300 + random_ms(600));
    let drained = loop {
        let now = Instant::now();
        if now >= started + LIMIT {
            break false;
        }
        if kills < MAX_KILLS && now >= next_kill {
            let victim = kills % inboxes.len();
            sigkill(&inboxes[victim]);
            let _ = inboxes[victim].wait().await;
            inboxes[victim] = spawn_inbox(&db, &stream);
            kills += 1;
            next_kill = now + Duration::from_millis(300 + random_ms(600));
        }
        let info = consumer.clone().info().await.unwrap().clone();
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            break true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let took = started.elapsed();
    for mut inbox in inboxes {
        let _ = inbox.kill().await;
    }
    let info = consumer.clone().info().await.unwrap().clone();
    let deliveries = info.delivered.consumer_sequence;
    eprintln!(
        "consumed {MESSAGES} messages in {took:.1?} through {kills} SIGKILLs; \
         {deliveries} deliveries"
    );
    assert!(
        drained,
        "the inbox did not answer every message within {LIMIT:?}"
    );
    assert!(
        kills >= 3,
        "only {kills} kills happened before the stream was drained"
    );
    assert!(
        deliveries > MESSAGES as u64,
        "no message was delivered twice ({deliveries} deliveries): the kills hit nothing in flight"
    );

    let (rows, ids, ns) = effect_counts(&db).await;
    assert_eq!(ids, MESSAGES, "every message has an effect");
    assert_eq!(ns, MESSAGES, "every event number has an effect");
    assert_eq!(rows, MESSAGES, "no effect happened twice");
    let processed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_processed WHERE handler = 'record'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(processed, MESSAGES, "one processed record per message");

    js.delete_stream(&stream).await.unwrap();
    db.drop_db().await;
}
