//! The workers: every live worker (name, topics, waiting or working, started, last
//! heartbeat) and the live workers per topic.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{failure, frame, html};
use crate::console::html::{esc, num, when, Nav};
use crate::console::{Base, Shared};
use crate::store::Store;

/// One live worker, as the workers page shows it.
struct WorkerRow {
    id: Uuid,
    name: String,
    topics: Vec<String>,
    waiting: bool,
    started_at: DateTime<Utc>,
    heartbeat_at: DateTime<Utc>,
}

/// The live workers (heartbeat within seconds), from the store's worker listing.
async fn live_workers(store: &Store) -> crate::error::Result<Option<Vec<WorkerRow>>> {
    Ok(Some(
        store
            .workers()
            .await?
            .into_iter()
            .filter(|w| w.live)
            .map(|w| WorkerRow {
                id: w.id,
                name: w.name,
                topics: w.topics,
                waiting: w.waiting,
                started_at: w.started_at,
                heartbeat_at: w.heartbeat_at,
            })
            .collect(),
    ))
}

/// The live workers; per topic counts where the store cannot list them yet.
pub(in crate::console) async fn workers(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
) -> Response {
    let f = frame(&c, &base);
    let (rows, stats) = match tokio::try_join!(live_workers(&c.store), c.store.stats()) {
        Ok(r) => r,
        Err(e) => return failure(&f, &e),
    };
    let mut b = String::from("<div class=\"title\"><h1>Workers</h1></div>");
    match rows {
        Some(rows) => workers_table(&mut b, &rows, Utc::now()),
        None => b.push_str(
            "<div class=\"notice\" id=\"workers-pending\">This version lists live workers per \
             topic only; the list of individual workers (name, topics, waiting, started, last \
             heartbeat) comes with the store's worker listing.</div>",
        ),
    }
    b.push_str(
        "<h2>Live workers per topic</h2><table class=\"grid\" id=\"topic-workers\"><thead><tr>\
         <th>Topic</th><th class=\"n\">Live workers</th><th class=\"n\">Ready</th><th class=\"n\">In flight</th></tr></thead><tbody>",
    );
    for t in &stats.topics {
        let class = if t.unserved() {
            " class=\"unserved\""
        } else {
            ""
        };
        let _ = write!(
            b,
            "<tr data-topic=\"{0}\"{class}><th>{0}</th><td class=\"n\">{1}</td><td class=\"n\">{2}</td><td class=\"n\">{3}</td></tr>",
            esc(&t.topic),
            num(t.live_workers),
            num(t.ready),
            num(t.in_flight)
        );
    }
    if stats.topics.is_empty() {
        b.push_str("<tr><td colspan=\"4\" class=\"empty\">No topics yet.</td></tr>");
    }
    b.push_str("</tbody></table>");
    html(StatusCode::OK, f.page("Workers", Nav::Workers, None, &b))
}

fn workers_table(b: &mut String, rows: &[WorkerRow], now: DateTime<Utc>) {
    if rows.is_empty() {
        b.push_str("<p class=\"empty\" id=\"no-workers\">No live worker.</p>");
        return;
    }
    b.push_str(
        "<table class=\"grid\" id=\"workers\"><thead><tr><th>Name</th><th>Id</th><th>Topics</th>\
         <th>State</th><th>Started</th><th>Last heartbeat</th></tr></thead><tbody>",
    );
    for w in rows {
        let topics: Vec<String> = w.topics.iter().map(|t| esc(t)).collect();
        let _ = write!(
            b,
            "<tr><th>{}</th><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&w.name),
            w.id,
            topics.join(", "),
            if w.waiting { "waiting" } else { "working" },
            when(w.started_at, now),
            when(w.heartbeat_at, now),
        );
    }
    b.push_str("</tbody></table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_render_escaped() {
        let now = Utc::now();
        let mut b = String::new();
        workers_table(
            &mut b,
            &[WorkerRow {
                id: Uuid::nil(),
                name: "<b>w1</b>".into(),
                topics: vec!["a".into(), "<i>".into()],
                waiting: true,
                started_at: now,
                heartbeat_at: now,
            }],
            now,
        );
        assert!(b.contains("&lt;b&gt;w1&lt;/b&gt;"));
        assert!(b.contains("a, &lt;i&gt;"));
        assert!(b.contains("waiting"));
    }
}
