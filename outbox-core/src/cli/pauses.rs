//! `outbox pause`, `outbox resume` and `outbox pauses`: hold a handler or a topic for every
//! worker, lift the hold, list the holds.
//!
//! ```text
//! outbox pause (--handler H | --topic T) [--for 30m] [--reason TEXT]
//! outbox resume (--handler H | --topic T)
//! outbox pauses [--json]
//! ```

use std::time::Duration;

use chrono::Utc;
use clap::Args;

use super::{duration, exit};
use crate::pause::{PauseInfo, PauseTarget};
use crate::store::Store;

/// What to pause or resume: one handler or one topic.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(super) struct Target {
    /// A handler, by name (`outbox workers` lists them), on every topic it handles.
    #[arg(long)]
    handler: Option<String>,
    /// A topic: none of its messages is claimed.
    #[arg(long)]
    topic: Option<String>,
}

impl Target {
    fn target(&self) -> PauseTarget {
        match (&self.handler, &self.topic) {
            (Some(h), _) => PauseTarget::handler(h.clone()),
            (None, Some(t)) => PauseTarget::topic(t.clone()),
            // clap's group requires one of them.
            (None, None) => PauseTarget::topic(String::new()),
        }
    }
}

/// `outbox pause`.
#[derive(Debug, Args)]
pub(super) struct Pause {
    #[command(flatten)]
    target: Target,
    /// End the pause by itself after this long, e.g. `30m`, `2h`, `90s` (else: until resumed).
    #[arg(long = "for", value_name = "DURATION", value_parser = duration)]
    for_: Option<Duration>,
    /// Why, shown by `outbox pauses` and `outbox stats`.
    #[arg(long)]
    reason: Option<String>,
}

/// `outbox resume`.
#[derive(Debug, Args)]
pub(super) struct Resume {
    #[command(flatten)]
    target: Target,
}

/// `outbox pauses`.
#[derive(Debug, Args)]
pub(super) struct Pauses {
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

/// Runs `outbox pause`; returns the exit code.
pub(super) async fn pause(args: Pause, store: &Store) -> crate::error::Result<u8> {
    let target = args.target.target();
    let paused = store
        .pause_because(&target, args.for_, args.reason.as_deref())
        .await?;
    let until = paused
        .pause
        .until
        .map(|u| {
            format!(
                "until {}",
                u.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        })
        .unwrap_or_else(|| "until resumed".into());
    println!("paused {target} {until}; every worker holds it within a second");
    if !paused.served {
        println!(
            "note: no worker has served topic {} yet; the pause holds for workers that start later",
            target.name()
        );
    }
    Ok(exit::OK)
}

/// Runs `outbox resume`; returns the exit code.
pub(super) async fn resume(args: Resume, store: &Store) -> crate::error::Result<u8> {
    let target = args.target.target();
    let resumed = store.resume(&target).await?;
    if !resumed.was_paused {
        println!("{target} was not paused");
        return Ok(exit::OK);
    }
    match target {
        PauseTarget::Handler(_) => println!(
            "resumed {target}; {} parked message(s) run again",
            resumed.unparked
        ),
        _ => println!("resumed {target}; its messages are claimed again"),
    }
    Ok(exit::OK)
}

/// Runs `outbox pauses`; returns the exit code.
pub(super) async fn list(args: Pauses, store: &Store) -> crate::error::Result<u8> {
    let pauses = store.pauses().await?;
    if args.json {
        let rows: Vec<serde_json::Value> = pauses.iter().map(json_of).collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(exit::OK);
    }
    if pauses.is_empty() {
        println!("nothing is paused");
    }
    for p in &pauses {
        println!("{}", line_of(p));
    }
    Ok(exit::OK)
}

/// One pause on one line: what, since when and for how long, until when, waiting messages,
/// by whom and why.
pub(super) fn line_of(p: &PauseInfo) -> String {
    let secs = (Utc::now() - p.paused_at).num_seconds().max(0);
    let until = p
        .until
        .map(|u| u.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "resumed".into());
    format!(
        "{}  since {} ({secs}s)  until {until}{}  waiting={}  by {}{}",
        p.target,
        p.paused_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        if p.active { "" } else { " (expired)" },
        p.waiting,
        p.paused_by,
        p.reason
            .as_deref()
            .map(|r| format!("  reason: {r}"))
            .unwrap_or_default()
    )
}

/// One pause as JSON, as `outbox pauses --json` and `outbox stats --json` print it.
pub(crate) fn json_of(p: &PauseInfo) -> serde_json::Value {
    serde_json::json!({
        "scope": p.target.scope(), "name": p.target.name(),
        "paused_at": p.paused_at.to_rfc3339(),
        "until": p.until.map(|u| u.to_rfc3339()),
        "paused_secs": (Utc::now() - p.paused_at).num_seconds().max(0),
        "paused_by": p.paused_by, "reason": p.reason,
        "active": p.active, "waiting": p.waiting,
    })
}
