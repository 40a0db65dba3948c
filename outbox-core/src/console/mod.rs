//! An operator's console in the browser: the queue's numbers per topic, the dead letters
//! (look, retry, discard), one message at a time, and the live workers.
//!
//! Server-rendered HTML with its stylesheet and a few lines of script embedded: no build step,
//! nothing fetched from elsewhere, so it works offline. Mount [`router`] in your own axum app,
//! or run `outbox console --addr 127.0.0.1:8080` (features `cli` and `console`).
//!
//! ```no_run
//! use outbox::console::{self, ConsoleConfig};
//!
//! # async fn run(pool: outbox::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let config = ConsoleConfig::new().token(std::env::var("OUTBOX_CONSOLE_TOKEN")?);
//! let app = axum::Router::new().nest("/outbox", console::router(&pool, config));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```
//!
//! # Safe by default
//!
//! - Without credentials ([`ConsoleConfig::token`] or [`ConsoleConfig::basic`]) the console
//!   answers only requests addressed to a loopback name (`localhost`, `127.0.0.1`, `[::1]`),
//!   which also defeats DNS rebinding, and [`ConsoleConfig::check_addr`] (which
//!   `outbox console` calls) refuses to bind anywhere else. An application that authenticates
//!   every request itself says so with [`ConsoleConfig::behind_auth`].
//! - Every request that changes something is a `POST` carrying a random token of this router
//!   (embedded in its forms); a `POST` without it, or from another origin, is refused.
//! - [`ConsoleConfig::read_only`] shows no buttons and refuses every change.
//! - Topics, payloads and errors are HTML-escaped, and a Content-Security-Policy allows no
//!   inline script: a payload holding `<script>` shows as text.
//! - Pages are never cached and never framed.

mod html;
mod pages;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{OriginalUri, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use base64::Engine as _;
use rand::Rng as _;

use crate::error::{Error, Result};
use crate::store::Store;

/// How a person proves they may use the console.
#[derive(Clone)]
#[non_exhaustive]
pub enum Credentials {
    /// A secret token: sent as `Authorization: Bearer <token>` by scripts, or typed once into
    /// the console's sign-in page, which then keeps the browser signed in with a cookie
    /// (`HttpOnly`, `SameSite=Strict`) that lasts as long as the process.
    Token(String),
    /// HTTP basic authentication: the browser asks for a user name and a password. Use it
    /// behind TLS (a reverse proxy) anywhere but on loopback.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Token(_) => f.write_str("Token(<redacted>)"),
            Credentials::Basic { user, .. } => f
                .debug_struct("Basic")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

/// How the console behaves: credentials, read-only mode, refresh, page size.
///
/// The default is safe for loopback: no credentials (so only loopback requests are answered),
/// changes allowed, the overview refreshing every 5 seconds, 50 dead letters a page.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    credentials: Option<Credentials>,
    behind_auth: bool,
    read_only: bool,
    refresh: Option<Duration>,
    page_size: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            credentials: None,
            behind_auth: false,
            read_only: false,
            refresh: Some(Duration::from_secs(5)),
            page_size: 50,
        }
    }
}

impl ConsoleConfig {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Requires a token (see [`Credentials::Token`]).
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::Token(token.into()));
        self
    }

    /// Requires HTTP basic authentication (see [`Credentials::Basic`]).
    #[must_use]
    pub fn basic(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials::Basic {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Sets or clears the credentials.
    #[must_use]
    pub fn credentials(mut self, credentials: Option<Credentials>) -> Self {
        self.credentials = credentials;
        self
    }

    /// Says that the application in front authenticates every request that reaches the
    /// console, so that the console, having no credentials of its own, answers any host name.
    #[must_use]
    pub fn behind_auth(mut self, yes: bool) -> Self {
        self.behind_auth = yes;
        self
    }

    /// Read-only: no buttons, and every change refused.
    #[must_use]
    pub fn read_only(mut self, yes: bool) -> Self {
        self.read_only = yes;
        self
    }

    /// How often the overview reloads itself (`None`: never). Whole seconds, at least one.
    #[must_use]
    pub fn refresh(mut self, every: Option<Duration>) -> Self {
        self.refresh = every;
        self
    }

    /// Dead letters per page (1 to 500).
    #[must_use]
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n.clamp(1, 500);
        self
    }

    /// Whether the console is read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Checks that serving this console on `addr` is safe: a non-loopback address needs
    /// credentials (or [`behind_auth`](Self::behind_auth)), and credentials must not be empty.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] saying what is wrong.
    pub fn check_addr(&self, addr: SocketAddr) -> Result<()> {
        match &self.credentials {
            Some(Credentials::Token(t)) if t.trim().is_empty() => {
                return Err(Error::Config("the console token is empty".into()));
            }
            Some(Credentials::Basic { user, password })
                if user.is_empty() || password.is_empty() =>
            {
                return Err(Error::Config(
                    "the console's basic-auth user and password must both be set".into(),
                ));
            }
            _ => {}
        }
        if !addr.ip().is_loopback() && self.credentials.is_none() && !self.behind_auth {
            return Err(Error::Config(format!(
                "refusing to serve the console on {addr}: it is not a loopback address and no \
                 credentials are configured; set a token or basic auth, or bind 127.0.0.1"
            )));
        }
        Ok(())
    }
}

/// What every handler shares.
struct Console {
    store: Store,
    config: ConsoleConfig,
    /// Embedded in every form; a POST without it is refused.
    csrf: String,
    /// The value of the sign-in cookie (token credentials only).
    session: String,
}

type Shared = Arc<Console>;

/// The path the console is mounted at, found per request (`""` at the root).
#[derive(Clone, Debug)]
struct Base(String);

const COOKIE: &str = "outbox_console";

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// The console as an axum router, to serve alone or to `nest` under a path of your app.
///
/// Links follow the path it is mounted at. See the [module](self) for what it guards.
pub fn router(store: impl Into<Store>, config: ConsoleConfig) -> Router {
    let shared: Shared = Arc::new(Console {
        store: store.into(),
        config,
        csrf: random_hex(),
        session: random_hex(),
    });
    Router::new()
        .route("/", get(pages::overview))
        .route("/dead", get(pages::dead_letters))
        .route("/dead/confirm", post(pages::confirm))
        .route("/dead/apply", post(pages::apply))
        .route("/messages/{id}", get(pages::message))
        .route("/workers", get(pages::workers))
        .route("/login", get(pages::login_page).post(pages::login))
        .route("/logout", post(pages::logout))
        .route(
            "/assets/console.css",
            get(|| asset("text/css; charset=utf-8", CSS)),
        )
        .route(
            "/assets/console.js",
            get(|| asset("text/javascript; charset=utf-8", JS)),
        )
        .route(
            "/assets/favicon.svg",
            get(|| asset("image/svg+xml", FAVICON)),
        )
        .fallback(pages::not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        body,
    )
        .into_response()
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares secrets in time independent of where they differ. An empty secret never matches.
fn same_secret(given: &str, expected: &str) -> bool {
    if expected.is_empty() || given.len() != expected.len() {
        return false;
    }
    given
        .bytes()
        .zip(expected.bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
        == 0
}

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
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
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

fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{text}\n"),
    )
        .into_response()
}

/// Runs before every handler: finds the mount path, checks the host, the credentials, the
/// read-only mode and the origin of POSTs; then adds the security headers to the answer.
async fn guard(State(c): State<Shared>, mut req: Request, next: Next) -> Response {
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

/// Parses an `application/x-www-form-urlencoded` body, keeping repeated names.
fn form(body: &[u8]) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

/// The first value of `name` in a parsed form.
fn field<'f>(form: &'f [(String, String)], name: &str) -> Option<&'f str> {
    form.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Whether a parsed form carries this console's CSRF token.
fn csrf_ok(c: &Console, form: &[(String, String)]) -> bool {
    field(form, "csrf").is_some_and(|t| same_secret(t, &c.csrf))
}

fn csrf_refused() -> Response {
    plain(
        StatusCode::FORBIDDEN,
        "Refused: the form's security token is missing or stale. Reload the page and try again.",
    )
}

/// The sign-in cookie, set or cleared.
fn session_cookie(base: &str, value: Option<&str>) -> HeaderValue {
    let path = if base.is_empty() { "/" } else { base };
    let v = match value {
        Some(v) => format!("{COOKIE}={v}; Path={path}; HttpOnly; SameSite=Strict"),
        None => format!("{COOKIE}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0"),
    };
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// A body read into memory, at most 1 MiB.
async fn body_bytes(body: Body) -> Vec<u8> {
    axum::body::to_bytes(body, 1 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default()
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
    fn addresses() {
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(ConsoleConfig::new().check_addr(lo).is_ok());
        assert!(ConsoleConfig::new().check_addr(any).is_err());
        assert!(ConsoleConfig::new().token("s3cret").check_addr(any).is_ok());
        assert!(ConsoleConfig::new().token(" ").check_addr(lo).is_err());
        assert!(ConsoleConfig::new().basic("u", "").check_addr(any).is_err());
        assert!(ConsoleConfig::new().basic("u", "p").check_addr(any).is_ok());
        assert!(ConsoleConfig::new()
            .behind_auth(true)
            .check_addr(any)
            .is_ok());
    }

    #[test]
    fn cookies_and_forms() {
        let h = headers(&[("cookie", "a=1; outbox_console=xyz; b=2")]);
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        let f = form(b"id=1&id=2&csrf=t&topic=a%26b");
        assert_eq!(field(&f, "topic"), Some("a&b"));
        assert_eq!(f.iter().filter(|(k, _)| k == "id").count(), 2);
    }
}
