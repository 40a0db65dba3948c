//! What the binaries print: the queue statistics, the topics a worker serves, and an error on
//! one line.

use std::process::ExitCode;

use super::exit;
use crate::registry::Registry;
use crate::worker::Worker;

/// Prints topic -> handlers, the declared events without a handler and the pending topics
/// nobody here handles, for `--list-topics`.
pub(super) async fn list_topics(worker: &Worker) -> ExitCode {
    for (topic, handlers) in worker.topics() {
        println!("{topic}: {}", handlers.join(", "));
    }
    for e in Registry::linked().unhandled_events() {
        println!(
            "warning: declared event {} (topic {}) has no handler",
            e.type_name(),
            e.topic()
        );
    }
    match worker.unhandled_pending_topics().await {
        Ok(topics) => {
            for (topic, n) in topics {
                println!("warning: {n} pending message(s) of topic {topic} have no handler here");
            }
            ExitCode::from(exit::OK)
        }
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::from(exit::for_error(&e))
        }
    }
}

/// An error and its sources on one line, for a binary's `error: ...` message: see
/// [`Error::line`](crate::Error::line).
pub fn error_line(e: &crate::error::Error) -> String {
    e.line()
}

/// Prints queue statistics as a table (or JSON), with the pending topics that `registry` has
/// no handler for listed apart when a registry is given, and the topics whose ready messages
/// no live worker serves listed apart always.
pub fn print_stats(stats: &crate::Stats, registry: Option<&Registry>, json: bool) {
    let unhandled: Vec<&crate::TopicStats> =
        registry.map(|r| stats.unhandled(r)).unwrap_or_default();
    let unserved: Vec<&crate::TopicStats> = stats.topics.iter().filter(|t| t.unserved()).collect();
    if json {
        let row = |t: &crate::TopicStats| {
            serde_json::json!({
                "topic": t.topic, "ready": t.ready, "scheduled": t.scheduled, "in_flight": t.in_flight,
                "stalled": t.stalled, "dead": t.dead, "done_last_5m": t.done_last_5m,
                "oldest_ready_age_secs": t.oldest_ready_age.map(|d| d.as_secs_f64()),
                "live_workers": t.live_workers, "blocked": t.blocked,
                "blocked_by_dead": t.blocked_by_dead,
                "oldest_blocked_age_secs": t.oldest_blocked_age.map(|d| d.as_secs_f64()),
            })
        };
        let doc = serde_json::json!({
            "topics": stats.topics.iter().map(row).collect::<Vec<_>>(),
            "total": row(&stats.total),
            "unhandled": unhandled.iter().map(|t| row(t)).collect::<Vec<_>>(),
            "unserved": unserved.iter().map(|t| row(t)).collect::<Vec<_>>(),
        });
        println!("{doc}");
        return;
    }
    let line = |t: &crate::TopicStats| {
        let age = t
            .oldest_ready_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let blocked_age = t
            .oldest_blocked_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}",
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
            blocked_age
        );
    };
    println!(
        "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}",
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
        "blk oldest"
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
}
