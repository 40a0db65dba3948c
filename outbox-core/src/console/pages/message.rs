//! One message: topic, status, attempts, timestamps, keys, the handlers already done, the last
//! error and the payload; a dead one with its retry and discard buttons.

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{failure, frame, html};
use crate::console::html::{esc, query, when, Nav};
use crate::console::{Base, Shared};
use crate::model::MessageStatus;

/// The payload indented when it is JSON, as it is otherwise.
fn pretty(payload: &str) -> String {
    serde_json::from_str::<serde_json::Value>(payload)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| payload.to_owned())
}

/// One message: topic, status, attempts, timestamps, last error and the payload.
pub(in crate::console) async fn message(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_pretty_or_as_they_are() {
        assert_eq!(pretty("{\"a\":1}"), "{\n  \"a\": 1\n}");
        assert_eq!(pretty("not json"), "not json");
    }
}
