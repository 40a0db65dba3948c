//! `outbox replay`: deliver a window of a retained topic's events again to one handler.
//!
//! ```text
//! outbox replay --topic T --handler H [--since TIME] [--until TIME] [--key K] [--rate N]
//!               [--fresh] [--dry-run] [--follow]
//! outbox replay status [ID] [--json]
//! outbox replay pause ID | resume ID | cancel ID
//! ```

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use uuid::Uuid;

use super::events::Window;
use super::exit;
use crate::retention::{ReplayInfo, ReplayRequest, ReplayState};
use crate::store::Store;

/// `outbox replay`: start a replay, or one of the subcommands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct Replay {
    #[command(subcommand)]
    command: Option<ReplayCommand>,
    #[command(flatten)]
    start: StartArgs,
}

#[derive(Debug, Subcommand)]
enum ReplayCommand {
    /// The replays with their progress, or one with its failed events.
    Status {
        /// One replay.
        id: Option<Uuid>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Pause a running replay after the batch in hand.
    Pause {
        /// The replay.
        id: Uuid,
    },
    /// Resume a paused replay from its cursor.
    Resume {
        /// The replay.
        id: Uuid,
    },
    /// Cancel a running or paused replay.
    Cancel {
        /// The replay.
        id: Uuid,
    },
}

/// What to replay.
#[derive(Debug, Args)]
struct StartArgs {
    /// The retained topic.
    #[arg(long)]
    topic: Option<String>,
    /// The one handler of the topic that gets the events (others see nothing).
    #[arg(long)]
    handler: Option<String>,
    #[command(flatten)]
    window: Window,
    /// At most this many events per second.
    #[arg(long)]
    rate: Option<u32>,
    /// New message ids and idempotency keys: a re-run that dedup-wrapped handlers do not skip.
    #[arg(long)]
    fresh: bool,
    /// Print how many events and which time range it would deliver, and start nothing.
    #[arg(long)]
    dry_run: bool,
    /// Show a progress bar until the replay ends.
    #[arg(long)]
    follow: bool,
}

/// Runs `outbox replay ...`; returns the exit code.
pub(super) async fn run(replay: Replay, store: Store) -> crate::error::Result<u8> {
    match replay.command {
        None => start(replay.start, &store).await,
        Some(ReplayCommand::Status { id: None, json }) => {
            let all = store.replays().await?;
            if json {
                let rows: Vec<serde_json::Value> = all.iter().map(json_of).collect();
                println!("{}", serde_json::Value::Array(rows));
            } else if all.is_empty() {
                println!("no replays");
            }
            if !json {
                for r in &all {
                    println!("{}", line(r));
                }
            }
            Ok(exit::OK)
        }
        Some(ReplayCommand::Status { id: Some(id), json }) => {
            let Some(r) = store.replay(id).await? else {
                eprintln!("error: there is no replay {id}");
                return Ok(exit::FAILURE);
            };
            let failures = store.replay_failures(id).await?;
            if json {
                let mut doc = json_of(&r);
                doc["failures"] = failures
                    .iter()
                    .map(|f| serde_json::json!({"event_id": f.event_id, "attempts": f.attempts, "error": f.error}))
                    .collect();
                println!("{doc}");
            } else {
                println!("{}", line(&r));
                for f in &failures {
                    println!(
                        "  failed {} after {} attempt(s): {}",
                        f.event_id, f.attempts, f.error
                    );
                }
            }
            Ok(exit::OK)
        }
        Some(ReplayCommand::Pause { id }) => {
            store.pause_replay(id).await?;
            println!("replay {id} paused");
            Ok(exit::OK)
        }
        Some(ReplayCommand::Resume { id }) => {
            store.resume_replay(id).await?;
            println!("replay {id} resumed");
            Ok(exit::OK)
        }
        Some(ReplayCommand::Cancel { id }) => {
            store.cancel_replay(id).await?;
            println!("replay {id} cancelled");
            Ok(exit::OK)
        }
    }
}

async fn start(args: StartArgs, store: &Store) -> crate::error::Result<u8> {
    let (Some(topic), Some(handler)) = (args.topic, args.handler) else {
        eprintln!("error: name the topic and the handler: `outbox replay --topic T --handler H` (the replays: `outbox replay status`)");
        return Ok(exit::USAGE);
    };
    let mut request = ReplayRequest::new(topic, handler);
    request.since = args.window.since;
    request.until = args.window.until;
    request.key = args.window.key;
    request.rate = args.rate;
    request.fresh = args.fresh;
    if args.dry_run {
        let plan = store.plan_replay(&request).await?;
        let at = |t: Option<DateTime<Utc>>| t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into());
        println!(
            "would replay {} event(s) of topic {} to handler {}, enqueued from {} to {}",
            plan.events,
            request.topic,
            request.handler,
            at(plan.first),
            at(plan.last)
        );
        return Ok(exit::OK);
    }
    let replay = store.start_replay(&request).await?;
    println!(
        "replay {} started: {} event(s) of topic {} to handler {}",
        replay.id, replay.total, request.topic, request.handler
    );
    if !args.follow {
        println!("follow it with `outbox replay status {}`", replay.id);
        return Ok(exit::OK);
    }
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(now) = store.replay(replay.id).await? else {
            return Ok(exit::FAILURE);
        };
        eprint!("\r{}   ", now.progress_line());
        if now.state != ReplayState::Running {
            eprintln!();
            return Ok(if now.state == ReplayState::Done {
                exit::OK
            } else {
                exit::FAILURE
            });
        }
    }
}

fn line(r: &ReplayInfo) -> String {
    format!(
        "{}  {} -> {}{}  {}",
        r.id,
        r.request.topic,
        r.request.handler,
        if r.backfill { " (backfill)" } else { "" },
        r.progress_line()
    )
}

fn json_of(r: &ReplayInfo) -> serde_json::Value {
    serde_json::json!({
        "id": r.id, "topic": r.request.topic, "handler": r.request.handler,
        "since": r.request.since.map(|t| t.to_rfc3339()), "until": r.request.until.to_rfc3339(),
        "key": r.request.key, "rate": r.request.rate, "fresh": r.request.fresh,
        "backfill": r.backfill, "state": r.state.as_str(), "total": r.total,
        "delivered": r.delivered, "failed": r.failed, "progress": r.progress(),
        "rate_per_sec": r.rate(), "secs_left": r.time_left().map(|d| d.as_secs()),
        "running_now": r.leased,
    })
}
