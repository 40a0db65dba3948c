//! The workers: every live worker (name, host, process id, per topic the version it knows
//! and its handlers, waiting or working, started, last heartbeat) and the live workers per
//! topic.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};

use super::{failure, frame, html};
use crate::console::html::{esc, num, when, Nav};
use crate::console::{Base, Shared};
use crate::model::WorkerInfo;
use crate::store::Store;

/// The live workers (heartbeat within seconds), from the store's worker listing.
async fn live_workers(store: &Store) -> crate::error::Result<Option<Vec<WorkerInfo>>> {
    Ok(Some(
        store
            .workers()
            .await?
            .into_iter()
            .filter(|w| w.live)
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

fn workers_table(b: &mut String, rows: &[WorkerInfo], now: DateTime<Utc>) {
    if rows.is_empty() {
        b.push_str("<p class=\"empty\" id=\"no-workers\">No live worker.</p>");
        return;
    }
    b.push_str(
        "<table class=\"grid\" id=\"workers\"><thead><tr><th>Name</th><th>Host</th>\
         <th class=\"n\">Pid</th><th>Topics, versions and handlers</th><th>State</th>\
         <th>Started</th><th>Last heartbeat</th><th>Id</th></tr></thead><tbody>",
    );
    for w in rows {
        let serves: Vec<String> = w
            .serves()
            .map(|(topic, version, handlers)| {
                let names: Vec<String> = handlers.iter().map(|h| esc(h)).collect();
                format!(
                    "<span class=\"serves\" data-topic=\"{0}\">{0} v{1}: {2}</span>",
                    esc(topic),
                    version.unwrap_or(1),
                    if names.is_empty() {
                        "-".to_string()
                    } else {
                        names.join(", ")
                    }
                )
            })
            .collect();
        let _ = write!(
            b,
            "<tr data-worker=\"{}\"><th>{}</th><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td></tr>",
            w.id,
            esc(&w.name),
            esc(w.host.as_deref().unwrap_or("-")),
            w.pid.map_or_else(|| "-".into(), |p| p.to_string()),
            serves.join("<br>"),
            if w.waiting { "waiting" } else { "working" },
            when(w.started_at, now),
            when(w.heartbeat_at, now),
            w.id,
        );
    }
    b.push_str("</tbody></table>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn workers_render_escaped() {
        let now = Utc::now();
        let mut b = String::new();
        workers_table(
            &mut b,
            &[WorkerInfo {
                id: Uuid::nil(),
                name: "<b>w1</b>".into(),
                host: Some("<h>".into()),
                pid: Some(42),
                topics: vec!["a".into(), "<i>".into()],
                versions: vec![2, 1],
                handlers: vec![vec!["x".into(), "<y>".into()], vec![]],
                waiting: true,
                started_at: now,
                heartbeat_at: now,
                live: true,
            }],
            now,
        );
        assert!(b.contains("&lt;b&gt;w1&lt;/b&gt;"), "{b}");
        assert!(
            b.contains("<td>&lt;h&gt;</td><td class=\"n\">42</td>"),
            "{b}"
        );
        assert!(b.contains("a v2: x, &lt;y&gt;"), "{b}");
        assert!(b.contains("&lt;i&gt; v1: -"), "{b}");
        assert!(b.contains("waiting"));
    }
}
