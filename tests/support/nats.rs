//! NATS for the relay and inbox tests: the server at `NATS_URL` (default 127.0.0.1:4222, with
//! JetStream).

use std::time::Duration;

use futures_util::StreamExt;
use outbox_handlers::async_nats::{self, jetstream};

/// The server's address.
pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_string())
}

/// A JetStream context on a new connection.
///
/// # Panics
///
/// When NATS cannot be reached.
pub async fn jetstream() -> jetstream::Context {
    let client = async_nats::connect(nats_url()).await.unwrap_or_else(|e| {
        panic!(
            "cannot connect to NATS at {}: {e}; start nats-server -js or set NATS_URL",
            nats_url()
        )
    });
    jetstream::new(client)
}

/// A memory stream capturing `{prefix}.>`, both unique to one test and starting with `kind`:
/// its name and its prefix. Kept an hour at most, in case the test fails before deleting it.
///
/// # Panics
///
/// When JetStream refuses the stream.
pub async fn memory_stream(js: &jetstream::Context, kind: &str) -> (String, String) {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let (name, prefix) = (format!("{kind}_{id}"), format!("t{id}"));
    js.create_stream(jetstream::stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}.>")],
        storage: jetstream::stream::StorageType::Memory,
        max_age: Duration::from_secs(3600),
        ..Default::default()
    })
    .await
    .expect("create the test stream");
    (name, prefix)
}

/// The next message of `consumer`, waiting 5 s at most.
///
/// # Panics
///
/// When none comes.
pub async fn fetch_one(consumer: &jetstream::consumer::PullConsumer) -> jetstream::Message {
    consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(5))
        .messages()
        .await
        .expect("a fetch")
        .next()
        .await
        .expect("a message")
        .expect("no error")
}
