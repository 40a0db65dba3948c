//! A worker binary for the process tests: handlers that record each run in a table, sleep on
//! request, and fail on request. Built on `outbox::cli` exactly as a user's worker is.
//!
//! Events: topic `test.work` (handler `record`). Each run inserts a row into `effects`
//! (message_id, handler, n) of the same database, PostgreSQL, SQLite or MariaDB; the test decides
//! whether that table has a unique key. With `OUTBOX_TEST_LOG_STARTS` set, each run also prints
//! `started <message id> attempt <n>` on stdout as it begins, before it sleeps.

use std::process::ExitCode;
use std::time::Duration;

use outbox::{
    register_handler, Context, FromResources, Handler, HandlerError, ResourceError, Resources,
};
use outbox_tests::events::Work;
use sqlx::{MySqlPool, PgPool, SqlitePool};

/// Where the effects go: the worker's own database.
#[derive(Clone)]
enum Effects {
    Pg(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

struct Record {
    effects: Effects,
    log_starts: bool,
}

#[outbox::async_trait]
impl Handler for Record {
    type Event = Work;
    const NAME: &'static str = "record";

    async fn handle(&self, work: Work, ctx: &Context) -> Result<(), HandlerError> {
        if self.log_starts {
            println!("started {} attempt {}", ctx.message_id(), ctx.attempt());
        }
        if work.sleep_ms > 0 {
            tokio::time::sleep(Duration::from_millis(work.sleep_ms)).await;
        }
        match &self.effects {
            Effects::Pg(pool) => {
                sqlx::query("INSERT INTO effects (message_id, handler, n) VALUES ($1, $2, $3)")
                    .bind(ctx.message_id())
                    .bind(ctx.handler_name())
                    .bind(work.n)
                    .execute(pool)
                    .await?;
            }
            Effects::Sqlite(pool) => {
                sqlx::query("INSERT INTO effects (message_id, handler, n) VALUES (?1, ?2, ?3)")
                    .bind(ctx.message_id().to_string())
                    .bind(ctx.handler_name())
                    .bind(work.n)
                    .execute(pool)
                    .await?;
            }
            Effects::MySql(pool) => {
                sqlx::query("INSERT INTO effects (message_id, handler, n) VALUES (?, ?, ?)")
                    .bind(ctx.message_id())
                    .bind(ctx.handler_name())
                    .bind(work.n)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }
}

impl FromResources for Record {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        Ok(Record {
            effects: resources.require::<Effects>()?.clone(),
            log_starts: std::env::var_os("OUTBOX_TEST_LOG_STARTS").is_some(),
        })
    }
}

register_handler!(Record);

#[tokio::main]
async fn main() -> ExitCode {
    outbox::cli::run_worker(|args, builder| {
        // The test support crate declares events that other test workers serve.
        let builder = builder.registry(outbox::Registry::linked().allow_unhandled("test.job"));
        let url = &args.database_url;
        let effects = if url.starts_with("sqlite:") {
            let options = outbox::sqlite_options(url).expect("SQLite URL parses");
            Effects::Sqlite(SqlitePool::connect_lazy_with(options))
        } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
            Effects::MySql(MySqlPool::connect_lazy(url).expect("MySQL URL parses"))
        } else {
            Effects::Pg(PgPool::connect_lazy(url).expect("database URL parses"))
        };
        builder.resource(effects)
    })
    .await
}
