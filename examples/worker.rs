//! A custom worker binary: your handlers, your resources, the outbox command line.
//!
//! Run with
//! `DATABASE_URL=sqlite://worker-example.sqlite cargo run -p outbox-examples --example worker -- --once`
//! (or a `postgres://` URL). It understands every flag of `outbox::cli::WorkerArgs`:
//! `--once`, `--list-topics`, `--stats`, `--concurrency 16`, `--metrics-addr 127.0.0.1:9464`, ...
//! and stops cleanly on SIGTERM or Ctrl-C.
//!
//! With `--demo-events 5` it first enqueues five events, so there is something to do.

use std::process::ExitCode;
use std::sync::Arc;

use outbox::{
    outbox_event, register_handler, Context, FromResources, Handler, HandlerError, ResourceError,
    Resources,
};
use serde::{Deserialize, Serialize};

/// A guest checked out; topic `guest.checked.out`.
#[outbox_event]
#[derive(Debug, Serialize, Deserialize)]
struct GuestCheckedOut {
    booking_id: i64,
    nights: u32,
}

/// Shared configuration, given to the worker as a resource rather than read from a global.
#[derive(Debug, Clone)]
struct Loyalty {
    points_per_night: u32,
}

/// Credits loyalty points; in a real service this would call a loyalty API with the
/// idempotency key, so a redelivery does not credit twice.
struct CreditPoints {
    loyalty: Arc<Loyalty>,
}

#[outbox::async_trait]
impl Handler for CreditPoints {
    type Event = GuestCheckedOut;
    const NAME: &'static str = "credit-points";

    async fn handle(&self, e: GuestCheckedOut, ctx: &Context) -> Result<(), HandlerError> {
        let points = e.nights * self.loyalty.points_per_night;
        tracing::info!(
            booking = e.booking_id,
            points,
            key = ctx.idempotency_key(),
            "credited loyalty points"
        );
        Ok(())
    }
}

impl FromResources for CreditPoints {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(CreditPoints {
            loyalty: Arc::new(resources.require::<Loyalty>()?.clone()),
        })
    }
}

register_handler!(CreditPoints);

#[tokio::main]
async fn main() -> ExitCode {
    // Our own flag, taken off before the outbox command line sees the rest.
    let mut args: Vec<String> = std::env::args().collect();
    let demo_events = take_flag(&mut args, "--demo-events")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    if demo_events > 0 {
        if let Err(e) = enqueue_demo(demo_events).await {
            eprintln!("error: could not enqueue the demo events: {e}");
            return ExitCode::from(outbox::cli::exit::DATABASE);
        }
    }
    outbox::cli::init_logging();
    let args = <outbox::cli::WorkerArgs as clap::Parser>::parse_from(args);
    outbox::cli::run_worker_with(
        args,
        |_args, builder| {
            builder.resource(Loyalty {
                points_per_night: 100,
            })
        },
        outbox::cli::shutdown_signal(),
    )
    .await
}

fn take_flag(args: &mut Vec<String>, name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    args.remove(i);
    (i < args.len()).then(|| args.remove(i))
}

async fn enqueue_demo(n: i64) -> anyhow::Result<()> {
    let url = std::env::var("DATABASE_URL")?;
    let store = outbox::cli::connect(&url).await?;
    outbox::migrate(store.clone()).await?;
    let events: Vec<GuestCheckedOut> = (1..=n)
        .map(|i| GuestCheckedOut {
            booking_id: i,
            nights: 2,
        })
        .collect();
    if url.starts_with("sqlite:") {
        let pool = outbox::sqlite_pool(&url).await?;
        let mut tx = pool.begin().await?;
        outbox::enqueue_many(&mut *tx, &events).await?;
        tx.commit().await?;
    } else {
        let pool = sqlx::PgPool::connect(&url).await?;
        let mut tx = pool.begin().await?;
        outbox::enqueue_many(&mut *tx, &events).await?;
        tx.commit().await?;
    }
    Ok(())
}
