//! Signing in with the console's token, and out: the sign-in page, the check of the token and
//! the cookie that keeps the browser signed in. Only with token credentials; elsewhere these
//! addresses lead to the overview.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;

use super::{frame, html};
use crate::console::form::{CheckedForm, FormRefused};
use crate::console::guard::{same_secret, session_cookie};
use crate::console::html::{esc, Frame, Nav};
use crate::console::{Base, Console, Credentials, Shared};

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
///
/// Without token credentials there is nothing to sign in to, and the request goes to the
/// overview whatever its form holds: the form's check is taken as a result, and its refusal
/// answered only once token credentials are known to be in use.
pub(in crate::console) async fn login(
    State(c): State<Shared>,
    Extension(Base(base)): Extension<Base>,
    form: Result<CheckedForm, FormRefused>,
) -> Response {
    let f = Frame {
        logout: None,
        ..frame(&c, &base)
    };
    let Some(Credentials::Token(token)) = &c.config.credentials else {
        return Redirect::to(&f.home()).into_response();
    };
    let form = match form {
        Ok(form) => form,
        Err(refused) => return refused.into_response(),
    };
    if !form
        .field("token")
        .is_some_and(|t| same_secret(t.trim(), token))
    {
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

/// Clears the sign-in cookie. The form holds nothing but its token.
pub(in crate::console) async fn logout(
    Extension(Base(base)): Extension<Base>,
    _form: CheckedForm,
) -> Response {
    let mut res = Redirect::to(&format!("{base}/login")).into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(&base, None));
    res
}
