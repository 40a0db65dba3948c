//! Retrying and discarding dead letters: the confirmation page, which says what will happen
//! to how many, and the change it confirms.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use uuid::Uuid;

use super::{failure, frame, html};
use crate::console::form::CheckedForm;
use crate::console::html::{esc, plural, query, Frame, Nav};
use crate::console::{Base, Shared};
use crate::model::{DeadSelection, MessageStatus, Stats};
use crate::store::Store;

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
fn parse_request(form: &CheckedForm) -> Option<(Action, Scope)> {
    let (action, scope, one) = match form.field("op") {
        Some(op) => {
            let mut parts = op.splitn(3, ':');
            (parts.next()?, parts.next()?, parts.next())
        }
        None => (form.field("action")?, form.field("scope")?, None),
    };
    let action = Action::parse(action)?;
    let scope = match scope {
        "one" => Scope::Ids(vec![one?.parse().ok()?]),
        "selected" | "ids" => {
            Scope::Ids(form.values("id").filter_map(|v| v.parse().ok()).collect())
        }
        "topic" => Scope::Topic(form.field("topic").filter(|t| !t.is_empty())?.to_owned()),
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
pub(in crate::console) async fn confirm(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    form: CheckedForm,
) -> Response {
    let f = frame(&c, &base);
    let Some((action, scope)) = parse_request(&form) else {
        return bad_request(&f, "Select at least one dead letter first.");
    };
    let back_topic = form.field("topic").unwrap_or("");
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
pub(in crate::console) async fn apply(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    form: CheckedForm,
) -> Response {
    let f = frame(&c, &base);
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
                    ("topic", form.field("back").unwrap_or("")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> CheckedForm {
        CheckedForm::unchecked(pairs)
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
}
