//! Signing in with the console's token, and out: the sign-in page, the check of the token and
//! the cookie that keeps the browser signed in. Only with token credentials; elsewhere these
//! addresses lead to the overview.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;

use super::{frame, html};
use crate::console::guard::{same_secret, session_cookie};
use crate::console::html::{esc, Frame, Nav};
use crate::console::{
    body_bytes, csrf_ok, csrf_refused, field, form, Base, Console, Credentials, Shared,
};

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
pub(in crate::console) async fn login_page(
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
pub(in crate::console) async fn login(
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
pub(in crate::console) async fn logout(
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
