//! A relay worker for the broker chaos test: every `chaos.relayed` event goes to NATS
//! JetStream and to RabbitMQ (two handlers of one topic, each with its own progress). Built on
//! `outbox::cli` as a user's worker is; the relays are registered at link time and built from
//! the publishers put into the worker's resources.
//!
//! - `NATS_URL`: the NATS server (the test points it at a proxy that drops connections);
//! - `RELAY_PREFIX`: the JetStream subject prefix (`{prefix}.chaos.relayed`);
//! - `AMQP_URL`, `RELAY_EXCHANGE`: the RabbitMQ broker and the exchange published to.

use std::process::ExitCode;
use std::time::Duration;

use outbox::{outbox_event, register_handler};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::relay::nats::{NatsPublisher, NatsRelay};
use outbox_handlers::relay::rabbitmq::{RabbitPublisher, RabbitRelay};
use serde::{Deserialize, Serialize};

/// The relayed event; the chaos test enqueues the same type under the same topic.
#[outbox_event(topic = "chaos.relayed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Relayed {
    /// The event's number, 0..20,000.
    pub n: i64,
}

register_handler!(NatsRelay<Relayed>);
register_handler!(RabbitRelay<Relayed>);

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main]
async fn main() -> ExitCode {
    // The client reconnects by itself after the proxy drops it; waiting for an
    // acknowledgement is bounded by the JetStream context's timeout, so a publish lost with its
    // connection becomes a retry rather than a hung handler.
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(2))
        .connect(env("NATS_URL"))
        .await
        .expect("connect to NATS");
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .build(client);
    let nats = NatsPublisher::builder(js)
        .prefix(env("RELAY_PREFIX"))
        .build()
        .expect("a valid prefix");
    let rabbit = RabbitPublisher::builder(env("AMQP_URL"))
        .exchange(env("RELAY_EXCHANGE"))
        .build()
        .expect("a valid exchange");
    outbox::cli::run_worker(move |_args, builder| {
        // The test support crate declares events that other test workers serve.
        let builder = builder.registry(
            outbox::Registry::linked()
                .allow_unhandled("test.work")
                .allow_unhandled("test.job"),
        );
        builder.resource(nats).resource(rabbit)
    })
    .await
}
