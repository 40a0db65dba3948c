//! `outbox events`: the event log, from the command line.
//!
//! ```text
//! outbox events --topic T [--since TIME] [--until TIME] [--key K] [--after ID] [--limit 100] [--json]
//! outbox events topics [--json]
//! outbox events retain --topic T (--for 180d | --off)
//! outbox events upkeep
//! ```
//!
//! A TIME is an RFC 3339 instant (`2026-06-01T00:00:00Z`) or a duration before now (`30d`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use uuid::Uuid;

use super::{duration, exit};
use crate::retention::EventFilter;
use crate::store::Store;

/// `outbox events`: list a topic's retained events, or one of the subcommands.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(super) struct Events {
    #[command(subcommand)]
    command: Option<EventsCommand>,
    #[command(flatten)]
    list: List,
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// The retained topics: window, events kept, size, oldest event, partitions ahead.
    Topics {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set how long a topic keeps its delivered events, for good (the workers' declarations
    /// no longer change it), or stop keeping them and delete its log.
    Retain {
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The window, e.g. `180d`, `12h` (one minute to 100 years).
        #[arg(long = "for", value_parser = duration, conflicts_with = "off", required_unless_present = "off")]
        window: Option<Duration>,
        /// Stop retaining the topic and delete its log.
        #[arg(long)]
        off: bool,
    },
    /// Create the partitions of the next days and remove expired events now, as the workers
    /// do every ten minutes.
    Upkeep,
}

/// The listing's filters.
#[derive(Debug, Args)]
struct List {
    /// The topic whose events to list.
    #[arg(long)]
    topic: Option<String>,
    #[command(flatten)]
    window: Window,
    /// Only events after this one (the last id of the previous page).
    #[arg(long)]
    after: Option<Uuid>,
    /// At most this many.
    #[arg(long, default_value_t = 100)]
    limit: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Which events of a topic: a window of enqueue times and an ordering key (`outbox events` and
/// `outbox replay` alike).
#[derive(Debug, Args)]
pub(super) struct Window {
    /// Only events enqueued at or after this time (RFC 3339, or a duration ago such as `7d`).
    #[arg(long, value_parser = instant)]
    pub(super) since: Option<DateTime<Utc>>,
    /// Only events enqueued before this time (RFC 3339, or a duration ago; default: now).
    #[arg(long, value_parser = instant)]
    pub(super) until: Option<DateTime<Utc>>,
    /// Only the events of this ordering key.
    #[arg(long)]
    pub(super) key: Option<String>,
}

/// An RFC 3339 instant, or a duration before now.
pub(super) fn instant(s: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = duration(s).map_err(|_| {
        format!("`{s}` is not a time: write an RFC 3339 instant (2026-06-01T00:00:00Z) or a duration ago (30d)")
    })?;
    let ago = chrono::Duration::from_std(ago).map_err(|e| e.to_string())?;
    Ok(Utc::now() - ago)
}

/// Runs `outbox events ...`; returns the exit code.
pub(super) async fn run(events: Events, store: Store) -> crate::error::Result<u8> {
    match events.command {
        None => list(events.list, &store).await,
        Some(EventsCommand::Topics { json }) => topics(&store, json).await,
        Some(EventsCommand::Retain { topic, window, off }) => {
            let window = if off { None } else { window };
            let found = store.set_retention(&topic, window).await?;
            match window {
                Some(w) => println!(
                    "topic {topic} keeps its delivered events for {}",
                    humantime::format_duration(w)
                ),
                None if found => {
                    println!("topic {topic} no longer keeps its events; its log is deleted")
                }
                None => {
                    eprintln!("error: topic {topic} keeps no events");
                    return Ok(exit::FAILURE);
                }
            }
            Ok(exit::OK)
        }
        Some(EventsCommand::Upkeep) => {
            match store.log_upkeep().await? {
                Some(done) => println!(
                    "event log upkeep: {} day partition(s) created, {} dropped, {} event(s) deleted",
                    done.created, done.dropped, done.deleted
                ),
                None => println!("another process is keeping the event log up now"),
            }
            Ok(exit::OK)
        }
    }
}

async fn list(args: List, store: &Store) -> crate::error::Result<u8> {
    let Some(topic) = args.topic else {
        eprintln!("error: name the topic to list: `outbox events --topic T` (the retained topics: `outbox events topics`)");
        return Ok(exit::USAGE);
    };
    let mut filter = EventFilter::topic(&topic).limit(args.limit);
    filter.since = args.window.since;
    filter.until = args.window.until;
    filter.key = args.window.key;
    filter.after = args.after;
    let events = store.events(&filter).await?;
    if events.is_empty() && !args.json {
        let retained = store
            .retained_topics()
            .await?
            .iter()
            .any(|t| t.topic == topic);
        if retained {
            println!("no events of topic {topic} match");
        } else {
            eprintln!("error: topic {topic} keeps no events: declare `#[outbox_event(retain = \"180d\")]` on its event type, or run `outbox events retain --topic {topic} --for 180d`");
            return Ok(exit::FAILURE);
        }
    }
    for e in &events {
        if args.json {
            let payload: serde_json::Value =
                serde_json::from_str(&e.payload).unwrap_or(serde_json::Value::Null);
            println!(
                "{}",
                serde_json::json!({
                    "id": e.id, "topic": e.topic, "version": e.version, "payload": payload,
                    "ordering_key": e.ordering_key, "idempotency_key": e.idempotency_key,
                    "created_at": e.created_at.to_rfc3339(), "delivered_at": e.delivered_at.to_rfc3339(),
                })
            );
        } else {
            let payload: String = e.payload.chars().take(100).collect();
            println!(
                "{}  {}  key={}  v{}  {}",
                e.id,
                e.created_at.to_rfc3339(),
                e.ordering_key.as_deref().unwrap_or("-"),
                e.version,
                payload
            );
        }
    }
    Ok(exit::OK)
}

async fn topics(store: &Store, json: bool) -> crate::error::Result<u8> {
    let topics = store.retained_topics().await?;
    let now = Utc::now();
    if json {
        let rows: Vec<serde_json::Value> = topics
            .iter()
            .map(|t| {
                serde_json::json!({
                    "topic": t.topic, "retain_secs": t.retain.as_secs(), "events": t.events,
                    "bytes": t.bytes, "oldest": t.oldest.map(|o| o.to_rfc3339()),
                    "partitions_until": t.partitions_until.map(|u| u.to_rfc3339()),
                    "runway_note": t.runway_note(now),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(exit::OK);
    }
    if topics.is_empty() {
        println!("no topic keeps its events");
        return Ok(exit::OK);
    }
    println!(
        "{:<32} {:>10} {:>10} {:>10}  {:<25}  partitions until",
        "topic", "retain", "events", "size", "oldest"
    );
    for t in &topics {
        println!(
            "{:<32} {:>10} {:>10} {:>10}  {:<25}  {}",
            t.topic,
            humantime::format_duration(t.retain).to_string(),
            t.events,
            t.bytes
                .map(|b| format!("{:.1} MB", b as f64 / 1e6))
                .unwrap_or_else(|| "-".into()),
            t.oldest
                .map(|o| o.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "-".into()),
            t.partitions_until
                .map(|u| u.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                .unwrap_or_else(|| "-".into()),
        );
    }
    for note in topics.iter().filter_map(|t| t.runway_note(now)) {
        println!("warning: {note}");
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_instants_or_durations_ago() {
        let t = instant("2026-06-01T00:00:00Z").unwrap();
        assert_eq!(t.to_rfc3339(), "2026-06-01T00:00:00+00:00");
        let ago = instant("1d").unwrap();
        let expected = Utc::now() - chrono::Duration::days(1);
        assert!((ago - expected).num_seconds().abs() < 5);
        let e = instant("yesterday").unwrap_err();
        assert!(e.contains("RFC 3339"), "{e}");
    }
}
