//! The worker of the fault-injection soak (tests/soak.rs), built on
//! `outbox::cli::run_worker` exactly as a user's worker is. It serves a PostgreSQL
//! (`postgres://`), a MariaDB/MySQL (`mysql://`) or a SQLite (`sqlite:`) database: the soak's
//! tables are on it, and the few statements the handlers run are written for each ([`SoakDb`]).
//!
//! Topics and handlers:
//!
//! - `soak.billing`: two handlers. `audit` (plain) appends each successful delivery to
//!   `soak_deliveries`; `ledger` is `Paced<Dedup<Ledger, Postgres>>` (on MariaDB `Dedup<Ledger, MySql>`, on SQLite
//!   `Dedup<Ledger, Sqlite>`), whose
//!   effect is an INSERT into `soak_effects` on the dedup transaction, a table with no unique
//!   key: exactly one row per message proves the dedup.
//! - `soak.emails`: `mail` (plain, logs to `soak_deliveries`).
//! - `soak.index`: `index` (plain, logs to `soak_deliveries`); the harness enqueues it with
//!   ordering keys.
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
//!   message ends DEAD, which the soak reports. A `stale_done` laggard succeeds instead: its
//!   done write comes from the stale claim while the newer one runs. The fence must drop it;
//!   without it the message still ends DONE (the newer claim's write then finds nothing), and
//!   only the protocol trace shows the stale write.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use outbox::{
    outbox_event, register_handler, Context, Event, FromResources, Handler, HandlerError,
    ResourceError, Resources,
};
use outbox_handlers::dedup::{Dedup, TxHandler};
use serde::{Deserialize, Serialize};
use sqlx::{MySqlConnection, MySqlPool, PgConnection, PgPool, SqliteConnection, SqlitePool};
use uuid::Uuid;

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
    /// A laggard whose stale claim writes the message done (see the module docs).
    #[serde(default)]
    stale_done: bool,
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
/// must drop (a `stale_done` laggard goes on and succeeds: a stale done write). On later attempts it sleeps [`LIVE_SLEEP`], so the newer claim is still running
/// when the stale outcome is written.
async fn pace(body: &Body, ctx: &Context, db: &SoakDb) -> Result<(), HandlerError> {
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
            db.lapse(ctx.message_id(), attempt_i32(ctx)),
        )
        .await;
        let current =
            tokio::time::timeout(Duration::from_millis(300), db.attempts(ctx.message_id())).await;
        if let Ok(Ok(current)) = current {
            if i64::from(current) > i64::from(ctx.attempt()) {
                let _ =
                    tokio::time::timeout(Duration::from_millis(300), db.preempted(ctx, current))
                        .await;
                if body.stale_done {
                    // The handler's work goes on: the stale claim's done write follows.
                    return Ok(());
                }
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

/// The soak's database, a worker resource: the statements of the handlers, each written for
/// PostgreSQL, for MariaDB/MySQL (ids `BINARY(16)`, times Unix milliseconds) and for SQLite
/// (the outbox's ids hyphenated text, times Unix milliseconds; the soak's own ids blobs).
#[derive(Clone)]
enum SoakDb {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// Now in Unix milliseconds, as the SQLite backend writes its times.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl SoakDb {
    /// Lets the lease of `id`'s claim at `attempt` lapse (a laggard's injected fault).
    async fn lapse(&self, id: Uuid, attempt: i32) -> Result<(), sqlx::Error> {
        match self {
            SoakDb::Pg(pool) => sqlx::query(
                "UPDATE outbox_messages SET locked_until = now() - interval '1 millisecond' \
                 WHERE id = $1 AND attempts = $2",
            )
            .bind(id)
            .bind(attempt)
            .execute(pool)
            .await
            .map(drop),
            SoakDb::My(pool) => sqlx::query(
                "UPDATE outbox_messages SET locked_until = CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) - 1 \
                 WHERE id = ? AND attempts = ?",
            )
            .bind(id)
            .bind(attempt)
            .execute(pool)
            .await
            .map(drop),
            SoakDb::Lite(pool) => sqlx::query(
                "UPDATE outbox_messages SET locked_until = ?1 - 1 WHERE id = ?2 AND attempts = ?3",
            )
            .bind(unix_ms())
            .bind(id.hyphenated().to_string())
            .bind(attempt)
            .execute(pool)
            .await
            .map(drop),
        }
    }

    /// The attempts of live message `id`: past the caller's when a newer claim took it.
    async fn attempts(&self, id: Uuid) -> Result<i32, sqlx::Error> {
        match self {
            SoakDb::Pg(pool) => {
                sqlx::query_scalar("SELECT attempts FROM outbox_messages WHERE id = $1")
                    .bind(id)
                    .fetch_one(pool)
                    .await
            }
            SoakDb::My(pool) => {
                sqlx::query_scalar("SELECT attempts FROM outbox_messages WHERE id = ?")
                    .bind(id)
                    .fetch_one(pool)
                    .await
            }
            SoakDb::Lite(pool) => {
                sqlx::query_scalar("SELECT attempts FROM outbox_messages WHERE id = ?1")
                    .bind(id.hyphenated().to_string())
                    .fetch_one(pool)
                    .await
            }
        }
    }

    /// Records that a laggard saw the newer claim at attempt `newer` (`soak_preempted`).
    async fn preempted(&self, ctx: &Context, newer: i32) -> Result<(), sqlx::Error> {
        const SQL: [&str; 2] = [
            "INSERT INTO soak_preempted (message_id, handler, attempt, newer_attempt, pid) \
             VALUES ($1, $2, $3, $4, $5)",
            "INSERT INTO soak_preempted (message_id, handler, attempt, newer_attempt, pid) \
             VALUES (?, ?, ?, ?, ?)",
        ];
        macro_rules! insert {
            ($pool:expr, $sql:expr) => {
                sqlx::query($sql)
                    .bind(ctx.message_id())
                    .bind(ctx.handler_name())
                    .bind(attempt_i32(ctx))
                    .bind(newer)
                    .bind(pid_i32())
                    .execute($pool)
                    .await
                    .map(drop)
            };
        }
        match self {
            SoakDb::Pg(pool) => insert!(pool, SQL[0]),
            SoakDb::My(pool) => insert!(pool, SQL[1]),
            SoakDb::Lite(pool) => insert!(pool, SQL[1]),
        }
    }

    /// Appends this delivery to `soak_deliveries`.
    async fn delivered(&self, ctx: &Context) -> Result<(), sqlx::Error> {
        const SQL: [&str; 2] = [
            "INSERT INTO soak_deliveries (message_id, handler, pid, attempt) VALUES ($1, $2, $3, $4)",
            "INSERT INTO soak_deliveries (message_id, handler, pid, attempt) VALUES (?, ?, ?, ?)",
        ];
        macro_rules! insert {
            ($pool:expr, $sql:expr) => {
                sqlx::query($sql)
                    .bind(ctx.message_id())
                    .bind(ctx.handler_name())
                    .bind(pid_i32())
                    .bind(attempt_i32(ctx))
                    .execute($pool)
                    .await
                    .map(drop)
            };
        }
        match self {
            SoakDb::Pg(pool) => insert!(pool, SQL[0]),
            SoakDb::My(pool) => insert!(pool, SQL[1]),
            SoakDb::Lite(pool) => insert!(pool, SQL[1]),
        }
    }
}

/// A plain handler: appends each successful delivery to `soak_deliveries`.
struct LogDelivery<E> {
    db: SoakDb,
    _event: std::marker::PhantomData<fn() -> E>,
}

async fn log_delivery(db: &SoakDb, body: &Body, ctx: &Context) -> Result<(), HandlerError> {
    pace(body, ctx, db).await?;
    if let Some(e) = injected(body, ctx) {
        return Err(e);
    }
    retry_db(|| db.delivered(ctx)).await?;
    Ok(())
}

macro_rules! plain_handler {
    ($event:ty, $name:literal) => {
        #[outbox::async_trait]
        impl Handler for LogDelivery<$event> {
            type Event = $event;
            const NAME: &'static str = $name;

            async fn handle(&self, event: $event, ctx: &Context) -> Result<(), HandlerError> {
                log_delivery(&self.db, event.as_ref(), ctx).await
            }
        }

        impl FromResources for LogDelivery<$event> {
            fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
                Ok(LogDelivery {
                    db: resources.require::<SoakDb>()?.clone(),
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

macro_rules! ledger {
    ($db:ty, $conn:ty, $insert:literal) => {
        #[outbox::async_trait]
        impl TxHandler<$db> for Ledger {
            type Event = InvoiceIssued;
            const NAME: &'static str = "ledger";

            async fn handle(
                &self,
                event: InvoiceIssued,
                ctx: &Context,
                tx: &mut $conn,
            ) -> Result<(), HandlerError> {
                sqlx::query($insert)
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
    };
}

ledger!(
    sqlx::Postgres,
    PgConnection,
    "INSERT INTO soak_effects (message_id, n, pid, attempt) VALUES ($1, $2, $3, $4)"
);
ledger!(
    sqlx::MySql,
    MySqlConnection,
    "INSERT INTO soak_effects (message_id, n, pid, attempt) VALUES (?, ?, ?, ?)"
);
ledger!(
    sqlx::Sqlite,
    SqliteConnection,
    "INSERT INTO soak_effects (message_id, n, pid, attempt) VALUES (?, ?, ?, ?)"
);

/// [`Ledger`] under the dedup wrapper of the soak's database.
enum DedupLedger {
    Pg(Dedup<Ledger, sqlx::Postgres>),
    My(Dedup<Ledger, sqlx::MySql>),
    Lite(Dedup<Ledger, sqlx::Sqlite>),
}

#[outbox::async_trait]
impl Handler for DedupLedger {
    type Event = InvoiceIssued;
    const NAME: &'static str = "ledger";

    async fn handle(&self, event: InvoiceIssued, ctx: &Context) -> Result<(), HandlerError> {
        match self {
            DedupLedger::Pg(h) => h.handle(event, ctx).await,
            DedupLedger::My(h) => h.handle(event, ctx).await,
            DedupLedger::Lite(h) => h.handle(event, ctx).await,
        }
    }
}

impl FromResources for DedupLedger {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(match resources.require::<SoakDb>()? {
            SoakDb::Pg(pool) => DedupLedger::Pg(Dedup::with_pool(Ledger, pool.clone())),
            SoakDb::My(pool) => DedupLedger::My(Dedup::with_pool(Ledger, pool.clone())),
            SoakDb::Lite(pool) => DedupLedger::Lite(Dedup::with_pool(Ledger, pool.clone())),
        })
    }
}

/// Paces laggards around the dedup wrapper, and runs it again on a database error: the dedup
/// makes a repeat safe, so a connection killed mid-transaction costs no attempt.
struct Paced<H> {
    inner: H,
    db: SoakDb,
}

#[outbox::async_trait]
impl<H: Handler<Event = InvoiceIssued>> Handler for Paced<H> {
    type Event = InvoiceIssued;
    const NAME: &'static str = H::NAME;

    async fn handle(&self, event: InvoiceIssued, ctx: &Context) -> Result<(), HandlerError> {
        pace(&event.body, ctx, &self.db).await?;
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
            db: resources.require::<SoakDb>()?.clone(),
        })
    }
}

register_handler!(Paced<DedupLedger>);

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
        let url = &args.database_url;
        let db = if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            SoakDb::My(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(6)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(url)
                    .expect("database URL parses"),
            )
        } else if url.starts_with("sqlite:") {
            // The backend's own options (WAL, a busy timeout): the soak's writes wait for the
            // outbox's, as a user's handlers on the same file do.
            SoakDb::Lite(
                sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(6)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy_with(outbox::sqlite_options(url).expect("database URL parses")),
            )
        } else {
            SoakDb::Pg(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(6)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_lazy(url)
                    .expect("database URL parses"),
            )
        };
        builder.resource(db)
    })
    .await
}
