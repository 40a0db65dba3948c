//! An inbox process for the inbox chaos test: pulls `chaos.inboxed` events from a durable
//! JetStream consumer and records each in `effects` inside the processed-id dedup's
//! transaction, as a consuming service would. The test SIGKILLs it mid-stream and starts
//! another.
//!
//! - `NATS_URL`, `INBOX_STREAM`, `INBOX_CONSUMER`: the stream and its durable pull consumer;
//! - `DATABASE_URL`: the consuming service's PostgreSQL database (migrated, with `effects`).

use std::time::Duration;

use outbox::{outbox_event, Context, HandlerError};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::Inbox;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

/// The consumed event; the test publishes the same type under the same topic.
#[outbox_event(topic = "chaos.inboxed")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Inboxed {
    /// The event's number.
    pub n: i64,
}

/// Writes one effect row per event, in the transaction that records the message as processed.
struct Record;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for Record {
    type Event = Inboxed;
    const NAME: &'static str = "record";

    async fn handle(
        &self,
        e: Inboxed,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id, n) VALUES ($1, $2)")
            .bind(ctx.message_id())
            .bind(e.n)
            .execute(&mut *tx)
            .await?;
        // A little work inside the transaction, so kills land between effect, commit and ack.
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(())
    }
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

#[tokio::main]
async fn main() {
    let client = async_nats::connect(env("NATS_URL"))
        .await
        .expect("connect to NATS");
    let consumer = jetstream::new(client)
        .get_stream(env("INBOX_STREAM"))
        .await
        .expect("the stream exists")
        .get_consumer::<jetstream::consumer::pull::Config>(&env("INBOX_CONSUMER"))
        .await
        .expect("the durable consumer exists");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&env("DATABASE_URL"))
        .await
        .expect("connect to PostgreSQL");
    let inbox = Inbox::builder(consumer, pool)
        .handler(Record)
        .concurrency(8)
        .build()
        .expect("a valid inbox");
    inbox
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .expect("the inbox runs");
}
