//! The console's pages: overview, dead letters (with their confirmation), one message,
//! workers, sign-in.

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::html::{age, esc, excerpt, num, plural, query, when, Frame, Nav};
use super::{
    body_bytes, csrf_ok, csrf_refused, field, form, same_secret, session_cookie, Base, Console,
    Credentials, Shared,
};
use crate::model::{DeadCursor, DeadLetterFilter, DeadSelection, MessageStatus, Stats, TopicStats};
use crate::store::Store;

/// A place in the dead-letter listing as a link carries it: `{dead_at in µs}.{id}`.
fn cursor_text(c: &DeadCursor) -> String {
    format!("{}.{}", c.dead_at.timestamp_micros(), c.id)
}

fn parse_cursor(text: &str) -> Option<DeadCursor> {
    let (micros, id) = text.split_once('.')?;
    Some(DeadCursor {
        dead_at: DateTime::from_timestamp_micros(micros.parse().ok()?)?,
        id: id.parse().ok()?,
    })
}

fn frame<'a>(c: &'a Console, base: &'a str) -> Frame<'a> {
    Frame {
        base,
        kind: c.store.kind(),
        read_only: c.config.read_only,
        logout: matches!(c.config.credentials, Some(Credentials::Token(_))).then_some(&*c.csrf),
    }
}

fn html(status: StatusCode, page: String) -> Response {
    (status, Html(page)).into_response()
}

fn failure(f: &Frame<'_>, e: &crate::Error) -> Response {
    let body = format!(
        "<h1>Something went wrong</h1><div class=\"notice bad\"><pre>{}</pre></div>",
        esc(&e.to_string())
    );
    html(
        StatusCode::INTERNAL_SERVER_ERROR,
        f.page("Error", Nav::None, None, &body),
    )
}

/// 404 for any other path.
pub(super) async fn not_found(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
) -> Response {
    let f = frame(&c, &base);
    let body = format!(
        "<h1>Not found</h1><p>No such page. <a href=\"{}\">Back to the overview</a>.</p>",
        f.home()
    );
    html(
        StatusCode::NOT_FOUND,
        f.page("Not found", Nav::None, None, &body),
    )
}

// ---------------------------------------------------------------------------------------------
// Overview

#[derive(Debug, Deserialize)]
pub(super) struct OverviewQuery {
    refresh: Option<String>,
}

fn opt_age(d: Option<Duration>) -> String {
    d.map_or_else(|| "<span class=\"muted\">–</span>".into(), age)
}

/// Per topic and in total: ready, scheduled, in flight, stalled, dead, done in 5 minutes,
/// oldest ready age, live workers; topics nobody serves called out.
pub(super) async fn overview(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    Query(q): Query<OverviewQuery>,
) -> Response {
    let f = frame(&c, &base);
    let (stats, per_minute) =
        match tokio::try_join!(c.store.stats(), c.store.done_per_minute(CHART_MINUTES)) {
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
             <th class=\"n\">Stalled</th>\
             <th class=\"n\">Dead</th><th class=\"n\">Done (5 min)</th><th class=\"n\">Oldest ready</th>\
             <th class=\"n\">Live workers</th></tr></thead><tbody>",
        );
        for t in &stats.topics {
            topic_row(&mut b, &f, t, false);
        }
        b.push_str("</tbody><tfoot>");
        topic_row(&mut b, &f, &stats.total, true);
        b.push_str("</tfoot></table>");
    }
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
        "<tr data-topic=\"{}\"{class}>{name}{}{}{}{}{}{}{}{}{}</tr>",
        esc(&t.topic),
        cell("ready", num(t.ready)),
        cell("scheduled", num(t.scheduled)),
        cell("in-flight", num(t.in_flight)),
        cell(
            if t.blocked_by_dead > 0 {
                "blocked bad"
            } else {
                "blocked"
            },
            if t.blocked_by_dead > 0 {
                format!(
                    "{} <span class=\"muted\">({} by dead)</span>",
                    num(t.blocked),
                    num(t.blocked_by_dead)
                )
            } else {
                num(t.blocked)
            }
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
        cell(
            "workers",
            if total {
                "<span class=\"muted\">–</span>".into()
            } else {
                num(t.live_workers)
            }
        ),
    );
}

// ---------------------------------------------------------------------------------------------
// Dead letters

#[derive(Debug, Deserialize)]
pub(super) struct DeadQuery {
    topic: Option<String>,
    older_than: Option<String>,
    /// The page starts after this dead letter ([`cursor_text`]).
    after: Option<String>,
    /// How many rows came before this page (for the "41–60" it shows).
    skip: Option<u64>,
    done: Option<String>,
    n: Option<u64>,
}

/// Dead letters, newest first, filtered by topic and age, a page at a time.
pub(super) async fn dead_letters(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    Query(q): Query<DeadQuery>,
) -> Response {
    let f = frame(&c, &base);
    let topic = q.topic.filter(|t| !t.is_empty());
    let age_text = q.older_than.unwrap_or_default().trim().to_owned();
    let (older_than, age_error) = if age_text.is_empty() {
        (None, None)
    } else {
        match crate::duration::parse(&age_text) {
            Ok(d) => (Some(d), None),
            Err(_) => (None, Some(&age_text)),
        }
    };
    let size = c.config.page_size;
    // A page is read through the index from where the last one ended, however deep.
    let after = q.after.as_deref().and_then(parse_cursor);
    let skip = if after.is_some() {
        q.skip.unwrap_or(0)
    } else {
        0
    };
    let filter = DeadLetterFilter {
        topic: topic.clone(),
        older_than,
        limit: Some(size + 1),
        after,
    };
    let (mut rows, stats) = match tokio::try_join!(c.store.dead_letters(&filter), c.store.stats()) {
        Ok(r) => r,
        Err(e) => return failure(&f, &e),
    };
    let more = rows.len() > size as usize;
    rows.truncate(size as usize);
    let now = Utc::now();

    let mut b = String::from("<div class=\"title\"><h1>Dead letters</h1>");
    let scope_count = match &topic {
        Some(t) => stats
            .topics
            .iter()
            .find(|s| &s.topic == t)
            .map_or(0, |s| s.dead),
        None => stats.total.dead,
    };
    let _ = write!(
        b,
        "<p class=\"sub\">{} {}</p></div>",
        plural(
            u64::try_from(scope_count).unwrap_or(0),
            "dead letter",
            "dead letters"
        ),
        match &topic {
            Some(t) => format!("in topic <strong>{}</strong>", esc(t)),
            None => "in all topics".into(),
        }
    );
    match (q.done.as_deref(), q.n) {
        (Some("retried"), Some(n)) => {
            let _ = write!(
                b,
                "<div class=\"notice good\" id=\"flash\">{} sent back to pending.</div>",
                plural(n, "dead letter", "dead letters")
            );
        }
        (Some("discarded"), Some(n)) => {
            let _ = write!(
                b,
                "<div class=\"notice good\" id=\"flash\">{} discarded.</div>",
                plural(n, "dead letter", "dead letters")
            );
        }
        _ => {}
    }
    if let Some(bad) = age_error {
        let _ = write!(
            b,
            "<div class=\"notice bad\">“{}” is not an age: write e.g. 90s, 30m, 12h or 7d. \
             Showing every age.</div>",
            esc(bad)
        );
    }

    // The filter.
    let _ = write!(
        b,
        "<form method=\"get\" action=\"{}\" class=\"filters\" id=\"filters\">\
         <label>Topic <select name=\"topic\"><option value=\"\">All topics</option>",
        f.link("/dead")
    );
    let mut topics: Vec<&str> = stats
        .topics
        .iter()
        .filter(|t| t.dead > 0)
        .map(|t| t.topic.as_str())
        .collect();
    if let Some(t) = &topic {
        if !topics.contains(&t.as_str()) {
            topics.push(t);
        }
    }
    for t in topics {
        let sel = if topic.as_deref() == Some(t) {
            " selected"
        } else {
            ""
        };
        let _ = write!(b, "<option value=\"{0}\"{sel}>{0}</option>", esc(t));
    }
    let _ = write!(
        b,
        "</select></label><label>Dead for at least <input name=\"older_than\" value=\"{}\" \
         placeholder=\"e.g. 1h, 7d\" size=\"8\"></label><button type=\"submit\" id=\"filter\">Filter</button>",
        esc(&age_text)
    );
    if topic.is_some() || !age_text.is_empty() {
        let _ = write!(b, "<a href=\"{}\">Clear</a>", f.link("/dead"));
    }
    b.push_str("</form>");

    let writable = !c.config.read_only;
    if writable {
        let _ = write!(
            b,
            "<form method=\"post\" action=\"{}\" id=\"dead-form\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <input type=\"hidden\" name=\"topic\" value=\"{}\">",
            f.link("/dead/confirm"),
            esc(&c.csrf),
            esc(topic.as_deref().unwrap_or(""))
        );
        b.push_str(
            "<div class=\"toolbar\"><span class=\"group\">\
             <button name=\"op\" value=\"retry:selected\" id=\"retry-selected\" class=\"needs-selection\">Retry selected</button>\
             <button name=\"op\" value=\"discard:selected\" id=\"discard-selected\" class=\"danger needs-selection\">Discard selected</button></span>",
        );
        if scope_count > 0 {
            let (what, scope) = match &topic {
                Some(t) => (format!("all of {}", esc(t)), "topic"),
                None => ("all".to_string(), "all"),
            };
            let _ = write!(
                b,
                "<span class=\"group right\">\
                 <button name=\"op\" value=\"retry:{scope}\" id=\"retry-{scope}\">Retry {what}</button>\
                 <button name=\"op\" value=\"discard:{scope}\" id=\"discard-{scope}\" class=\"danger\">Discard {what}</button></span>"
            );
        }
        b.push_str("</div>");
    }

    if rows.is_empty() {
        b.push_str("<p class=\"empty\" id=\"no-dead\">No dead letters here.</p>");
    } else {
        b.push_str("<table class=\"grid\" id=\"dead\"><thead><tr>");
        if writable {
            b.push_str(
                "<th class=\"check\"><input type=\"checkbox\" id=\"select-all\" title=\"Select all on this page\"></th>",
            );
        }
        b.push_str(
            "<th>Message</th><th>Topic</th><th class=\"n\">Attempts</th><th>Dead since</th><th>Last error</th>",
        );
        if writable {
            b.push_str("<th></th>");
        }
        b.push_str("</tr></thead><tbody>");
        for m in &rows {
            let id = m.id.to_string();
            let _ = write!(b, "<tr data-id=\"{id}\">");
            if writable {
                let _ = write!(
                    b,
                    "<td class=\"check\"><input type=\"checkbox\" name=\"id\" value=\"{id}\"></td>"
                );
            }
            let _ = write!(
                b,
                "<td><a class=\"mono\" href=\"{}\">{}…</a></td><td>{}</td><td class=\"n\">{}</td>\
                 <td>{}</td><td class=\"err\">{}</td>",
                f.link(&format!("/messages/{id}")),
                &id[..13],
                esc(&m.topic),
                m.attempts,
                m.processed_at.map_or_else(String::new, |t| when(t, now)),
                esc(&excerpt(m.last_error.as_deref().unwrap_or(""), 140)),
            );
            if writable {
                let _ = write!(
                    b,
                    "<td class=\"actions\"><button name=\"op\" value=\"retry:one:{id}\" class=\"small\">Retry</button>\
                     <button name=\"op\" value=\"discard:one:{id}\" class=\"small danger\">Discard</button></td>"
                );
            }
            b.push_str("</tr>");
        }
        b.push_str("</tbody></table>");
    }
    if writable {
        b.push_str("</form>");
    }

    // The pager: on to older ones from the last row, or back to the newest.
    if after.is_some() || more {
        let link = |after: &str, skip: &str| {
            format!(
                "{}{}",
                f.link("/dead"),
                query(&[
                    ("topic", topic.as_deref().unwrap_or("")),
                    ("older_than", &age_text),
                    ("after", after),
                    ("skip", skip),
                ])
            )
        };
        b.push_str("<nav class=\"pager\">");
        if after.is_some() {
            let _ = write!(b, "<a href=\"{}\" id=\"prev\">← Newest</a>", link("", ""));
        }
        let shown = rows.len() as u64;
        let _ = write!(
            b,
            "<span>{}–{}</span>",
            num(i64::try_from(skip + 1).unwrap_or(i64::MAX)),
            num(i64::try_from(skip + shown).unwrap_or(i64::MAX))
        );
        if let Some(last) = more.then(|| rows.last().and_then(DeadCursor::of)).flatten() {
            let _ = write!(
                b,
                "<a href=\"{}\" id=\"next\">Older →</a>",
                link(&cursor_text(&last), &(skip + shown).to_string())
            );
        }
        b.push_str("</nav>");
    }
    html(StatusCode::OK, f.page("Dead letters", Nav::Dead, None, &b))
}

/// Retry or discard.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Retry,
    Discard,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "retry" => Some(Action::Retry),
            "discard" => Some(Action::Discard),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Discard => "discard",
        }
    }
    fn verb(self) -> &'static str {
        match self {
            Action::Retry => "Retry",
            Action::Discard => "Discard",
        }
    }
}

/// Which dead letters an action is about.
enum Scope {
    Ids(Vec<Uuid>),
    Topic(String),
    All,
}

/// Reads the action and its scope from a form: either `op` (`retry:one:<id>`,
/// `discard:selected`, `retry:topic`, `discard:all`) or `action` and `scope` as the
/// confirmation page sends them.
fn parse_request(form: &[(String, String)]) -> Option<(Action, Scope)> {
    let (action, scope, one) = match field(form, "op") {
        Some(op) => {
            let mut parts = op.splitn(3, ':');
            (parts.next()?, parts.next()?, parts.next())
        }
        None => (field(form, "action")?, field(form, "scope")?, None),
    };
    let action = Action::parse(action)?;
    let scope = match scope {
        "one" => Scope::Ids(vec![one?.parse().ok()?]),
        "selected" | "ids" => Scope::Ids(
            form.iter()
                .filter(|(k, _)| k == "id")
                .filter_map(|(_, v)| v.parse().ok())
                .collect(),
        ),
        "topic" => Scope::Topic(field(form, "topic").filter(|t| !t.is_empty())?.to_owned()),
        "all" => Scope::All,
        _ => return None,
    };
    Some((action, scope))
}

fn dead_count(stats: &Stats, topic: Option<&str>) -> u64 {
    let n = match topic {
        Some(t) => stats
            .topics
            .iter()
            .find(|s| s.topic == t)
            .map_or(0, |s| s.dead),
        None => stats.total.dead,
    };
    u64::try_from(n).unwrap_or(0)
}

fn bad_request(f: &Frame<'_>, text: &str) -> Response {
    let body = format!(
        "<h1>Nothing to do</h1><div class=\"notice bad\">{}</div><p><a href=\"{}\">Back to the dead letters</a></p>",
        esc(text),
        f.link("/dead")
    );
    html(
        StatusCode::BAD_REQUEST,
        f.page("Nothing to do", Nav::Dead, None, &body),
    )
}

/// The confirmation page: says what will happen to how many dead letters, and asks.
pub(super) async fn confirm(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    body: Body,
) -> Response {
    let f = frame(&c, &base);
    let form = form(&body_bytes(body).await);
    if !csrf_ok(&c, &form) {
        return csrf_refused();
    }
    let Some((action, scope)) = parse_request(&form) else {
        return bad_request(&f, "Select at least one dead letter first.");
    };
    let back_topic = field(&form, "topic").unwrap_or("");
    let (count, what, hidden) = match &scope {
        Scope::Ids(ids) if ids.is_empty() => {
            return bad_request(&f, "Select at least one dead letter first.")
        }
        Scope::Ids(ids) => {
            // Only those still dead count; a stale page may hold some that are gone.
            let mut dead = Vec::new();
            for id in ids {
                match c.store.message(*id).await {
                    Ok(Some(m)) if m.status == MessageStatus::Dead => dead.push(m),
                    Ok(_) => {}
                    Err(e) => return failure(&f, &e),
                }
            }
            if dead.is_empty() {
                return bad_request(
                    &f,
                    "None of the selected messages is a dead letter any more.",
                );
            }
            let mut list = String::from("<ul class=\"ids\">");
            let mut hidden = String::from("<input type=\"hidden\" name=\"scope\" value=\"ids\">");
            for m in &dead {
                let _ = write!(
                    list,
                    "<li><span class=\"mono\">{}</span> <span class=\"muted\">{}</span></li>",
                    m.id,
                    esc(&m.topic)
                );
                let _ = write!(
                    hidden,
                    "<input type=\"hidden\" name=\"id\" value=\"{}\">",
                    m.id
                );
            }
            list.push_str("</ul>");
            (dead.len() as u64, list, hidden)
        }
        Scope::Topic(t) => {
            let stats = match c.store.stats().await {
                Ok(s) => s,
                Err(e) => return failure(&f, &e),
            };
            (
                dead_count(&stats, Some(t)),
                format!(
                    "<p>Every dead letter of topic <strong>{}</strong>, whatever its age.</p>",
                    esc(t)
                ),
                format!(
                    "<input type=\"hidden\" name=\"scope\" value=\"topic\">\
                     <input type=\"hidden\" name=\"topic\" value=\"{}\">",
                    esc(t)
                ),
            )
        }
        Scope::All => {
            let stats = match c.store.stats().await {
                Ok(s) => s,
                Err(e) => return failure(&f, &e),
            };
            (
                dead_count(&stats, None),
                "<p>Every dead letter of every topic.</p>".to_string(),
                "<input type=\"hidden\" name=\"scope\" value=\"all\">".to_string(),
            )
        }
    };
    let n = plural(count, "dead letter", "dead letters");
    let (class, effect) = match action {
        Action::Retry => (
            "primary",
            "They go back to pending, due now, with their attempts reset, and a worker runs \
             their handlers again.",
        ),
        Action::Discard => (
            "danger",
            "They are deleted for good: this cannot be undone.",
        ),
    };
    let title = format!("{} {n}?", action.verb());
    let back = format!("{}{}", f.link("/dead"), query(&[("topic", back_topic)]));
    let body = format!(
        "<div class=\"confirm\" id=\"confirm-box\"><h1 id=\"confirm-title\">{title}</h1>{what}<p>{effect}</p>\
         <form method=\"post\" action=\"{apply}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"action\" value=\"{action}\">\
         <input type=\"hidden\" name=\"back\" value=\"{back_topic}\">{hidden}\
         <button type=\"submit\" class=\"{class}\" id=\"confirm\">{verb} {n}</button> \
         <a href=\"{back}\" class=\"button\" id=\"cancel\">Cancel</a></form></div>",
        apply = f.link("/dead/apply"),
        csrf = esc(&c.csrf),
        action = action.name(),
        back_topic = esc(back_topic),
        verb = action.verb(),
    );
    html(StatusCode::OK, f.page(&title, Nav::Dead, None, &body))
}

/// Does what the confirmation page asked, then goes back to the list, saying how many.
pub(super) async fn apply(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    body: Body,
) -> Response {
    let f = frame(&c, &base);
    let form = form(&body_bytes(body).await);
    if !csrf_ok(&c, &form) {
        return csrf_refused();
    }
    let Some((action, scope)) = parse_request(&form) else {
        return bad_request(&f, "Nothing was selected.");
    };
    let run = |sel: DeadSelection| {
        let store: Store = c.store.clone();
        async move {
            match action {
                Action::Retry => store.retry_dead(&sel).await,
                Action::Discard => store.discard_dead(&sel).await,
            }
        }
    };
    let done = match scope {
        Scope::Ids(ids) => {
            let mut n = 0;
            for id in ids {
                match run(DeadSelection::One(id)).await {
                    Ok(k) => n += k,
                    Err(e) => return failure(&f, &e),
                }
            }
            Ok(n)
        }
        Scope::Topic(t) => run(DeadSelection::Topic(t)).await,
        Scope::All => run(DeadSelection::All).await,
    };
    match done {
        Ok(n) => {
            let n = n.to_string();
            let to = format!(
                "{}/dead{}",
                base,
                serde_urlencoded::to_string([
                    ("topic", field(&form, "back").unwrap_or("")),
                    (
                        "done",
                        if action == Action::Retry {
                            "retried"
                        } else {
                            "discarded"
                        }
                    ),
                    ("n", &n),
                ])
                .map(|q| format!("?{q}"))
                .unwrap_or_default()
            );
            Redirect::to(&to).into_response()
        }
        Err(e) => failure(&f, &e),
    }
}

// ---------------------------------------------------------------------------------------------
// One message

fn pretty(payload: &str) -> String {
    serde_json::from_str::<serde_json::Value>(payload)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| payload.to_owned())
}

/// One message: topic, status, attempts, timestamps, last error and the payload.
pub(super) async fn message(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    Path(id): Path<String>,
) -> Response {
    let f = frame(&c, &base);
    let found = match id.parse::<Uuid>() {
        Ok(id) => match c.store.message(id).await {
            Ok(m) => m,
            Err(e) => return failure(&f, &e),
        },
        Err(_) => None,
    };
    let Some(m) = found else {
        let body = format!(
            "<h1>No such message</h1><p>No message has the id <span class=\"mono\">{}</span>: \
             it may have been done (done messages are deleted) or discarded.</p>\
             <p><a href=\"{}\">Back to the dead letters</a></p>",
            esc(&id),
            f.link("/dead")
        );
        return html(
            StatusCode::NOT_FOUND,
            f.page("No such message", Nav::Dead, None, &body),
        );
    };
    let now = Utc::now();
    let dead = m.status == MessageStatus::Dead;
    let mut b = format!(
        "<div class=\"title\"><h1>Message <span class=\"mono\" id=\"message-id\">{}</span></h1>\
         <span class=\"badge status-{st}\" id=\"status\">{st}</span></div>",
        m.id,
        st = m.status.as_str(),
    );
    let topic = if dead {
        format!(
            "<a href=\"{}{}\">{}</a>",
            f.link("/dead"),
            query(&[("topic", &m.topic)]),
            esc(&m.topic)
        )
    } else {
        esc(&m.topic)
    };
    let due_label = match m.status {
        MessageStatus::Running => "Lease until",
        MessageStatus::Dead => "Dead since",
        _ => "Due",
    };
    let ts = |t: Option<DateTime<Utc>>| t.map_or_else(|| "–".into(), |t| when(t, now));
    let _ = write!(
        b,
        "<dl class=\"facts\"><dt>Topic</dt><dd id=\"topic\">{topic}</dd>\
         <dt>Attempts</dt><dd id=\"attempts\">{}</dd>\
         <dt>Created</dt><dd>{}</dd><dt>{due_label}</dt><dd>{}</dd>",
        m.attempts,
        ts(Some(m.created_at)),
        ts(Some(m.available_at)),
    );
    if !dead {
        let _ = write!(b, "<dt>Processed</dt><dd>{}</dd>", ts(m.processed_at));
    }
    let _ = write!(
        b,
        "<dt>Idempotency key</dt><dd class=\"mono\" id=\"idempotency-key\">{}</dd>",
        m.idempotency_key.as_deref().map_or_else(
            || "<span class=\"muted\">none: each handler gets {id}:{handler}</span>".to_string(),
            esc
        )
    );
    if let Some(key) = &m.ordering_key {
        let _ = write!(
            b,
            "<dt>Ordering key</dt><dd class=\"mono\" id=\"ordering-key\">{}</dd>",
            esc(key)
        );
    }
    if !m.handlers_done.is_empty() {
        let done: Vec<String> = m
            .handlers_done
            .iter()
            .map(|(h, at)| format!("{} <span class=\"muted\">{}</span>", esc(h), when(*at, now)))
            .collect();
        let _ = write!(
            b,
            "<dt>Handlers done</dt><dd id=\"handlers-done\">{}</dd>",
            done.join("<br>")
        );
    }
    b.push_str("</dl>");
    if dead && !c.config.read_only {
        let _ = write!(
            b,
            "<form method=\"post\" action=\"{}\" class=\"toolbar\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <input type=\"hidden\" name=\"topic\" value=\"{}\">\
             <button name=\"op\" value=\"retry:one:{id}\" id=\"retry\" class=\"primary\">Retry</button>\
             <button name=\"op\" value=\"discard:one:{id}\" id=\"discard\" class=\"danger\">Discard</button></form>",
            f.link("/dead/confirm"),
            esc(&c.csrf),
            esc(&m.topic),
            id = m.id,
        );
    }
    if let Some(err) = &m.last_error {
        let _ = write!(
            b,
            "<h2>Last error</h2><pre class=\"error\" id=\"last-error\">{}</pre>",
            esc(err)
        );
    }
    let _ = write!(
        b,
        "<h2>Payload</h2><pre class=\"payload\" id=\"payload\">{}</pre>",
        esc(&pretty(&m.payload))
    );
    html(
        StatusCode::OK,
        f.page(&format!("Message {}", m.id), Nav::Dead, None, &b),
    )
}

// ---------------------------------------------------------------------------------------------
// Workers

/// One live worker, as the workers page shows it.
///
/// The fields `Store::workers()` is to return; until it does, [`live_workers`] has nothing
/// to fill them from.
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct WorkerRow {
    pub(super) id: Uuid,
    pub(super) name: String,
    pub(super) topics: Vec<String>,
    pub(super) waiting: bool,
    pub(super) started_at: DateTime<Utc>,
    pub(super) heartbeat_at: DateTime<Utc>,
}

/// The live workers (heartbeat within seconds), from the store's worker listing.
async fn live_workers(store: &Store) -> crate::Result<Option<Vec<WorkerRow>>> {
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
pub(super) async fn workers(
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

// ---------------------------------------------------------------------------------------------
// Sign-in (token credentials)

fn login_form(c: &Console, f: &Frame<'_>, error: Option<&str>) -> String {
    let error = error.map_or_else(String::new, |e| {
        format!(
            "<div class=\"notice bad\" id=\"login-error\">{}</div>",
            esc(e)
        )
    });
    let body = format!(
        "<div class=\"confirm\"><h1>Sign in</h1>{error}<p>This console asks for its access \
         token.</p><form method=\"post\" action=\"{}\" class=\"login\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>Token <input type=\"password\" name=\"token\" id=\"token\" autofocus \
         autocomplete=\"current-password\"></label> <button type=\"submit\" class=\"primary\">Sign in</button></form></div>",
        f.link("/login"),
        esc(&c.csrf)
    );
    f.page("Sign in", Nav::None, None, &body)
}

/// The sign-in page (token credentials only; elsewhere it leads to the overview).
pub(super) async fn login_page(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
) -> Response {
    let f = Frame {
        logout: None,
        ..frame(&c, &base)
    };
    if !matches!(c.config.credentials, Some(Credentials::Token(_))) {
        return Redirect::to(&f.home()).into_response();
    }
    html(StatusCode::OK, login_form(&c, &f, None))
}

/// Checks the token and sets the sign-in cookie.
pub(super) async fn login(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    body: Body,
) -> Response {
    let f = Frame {
        logout: None,
        ..frame(&c, &base)
    };
    let Some(Credentials::Token(token)) = &c.config.credentials else {
        return Redirect::to(&f.home()).into_response();
    };
    let form = form(&body_bytes(body).await);
    if !csrf_ok(&c, &form) {
        return csrf_refused();
    }
    if !field(&form, "token").is_some_and(|t| same_secret(t.trim(), token)) {
        // A pause per wrong guess, so guessing is slow.
        tokio::time::sleep(Duration::from_millis(300)).await;
        return html(
            StatusCode::UNAUTHORIZED,
            login_form(&c, &f, Some("That token is not right.")),
        );
    }
    let mut res = Redirect::to(&f.home()).into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&base, Some(&c.session)));
    res
}

/// Clears the sign-in cookie.
pub(super) async fn logout(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    body: Body,
) -> Response {
    let form = form(&body_bytes(body).await);
    if !csrf_ok(&c, &form) {
        return csrf_refused();
    }
    let mut res = Redirect::to(&format!("{base}/login")).into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&base, None));
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn requests_parse() {
        let id = Uuid::now_v7();
        let one = format!("retry:one:{id}");
        let Some((Action::Retry, Scope::Ids(ids))) = parse_request(&form(&[("op", &one)])) else {
            panic!("one");
        };
        assert_eq!(ids, vec![id]);
        let idt = id.to_string();
        let Some((Action::Discard, Scope::Ids(ids))) = parse_request(&form(&[
            ("op", "discard:selected"),
            ("id", &idt),
            ("id", "junk"),
        ])) else {
            panic!("selected");
        };
        assert_eq!(ids, vec![id]);
        assert!(matches!(
            parse_request(&form(&[("action", "retry"), ("scope", "topic"), ("topic", "a")])),
            Some((Action::Retry, Scope::Topic(t))) if t == "a"
        ));
        assert!(parse_request(&form(&[("op", "retry:topic")])).is_none());
        assert!(parse_request(&form(&[("op", "explode:all")])).is_none());
        assert!(matches!(
            parse_request(&form(&[("op", "discard:all")])),
            Some((Action::Discard, Scope::All))
        ));
    }

    #[test]
    fn payloads_are_pretty_or_as_they_are() {
        assert_eq!(pretty("{\"a\":1}"), "{\n  \"a\": 1\n}");
        assert_eq!(pretty("not json"), "not json");
    }

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
