//! The event log: the topics that keep their delivered events (window, events, size, oldest
//! event, how far ahead the day partitions go, and the warning when those run short), and one
//! topic's events in enqueue order, a page at a time, optionally of one ordering key. It only
//! reads: windows are changed with `outbox events retain` or `Store::set_retention`.

use std::fmt::Write as _;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::{bad_address, failure, frame, html, not_a_topic, quoted};
use crate::console::html::{esc, excerpt, num, plural, query, size, when, window, Frame, Nav};
use crate::console::{Base, Console, Shared};
use crate::retention::{EventFilter, ReplayInfo, RetainedEvent, RetainedTopic};

/// How many characters of a payload a row shows.
const PAYLOAD_CHARS: usize = 160;

/// What the event log's address may carry: a topic, then an ordering key and the last event
/// of the previous page.
#[derive(Debug, Deserialize)]
pub(in crate::console) struct EventsQuery {
    topic: Option<String>,
    key: Option<String>,
    after: Option<String>,
}

/// A topic's events, as the address asks for them once checked.
#[derive(Debug)]
struct TopicRequest {
    topic: String,
    key: Option<String>,
    after: Option<Uuid>,
}

/// What a well-formed address asks for: the list of retained topics, or one topic's events;
/// else the sentence that says what is wrong with it.
fn parse(q: EventsQuery) -> Result<Option<TopicRequest>, String> {
    let some = |v: Option<String>| v.filter(|v| !v.is_empty());
    let (topic, key, after) = (some(q.topic), some(q.key), some(q.after));
    let Some(topic) = topic else {
        return match (key, after) {
            (None, None) => Ok(None),
            _ => Err("Name the topic whose events to list: key and after need a topic.".into()),
        };
    };
    if let Some(why) = not_a_topic(&topic) {
        return Err(why);
    }
    if key.as_deref().is_some_and(|k| k.contains('\0')) {
        return Err("An ordering key holds no NUL character.".into());
    }
    let after = match after {
        Some(a) => Some(a.parse::<Uuid>().map_err(|_| {
            format!(
                "“{}” is not an event id: after= takes the id of the last event of a page.",
                quoted(&a)
            )
        })?),
        None => None,
    };
    Ok(Some(TopicRequest { topic, key, after }))
}

/// The answer to an address the event log cannot read.
fn bad_request(f: &Frame<'_>, text: &str) -> Response {
    bad_address(f, "Event log", Nav::Events, "/events", text)
}

/// The retained topics at `/events`, or one topic's events at `/events?topic=T` (with `key=`
/// and `after=`); a 400 page for an address it cannot read.
pub(in crate::console) async fn event_log(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Response {
    let f = frame(&c, &base);
    let Ok(Query(q)) = q else {
        return bad_request(
            &f,
            "The event log takes topic, key and after in its address, each at most once.",
        );
    };
    match parse(q) {
        Err(why) => bad_request(&f, &why),
        Ok(None) => topics(&c, &f).await,
        Ok(Some(req)) => events(&c, &f, req).await,
    }
}

/// How to make a topic retain its delivered events, as HTML.
fn how_to_retain(topic: &str) -> String {
    format!(
        "declare <code>#[outbox_event(retain = \"180d\")]</code> on its event type, or run \
         <code>outbox events retain --topic {} --for 180d</code>",
        esc(topic)
    )
}

/// The table of the retained topics, and the replays.
async fn topics(c: &Console, f: &Frame<'_>) -> Response {
    let (topics, replays) = match tokio::try_join!(c.store.retained_topics(), c.store.replays()) {
        Ok(both) => both,
        Err(e) => return failure(f, &e),
    };
    let mut b = String::from("<div class=\"title\"><h1>Event log</h1>");
    if topics.is_empty() {
        b.push_str("</div>");
        let _ = write!(
            b,
            "<p class=\"empty\" id=\"no-retained\">No topic keeps its delivered events: to keep \
             a topic's, {}.</p>",
            how_to_retain("T")
        );
        replays_table(&mut b, &replays);
        return html(StatusCode::OK, f.page("Event log", Nav::Events, None, &b));
    }
    let _ = write!(
        b,
        "<p class=\"sub\">{}</p></div>",
        plural(
            topics.len() as u64,
            "topic keeps its delivered events",
            "topics keep their delivered events"
        )
    );
    let now = Utc::now();
    topics_table(&mut b, f, &topics, now);
    replays_table(&mut b, &replays);
    html(StatusCode::OK, f.page("Event log", Nav::Events, None, &b))
}

/// The replays, newest first, with their progress (`id="replays"`).
fn replays_table(b: &mut String, replays: &[ReplayInfo]) {
    b.push_str("<h2>Replays</h2>");
    if replays.is_empty() {
        b.push_str(
            "<p class=\"empty\" id=\"no-replays\">No replays: start one with <code>outbox replay \
             --topic T --handler H</code>.</p>",
        );
        return;
    }
    b.push_str(
        "<table class=\"grid\" id=\"replays\"><thead><tr><th>Replay</th><th>Topic</th>\
         <th>Handler</th><th>State</th><th>Progress</th><th class=\"n\">Failed</th></tr></thead>\
         <tbody>",
    );
    for r in replays {
        let _ = write!(
            b,
            "<tr data-replay=\"{id}\"><td><code>{id}</code>{backfill}</td><td>{topic}</td>\
             <td>{handler}</td><td class=\"state\">{state}{running}</td>\
             <td class=\"progress\"><progress max=\"1\" value=\"{value:.3}\"></progress> {line}</td>\
             <td class=\"n failed\">{failed}</td></tr>",
            id = r.id,
            backfill = if r.backfill {
                " <span class=\"badge\">backfill</span>"
            } else {
                ""
            },
            topic = esc(&r.request.topic),
            handler = esc(&r.request.handler),
            state = r.state,
            running = if r.leased { " (a worker runs it)" } else { "" },
            value = r.progress(),
            line = esc(&format!(
                "{}/{}{}{}",
                num(r.delivered),
                num(r.total),
                r.rate().map(|x| format!(", {x:.0}/s")).unwrap_or_default(),
                r.time_left()
                    .map(|d| format!(", ~{}s left", d.as_secs()))
                    .unwrap_or_default()
            )),
            failed = num(r.failed),
        );
    }
    b.push_str("</tbody></table>");
}

/// The retained topics' warnings (`id="runway"`) and their table (`id="retained"`).
fn topics_table(b: &mut String, f: &Frame<'_>, topics: &[RetainedTopic], now: DateTime<Utc>) {
    let notes: Vec<String> = topics
        .iter()
        .filter_map(|t| t.runway_note(now))
        .map(|n| esc(&n))
        .collect();
    if !notes.is_empty() {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"runway\">{}</div>",
            notes.join("<br>")
        );
    }
    b.push_str(
        "<table class=\"grid\" id=\"retained\"><thead><tr><th>Topic</th>\
         <th title=\"how long a delivered event is kept\">Window</th>\
         <th class=\"n\">Events</th>\
         <th class=\"n\" title=\"on disk, indexes included (PostgreSQL)\">Size</th>\
         <th>Oldest event</th>\
         <th title=\"the end of the last day partition: deliveries after it cannot be kept \
         (PostgreSQL)\">Partitions until</th></tr></thead><tbody>",
    );
    let dash = "<span class=\"muted\">-</span>";
    for t in topics {
        let short = t.runway_note(now).is_some();
        let badge = if short {
            " <span class=\"badge warn\">partitions run short</span>"
        } else {
            ""
        };
        let _ = write!(
            b,
            "<tr data-topic=\"{topic}\"{class}><th><a href=\"{link}{q}\">{topic}</a>{badge}</th>\
             <td class=\"window\">{}</td><td class=\"n events\">{}</td><td class=\"n size\">{}</td>\
             <td class=\"oldest\">{}</td><td class=\"until\">{}</td></tr>",
            window(t.retain),
            num(t.events),
            t.bytes.map_or_else(|| dash.to_string(), size),
            t.oldest.map_or_else(|| dash.to_string(), |o| when(o, now)),
            t.partitions_until
                .map_or_else(|| dash.to_string(), |u| when(u, now)),
            topic = esc(&t.topic),
            class = if short { " class=\"unserved\"" } else { "" },
            link = f.link("/events"),
            q = query(&[("topic", &t.topic)]),
        );
    }
    b.push_str("</tbody></table>");
}

/// One topic's events, a page at a time.
async fn events(c: &Console, f: &Frame<'_>, req: TopicRequest) -> Response {
    let per_page = c.config.page_size;
    let mut filter = EventFilter::topic(&req.topic).limit(per_page + 1);
    filter.key.clone_from(&req.key);
    filter.after = req.after;
    // The catalog only: no count of the whole log for every page.
    let (topics, mut rows) =
        match tokio::try_join!(c.store.retained_topics_brief(), c.store.events(&filter)) {
            Ok(r) => r,
            Err(e) => return failure(f, &e),
        };
    let now = Utc::now();
    let topic = esc(&req.topic);
    let back = format!(
        "<p><a href=\"{}\" id=\"all-topics\">← All retained topics</a></p>",
        f.link("/events")
    );
    let Some(retained) = topics.iter().find(|t| t.topic == req.topic) else {
        let body = format!(
            "<div class=\"title\"><h1>Event log of {topic}</h1></div>\
             <p class=\"empty\" id=\"not-retained\">Topic <strong>{topic}</strong> keeps no \
             events: they are deleted when delivered. To keep them, {}.</p>{back}",
            how_to_retain(&req.topic)
        );
        return html(
            StatusCode::OK,
            f.page(
                &format!("Event log of {}", req.topic),
                Nav::Events,
                None,
                &body,
            ),
        );
    };
    let more = rows.len() > per_page as usize;
    rows.truncate(per_page as usize);

    let mut b = format!(
        "<div class=\"title\"><h1>Event log of <span id=\"topic\">{topic}</span></h1>\
         <p class=\"sub\">kept for {} after delivery · in enqueue order, oldest first",
        window(retained.retain)
    );
    if let Some(until) = retained.partitions_until {
        let _ = write!(b, " · partitions until {}", when(until, now));
    }
    b.push_str("</p></div>");
    if let Some(note) = retained.runway_note(now) {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"runway\">{}</div>",
            esc(&note)
        );
    }
    let key = req.key.as_deref().unwrap_or("");
    // The filter: a GET, like every link here.
    let _ = write!(
        b,
        "<form method=\"get\" action=\"{}\" class=\"filters\" id=\"filters\">\
         <input type=\"hidden\" name=\"topic\" value=\"{topic}\">\
         <label>Ordering key <input name=\"key\" value=\"{}\" size=\"24\"></label>\
         <button type=\"submit\" id=\"filter\">Filter</button>",
        f.link("/events"),
        esc(key)
    );
    if !key.is_empty() {
        let _ = write!(
            b,
            "<a href=\"{}{}\">Clear</a>",
            f.link("/events"),
            query(&[("topic", &req.topic)])
        );
    }
    b.push_str("</form>");

    if rows.is_empty() {
        let what = match (req.after, &req.key) {
            (Some(_), _) => "No more events.".to_string(),
            (None, Some(k)) => format!(
                "No event of ordering key <strong>{}</strong> is kept.",
                esc(k)
            ),
            (None, None) => {
                "No event is kept yet: events of this topic appear here once delivered.".into()
            }
        };
        let _ = write!(b, "<p class=\"empty\" id=\"no-events\">{what}</p>");
    } else {
        events_table(&mut b, &rows, now);
    }

    // The pager: on from the last row, or back to the first page.
    if req.after.is_some() || more {
        let link = |after: &str| {
            format!(
                "{}{}",
                f.link("/events"),
                query(&[("topic", &req.topic), ("key", key), ("after", after)])
            )
        };
        b.push_str("<nav class=\"pager\">");
        if req.after.is_some() {
            let _ = write!(b, "<a href=\"{}\" id=\"first\">← First page</a>", link(""));
        }
        if let Some(last) = rows.last().filter(|_| more) {
            let _ = write!(
                b,
                "<a href=\"{}\" id=\"next\">Next page →</a>",
                link(&last.id.to_string())
            );
        }
        b.push_str("</nav>");
    }
    b.push_str(&back);
    html(
        StatusCode::OK,
        f.page(
            &format!("Event log of {}", req.topic),
            Nav::Events,
            None,
            &b,
        ),
    )
}

/// The events of a page (`id="events"`), one row each (`data-id`).
fn events_table(b: &mut String, rows: &[RetainedEvent], now: DateTime<Utc>) {
    b.push_str(
        "<table class=\"grid\" id=\"events\"><thead><tr><th>Id</th><th>Created</th>\
         <th>Delivered</th><th>Ordering key</th><th class=\"n\">Version</th><th>Payload</th>\
         </tr></thead><tbody>",
    );
    for e in rows {
        let _ = write!(
            b,
            "<tr data-id=\"{id}\"><td class=\"id mono\">{id}</td><td>{}</td><td>{}</td>\
             <td class=\"mono\">{}</td><td class=\"n\">{}</td><td class=\"payload\">{}</td></tr>",
            when(e.created_at, now),
            when(e.delivered_at, now),
            e.ordering_key
                .as_deref()
                .map_or_else(|| "<span class=\"muted\">-</span>".to_string(), esc),
            e.version,
            esc(&excerpt(&e.payload, PAYLOAD_CHARS)),
            id = e.id,
        );
    }
    b.push_str("</tbody></table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(topic: Option<&str>, key: Option<&str>, after: Option<&str>) -> EventsQuery {
        EventsQuery {
            topic: topic.map(Into::into),
            key: key.map(Into::into),
            after: after.map(Into::into),
        }
    }

    #[test]
    fn addresses_are_read_or_refused_with_a_reason() {
        assert!(matches!(parse(q(None, None, None)), Ok(None)));
        assert!(matches!(parse(q(Some(""), Some(""), Some(""))), Ok(None)));
        let id = Uuid::now_v7();
        let r = parse(q(Some("a.b"), Some("k1"), Some(&id.to_string())))
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.topic.as_str(), r.key.as_deref(), r.after),
            ("a.b", Some("k1"), Some(id))
        );
        let e = parse(q(Some("a.b"), None, Some("<script>"))).unwrap_err();
        assert!(e.contains("not an event id"), "{e}");
        assert!(parse(q(None, Some("k"), None)).is_err());
        assert!(parse(q(None, None, Some(&id.to_string()))).is_err());
        assert!(parse(q(Some(&"t".repeat(65)), None, None)).is_err());
        assert!(parse(q(Some(&"t".repeat(64)), None, None)).is_ok());
        let e = parse(q(Some("a\0b"), None, None)).unwrap_err();
        assert!(e.contains("“a\u{fffd}b”"), "{e}");
        assert!(parse(q(Some("a"), Some("k\0"), None)).is_err());
    }

    #[test]
    fn rows_render_escaped() {
        let now = Utc::now();
        let mut b = String::new();
        let event = RetainedEvent {
            id: Uuid::nil(),
            seq: 1,
            topic: "t".into(),
            payload: format!(
                "{{\"note\":\"<script>alert(1)</script>{}\"}}",
                "x".repeat(400)
            ),
            version: 2,
            idempotency_key: None,
            ordering_key: Some("<b>k</b>".into()),
            created_at: now,
            delivered_at: now,
            traceparent: None,
        };
        events_table(&mut b, &[event], now);
        assert!(!b.contains("<script>") && !b.contains("<b>"), "{b}");
        assert!(
            b.contains("&lt;script&gt;alert(1)") && b.contains("&lt;b&gt;k"),
            "{b}"
        );
        assert!(b.contains('…'), "a long payload is cut: {b}");
    }
}
