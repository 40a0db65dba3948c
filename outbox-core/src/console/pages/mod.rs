//! The console's pages, one file each: the overview, the dead letters, retrying or discarding
//! them (the confirmation page and the change it confirms), pausing or resuming a handler (the
//! same), one message, the workers, the
//! event log, and the sign-in. What every page shares is here: its frame, the error page and the 404.

mod dead_actions;
mod dead_letters;
mod event_log;
mod message;
mod overview;
mod pause_actions;
mod sign_in;
mod workers;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;

pub(super) use self::dead_actions::{apply, confirm};
pub(super) use self::dead_letters::dead_letters;
pub(super) use self::event_log::event_log;
pub(super) use self::message::message;
pub(super) use self::overview::overview;
pub(super) use self::pause_actions::{apply_pause, confirm_pause};
pub(super) use self::sign_in::{login, login_page, logout};
pub(super) use self::workers::workers;
use super::html::{esc, Frame, Nav};
use super::{Base, Console, Credentials, Shared};

/// The frame of a page of this console mounted at `base`.
fn frame<'a>(c: &'a Console, base: &'a str) -> Frame<'a> {
    Frame {
        base,
        kind: c.store.kind(),
        read_only: c.config.read_only,
        logout: matches!(c.config.credentials, Some(Credentials::Token(_))).then_some(&*c.csrf),
    }
}

/// An HTML answer.
fn html(status: StatusCode, page: String) -> Response {
    (status, Html(page)).into_response()
}

/// The error page for a failed store call.
fn failure(f: &Frame<'_>, e: &crate::error::Error) -> Response {
    let body = format!(
        "<h1>Something went wrong</h1><div class=\"notice bad\"><pre>{}</pre></div>",
        esc(&e.to_string())
    );
    html(
        StatusCode::INTERNAL_SERVER_ERROR,
        f.page("Error", Nav::None, None, &body),
    )
}

/// Text from the address, to quote in a refusal: at most 64 characters, control characters
/// shown as U+FFFD.
fn quoted(text: &str) -> String {
    super::html::excerpt(text, 64)
        .chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// Why `topic`, read from an address, cannot be a topic; `None` when it can.
fn not_a_topic(topic: &str) -> Option<String> {
    (topic.chars().count() > 64 || topic.chars().any(char::is_control)).then(|| {
        format!(
            "“{}” is not a topic: a topic has 1 to 64 characters and no control characters.",
            quoted(topic)
        )
    })
}

/// A 400 page for an address a listing cannot read: `why` (escaped) and a link back to `back`.
fn bad_address(f: &Frame<'_>, title: &str, nav: Nav, back: &str, why: &str) -> Response {
    let body = format!(
        "<h1>Not an address of the {}</h1><div class=\"notice bad\" id=\"bad-request\">{}</div>\
         <p><a href=\"{}\">Back to the {}</a></p>",
        esc(&title.to_lowercase()),
        esc(why),
        f.link(back),
        esc(&title.to_lowercase()),
    );
    html(StatusCode::BAD_REQUEST, f.page(title, nav, None, &body))
}

/// 404 for any other path.
pub(in crate::console) async fn not_found(
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
