//! `outbox workers`: the live workers, who each is and what it serves: the list to read before
//! `outbox replay --handler`.
//!
//! ```text
//! outbox workers [--all] [--json]
//! ```

use chrono::Utc;
use clap::Args;

use super::exit;
use crate::model::WorkerInfo;
use crate::store::Store;

/// `outbox workers`: which workers to list, and how.
#[derive(Debug, Args)]
pub(super) struct Workers {
    /// Also the workers whose heartbeat stopped (kept for a minute after they die).
    #[arg(long)]
    all: bool,
    /// Print JSON instead of lines.
    #[arg(long)]
    json: bool,
}

/// Runs `outbox workers`; returns the exit code.
pub(super) async fn run(args: Workers, store: &Store) -> crate::error::Result<u8> {
    let workers: Vec<WorkerInfo> = store
        .workers()
        .await?
        .into_iter()
        .filter(|w| args.all || w.live)
        .collect();
    if args.json {
        let rows: Vec<serde_json::Value> = workers.iter().map(json_of).collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(exit::OK);
    }
    if workers.is_empty() {
        println!("no live worker");
    }
    let now = Utc::now();
    for w in &workers {
        let ago = (now - w.heartbeat_at).num_milliseconds().max(0) as f64 / 1000.0;
        println!(
            "{}  host={}  pid={}  {}  started {}  last heartbeat {ago:.1}s ago{}  id={}",
            w.name,
            w.host.as_deref().unwrap_or("-"),
            w.pid.map_or_else(|| "-".into(), |p| p.to_string()),
            if w.waiting { "waiting" } else { "working" },
            w.started_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            if w.live { "" } else { " (not live)" },
            w.id,
        );
        for (topic, version, handlers) in w.serves() {
            println!(
                "  {topic}  v{}  {}",
                version.unwrap_or(1),
                if handlers.is_empty() {
                    "-".to_string()
                } else {
                    handlers.join(", ")
                }
            );
        }
    }
    Ok(exit::OK)
}

fn json_of(w: &WorkerInfo) -> serde_json::Value {
    let topics: Vec<serde_json::Value> = w
        .serves()
        .map(|(topic, version, handlers)| {
            serde_json::json!({"topic": topic, "version": version, "handlers": handlers})
        })
        .collect();
    serde_json::json!({
        "id": w.id, "name": w.name, "host": w.host, "pid": w.pid, "live": w.live,
        "waiting": w.waiting, "started_at": w.started_at.to_rfc3339(),
        "heartbeat_at": w.heartbeat_at.to_rfc3339(), "topics": topics,
    })
}
