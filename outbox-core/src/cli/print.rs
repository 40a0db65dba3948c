//! What the binaries print: the queue statistics, the topics a worker serves, and an error on
//! one line.

use std::collections::BTreeMap;
use std::process::ExitCode;

use super::exit;
use crate::registry::Registry;
use crate::resources::ResourceError;
use crate::worker::Worker;
use crate::{error::Error, store::Store};

/// Prints what `--list-topics` shows, and returns its exit code.
///
/// First every topic with its handlers: the worker's when it could be built, else every
/// handler linked into the binary. Then the declared events that no handler here serves and
/// that are served elsewhere, and on lines starting `missing:` what stops the worker from
/// starting (declared events without a handler, handlers that cannot be built and why, any
/// other setup problem). Last, the pending topics in the database that nobody here handles.
///
/// Exits with [`exit::OK`] when the worker would start, and with [`exit::CONFIG`] (the code
/// the worker itself would exit with) when something is missing.
pub(super) async fn list_topics(
    built: &crate::error::Result<Worker>,
    served_elsewhere: &[String],
    store: &Store,
) -> ExitCode {
    let linked = Registry::linked();
    let topics: BTreeMap<&'static str, Vec<&'static str>> = match built {
        Ok(worker) => worker.topics(),
        Err(_) => linked
            .topics()
            .into_iter()
            .map(|(topic, handlers)| (topic, handlers.iter().map(|h| h.name).collect()))
            .collect(),
    };
    for (topic, handlers) in &topics {
        println!("{topic}: {}", handlers.join(", "));
    }
    let mut missing: Vec<String> = match built {
        Ok(_) => Vec::new(),
        Err(Error::Registry(e)) => e.problems().to_vec(),
        // This one names the resource but not the handler that asked for it.
        Err(e @ Error::Resource(ResourceError::Missing { .. })) => {
            vec![format!("a handler cannot be built: {}", error_line(e))]
        }
        Err(e) => vec![error_line(e)],
    };
    for event in linked.unhandled_events() {
        let topic = event.topic();
        if topics.contains_key(topic) {
            continue;
        }
        // A worker that builds refuses every declared event it does not serve unless it is
        // served elsewhere, by the flag or in the binary's code.
        if built.is_ok() || served_elsewhere.iter().any(|t| t == topic) {
            println!("served elsewhere: {topic} (event {})", event.type_name());
        } else if !missing.iter().any(|m| m.contains(event.type_name())) {
            missing.push(format!(
                "event `{}` (topic `{topic}`) is declared but no handler linked into this binary \
                 serves it: link the crate that registers its handler (`use my_handlers as _;` in \
                 the binary), or declare the topic served elsewhere (`--served-elsewhere {topic}`)",
                event.type_name()
            ));
        }
    }
    for m in &missing {
        println!("missing: {m}");
    }
    let known: Vec<&str> = topics.keys().copied().collect();
    match store.backend().outbox_unknown_topics(&known).await {
        Ok(pending) => {
            for (topic, n) in pending {
                println!("warning: {n} pending message(s) of topic {topic} have no handler here");
            }
        }
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            return ExitCode::from(exit::for_error(&e));
        }
    }
    if missing.is_empty() {
        ExitCode::from(exit::OK)
    } else {
        eprintln!(
            "error: this worker would not start: see the {} `missing:` line(s) above",
            missing.len()
        );
        ExitCode::from(exit::CONFIG)
    }
}

/// An error and its sources on one line, for a binary's `error: ...` message: see
/// [`Error::line`](crate::error::Error::line).
pub fn error_line(e: &crate::error::Error) -> String {
    e.line()
}

/// Prints queue statistics as a table (or JSON), with the pending topics that `registry` has
/// no handler for listed apart when a registry is given, and the topics whose ready messages
/// no live worker serves listed apart always.
pub fn print_stats(stats: &crate::model::Stats, registry: Option<&Registry>, json: bool) {
    let unhandled: Vec<&crate::model::TopicStats> =
        registry.map(|r| stats.unhandled(r)).unwrap_or_default();
    let unserved: Vec<&crate::model::TopicStats> =
        stats.topics.iter().filter(|t| t.unserved()).collect();
    if json {
        let row = |t: &crate::model::TopicStats| {
            serde_json::json!({
                "topic": t.topic, "ready": t.ready, "scheduled": t.scheduled, "in_flight": t.in_flight,
                "stalled": t.stalled, "dead": t.dead, "done_last_5m": t.done_last_5m,
                "oldest_ready_age_secs": t.oldest_ready_age.map(|d| d.as_secs_f64()),
                "live_workers": t.live_workers, "blocked": t.blocked,
                "blocked_by_dead": t.blocked_by_dead,
                "oldest_blocked_age_secs": t.oldest_blocked_age.map(|d| d.as_secs_f64()),
                "unknown_version": t.unknown_version,
                "awaiting_version": t.awaiting_version,
                "oldest_awaiting_version_age_secs": t.oldest_awaiting_version_age.map(|d| d.as_secs_f64()),
            })
        };
        let doc = serde_json::json!({
            "topics": stats.topics.iter().map(row).collect::<Vec<_>>(),
            "total": row(&stats.total),
            "unhandled": unhandled.iter().map(|t| row(t)).collect::<Vec<_>>(),
            "unserved": unserved.iter().map(|t| row(t)).collect::<Vec<_>>(),
            "pauses": stats.pauses.iter().map(super::pauses::json_of).collect::<Vec<_>>(),
            "breakers": stats.breakers.iter().map(|b| serde_json::json!({
                "handler": b.handler, "opened_at": b.opened_at.to_rfc3339(),
                "next_probe_at": b.next_probe_at.to_rfc3339(), "failed_probes": b.failed_probes,
                "last_error": b.last_error, "waiting": b.waiting,
            })).collect::<Vec<_>>(),
        });
        println!("{doc}");
        return;
    }
    let line = |t: &crate::model::TopicStats| {
        let age = t
            .oldest_ready_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let blocked_age = t
            .oldest_blocked_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12} {:>9}",
            t.topic,
            t.ready,
            t.scheduled,
            t.in_flight,
            t.stalled,
            t.dead,
            t.done_last_5m,
            age,
            t.live_workers,
            t.blocked,
            t.blocked_by_dead,
            blocked_age,
            t.awaiting_version
        );
    };
    println!(
        "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12} {:>9}",
        "topic",
        "ready",
        "scheduled",
        "in flight",
        "stalled",
        "dead",
        "done 5m",
        "oldest",
        "workers",
        "blocked",
        "by dead",
        "blk oldest",
        "awaiting v"
    );
    stats.topics.iter().for_each(line);
    line(&stats.total);
    if !unhandled.is_empty() {
        println!("\npending topics with no handler in this binary (they stay pending):");
        unhandled.iter().for_each(|t| line(t));
    }
    if !unserved.is_empty() {
        println!(
            "\nready messages that no live worker serves (they wait until a worker with their \
             handlers starts: is a handler crate not linked, or its workers down?):"
        );
        unserved.iter().for_each(|t| line(t));
    }
    if !stats.pauses.is_empty() {
        println!("\npaused (their messages wait, no attempt counted, until `outbox resume`):");
        for p in &stats.pauses {
            println!("  {}", super::pauses::line_of(p));
        }
    }
    if !stats.breakers.is_empty() {
        println!("\nbreakers open (their dependency fails; messages wait, no attempt counted, until a probe succeeds):");
        let now = chrono::Utc::now();
        for b in &stats.breakers {
            println!(
                "  handler {}: open {}s, {} waiting, next probe in {}s, {} failed probes; {}",
                b.handler,
                (now - b.opened_at).num_seconds().max(0),
                b.waiting,
                (b.next_probe_at - now).num_seconds().max(0),
                b.failed_probes,
                b.last_error.as_deref().unwrap_or("")
            );
        }
    }
    let waiting: Vec<String> = stats
        .topics
        .iter()
        .filter_map(|t| t.unknown_version_note())
        .collect();
    if !waiting.is_empty() {
        println!(
            "
versions that wait (their messages stay pending, never claimed):"
        );
        waiting.iter().for_each(|note| println!("  {note}"));
    }
}
