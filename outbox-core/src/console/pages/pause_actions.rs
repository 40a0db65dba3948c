//! Pausing and resuming a handler from the overview: its table of handlers with a Pause or
//! Resume button each, the confirmation page, which says what will happen, and the change it
//! confirms. The same rules as the dead-letter actions: a `POST` with this console's token,
//! refused when read-only, and a confirmation page before anything changes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use chrono::Utc;

use super::{failure, frame, html};
use crate::console::form::CheckedForm;
use crate::console::html::{age, esc, Frame, Nav};
use crate::console::{Base, Console, Shared};
use crate::model::{Stats, WorkerInfo};
use crate::pause::PauseTarget;

/// Pause or resume.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Pause,
    Resume,
}

impl Action {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "pause" => Some(Action::Pause),
            "resume" => Some(Action::Resume),
            _ => None,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
        }
    }
    fn verb(self) -> &'static str {
        match self {
            Action::Pause => "Pause",
            Action::Resume => "Resume",
        }
    }
}

/// Reads the action and the handler from a form: `op` (`pause:<handler>`), or `action` and
/// `handler` as the confirmation page sends them.
fn parse_request(form: &CheckedForm) -> Option<(Action, String)> {
    let (action, handler) = match form.field("op") {
        Some(op) => op.split_once(':')?,
        None => (form.field("action")?, form.field("handler")?),
    };
    let handler = handler.trim();
    if handler.is_empty() {
        return None;
    }
    Some((Action::parse(action)?, handler.to_owned()))
}

/// The handlers the live workers run, each with the topics it handles.
fn handlers(workers: &[WorkerInfo]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in workers.iter().filter(|w| w.live) {
        for (topic, _, names) in w.serves() {
            for name in names {
                let topics = out.entry(name.clone()).or_default();
                if !topics.iter().any(|t| t == topic) {
                    topics.push(topic.to_owned());
                }
            }
        }
    }
    out
}

/// The overview's table of handlers: each live worker's handlers and the paused ones, whether
/// paused (since when, how many messages wait) and, unless read-only, a Pause or Resume button.
pub(super) fn handlers_table(
    b: &mut String,
    c: &Console,
    f: &Frame<'_>,
    stats: &Stats,
    workers: &[WorkerInfo],
) {
    let mut rows = handlers(workers);
    let paused: BTreeMap<&str, &crate::pause::PauseInfo> = stats
        .pauses
        .iter()
        .filter_map(|p| match &p.target {
            PauseTarget::Handler(h) => Some((h.as_str(), p)),
            _ => None,
        })
        .collect();
    for h in paused.keys() {
        rows.entry((*h).to_owned()).or_default();
    }
    let topics: Vec<String> = stats
        .pauses
        .iter()
        .filter_map(|p| match &p.target {
            PauseTarget::Topic(t) => Some(esc(t)),
            _ => None,
        })
        .collect();
    if !topics.is_empty() {
        let _ = write!(
            b,
            "<div class=\"notice warn\" id=\"paused-topics\"><strong>Paused topics:</strong> {}. \
             Their messages wait, no attempt counted (<code>outbox resume --topic</code>).</div>",
            topics.join(", ")
        );
    }
    if rows.is_empty() {
        return;
    }
    let writable = !c.config.read_only;
    b.push_str("<h2>Handlers</h2>");
    if writable {
        let _ = write!(
            b,
            "<form method=\"post\" action=\"{}\" id=\"pause-form\">\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">",
            f.link("/pauses/confirm"),
            esc(&c.csrf)
        );
    }
    b.push_str(
        "<table class=\"grid\" id=\"handlers\"><thead><tr><th>Handler</th><th>Topics</th>\
         <th>State</th><th class=\"n\">Waiting</th><th></th></tr></thead><tbody>",
    );
    let now = Utc::now();
    for (name, topics) in &rows {
        let pause = paused.get(name.as_str());
        let state = match pause {
            Some(p) => format!(
                "<span class=\"badge warn\">paused</span> for {}{}",
                age((now - p.paused_at).to_std().unwrap_or_default()),
                p.until
                    .map(|u| format!(
                        ", until {}",
                        esc(&u.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                    ))
                    .unwrap_or_default()
            ),
            None => "running".to_string(),
        };
        let breaker = stats.breakers.iter().find(|x| &x.handler == name);
        let state = match breaker {
            Some(x) => format!(
                "{state}{}<span class=\"badge warn\">breaker open</span> for {}, next probe in {}, {} waiting",
                if pause.is_some() { "; " } else { "" },
                age((now - x.opened_at).to_std().unwrap_or_default()),
                age((x.next_probe_at - now).to_std().unwrap_or_default()),
                x.waiting
            ),
            None => state,
        };
        let state = if breaker.is_some() && pause.is_none() {
            state.trim_start_matches("running").to_string()
        } else {
            state
        };
        let button = if writable {
            let action = if pause.is_some() {
                Action::Resume
            } else {
                Action::Pause
            };
            format!(
                "<button name=\"op\" value=\"{}:{}\" id=\"{}-{}\">{}</button>",
                action.name(),
                esc(name),
                action.name(),
                esc(name),
                action.verb()
            )
        } else {
            String::new()
        };
        let _ = write!(
            b,
            "<tr data-handler=\"{}\"><td class=\"mono\">{}</td><td>{}</td><td>{state}</td>\
             <td class=\"n\">{}</td><td>{button}</td></tr>",
            esc(name),
            esc(name),
            esc(&topics.join(", ")),
            pause
                .map(|p| p.waiting)
                .or(breaker.map(|x| x.waiting))
                .map_or_else(String::new, |n| n.to_string()),
        );
    }
    b.push_str("</tbody></table>");
    if writable {
        b.push_str("</form>");
    }
}

fn bad_request(f: &Frame<'_>, text: &str) -> Response {
    let body = format!(
        "<h1>Nothing to do</h1><div class=\"notice bad\">{}</div><p><a href=\"{}\">Back to the overview</a></p>",
        esc(text),
        f.home()
    );
    html(
        StatusCode::BAD_REQUEST,
        f.page("Nothing to do", Nav::Overview, None, &body),
    )
}

/// The confirmation page: says what pausing or resuming the handler does, and asks.
pub(in crate::console) async fn confirm_pause(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    form: CheckedForm,
) -> Response {
    let f = frame(&c, &base);
    let Some((action, handler)) = parse_request(&form) else {
        return bad_request(&f, "Choose a handler to pause or resume.");
    };
    let effect = match action {
        Action::Pause => {
            "Every worker stops running it within a second. Its messages wait, parked, with no \
             attempt counted; the other handlers of their topics go on. Nothing is lost: Resume \
             runs them."
        }
        Action::Resume => {
            "Every worker runs it again within a second, starting with the messages parked for \
             it (only this handler runs for those: the others already succeeded)."
        }
    };
    let title = format!("{} handler {}?", action.verb(), handler);
    let body = format!(
        "<div class=\"confirm\" id=\"confirm-box\"><h1 id=\"confirm-title\">{title}</h1><p>{effect}</p>\
         <form method=\"post\" action=\"{apply}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"action\" value=\"{action}\">\
         <input type=\"hidden\" name=\"handler\" value=\"{handler}\">\
         <button type=\"submit\" class=\"primary\" id=\"confirm\">{verb} {handler}</button> \
         <a href=\"{back}\" class=\"button\" id=\"cancel\">Cancel</a></form></div>",
        title = esc(&title),
        apply = f.link("/pauses/apply"),
        csrf = esc(&c.csrf),
        action = action.name(),
        handler = esc(&handler),
        verb = action.verb(),
        back = f.home(),
    );
    html(StatusCode::OK, f.page(&title, Nav::Overview, None, &body))
}

/// Does what the confirmation page asked, then goes back to the overview.
pub(in crate::console) async fn apply_pause(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    form: CheckedForm,
) -> Response {
    let f = frame(&c, &base);
    let Some((action, handler)) = parse_request(&form) else {
        return bad_request(&f, "No handler was chosen.");
    };
    let target = PauseTarget::handler(handler);
    let done = match action {
        Action::Pause => c.store.pause(&target, None).await.map(drop),
        Action::Resume => c.store.resume(&target).await.map(drop),
    };
    match done {
        Ok(()) => {
            let to = if base.is_empty() { "/" } else { base.as_str() };
            Redirect::to(to).into_response()
        }
        Err(e @ crate::error::Error::Pause(_)) => bad_request(&f, &e.to_string()),
        Err(e) => failure(&f, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> CheckedForm {
        CheckedForm::unchecked(pairs)
    }

    #[test]
    fn requests_parse() {
        assert!(matches!(
            parse_request(&form(&[("op", "pause:send-confirmation")])),
            Some((Action::Pause, h)) if h == "send-confirmation"
        ));
        assert!(matches!(
            parse_request(&form(&[("action", "resume"), ("handler", "index")])),
            Some((Action::Resume, h)) if h == "index"
        ));
        assert!(parse_request(&form(&[("op", "pause:")])).is_none());
        assert!(parse_request(&form(&[("op", "explode:index")])).is_none());
        assert!(parse_request(&form(&[("op", "pause")])).is_none());
    }
}
