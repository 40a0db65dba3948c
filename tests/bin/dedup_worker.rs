//! A worker binary for the dedup crash test (tests/handlers_dedup.rs), built on
//! `outbox::cli::run_worker` exactly as a user's worker is.
//!
//! Topic `test.dedup`, handler `dedup-effect`: `SleepAfter<Dedup<InsertEffect, Postgres>>`. `InsertEffect`
//! inserts `(message_id, n)` into `effects` on the dedup transaction; `Dedup` records the message
//! id in `outbox_processed` and commits both; then, on the first attempt only, `SleepAfter` sleeps
//! `sleep_after_ms`, so the test can SIGKILL the process after the effect committed and before
//! the message is marked done.

use std::process::ExitCode;
use std::time::Duration;

use outbox::{
    outbox_event, register_handler, Context, FromResources, Handler, HandlerError, ResourceError,
    Resources,
};
use outbox_handlers::dedup::{Dedup, TxHandler};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

/// The event: record `n`, then sleep `sleep_after_ms` on the first attempt.
#[outbox_event(topic = "test.dedup")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct DedupWork {
    n: i64,
    #[serde(default)]
    sleep_after_ms: u64,
}

/// The effect: one row in `effects`, on the dedup transaction.
struct InsertEffect;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for InsertEffect {
    type Event = DedupWork;
    const NAME: &'static str = "dedup-effect";

    async fn handle(
        &self,
        work: DedupWork,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id, n) VALUES ($1, $2)")
            .bind(ctx.message_id())
            .bind(work.n)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// Runs the inner handler, then sleeps on the first attempt: the window between the dedup
/// commit and the worker's "done".
struct SleepAfter<H>(H);

#[outbox::async_trait]
impl<H: Handler<Event = DedupWork>> Handler for SleepAfter<H> {
    type Event = DedupWork;
    const NAME: &'static str = H::NAME;

    async fn handle(&self, work: DedupWork, ctx: &Context) -> Result<(), HandlerError> {
        let sleep = Duration::from_millis(work.sleep_after_ms);
        self.0.handle(work, ctx).await?;
        if ctx.attempt() == 1 && !sleep.is_zero() {
            tokio::time::sleep(sleep).await;
        }
        Ok(())
    }
}

impl FromResources for InsertEffect {
    fn from_resources(_: &Resources) -> Result<Self, ResourceError> {
        Ok(InsertEffect)
    }
}

impl<H: FromResources> FromResources for SleepAfter<H> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(SleepAfter(H::from_resources(resources)?))
    }
}

// Registered, so the worker builds it from its resources: `Dedup` takes the `PgPool` resource.
register_handler!(SleepAfter<Dedup<InsertEffect, sqlx::Postgres>>);

#[tokio::main]
async fn main() -> ExitCode {
    outbox::cli::run_worker(|args, builder| {
        // The test support crate declares events that other test workers serve.
        let builder = builder.registry(
            outbox::Registry::linked()
                .allow_unhandled("test.work")
                .allow_unhandled("test.job"),
        );
        let pool = PgPool::connect_lazy(&args.database_url).expect("database URL parses");
        builder.resource(pool)
    })
    .await
}
