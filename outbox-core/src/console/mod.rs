//! An operator's console in the browser: the queue's numbers per topic, the dead letters
//! (look, retry, discard), one message at a time, the live workers, and the event log (the
//! retained topics and their delivered events, read only).
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

mod form;
mod guard;
mod html;
mod pages;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
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
/// changes allowed, the overview refreshing every 5 seconds, 50 rows a page.
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

    /// Rows per page of the dead letters and of a topic's event log (1 to 500).
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
    /// Embedded in every form; a POST whose form lacks it is refused (see
    /// [`CheckedForm`](form::CheckedForm)).
    csrf: String,
    /// The value of the sign-in cookie (token credentials only).
    session: String,
}

type Shared = Arc<Console>;

/// The path the console is mounted at, found per request (`""` at the root).
#[derive(Clone, Debug)]
struct Base(String);

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
    // Every POST handler takes a `CheckedForm`, which refuses a form without this router's
    // token before the handler runs.
    Router::new()
        .route("/", get(pages::overview))
        .route("/dead", get(pages::dead_letters))
        .route("/dead/confirm", post(pages::confirm))
        .route("/dead/apply", post(pages::apply))
        .route("/pauses/confirm", post(pages::confirm_pause))
        .route("/pauses/apply", post(pages::apply_pause))
        .route("/messages/{id}", get(pages::message))
        .route("/workers", get(pages::workers))
        .route("/events", get(pages::event_log))
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
        .layer(middleware::from_fn_with_state(shared.clone(), guard::guard))
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
