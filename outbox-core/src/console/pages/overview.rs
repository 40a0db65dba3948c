//! The overview: the queue's numbers per topic and in total, the warnings that need an
//! operator (topics nobody serves, messages blocked behind a dead letter, stalled leases, an
//! event log running short of partitions), the throughput of the last hour, and the handlers
//! with their pauses (a Pause or Resume button each, see `pause_actions`).

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{failure, frame, html};
use crate::console::html::{age, esc, num, plural, query, Frame, Nav};
use crate::console::{Base, Shared};
use crate::model::TopicStats;

#[derive(Debug, Deserialize)]
pub(in crate::console) struct OverviewQuery {
    refresh: Option<String>,
}

fn opt_age(d: Option<Duration>) -> String {
    d.map_or_else(|| "<span class=\"muted\">–</span>".into(), age)
}

/// Per topic and in total, as `outbox stats` counts them: ready, scheduled, in flight,
/// blocked and blocked by a dead letter, awaiting a worker that knows their version, stalled,
/// dead, done in 5 minutes, oldest ready age, live workers; topics nobody serves and versions
/// nobody knows called out.
pub(in crate::console) async fn overview(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let f = frame(&c, &base);
    // The event log's catalog only (no count of any log): the page reloads every few seconds.
    let (stats, per_minute, retained, workers) = match tokio::try_join!(
        c.store.stats(),
        c.store.done_per_minute(CHART_MINUTES),
        c.store.retained_topics_brief(),
        c.store.workers()
    ) {
        Ok(r) => r,
        Err(e) => return failure(&f, &e),
    };
    let paused = q.refresh.as_deref() == Some("off");
    let refresh = c
        .config
        .refresh
        .filter(|_| !paused)
        .map(|d| d.as_secs().max(1));
    let mut b = String::new();
    let _ = write!(
        b,
        "<div class=\"title\"><h1>Overview</h1><p class=\"sub\">Updated {} · ",
        Utc::now().format("%H:%M:%S UTC")
    );
    match (refresh, c.config.refresh) {
        (Some(s), _) => {
            let _ = write!(
                b,
                "refreshes every {s} s (<a href=\"{}?refresh=off\">pause</a>)",
                f.home()
            );
        }
        (None, Some(_)) => {
            let _ = write!(b, "refresh paused (<a href=\"{}\">resume</a>)", f.home());
        }
        (None, None) => b.push_str("reload to refresh"),
    }
    b.push_str("</p></div>");

    let unserved: Vec<&TopicStats> = stats.topics.iter().filter(|t| t.unserved()).collect();
    if !unserved.is_empty() {
        let names: Vec<String> = unserved
            .iter()
            .map(|t| {
                format!(
                    "<strong>{}</strong> ({} ready)",
                    esc(&t.topic),
                    num(t.ready)
                )
            })
            .collect();
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"unserved\"><strong>No live worker serves {}:</strong> {}. \
             Their messages wait until a worker that handles them starts.</div>",
            if unserved.len() == 1 { "this topic" } else { "these topics" },
            names.join(", ")
        );
    }
    let waiting: Vec<String> = stats
        .topics
        .iter()
        .filter_map(|t| {
            t.unknown_version.map(|v| {
                format!(
                    "version {v} of <strong>{}</strong> ({} waiting, the oldest {})",
                    esc(&t.topic),
                    num(t.awaiting_version),
                    opt_age(t.oldest_awaiting_version_age)
                )
            })
        })
        .collect();
    if !waiting.is_empty() {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"unknown-versions\"><strong>No live worker knows \
             {}.</strong> Those messages wait, never claimed nor dead-lettered, until workers \
             built with that version start.</div>",
            waiting.join(", ")
        );
    }
    if stats.total.blocked_by_dead > 0 {
        let _ = write!(
            b,
            "<div class=\"notice bad\" id=\"blocked\"><strong>{}</strong> behind a dead letter of their \
             ordering key (oldest {}): retry or discard the dead letters to let them run.</div>",
            plural(
                u64::try_from(stats.total.blocked_by_dead).unwrap_or(0),
                "message waits",
                "messages wait"
            ),
            opt_age(stats.total.oldest_blocked_age)
        );
    }
    if stats.total.stalled > 0 {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"stalled\"><strong>{}</strong> held by workers that \
             stopped renewing their lease (oldest {}); they are ready again for a live worker.</div>",
            plural(u64::try_from(stats.total.stalled).unwrap_or(0), "message is", "messages are"),
            opt_age(stats.total.oldest_stalled_age)
        );
    }
    let now = Utc::now();
    let runway: Vec<String> = retained
        .iter()
        .filter_map(|t| t.runway_note(now))
        .map(|n| esc(&n))
        .collect();
    if !runway.is_empty() {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"event-log-runway\"><strong>The event log runs \
             short of day partitions:</strong> {}. <a href=\"{}\">See the event log</a>.</div>",
            runway.join("; "),
            f.link("/events")
        );
    }

    let t = &stats.total;
    b.push_str("<div class=\"cards\">");
    let card = |b: &mut String, id: &str, label: &str, value: String, class: &str| {
        let _ = write!(
            b,
            "<div class=\"card {class}\"><div class=\"label\">{label}</div>\
             <div class=\"value\" id=\"total-{id}\">{value}</div></div>"
        );
    };
    card(&mut b, "ready", "Ready", num(t.ready), "");
    card(&mut b, "scheduled", "Scheduled", num(t.scheduled), "");
    card(&mut b, "in-flight", "In flight", num(t.in_flight), "");
    card(
        &mut b,
        "stalled",
        "Stalled",
        num(t.stalled),
        if t.stalled > 0 { "warn" } else { "" },
    );
    card(
        &mut b,
        "dead",
        "Dead",
        num(t.dead),
        if t.dead > 0 { "bad" } else { "" },
    );
    card(
        &mut b,
        "done",
        "Done (5 min)",
        num(t.done_last_5m),
        if t.done_last_5m > 0 { "good" } else { "" },
    );
    card(
        &mut b,
        "oldest",
        "Oldest ready",
        opt_age(t.oldest_ready_age),
        "",
    );
    b.push_str("</div>");
    throughput_chart(&mut b, &per_minute, Utc::now());

    if stats.topics.is_empty() {
        b.push_str(
            "<p class=\"empty\">No messages yet: nothing pending, dead or recently done.</p>",
        );
    } else {
        b.push_str(
            "<table class=\"grid\" id=\"topics\"><thead><tr><th>Topic</th><th class=\"n\">Ready</th>\
             <th class=\"n\">Scheduled</th><th class=\"n\">In flight</th>\
             <th class=\"n\" title=\"waiting behind an earlier message of their ordering key\">Blocked</th>\
             <th class=\"n\" title=\"of the blocked, those behind a dead letter of their ordering key: \
             they wait until it is retried or discarded\">By dead</th>\
             <th class=\"n\" title=\"due, of a version no live worker of the topic knows: they wait \
             for workers built with it\">Awaiting version</th>\
             <th class=\"n\">Stalled</th>\
             <th class=\"n\">Dead</th><th class=\"n\">Done (5 min)</th><th class=\"n\">Oldest ready</th>\
             <th class=\"n\" title=\"workers whose heartbeat is recent; for all topics, the most \
             that serve any one topic\">Live workers</th></tr></thead><tbody>",
        );
        for t in &stats.topics {
            topic_row(&mut b, &f, t, false);
        }
        b.push_str("</tbody><tfoot>");
        topic_row(&mut b, &f, &stats.total, true);
        b.push_str("</tfoot></table>");
    }
    super::pause_actions::handlers_table(&mut b, &c, &f, &stats, &workers);
    html(
        StatusCode::OK,
        f.page("Overview", Nav::Overview, refresh, &b),
    )
}

/// The minutes of the overview's throughput chart.
const CHART_MINUTES: u32 = 60;

/// Messages done per minute over the last hour, as an inline SVG bar chart (one bar a minute,
/// the current one last; each bar's tooltip gives its minute and count).
fn throughput_chart(b: &mut String, per_minute: &[(DateTime<Utc>, i64)], now: DateTime<Utc>) {
    let minutes = CHART_MINUTES as i64 + 1;
    let this_minute = now.timestamp().div_euclid(60);
    let mut counts = vec![0i64; minutes as usize];
    for (minute, n) in per_minute {
        let back = this_minute - minute.timestamp().div_euclid(60);
        if (0..minutes).contains(&back) {
            counts[(minutes - 1 - back) as usize] += n;
        }
    }
    let peak = counts.iter().copied().max().unwrap_or(0);
    let total: i64 = counts.iter().sum();
    let _ = write!(
        b,
        "<div class=\"chart\" id=\"throughput\"><div class=\"label\">Done per minute, last hour \
         <span class=\"muted\">· {} in all · peak {}/min</span></div>\
         <svg viewBox=\"0 0 {w} 60\" preserveAspectRatio=\"none\" role=\"img\" \
         aria-label=\"messages done per minute over the last hour\">",
        num(total),
        num(peak),
        w = minutes * 10
    );
    for (i, n) in counts.iter().enumerate() {
        let h = if peak > 0 {
            ((*n as f64 / peak as f64) * 56.0)
                .round()
                .max(if *n > 0 { 1.0 } else { 0.0 })
        } else {
            0.0
        };
        let at = now - chrono::Duration::minutes(minutes - 1 - i as i64);
        let _ = write!(
            b,
            "<rect x=\"{}\" y=\"{}\" width=\"8\" height=\"{h}\"><title>{}: {} done</title></rect>",
            i * 10 + 1,
            60.0 - h,
            at.format("%H:%M"),
            num(*n)
        );
    }
    b.push_str("</svg></div>");
}

fn topic_row(b: &mut String, f: &Frame<'_>, t: &TopicStats, total: bool) {
    let class = if t.unserved() && !total {
        " class=\"unserved\""
    } else {
        ""
    };
    let name = if total {
        "<th>All topics</th>".to_string()
    } else {
        let badge = if t.unserved() {
            " <span class=\"badge warn\">no worker</span>"
        } else {
            ""
        };
        format!("<th>{}{badge}</th>", esc(&t.topic))
    };
    let dead = if t.dead > 0 {
        let topic = if total { "" } else { t.topic.as_str() };
        format!(
            "<a href=\"{}{}\">{}</a>",
            f.link("/dead"),
            query(&[("topic", topic)]),
            num(t.dead)
        )
    } else {
        num(0)
    };
    let cell = |class: &str, v: String| format!("<td class=\"n {class}\">{v}</td>");
    let _ = write!(
        b,
        "<tr data-topic=\"{}\"{class}>{name}{}{}{}{}{}{}{}{}{}{}{}</tr>",
        esc(&t.topic),
        cell("ready", num(t.ready)),
        cell("scheduled", num(t.scheduled)),
        cell("in-flight", num(t.in_flight)),
        cell("blocked", num(t.blocked)),
        cell(
            if t.blocked_by_dead > 0 {
                "blocked-by-dead bad"
            } else {
                "blocked-by-dead"
            },
            num(t.blocked_by_dead)
        ),
        cell(
            if t.awaiting_version > 0 {
                "awaiting-version warn"
            } else {
                "awaiting-version"
            },
            num(t.awaiting_version)
        ),
        cell(
            if t.stalled > 0 {
                "stalled warn"
            } else {
                "stalled"
            },
            num(t.stalled)
        ),
        cell(if t.dead > 0 { "dead bad" } else { "dead" }, dead),
        cell("done", num(t.done_last_5m)),
        cell("oldest", opt_age(t.oldest_ready_age)),
        cell("workers", num(t.live_workers)),
    );
}
