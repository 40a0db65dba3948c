//! The `outbox` operations command line: operate an outbox without linking any handler: migrate, stats, dead letters, purge.
//!
//! ```text
//! outbox migrate
//! outbox stats [--json]
//! outbox dead list [--topic T] [--older-than 1h] [--limit 100]
//! outbox dead show <ID>
//! outbox dead retry (<ID> | --topic T | --all)
//! outbox dead discard (<ID> | --topic T | --all)
//! outbox purge --older-than 7d [--batch 1000] [--processed]
//! outbox events --topic T [--since TIME] [--until TIME] [--key K] [--json]
//! outbox events topics | retain --topic T (--for 180d | --off) | upkeep
//! outbox replay --topic T --handler H [--since TIME] [--until TIME] [--key K] [--rate N] [--fresh] [--dry-run] [--follow]
//! outbox replay status [ID] | pause ID | resume ID | cancel ID
//! outbox workers [--all] [--json]
//! outbox pause (--handler H | --topic T) [--for 30m] [--reason TEXT]
//! outbox resume (--handler H | --topic T)
//! outbox pauses [--json]
//! outbox console [--addr 127.0.0.1:8080] [--read-only] [--token T | --user U --password P]
//! ```
//!
//! The database comes from `--database-url` or `DATABASE_URL` (`postgres://...`,
//! `mysql://...` or `sqlite:...`). Durations are refused over 100 years, before any SQL.
//!
//! Exit codes (the table in [`exit`]):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done |
//! | 1 | not found or refused, or an unclassified database error |
//! | 2 | bad arguments (including a duration over 100 years or a malformed database URL) |
//! | 4 | the database could not be reached (or stayed locked) |
//! | 5 | the outbox schema is missing or out of date: run `outbox migrate` |
//! | 6 | the database refused a write that breaks a constraint |
//! | 7 | the database refused a value as invalid or out of range |

use std::process::ExitCode;
use std::time::Duration;

use super::{connect, duration, error_line, exit, init_logging_with, print_stats};
use crate::{model::DeadLetterFilter, model::DeadSelection, store::Store};
use clap::{Args, Parser, Subcommand};
use uuid::Uuid;

const EXIT_CODES: &str = "Exit codes:
  0  done
  1  not found or refused, or an unclassified database error
  2  bad arguments (a duration over 100 years, a malformed database URL, ...)
  4  the database could not be reached (refused, lost, shut down, timed out) or stayed locked
  5  the outbox schema is missing or out of date: run `outbox migrate`
  6  the database refused a write that breaks a constraint
  7  the database refused a value as invalid or out of range";

#[derive(Parser)]
#[command(
    name = "outbox",
    about = "Operate a transactional outbox: migrate, stats, dead letters, purge, the event log, workers, pauses",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The database URL (postgres://..., mysql://... or sqlite:...).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

impl std::fmt::Debug for Cli {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cli")
            .field(
                "database_url",
                &self.database_url.as_deref().map(super::redact_url),
            )
            .field("command", &self.command)
            .finish()
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the outbox tables.
    Migrate,
    /// Per-topic counts: ready, scheduled, in flight, dead, done in 5 minutes, oldest ready age,
    /// and messages blocked behind an earlier message of their ordering key.
    Stats {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Inspect, retry or discard dead letters.
    #[command(subcommand)]
    Dead(Dead),
    /// Delete DONE messages (or processed-id records) older than a retention, in small batches.
    Purge {
        /// The retention, e.g. `7d`, `12h`, `30m` (at most 100 years).
        #[arg(long, value_parser = duration)]
        older_than: Duration,
        /// Rows per delete statement (1 to 1,000,000).
        #[arg(long, default_value_t = crate::ops::DEFAULT_PURGE_BATCH, value_parser = batch)]
        batch: usize,
        /// Purge the dedup handler's processed-id records instead of messages.
        #[arg(long)]
        processed: bool,
    },
    /// The event log: list a topic's retained events (`--topic T`), or the retained topics,
    /// a topic's window, the log's upkeep.
    Events(super::events::Events),
    /// Deliver a window of a retained topic's events again to one handler
    /// (`--topic T --handler H`), or follow, pause, resume or cancel a replay.
    Replay(super::replay::Replay),
    /// The live workers: name, host, process id, state, last heartbeat, and per topic the
    /// version they know and their handlers' names (what `replay --handler` takes).
    Workers(super::workers::Workers),
    /// Pause a handler or a topic for every worker (within a second): its messages wait,
    /// no attempt counted, until `outbox resume` or the end given by `--for`.
    Pause(super::pauses::Pause),
    /// Lift the pause of a handler or a topic: its waiting messages run again.
    Resume(super::pauses::Resume),
    /// The pauses, with since when, until when, and how many messages wait on each.
    Pauses(super::pauses::Pauses),
    /// Serve the operator's console in the browser.
    #[cfg(feature = "console")]
    Console(ConsoleArgs),
}

/// `outbox console`: where to listen and who may come in.
#[cfg(feature = "console")]
#[derive(Debug, Args)]
struct ConsoleArgs {
    /// The address to listen on. Anything but loopback needs --token or --user/--password.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: std::net::SocketAddr,
    /// Show everything, change nothing: no buttons, and every change refused.
    #[arg(long)]
    read_only: bool,
    /// Require this token (typed into the sign-in page, or sent as `Authorization: Bearer`).
    #[arg(
        long,
        env = "OUTBOX_CONSOLE_TOKEN",
        hide_env_values = true,
        conflicts_with = "user"
    )]
    token: Option<String>,
    /// Require HTTP basic authentication with this user (and --password).
    #[arg(
        long,
        env = "OUTBOX_CONSOLE_USER",
        hide_env_values = true,
        requires = "password"
    )]
    user: Option<String>,
    /// The basic-auth password.
    #[arg(
        long,
        env = "OUTBOX_CONSOLE_PASSWORD",
        hide_env_values = true,
        requires = "user"
    )]
    password: Option<String>,
}

#[cfg(feature = "console")]
impl ConsoleArgs {
    fn config(&self) -> crate::console::ConsoleConfig {
        let config = crate::console::ConsoleConfig::new().read_only(self.read_only);
        match (&self.token, &self.user, &self.password) {
            (Some(t), _, _) => config.token(t.clone()),
            (None, Some(u), Some(p)) => config.basic(u.clone(), p.clone()),
            _ => config,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Dead {
    /// List dead letters, newest first.
    List {
        /// Only this topic.
        #[arg(long)]
        topic: Option<String>,
        /// Only those dead for at least this long, e.g. `1h` (at most 100 years).
        #[arg(long, value_parser = duration)]
        older_than: Option<Duration>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Show one message: payload, attempts, last error, timestamps.
    Show {
        /// The message's public id.
        id: Uuid,
    },
    /// Send dead letters back to pending with their attempts reset.
    Retry(Which),
    /// Delete dead letters for good.
    Discard(Which),
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Which {
    /// One message, by public id.
    id: Option<Uuid>,
    /// Every dead letter of a topic.
    #[arg(long)]
    topic: Option<String>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

impl Which {
    fn selection(&self) -> DeadSelection {
        match (&self.id, &self.topic) {
            (Some(id), _) => DeadSelection::One(*id),
            (None, Some(t)) => DeadSelection::Topic(t.clone()),
            (None, None) => DeadSelection::All,
        }
    }
}

/// Serves the console until SIGTERM or SIGINT.
#[cfg(feature = "console")]
async fn console(args: &ConsoleArgs, store: Store) -> crate::error::Result<u8> {
    let config = args.config();
    let read_only = config.is_read_only();
    let listener = match tokio::net::TcpListener::bind(args.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.addr);
            return Ok(exit::FAILURE);
        }
    };
    let addr = listener.local_addr().unwrap_or(args.addr);
    println!(
        "outbox console on http://{addr}/{}",
        if read_only { " (read-only)" } else { "" }
    );
    let app = crate::console::router(store, config);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(super::shutdown_signal())
        .await
    {
        eprintln!("error: the console stopped: {e}");
        return Ok(exit::FAILURE);
    }
    Ok(exit::OK)
}

/// The most rows one purge statement may delete.
const MAX_BATCH: usize = 1_000_000;

fn batch(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=MAX_BATCH).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}` is not a batch size: write a whole number from 1 to {MAX_BATCH}"
        )),
    }
}

/// Runs the `outbox` operations command line: parses the arguments, connects, does the
/// command and returns the exit code.
///
/// # Cancellation safety
///
/// Meant to be the whole of `main`.
pub async fn main() -> ExitCode {
    // Our own warnings only: sqlx's (a statement slower than a second, say) are not the
    // operator's business here, and errors reach them as this command's one error line.
    init_logging_with("warn,sqlx=off");
    let cli = Cli::parse();
    // Refuse an unsafe console before touching the database.
    #[cfg(feature = "console")]
    if let Command::Console(args) = &cli.command {
        if let Err(e) = args.config().check_addr(args.addr) {
            eprintln!("error: {}", error_line(&e));
            return ExitCode::from(exit::USAGE);
        }
    }
    let Some(url) = cli.database_url.as_deref() else {
        eprintln!("error: no database: pass --database-url or set DATABASE_URL");
        return ExitCode::from(exit::USAGE);
    };
    let store = match connect(url).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            return ExitCode::from(exit::for_error(&e));
        }
    };
    match run(cli.command, store).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::from(exit::for_error(&e))
        }
    }
}

async fn run(command: Command, store: Store) -> crate::error::Result<u8> {
    match command {
        Command::Migrate => {
            crate::migrate(store).await?;
            println!("outbox schema is up to date");
        }
        Command::Stats { json } => {
            let stats = store.stats().await?;
            print_stats(&stats, None, json);
            if !json {
                for note in store.log_runway_notes().await? {
                    println!("warning: {note}");
                }
            }
        }
        Command::Dead(Dead::List {
            topic,
            older_than,
            limit,
        }) => {
            let filter = DeadLetterFilter {
                topic,
                older_than,
                limit: Some(limit),
                after: None,
            };
            let dead = store.dead_letters(&filter).await?;
            if dead.is_empty() {
                println!("no dead letters");
            }
            for m in dead {
                let when = m.processed_at.map(|t| t.to_rfc3339()).unwrap_or_default();
                let err = m.last_error.unwrap_or_default();
                let err: String = err.chars().take(120).collect();
                println!(
                    "{}  {}  attempts={}  dead_at={}  {}",
                    m.id, m.topic, m.attempts, when, err
                );
            }
        }
        Command::Dead(Dead::Show { id }) => {
            let Some(m) = store.message(id).await? else {
                eprintln!("error: no message with id {id}");
                return Ok(exit::FAILURE);
            };
            println!("id:           {}", m.id);
            println!("topic:        {}", m.topic);
            println!("status:       {}", m.status);
            println!("attempts:     {}", m.attempts);
            println!("created_at:   {}", m.created_at.to_rfc3339());
            println!("available_at: {}", m.available_at.to_rfc3339());
            println!(
                "processed_at: {}",
                m.processed_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "-".into())
            );
            println!("last_error:   {}", m.last_error.as_deref().unwrap_or("-"));
            println!("payload:      {}", m.payload);
        }
        Command::Dead(Dead::Retry(which)) => {
            let sel = which.selection();
            let n = store.retry_dead(&sel).await?;
            println!("{n} dead letter(s) sent back to pending");
            if n == 0 && matches!(sel, DeadSelection::One(_)) {
                eprintln!("error: no dead letter with that id");
                return Ok(exit::FAILURE);
            }
        }
        Command::Dead(Dead::Discard(which)) => {
            let sel = which.selection();
            let n = store.discard_dead(&sel).await?;
            println!("{n} dead letter(s) discarded");
            if n == 0 && matches!(sel, DeadSelection::One(_)) {
                eprintln!("error: no dead letter with that id");
                return Ok(exit::FAILURE);
            }
        }
        Command::Purge {
            older_than,
            batch,
            processed,
        } => {
            let n = if processed {
                store.purge_processed(older_than, batch).await?
            } else {
                store.purge_done(older_than, batch).await?
            };
            let what = if processed {
                "processed-id record(s)"
            } else {
                "per-minute done count(s)"
            };
            println!(
                "deleted {n} {what} older than {}",
                humantime::format_duration(older_than)
            );
        }
        Command::Events(events) => return super::events::run(events, store).await,
        Command::Replay(replay) => return super::replay::run(replay, store).await,
        Command::Workers(workers) => return super::workers::run(workers, &store).await,
        Command::Pause(args) => return super::pauses::pause(args, &store).await,
        Command::Resume(args) => return super::pauses::resume(args, &store).await,
        Command::Pauses(args) => return super::pauses::list(args, &store).await,
        #[cfg(feature = "console")]
        Command::Console(args) => return console(&args, store).await,
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_database_url() {
        let cli = Cli::try_parse_from([
            "outbox",
            "stats",
            "--database-url",
            "postgres://ops:hunter2-ops@db/app",
        ])
        .unwrap();
        let dbg = format!("{cli:?}");
        assert!(!dbg.contains("hunter2-ops"), "{dbg}");
        assert!(dbg.contains("postgres://ops:***@db/app"), "{dbg}");
    }

    #[test]
    fn help_names_every_environment_variable_without_its_value() {
        use clap::CommandFactory;
        let shown = crate::cli::args::env_values_shown(&Cli::command());
        assert!(shown.is_empty(), "--help shows the values of {shown:?}");
    }
}
