//! The dead letters: newest first, filtered by topic and age, a page at a time, with the
//! buttons that lead to retrying or discarding them (see [`dead_actions`](super::dead_actions)).

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::{bad_address, failure, frame, html, not_a_topic};
use crate::console::html::{esc, excerpt, num, plural, query, when, Nav};
use crate::console::{Base, Shared};
use crate::model::{DeadCursor, DeadLetterFilter};

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

#[derive(Debug, Deserialize)]
pub(in crate::console) struct DeadQuery {
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
pub(in crate::console) async fn dead_letters(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    Query(q): Query<DeadQuery>,
) -> Response {
    let f = frame(&c, &base);
    let topic = q.topic.filter(|t| !t.is_empty());
    if let Some(why) = topic.as_deref().and_then(not_a_topic) {
        return bad_address(&f, "Dead letters", Nav::Dead, "/dead", &why);
    }
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
            // The whole id: its first 13 characters are only the millisecond it was made in,
            // which messages enqueued together share.
            let _ = write!(
                b,
                "<td class=\"id\"><a class=\"mono\" href=\"{}\">{id}</a></td><td>{}</td>\
                 <td class=\"n\">{}</td><td>{}</td><td class=\"err\">{}</td>",
                f.link(&format!("/messages/{id}")),
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
