//! The form of a POST, read only together with the check of its security token.
//!
//! Every POST route of the console takes a [`CheckedForm`]: it reads the
//! `application/x-www-form-urlencoded` body and refuses the request unless the form's `csrf`
//! field holds this console's token. The form has no other constructor and the console has no
//! other body reader, so a handler gets what a form holds through this check or not at all.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::guard::{plain, same_secret};
use super::Shared;

/// The largest body read; a longer one, or one that cannot be read, counts as empty.
const MAX_BODY: usize = 1 << 20;

/// A POST's form, whose `csrf` field held this console's token.
///
/// Take it as a handler's last argument; the request is refused with [`FormRefused`] before
/// the handler runs when the token is missing or wrong.
pub(super) struct CheckedForm {
    /// Name and value, in the order sent, repeated names kept.
    pairs: Vec<(String, String)>,
}

impl CheckedForm {
    /// Parses `body` and keeps it if its token is `csrf`.
    fn check(body: &[u8], csrf: &str) -> Result<Self, FormRefused> {
        let form = Self { pairs: parse(body) };
        if form.field("csrf").is_some_and(|t| same_secret(t, csrf)) {
            Ok(form)
        } else {
            Err(FormRefused)
        }
    }

    /// The first value of `name`.
    pub(super) fn field(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every value of `name`, in the order sent (ticked checkboxes share their name).
    pub(super) fn values<'f>(&'f self, name: &'f str) -> impl Iterator<Item = &'f str> + 'f {
        self.pairs
            .iter()
            .filter(move |(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A form as if checked, for the tests of what handlers read from one.
    #[cfg(test)]
    pub(super) fn unchecked(pairs: &[(&str, &str)]) -> Self {
        Self {
            pairs: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }
}

/// Parses an `application/x-www-form-urlencoded` body, keeping repeated names; a malformed
/// one counts as empty.
fn parse(body: &[u8]) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

impl FromRequest<Shared> for CheckedForm {
    type Rejection = FormRefused;

    async fn from_request(req: Request, c: &Shared) -> Result<Self, Self::Rejection> {
        let body = axum::body::to_bytes(req.into_body(), MAX_BODY)
            .await
            .unwrap_or_else(|_| Bytes::new());
        Self::check(&body, &c.csrf)
    }
}

/// The refusal of a POST whose form lacks this console's token, or holds a stale one: 403,
/// asking to reload the page.
#[derive(Debug)]
pub(super) struct FormRefused;

impl IntoResponse for FormRefused {
    fn into_response(self) -> Response {
        plain(
            StatusCode::FORBIDDEN,
            "Refused: the form's security token is missing or stale. Reload the page and try again.",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let f = CheckedForm {
            pairs: parse(b"id=1&id=2&csrf=t&topic=a%26b"),
        };
        assert_eq!(f.field("topic"), Some("a&b"));
        assert_eq!(f.values("id").count(), 2);
    }

    #[test]
    fn only_a_form_with_the_token_is_kept() {
        let token = "0123abcd";
        assert!(CheckedForm::check(b"csrf=0123abcd&op=retry:all", token).is_ok());
        for body in [
            &b"op=retry:all"[..],
            b"csrf=&op=retry:all",
            b"csrf=0000&op=retry:all",
            b"",
        ] {
            assert!(CheckedForm::check(body, token).is_err(), "{body:?}");
        }
    }
}
