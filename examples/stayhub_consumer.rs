//! Another service's side of StayHub's relay: consumes `booking.created` from the JetStream
//! stream `STAYHUB` through an inbox and prints each booking it receives.
//!
//! Run the demo with `NATS_URL=127.0.0.1:4222` first, then
//! `DATABASE_URL=postgres://... cargo run -p outbox-examples --example stayhub_consumer`
//! (`NATS_URL` defaults to `127.0.0.1:4222`). The inbox keeps its processed-id records in
//! PostgreSQL: each booking's effect (here, a row in `stayhub_arrivals`, and the line printed)
//! commits with its record, so a message JetStream delivers again is acknowledged without
//! running the effect twice. The durable consumer `stayhub-consumer` remembers what was
//! acknowledged: a second run prints only new bookings. It stops once the stream has nothing
//! left for it.

use std::time::Duration;

use anyhow::Context as _;
use chrono::NaiveDate;
use outbox::{outbox_event, Context, HandlerError};
use outbox_handlers::async_nats::{self, jetstream};
use outbox_handlers::dedup::TxHandler;
use outbox_handlers::inbox::{Inbox, InboxMessage};
use serde::Deserialize;
use sqlx::PgConnection;
use uuid::Uuid;

/// StayHub's `booking.created`, as this service reads it: the fields it needs (the payload's
/// others are ignored). In a real system both sides would share one crate of event types.
#[outbox_event(topic = "booking.created")]
#[derive(Debug, serde::Serialize, Deserialize)]
struct BookingCreated {
    booking_id: Uuid,
    guest_email: String,
    check_in: NaiveDate,
    check_out: NaiveDate,
}

/// Records the guest's arrival, in the inbox's transaction, and says so.
struct RecordArrival;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for RecordArrival {
    type Event = BookingCreated;
    const NAME: &'static str = "record-arrival";

    async fn handle(
        &self,
        e: BookingCreated,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query(
            "INSERT INTO stayhub_arrivals (booking_id, guest_email, check_in) VALUES ($1, $2, $3) \
             ON CONFLICT (booking_id) DO NOTHING",
        )
        .bind(e.booking_id)
        .bind(&e.guest_email)
        .bind(e.check_in)
        .execute(&mut *tx)
        .await?;
        let origin = InboxMessage::of(ctx).map(|m| m.message_id.to_string());
        println!(
            "  received   booking {} for {} from {} to {} (outbox message {})",
            e.booking_id,
            e.guest_email,
            e.check_in,
            e.check_out,
            origin.as_deref().unwrap_or("?")
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "error".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();

    let url = std::env::var("DATABASE_URL").context(
        "set DATABASE_URL=postgres://...: the inbox keeps its processed-id records in PostgreSQL",
    )?;
    let pool = sqlx::PgPool::connect(&url)
        .await
        .with_context(|| format!("connecting to {}", outbox::cli::redact_url(&url)))?;
    // The processed-id table comes with the outbox migrations.
    outbox::migrate(&pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS stayhub_arrivals (booking_id UUID PRIMARY KEY, \
         guest_email TEXT NOT NULL, check_in DATE NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into());
    let js = jetstream::new(
        async_nats::connect(&nats_url)
            .await
            .with_context(|| format!("connecting to NATS at {nats_url}"))?,
    );
    let stream = js.get_stream("STAYHUB").await.with_context(|| {
        "no JetStream stream STAYHUB: run the demo with NATS_URL set first \
         (NATS_URL=127.0.0.1:4222 cargo run -p outbox-examples --example stayhub)"
    })?;
    let consumer = stream
        .get_or_create_consumer(
            "stayhub-consumer",
            jetstream::consumer::pull::Config {
                durable_name: Some("stayhub-consumer".into()),
                filter_subject: "stayhub.booking.created".into(),
                ack_wait: Duration::from_secs(30),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("creating the durable consumer: {e}"))?;
    let inbox = Inbox::builder(consumer.clone(), pool.clone())
        .handler(RecordArrival)
        .build()?;

    println!("stayhub_consumer: booking.created from JetStream stream STAYHUB, through an inbox");
    let mut idle = consumer.clone();
    inbox
        .run_until(async move {
            // Until nothing is left for this consumer, or a minute at most.
            for _ in 0..600 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if let Ok(info) = idle.info().await {
                    if info.num_pending == 0 && info.num_ack_pending == 0 {
                        return;
                    }
                }
            }
        })
        .await
        .map_err(|e| anyhow::anyhow!("the inbox failed: {e}"))?;
    let (arrivals,): (i64,) = sqlx::query_as("SELECT count(*) FROM stayhub_arrivals")
        .fetch_one(&pool)
        .await?;
    println!(
        "  {arrivals} arrivals recorded in all (each booking once, however often it was delivered)"
    );
    Ok(())
}
