//! The gate every request passes before a page sees it: the host (loopback only, without
//! credentials), the credentials (a token, its sign-in cookie, or basic auth), the origin of a
//! POST and the read-only mode; then the security headers on every answer.

use axum::extract::{OriginalUri, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;

use super::{Base, Console, Credentials, Shared};

/// The name of the sign-in cookie.
const COOKIE: &str = "outbox_console";

/// Compares secrets in time independent of where they differ. An empty secret never matches.
pub(super) fn same_secret(given: &str, expected: &str) -> bool {
    if expected.is_empty() || given.len() != expected.len() {
        return false;
    }
    given
        .bytes()
        .zip(expected.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

/// The value of the cookie `name`, if the request carries one.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Whether the request carries the configured credentials (always, when there are none).
fn authorized(c: &Console, headers: &HeaderMap) -> bool {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match &c.config.credentials {
        None => true,
        Some(Credentials::Token(token)) => {
            let bearer = auth
                .and_then(|a| a.strip_prefix("Bearer "))
                .is_some_and(|b| same_secret(b.trim(), token));
            bearer || cookie(headers, COOKIE).is_some_and(|v| same_secret(v, &c.session))
        }
        Some(Credentials::Basic { user, password }) => auth
            .and_then(|a| a.strip_prefix("Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok())
            .is_some_and(|pair| match pair.split_once(':') {
                // Both compared, whatever the first says.
                Some((u, p)) => same_secret(u, user) & same_secret(p, password),
                None => false,
            }),
    }
}

/// Whether the `Host` header names this machine's loopback.
fn loopback_host(headers: &HeaderMap) -> bool {
    headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(crate::diagnostics::is_loopback_host)
}

/// Whether a POST comes from a page of this console: its `Origin`, when the browser sends
/// one, names the same host, and it is not marked cross-site.
fn same_origin(headers: &HeaderMap) -> bool {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return false;
    }
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin.split_once("://").map(|(_, h)| h);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// A plain-text answer: refusals say in a sentence why.
pub(super) fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// Runs before every handler: finds the mount path, checks the host, the credentials, the
/// read-only mode and the origin of POSTs; then adds the security headers to the answer.
pub(super) async fn guard(State(c): State<Shared>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let original = req
        .extensions()
        .get::<OriginalUri>()
        .map_or_else(|| path.clone(), |o| o.0.path().to_owned());
    let base = match original.strip_suffix(path.as_str()) {
        Some(b) => b,
        None if path == "/" => original.as_str(),
        None => "",
    };
    let base = base.trim_end_matches('/').to_owned();

    let mut res = match check(&c, &req, &path, &base) {
        Some(refusal) => refusal,
        None => {
            req.extensions_mut().insert(Base(base));
            next.run(req).await
        }
    };
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it a browser sends `Origin: null` with the console's own
    // forms, which the origin check would then refuse.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

/// The refusal for a request that may not go on, if any.
fn check(c: &Console, req: &Request, path: &str, base: &str) -> Option<Response> {
    let headers = req.headers();
    let has_credentials = c.config.credentials.is_some();
    if !has_credentials && !c.config.behind_auth && !loopback_host(headers) {
        return Some(plain(
            StatusCode::FORBIDDEN,
            "This console has no credentials configured, so it answers only on a loopback \
             address (localhost, 127.0.0.1, [::1]). Configure a token or basic auth to serve it \
             elsewhere.",
        ));
    }
    let public = path.starts_with("/assets/")
        || (matches!(c.config.credentials, Some(Credentials::Token(_)))
            && (path == "/login" || path == "/logout"));
    if !public && !authorized(c, headers) {
        return Some(match c.config.credentials {
            Some(Credentials::Basic { .. }) => {
                let mut r = plain(
                    StatusCode::UNAUTHORIZED,
                    "Sign in to use the outbox console.",
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(r#"Basic realm="outbox console", charset="UTF-8""#),
                );
                r
            }
            _ if req.method() == Method::GET => {
                Redirect::to(&format!("{base}/login")).into_response()
            }
            _ => plain(
                StatusCode::UNAUTHORIZED,
                "Sign in to use the outbox console.",
            ),
        });
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        if !same_origin(headers) {
            return Some(plain(
                StatusCode::FORBIDDEN,
                "Refused: this request did not come from a page of this console.",
            ));
        }
        if c.config.read_only && path != "/login" && path != "/logout" {
            return Some(plain(
                StatusCode::FORBIDDEN,
                "Refused: this console is read-only.",
            ));
        }
    }
    None
}

/// The sign-in cookie, set or cleared.
pub(super) fn session_cookie(base: &str, value: Option<&str>) -> HeaderValue {
    let path = if base.is_empty() { "/" } else { base };
    let v = match value {
        Some(v) => format!("{COOKIE}={v}; Path={path}; HttpOnly; SameSite=Strict"),
        None => format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0"),
    };
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:1",
            "127.1.2.3",
            "[::1]:80",
            "[::1]",
        ] {
            assert!(loopback_host(&headers(&[("host", ok)])), "{ok}");
        }
        for bad in [
            "example.com",
            "10.0.0.1:80",
            "localhost.evil.com",
            "[::2]:80",
            "",
        ] {
            assert!(!loopback_host(&headers(&[("host", bad)])), "{bad}");
        }
        assert!(!loopback_host(&HeaderMap::new()));
    }

    #[test]
    fn origins() {
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])));
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "null")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("sec-fetch-site", "cross-site")
        ])));
    }

    #[test]
    fn secrets() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abd", "abc"));
        assert!(!same_secret("ab", "abc"));
        assert!(!same_secret("", ""));
    }

    #[test]
    fn cookies() {
        let h = headers(&[("cookie", "a=1; outbox_console=xyz; b=2")]);
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
    }
}
