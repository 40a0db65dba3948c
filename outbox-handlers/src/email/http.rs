//! [`HttpTransport`]: an email provider's HTTP API.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use outbox::HandlerError;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::StatusCode;

use super::{Email, EmailTransport};
use crate::config::{ConfigError, Secret};
use crate::http::{request_failure, status_failure};

const SERVICE: &str = "email provider";
const DEFAULT_PATH: &str = "/emails";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends emails through a provider's HTTP API: `POST {base_url}{path}` with a JSON body,
/// `Authorization: Bearer <api key>` and `Idempotency-Key: <key>`.
///
/// The body:
///
/// ```json
/// {"from": "Stayhub <bookings@stayhub.example>", "to": ["guest@example.com"],
///  "subject": "Your booking", "text": "...", "html": "..."}
/// ```
///
/// (`html` is left out when the email has none.) The API key is never logged, never part of an
/// error, and `Debug` prints `[redacted]` in its place.
///
/// The key is only sent over `https://`, or plain `http://` to this machine (a loopback address
/// or `localhost`, where the traffic never leaves the host): any other `http://` base URL is
/// refused by [`build`](HttpTransportBuilder::build) unless
/// [`allow_insecure_http(true)`](HttpTransportBuilder::allow_insecure_http) says the network in
/// between is trusted.
///
/// ```
/// use outbox_handlers::email::HttpTransport;
/// use std::time::Duration;
///
/// let transport = HttpTransport::builder()
///     .base_url("https://api.mail.example")
///     .api_key("sk_live_secret")
///     .from("bookings@stayhub.example")
///     .timeout(Duration::from_secs(5))
///     .build()?;
/// assert_eq!(transport.url().as_str(), "https://api.mail.example/emails");
/// assert!(!format!("{transport:?}").contains("sk_live_secret"));
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    url: reqwest::Url,
    api_key: Secret,
    authorization: HeaderValue,
    from: Option<String>,
    timeout: Duration,
}

impl HttpTransport {
    /// Starts building a transport.
    pub fn builder() -> HttpTransportBuilder {
        HttpTransportBuilder::default()
    }

    /// The URL emails are posted to.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// The default sender.
    pub fn default_from(&self) -> Option<&str> {
        self.from.as_deref()
    }

    /// The timeout of one request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransport")
            .field("url", &self.url.as_str())
            .field("api_key", &self.api_key)
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[async_trait]
impl EmailTransport for HttpTransport {
    async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError> {
        let from = email
            .from
            .as_deref()
            .or(self.from.as_deref())
            .ok_or_else(|| {
                HandlerError::permanent(
                "the email has no sender: set Email::from, or the transport's `from` (email.from)",
            )
            })?;
        let key = HeaderValue::from_str(idempotency_key).map_err(|_| {
            HandlerError::permanent(format!(
                "the idempotency key `{}` cannot be sent as an HTTP header; use printable ASCII keys",
                idempotency_key.escape_debug()
            ))
        })?;
        let mut body = serde_json::json!({
            "from": from,
            "to": email.to,
            "subject": email.subject,
            "text": email.text,
        });
        if let Some(html) = &email.html {
            body["html"] = serde_json::Value::String(html.clone());
        }
        let secrets = [self.api_key.expose()];
        let response = self
            .client
            .post(self.url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header("Idempotency-Key", key)
            .timeout(self.timeout)
            .json(&body)
            .send()
            .await
            .map_err(|e| request_failure(SERVICE, e, self.timeout, &secrets))?;
        let status = response.status();
        if status.is_success() {
            tracing::debug!(
                idempotency_key,
                status = status.as_u16(),
                "email accepted by the provider"
            );
            return Ok(());
        }
        if status == StatusCode::CONFLICT {
            tracing::debug!(
                idempotency_key,
                "the provider already has this idempotency key; the email counts as sent"
            );
            return Ok(());
        }
        Err(status_failure(SERVICE, response, &secrets).await)
    }
}

/// Builds an [`HttpTransport`]; [`build`](Self::build) checks the settings.
///
/// Settings and their configuration keys: `base_url` (required), `api_key` (required), `from`,
/// `path` (default `/emails`), `timeout` (default 10 s), and an optional
/// `reqwest::Client` of your own.
#[derive(Default)]
pub struct HttpTransportBuilder {
    base_url: Option<String>,
    path: Option<String>,
    api_key: Option<Secret>,
    from: Option<String>,
    timeout: Option<Duration>,
    allow_insecure_http: bool,
    client: Option<reqwest::Client>,
}

impl fmt::Debug for HttpTransportBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpTransportBuilder")
            .field("base_url", &crate::http::debug_base_url(&self.base_url))
            .field("path", &self.path)
            .field("api_key", &self.api_key)
            .field("from", &self.from)
            .field("timeout", &self.timeout)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .finish_non_exhaustive()
    }
}

impl HttpTransportBuilder {
    /// The provider's base URL, e.g. `https://api.mail.example` (required).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// The path emails are posted to, under the base URL (default `/emails`).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = Some(path.into());
        self
    }

    /// The API key, sent as `Authorization: Bearer <key>` (required).
    pub fn api_key(mut self, key: impl Into<Secret>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The default sender, for emails that do not set one.
    pub fn from(mut self, from: impl Into<String>) -> Self {
        self.from = Some(from.into());
        self
    }

    /// The timeout of one request, connection included (default 10 s). Keep it below the
    /// worker's handler timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Allows a plain `http://` base URL on a host other than this machine, over which the API
    /// key travels unencrypted (default: refused; `http://` to a loopback address or
    /// `localhost` is always allowed). Configuration key `allow_insecure_http`.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Uses this client (connection pool, proxy, TLS settings) instead of a new one. The
    /// transport's timeout is still applied to each request.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Checks the settings and builds the transport.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key (`email.base_url`, `email.api_key`, `email.path`,
    /// `email.from`, `email.timeout`) when a setting is missing or invalid, and for
    /// `email.base_url` when it is plain `http://` to another host without
    /// [`allow_insecure_http`](Self::allow_insecure_http).
    pub fn build(self) -> Result<HttpTransport, ConfigError> {
        let raw = self.base_url.ok_or_else(|| {
            ConfigError::missing(
                "email.base_url",
                "set HttpTransportBuilder::base_url, OUTBOX_EMAIL_BASE_URL or `base_url` in [email]",
            )
        })?;
        let base = crate::http::base_url("email.base_url", &raw)?;
        let path = self.path.unwrap_or_else(|| DEFAULT_PATH.to_string());
        if !path.starts_with('/') || path.contains(['?', '#']) || path.contains(char::is_whitespace)
        {
            return Err(ConfigError::invalid(
                "email.path",
                "use a path that starts with `/`, without query, fragment or spaces",
                &path,
            ));
        }
        let url = join(&base, &path);
        let api_key = self
            .api_key
            .filter(|k| !k.expose().is_empty())
            .ok_or_else(|| {
                ConfigError::missing(
                "email.api_key",
                "set HttpTransportBuilder::api_key, OUTBOX_EMAIL_API_KEY or `api_key` in [email]",
            )
            })?;
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", api_key.expose()))
            .ok()
            .filter(|_| !api_key.expose().contains(char::is_whitespace))
            .ok_or_else(|| {
                ConfigError::rejected(
                    "email.api_key",
                    "the key has spaces or characters an HTTP header cannot carry",
                )
            })?;
        authorization.set_sensitive(true);
        crate::http::check_credentials_over_http(
            "email",
            &base,
            "API key",
            self.allow_insecure_http,
        )?;
        if let Some(from) = &self.from {
            if from.trim().is_empty() || !from.contains('@') || from.contains(['\r', '\n']) {
                return Err(ConfigError::invalid(
                    "email.from",
                    "not an email address (`name@host` or `Name <name@host>`)",
                    from,
                ));
            }
        }
        let timeout =
            crate::http::check_timeout("email.timeout", self.timeout.unwrap_or(DEFAULT_TIMEOUT))?;
        let client = match self.client {
            Some(c) => c,
            None => crate::http::client("email")?,
        };
        Ok(HttpTransport {
            client,
            url,
            api_key,
            authorization,
            from: self.from,
            timeout,
        })
    }
}

/// `base` with `path` appended to its own path.
fn join(base: &reqwest::Url, path: &str) -> reqwest::Url {
    let prefix = base.path().trim_end_matches('/');
    let mut url = base.clone();
    url.set_path(&format!("{prefix}{path}"));
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> HttpTransportBuilder {
        HttpTransport::builder()
            .base_url("http://127.0.0.1:9")
            .api_key("sk_test_123")
    }

    #[test]
    fn the_url_joins_base_and_path() {
        let t = builder().base_url("https://api.x/v1/").build().unwrap();
        assert_eq!(t.url().as_str(), "https://api.x/v1/emails");
        let t = builder()
            .base_url("https://api.x/v1")
            .path("/send")
            .build()
            .unwrap();
        assert_eq!(t.url().as_str(), "https://api.x/v1/send");
    }

    #[test]
    fn settings_are_checked_and_errors_name_the_key() {
        let e = HttpTransport::builder().api_key("k").build().unwrap_err();
        assert_eq!(e.key(), Some("email.base_url"));
        let e = HttpTransport::builder()
            .base_url("https://x")
            .build()
            .unwrap_err();
        assert_eq!(e.key(), Some("email.api_key"));
        let e = builder().api_key("two words").build().unwrap_err();
        assert_eq!(e.key(), Some("email.api_key"));
        assert!(!e.to_string().contains("two words"));
        let e = builder().from("nobody").build().unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.from: not an email address (`name@host` or `Name <name@host>`) (got `nobody`)"
        );
        let e = builder().path("emails").build().unwrap_err();
        assert_eq!(e.key(), Some("email.path"));
        let e = builder().timeout(Duration::ZERO).build().unwrap_err();
        assert_eq!(e.key(), Some("email.timeout"));
    }

    #[test]
    fn the_key_goes_over_plain_http_only_to_this_machine_unless_allowed() {
        let e = builder()
            .base_url("http://mail.internal")
            .build()
            .unwrap_err();
        assert_eq!(e.key(), Some("email.base_url"));
        assert!(e.to_string().contains("allow_insecure_http"), "{e}");
        assert!(!e.to_string().contains("sk_test_123"), "{e}");
        builder()
            .base_url("http://mail.internal")
            .allow_insecure_http(true)
            .build()
            .unwrap();
        builder().base_url("http://localhost:8025").build().unwrap();
        builder().base_url("https://mail.internal").build().unwrap();
    }

    #[test]
    fn debug_never_shows_the_key() {
        let b = builder();
        assert!(!format!("{b:?}").contains("sk_test_123"));
        let t = b.build().unwrap();
        let dbg = format!("{t:?}");
        assert!(!dbg.contains("sk_test_123"), "{dbg}");
        assert!(dbg.contains("[redacted]"), "{dbg}");
    }
}
