//! The worker of the fault-injection soak (tests/soak.rs), built on
//! `outbox::cli::run_worker` exactly as a user's worker is.
//!
//! Topics and handlers:
//!
//! - `soak.billing`: two handlers. `audit` (plain) appends each successful delivery to
//!   `soak_deliveries`; `ledger` is `Paced<Dedup<Ledger, Postgres>>`, whose effect is an INSERT into
//!   `soak_effects`, a table with no unique key: exactly one row per message proves the dedup.
//! - `soak.emails`: `mail` (plain, logs to `soak_deliveries`).
//! - `soak.index`: `index` (plain, logs to `soak_deliveries`).
//!
//! Faults, all decided from the payload and the delivery so that a run is reproducible:
//!
//! - transient failures, about 5 % of the calls of the first [`TRANSIENT_ATTEMPTS`] attempts,
//!   chosen by a hash of (message id, attempt, handler). Attempts count at claim, so a kill
//!   costs one too: the soak gives messages a budget (`--max-attempts 6`) that two transient
//!   failures and a few kills cannot exhaust, and every healthy message ends DONE;
//! - `poison` messages fail on every attempt and end DEAD;
//! - `laggard` messages (topic `soak.billing`) stage a stale outcome: on the first attempt each
//!   handler lets its lease lapse, as a worker cut off from the database sees it lapse while its
//!   renewals fail, and waits for a newer claim (see [`pace`]); another worker claims the
//!   message again, and the laggard, seeing the newer claim, fails permanently: a dead-letter
//!   order from a stale claim. The fence must drop it, and the newer
//!   claim (each handler sleeping [`LIVE_SLEEP`]) ends the message DONE. Without the fence the
//!   message ends DEAD, which the soak reports.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use outbox::{
    outbox_event, register_handler, Context, Event, FromResources, Handler, HandlerError,
    ResourceError, Resources,
};
use outbox_handlers::dedup::{Dedup, TxHandler};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};

/// Per handler, on a laggard's first attempt, the longest wait for a newer claim: two of them
/// outlast the soak's lease (2.5 s), one stays below the handler timeout (2 s).
const LAG_WAIT: Duration = Duration::from_millis(1500);
/// Per handler, on a laggard's later attempts: long enough for the newer claim to still be
/// running when the stale one writes its outcome, short enough (two of them) to stay within
/// the lease.
const LIVE_SLEEP: Duration = Duration::from_millis(800);
/// Transient failures per 1000 calls...
const TRANSIENT_PER_MILLE: u64 = 50;
/// ...of the first attempts of a message: a flaky downstream that recovers.
const TRANSIENT_ATTEMPTS: u32 = 2;

/// The payload of every soak topic.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Body {
    /// A number unique across the run.
    n: i64,
    /// Fails on every attempt.
    #[serde(default)]
    poison: bool,
    /// Stages a stale outcome (see the module docs).
    #[serde(default)]
    laggard: bool,
}

macro_rules! soak_event {
    ($name:ident, $topic:literal) => {
        #[outbox_event(topic = $topic)]
        #[derive(Debug, Clone, Serialize, Deserialize)]
        struct $name {
            #[serde(flatten)]
            body: Body,
        }

        impl AsRef<Body> for $name {
            fn as_ref(&self) -> &Body {
                &self.body
            }
        }
    };
}

soak_event!(InvoiceIssued, "soak.billing");
soak_event!(EmailRequested, "soak.emails");
soak_event!(IndexChanged, "soak.index");

/// FNV-1a: stable across builds and platforms, unlike the std hasher.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The injected failure of this call, if any.
fn injected(body: &Body, ctx: &Context) -> Option<HandlerError> {
    let attempt = ctx.attempt();
    if body.poison {
        return Some(HandlerError::retry(format!(
            "injected: poison message n={} (attempt {attempt})",
            body.n
        )));
    }
    if body.laggard {
        return None; // its faults are staged by `pace`
    }
    if attempt <= TRANSIENT_ATTEMPTS && attempt < ctx.max_attempts() {
        let h = fnv(&[
            ctx.message_id().as_bytes(),
            &attempt.to_le_bytes(),
            ctx.handler_name().as_bytes(),
        ]);
        if h % 1000 < TRANSIENT_PER_MILLE {
            return Some(HandlerError::retry(format!(
                "injected: transient failure n={} attempt {attempt}",
                body.n
            )));
        }
    }
    None
}

/// The laggard's pacing, before the handler's own work. On the first attempt it lets its lease
/// lapse and waits up to [`LAG_WAIT`] for a newer claim of the message, and when one comes,
/// fails permanently: a dead-letter order from a stale claim, which the fence
/// must drop. On later attempts it sleeps [`LIVE_SLEEP`], so the newer claim is still running
/// when the stale outcome is written.
async fn pace(body: &Body, ctx: &Context, pool: &PgPool) -> Result<(), HandlerError> {
    if !body.laggard {
        return Ok(());
    }
    if ctx.attempt() > 1 {
        tokio::time::sleep(LIVE_SLEEP).await;
        return Ok(());
    }
    let until = Instant::now() + LAG_WAIT;
    loop {
        // The injected fault: this claim's lease lapses (its worker renews it every half
        // second, so lapse it again on every look until another worker takes the message).
        let _ = tokio::time::timeout(
            Duration::from_millis(300),
            sqlx::query(
                "UPDATE outbox_messages SET locked_until = now() - interval '1 millisecond' \
                 WHERE id = $1 AND attempts = $2",
            )
            .bind(ctx.message_id())
            .bind(attempt_i32(ctx))
            .execute(pool),
        )
        .await;
        let current = tokio::time::timeout(
            Duration::from_millis(300),
            sqlx::query_scalar::<_, i32>("SELECT attempts FROM outbox_messages WHERE id = $1")
                .bind(ctx.message_id())
                .fetch_one(pool),
        )
        .await;
        if let Ok(Ok(current)) = current {
            if i64::from(current) > i64::from(ctx.attempt()) {
                let _ = tokio::time::timeout(
                    Duration::from_millis(300),
                    sqlx::query(
                        "INSERT INTO soak_preempted (message_id, handler, attempt, newer_attempt, pid) \
                         VALUES ($1, $2, $3, $4, $5)",
                    )
                    .bind(ctx.message_id())
                    .bind(ctx.handler_name())
                    .bind(attempt_i32(ctx))
                    .bind(current)
                    .bind(pid_i32())
                    .execute(pool),
                )
                .await;
                return Err(HandlerError::permanent(format!(
                    "injected: laggard n={} attempt {} is stale (attempt {current} claimed it meanwhile): dead-letter it",
                    body.n,
                    ctx.attempt()
                )));
            }
        }
        if Instant::now() >= until {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs a statement again while the database refuses it (connections killed under the pool),
/// within the handler timeout.
async fn retry_db<T, F, Fut>(mut f: F) -> Result<T, HandlerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(_) if tries < 4 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50 * tries)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn attempt_i32(ctx: &Context) -> i32 {
    i32::try_from(ctx.attempt()).unwrap_or(i32::MAX)
}

fn pid_i32() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// A plain handler: appends each successful delivery to `soak_deliveries`.
struct LogDelivery<E> {
    pool: PgPool,
    _event: std::marker::PhantomData<fn() -> E>,
}

async fn log_delivery(pool: &PgPool, body: &Body, ctx: &Context) -> Result<(), HandlerError> {
    pace(body, ctx, pool).await?;
    if let Some(e) = injected(body, ctx) {
        return Err(e);
    }
    retry_db(|| {
        sqlx::query(
            "INSERT INTO soak_deliveries (message_id, handler, pid, attempt) VALUES ($1, $2, $3, $4)",
        )
        .bind(ctx.message_id())
        .bind(ctx.handler_name())
        .bind(pid_i32())
        .bind(attempt_i32(ctx))
        .execute(pool)
    })
    .await?;
    Ok(())
}

macro_rules! plain_handler {
    ($event:ty, $name:literal) => {
        #[outbox::async_trait]
        impl Handler for LogDelivery<$event> {
            type Event = $event;
            const NAME: &'static str = $name;

            async fn handle(&self, event: $event, ctx: &Context) -> Result<(), HandlerError> {
                log_delivery(&self.pool, event.as_ref(), ctx).await
            }
        }

        impl FromResources for LogDelivery<$event> {
            fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
                Ok(LogDelivery {
                    pool: resources.require::<PgPool>()?.clone(),
                    _event: std::marker::PhantomData,
                })
            }
        }

        register_handler!(LogDelivery<$event>);
    };
}

plain_handler!(InvoiceIssued, "audit");
plain_handler!(EmailRequested, "mail");
plain_handler!(IndexChanged, "index");

/// The dedup-wrapped effect: one row in `soak_effects`, on the dedup transaction. An injected
/// failure comes after the INSERT, so the rollback of effect and record together is exercised.
struct Ledger;

#[outbox::async_trait]
impl TxHandler<sqlx::Postgres> for Ledger {
    type Event = InvoiceIssued;
    const NAME: &'static str = "ledger";

    async fn handle(
        &self,
        event: InvoiceIssued,
        ctx: &Context,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        sqlx::query(
            "INSERT INTO soak_effects (message_id, n, pid, attempt) VALUES ($1, $2, $3, $4)",
        )
        .bind(ctx.message_id())
        .bind(event.body.n)
        .bind(pid_i32())
        .bind(attempt_i32(ctx))
        .execute(&mut *tx)
        .await?;
        if let Some(e) = injected(&event.body, ctx) {
            return Err(e);
        }
        Ok(())
    }
}

impl FromResources for Ledger {
    fn from_resources(_: &Resources) -> Result<Self, ResourceError> {
        Ok(Ledger)
    }
}

/// Paces laggards around the dedup wrapper, and runs it again on a database error: the dedup
/// makes a repeat safe, so a connection killed mid-transaction costs no attempt.
struct Paced<H> {
    inner: H,
    pool: PgPool,
}

#[outbox::async_trait]
impl<H: Handler<Event = InvoiceIssued>> Handler for Paced<H> {
    type Event = InvoiceIssued;
    const NAME: &'static str = H::NAME;

    async fn handle(&self, event: InvoiceIssued, ctx: &Context) -> Result<(), HandlerError> {
        pace(&event.body, ctx, &self.pool).await?;
        let mut tries = 0;
        loop {
            match self.inner.handle(event.clone(), ctx).await {
                Ok(()) => return Ok(()),
                Err(e) if tries < 3 && !e.chain_string().contains("injected:") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50 * tries)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl<H: FromResources> FromResources for Paced<H> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(Paced {
            inner: H::from_resources(resources)?,
            pool: resources.require::<PgPool>()?.clone(),
        })
    }
}

register_handler!(Paced<Dedup<Ledger, sqlx::Postgres>>);

#[tokio::main]
async fn main() -> ExitCode {
    // The protocol trace the soak checks against the model, when it asks for one.
    outbox_tests::protocol_trace::install("info");
    // Keep the event types' registrations referenced (the topics are checked at start-up).
    let _ = [
        InvoiceIssued::TOPIC,
        EmailRequested::TOPIC,
        IndexChanged::TOPIC,
    ];
    outbox::cli::run_worker(|args, builder| {
        // The test support crate declares events that other test workers serve.
        let builder = builder.registry(
            outbox::Registry::linked()
                .allow_unhandled("test.work")
                .allow_unhandled("test.job"),
        );
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy(&args.database_url)
            .expect("database URL parses");
        builder.resource(pool)
    })
    .await
}
