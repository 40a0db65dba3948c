//! The worker of the ordering chaos test (tests/ordering_chaos.rs), built on
//! `outbox::cli::run_worker` exactly as a user's worker is, on PostgreSQL, SQLite or MariaDB.
//!
//! Topics and handlers:
//!
//! - `chaos.a` (ordered by `key`, retained for replays): two handlers, `audit` and `mail`;
//! - `chaos.b` (ordered by `key`): one handler, `index`;
//! - `chaos.plain` (unordered): one handler, `plain`.
//!
//! Every handler call appends (handler, key, seq, attempt, pid) to `chaos_log` when it starts
//! (the key in column `ord_key`: `key` is a reserved word on MySQL),
//! before anything can fail, so the log holds the order in which calls started. Faults:
//! about 5 % of the calls of the first two attempts fail (chosen by a hash of message id,
//! attempt and handler), and `poison` messages fail on every attempt until the harness
//! inserts a row into `chaos_cured`.

use std::process::ExitCode;

use outbox::{
    outbox_event, register_handler, Context, Event, FromResources, Handler, HandlerError,
    ResourceError, Resources,
};
use serde::{Deserialize, Serialize};
use sqlx::{MySqlPool, PgPool, SqlitePool};

#[outbox_event(topic = "chaos.a", ordering_key = "key", retain = "1d")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepA {
    key: String,
    seq: i64,
    #[serde(default)]
    poison: bool,
}

#[outbox_event(topic = "chaos.b", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepB {
    key: String,
    seq: i64,
    #[serde(default)]
    poison: bool,
}

#[outbox_event(topic = "chaos.plain")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlainWork {
    n: i64,
}

/// Transient failures per 1000 calls of the first two attempts.
const TRANSIENT_PER_MILLE: u64 = 50;

/// FNV-1a: stable across builds and platforms.
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

#[derive(Clone)]
enum Db {
    Pg(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

impl Db {
    async fn log(&self, ctx: &Context, key: &str, seq: i64) -> Result<(), sqlx::Error> {
        let attempt = i64::from(ctx.attempt());
        let pid = i64::from(std::process::id());
        match self {
            Db::Pg(pool) => {
                sqlx::query(
                    "INSERT INTO chaos_log (handler, ord_key, seq, attempt, pid) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(ctx.handler_name())
                .bind(key)
                .bind(seq)
                .bind(attempt)
                .bind(pid)
                .execute(pool)
                .await?;
            }
            Db::Sqlite(pool) => {
                sqlx::query(
                    "INSERT INTO chaos_log (handler, ord_key, seq, attempt, pid) VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .bind(ctx.handler_name())
                .bind(key)
                .bind(seq)
                .bind(attempt)
                .bind(pid)
                .execute(pool)
                .await?;
            }
            Db::MySql(pool) => {
                sqlx::query(
                    "INSERT INTO chaos_log (handler, ord_key, seq, attempt, pid) VALUES (?, ?, ?, ?, ?)",
                )
                .bind(ctx.handler_name())
                .bind(key)
                .bind(seq)
                .bind(attempt)
                .bind(pid)
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    async fn cured(&self) -> Result<bool, sqlx::Error> {
        let n: i64 = match self {
            Db::Pg(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM chaos_cured")
                    .fetch_one(pool)
                    .await?
            }
            Db::Sqlite(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM chaos_cured")
                    .fetch_one(pool)
                    .await?
            }
            Db::MySql(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM chaos_cured")
                    .fetch_one(pool)
                    .await?
            }
        };
        Ok(n > 0)
    }
}

async fn run(
    db: &Db,
    ctx: &Context,
    key: &str,
    seq: i64,
    poison: bool,
) -> Result<(), HandlerError> {
    db.log(ctx, key, seq).await?;
    if poison && !db.cured().await? {
        return Err(HandlerError::retry(format!(
            "injected: poison {key}/{seq} (attempt {})",
            ctx.attempt()
        )));
    }
    let attempt = ctx.attempt();
    if attempt <= 2 && attempt < ctx.max_attempts() {
        let h = fnv(&[
            ctx.message_id().as_bytes(),
            &attempt.to_le_bytes(),
            ctx.handler_name().as_bytes(),
        ]);
        if h % 1000 < TRANSIENT_PER_MILLE {
            return Err(HandlerError::retry(format!(
                "injected: transient failure {key}/{seq} attempt {attempt}"
            )));
        }
    }
    Ok(())
}

struct Logged<E> {
    db: Db,
    _event: std::marker::PhantomData<fn() -> E>,
}

impl<E> FromResources for Logged<E> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(Logged {
            db: resources.require::<Db>()?.clone(),
            _event: std::marker::PhantomData,
        })
    }
}

/// A second handler of `chaos.a`.
struct Mail(Db);

impl FromResources for Mail {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(Mail(resources.require::<Db>()?.clone()))
    }
}

#[outbox::async_trait]
impl Handler for Logged<StepA> {
    type Event = StepA;
    const NAME: &'static str = "audit";
    async fn handle(&self, e: StepA, ctx: &Context) -> Result<(), HandlerError> {
        run(&self.db, ctx, &e.key, e.seq, e.poison).await
    }
}

#[outbox::async_trait]
impl Handler for Mail {
    type Event = StepA;
    const NAME: &'static str = "mail";
    async fn handle(&self, e: StepA, ctx: &Context) -> Result<(), HandlerError> {
        run(&self.0, ctx, &e.key, e.seq, e.poison).await
    }
}

#[outbox::async_trait]
impl Handler for Logged<StepB> {
    type Event = StepB;
    const NAME: &'static str = "index";
    async fn handle(&self, e: StepB, ctx: &Context) -> Result<(), HandlerError> {
        run(&self.db, ctx, &e.key, e.seq, e.poison).await
    }
}

#[outbox::async_trait]
impl Handler for Logged<PlainWork> {
    type Event = PlainWork;
    const NAME: &'static str = "plain";
    async fn handle(&self, e: PlainWork, ctx: &Context) -> Result<(), HandlerError> {
        run(&self.db, ctx, "-", e.n, false).await
    }
}

register_handler!(Logged<StepA>);
register_handler!(Mail);
register_handler!(Logged<StepB>);
register_handler!(Logged<PlainWork>);

#[tokio::main]
async fn main() -> ExitCode {
    let _ = [StepA::TOPIC, StepB::TOPIC, PlainWork::TOPIC];
    outbox::cli::run_worker(|args, builder| {
        // The test support crate declares events that other test workers serve.
        let builder = builder.registry(
            outbox::Registry::linked()
                .allow_unhandled("test.work")
                .allow_unhandled("test.job"),
        );
        let url = &args.database_url;
        let db = if url.starts_with("sqlite:") {
            let options = outbox::sqlite_options(url).expect("SQLite URL parses");
            Db::Sqlite(SqlitePool::connect_lazy_with(options))
        } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Db::MySql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(8)
                    .connect_lazy(url)
                    .expect("MySQL URL parses"),
            )
        } else {
            Db::Pg(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(8)
                    .connect_lazy(url)
                    .expect("database URL parses"),
            )
        };
        builder.resource(db)
    })
    .await
}
