//! [`EmailConfig`]: the email transport from environment variables or TOML.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{EmailTransport, FileTransport, HttpTransport};
use crate::config::{self, ConfigError, Secret};

/// The email transport's settings, read from environment variables or a TOML `[email]` table;
/// [`transport`](Self::transport) checks them and builds the transport.
///
/// | key | environment | meaning |
/// |-----|-------------|---------|
/// | `transport` | `OUTBOX_EMAIL_TRANSPORT` | `http` (default) or `file` |
/// | `base_url` | `OUTBOX_EMAIL_BASE_URL` | the provider's base URL (http) |
/// | `path` | `OUTBOX_EMAIL_PATH` | the path posted to, default `/emails` (http) |
/// | `api_key` | `OUTBOX_EMAIL_API_KEY` | the API key, sent as a bearer token (http) |
/// | `timeout` | `OUTBOX_EMAIL_TIMEOUT` | request timeout, such as `10s` or `500ms`, default `10s` (http); `timeout_secs` (`OUTBOX_EMAIL_TIMEOUT_SECS`), a number of seconds, is its old name and still read |
/// | `from` | `OUTBOX_EMAIL_FROM` | the default sender |
/// | `dir` | `OUTBOX_EMAIL_DIR` | the directory of email files (file) |
/// | `allow_insecure_http` | `OUTBOX_EMAIL_ALLOW_INSECURE_HTTP` | `true` to send the API key over plain `http://` to a host other than this machine; default `false` (http) |
///
/// The struct also derives `Deserialize`, to sit inside your own configuration type.
///
/// ```
/// use outbox_handlers::email::EmailConfig;
///
/// let config = EmailConfig::from_toml_str(r#"
///     [email]
///     base_url = "https://api.mail.example"
///     api_key = "sk_live_secret"
///     from = "bookings@stayhub.example"
///     timeout = "5s"
/// "#)?;
/// let transport = config.transport()?;
///
/// let err = EmailConfig::from_toml_str("[email]\nbase_url = 'foo'\napi_key = 'k'").unwrap()
///     .transport().unwrap_err();
/// assert_eq!(err.to_string(), "email.base_url: not a valid URL (got `foo`)");
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EmailConfig {
    /// `http` (default) or `file`.
    pub transport: Option<String>,
    /// The provider's base URL.
    pub base_url: Option<String>,
    /// The path emails are posted to.
    pub path: Option<String>,
    /// The API key.
    pub api_key: Option<Secret>,
    /// The default sender.
    pub from: Option<String>,
    /// The request timeout (key `timeout`, or its old name `timeout_secs`).
    #[serde(default, deserialize_with = "config::duration", alias = "timeout_secs")]
    pub timeout: Option<Duration>,
    /// The directory of the file transport.
    pub dir: Option<String>,
    /// Allow a plain `http://` base URL on a host other than this machine.
    pub allow_insecure_http: Option<bool>,
}

impl std::fmt::Debug for EmailConfig {
    /// The secrets print as `[redacted]`, and so does any user information in `base_url`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let EmailConfig {
            transport,
            base_url,
            path,
            api_key,
            from,
            timeout,
            dir,
            allow_insecure_http,
        } = self;
        f.debug_struct("EmailConfig")
            .field("transport", transport)
            .field("base_url", &crate::http::debug_base_url(base_url))
            .field("path", path)
            .field("api_key", api_key)
            .field("from", from)
            .field("timeout", timeout)
            .field("dir", dir)
            .field("allow_insecure_http", allow_insecure_http)
            .finish()
    }
}

config::section_constructors!(EmailConfig, section = "email", env_prefix = "OUTBOX_EMAIL_");

impl EmailConfig {
    /// Checks the settings and builds the transport they describe.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key that is missing or invalid.
    pub fn transport(&self) -> Result<Arc<dyn EmailTransport>, ConfigError> {
        match self.transport.as_deref().map(str::trim) {
            None | Some("http") => Ok(Arc::new(self.http_transport()?)),
            Some("file") => Ok(Arc::new(self.file_transport()?)),
            Some(other) => Err(ConfigError::invalid(
                "email.transport",
                "use `http` or `file`",
                other,
            )),
        }
    }

    /// Builds the HTTP transport, whatever `transport` says.
    ///
    /// # Errors
    ///
    /// As [`HttpTransportBuilder::build`](super::HttpTransportBuilder::build).
    pub fn http_transport(&self) -> Result<HttpTransport, ConfigError> {
        let mut b = HttpTransport::builder();
        if let Some(v) = &self.base_url {
            b = b.base_url(v);
        }
        if let Some(v) = &self.path {
            b = b.path(v);
        }
        if let Some(v) = &self.api_key {
            b = b.api_key(v.clone());
        }
        if let Some(v) = &self.from {
            b = b.from(v);
        }
        if let Some(timeout) = self.timeout {
            b = b.timeout(timeout);
        }
        if let Some(allow) = self.allow_insecure_http {
            b = b.allow_insecure_http(allow);
        }
        b.build()
    }

    /// Builds the file transport, whatever `transport` says.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Missing`] without `dir`, and as [`FileTransport::new`].
    pub fn file_transport(&self) -> Result<FileTransport, ConfigError> {
        let dir = self.dir.as_deref().ok_or_else(|| {
            ConfigError::missing(
                "email.dir",
                "set OUTBOX_EMAIL_DIR or `dir` in [email] for the file transport",
            )
        })?;
        let mut t = FileTransport::new(dir)?;
        if let Some(from) = &self.from {
            t = t.from(from);
        }
        Ok(t)
    }

    /// The configured timeout, if any, checked.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for `email.timeout` unless it is above 0 and at most 1 hour.
    pub fn timeout(&self) -> Result<Option<Duration>, ConfigError> {
        self.timeout
            .map(|t| crate::http::check_timeout("email.timeout", t))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn env_builds_an_http_transport() {
        let c = EmailConfig::from_lookup(
            "OUTBOX_EMAIL_",
            lookup(&[
                ("OUTBOX_EMAIL_BASE_URL", "https://api.mail.example"),
                ("OUTBOX_EMAIL_API_KEY", "sk_1"),
                ("OUTBOX_EMAIL_TIMEOUT", "2500ms"),
                ("OUTBOX_EMAIL_FROM", "a@b"),
            ]),
        )
        .unwrap();
        let t = c.http_transport().unwrap();
        assert_eq!(t.timeout(), Duration::from_millis(2500));
        assert_eq!(t.default_from(), Some("a@b"));
        assert!(!format!("{c:?}").contains("sk_1"));
    }

    #[test]
    fn errors_name_the_key() {
        let c =
            EmailConfig::from_lookup("X_", lookup(&[("X_BASE_URL", "foo"), ("X_API_KEY", "k")]))
                .unwrap();
        assert_eq!(
            c.transport().unwrap_err().to_string(),
            "email.base_url: not a valid URL (got `foo`)"
        );
        let c = EmailConfig::from_lookup("X_", lookup(&[("X_BASE_URL", "https://x")])).unwrap();
        assert_eq!(c.transport().unwrap_err().key(), Some("email.api_key"));
        let c = EmailConfig::from_lookup(
            "X_",
            lookup(&[
                ("X_BASE_URL", "https://x"),
                ("X_API_KEY", "k"),
                ("X_TIMEOUT", "0s"),
            ]),
        )
        .unwrap();
        assert_eq!(c.transport().unwrap_err().key(), Some("email.timeout"));
        let e = EmailConfig::from_lookup("X_", lookup(&[("X_TIMEOUT_SECS", "soon")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.timeout_secs: `soon` is not a duration (expected number at 0); write e.g. 500ms, \
             30s, 5m, 12h or 7d"
        );
        let c = EmailConfig::from_lookup("X_", lookup(&[("X_TRANSPORT", "pigeon")])).unwrap();
        assert_eq!(
            c.transport().unwrap_err().to_string(),
            "email.transport: use `http` or `file` (got `pigeon`)"
        );
        let c = EmailConfig::from_lookup("X_", lookup(&[("X_TRANSPORT", "file")])).unwrap();
        assert_eq!(c.transport().unwrap_err().key(), Some("email.dir"));
    }

    #[test]
    fn plain_http_to_another_host_needs_allow_insecure_http() {
        let c = EmailConfig::from_lookup(
            "X_",
            lookup(&[("X_BASE_URL", "http://mail.internal"), ("X_API_KEY", "k")]),
        )
        .unwrap();
        assert_eq!(c.transport().unwrap_err().key(), Some("email.base_url"));
        let c = EmailConfig::from_lookup(
            "X_",
            lookup(&[
                ("X_BASE_URL", "http://mail.internal"),
                ("X_API_KEY", "k"),
                ("X_ALLOW_INSECURE_HTTP", "true"),
            ]),
        )
        .unwrap();
        c.transport().unwrap();
        let c = EmailConfig::from_toml_str(
            "[email]\nbase_url = 'http://mail.internal'\napi_key = 'k'\nallow_insecure_http = true",
        )
        .unwrap();
        c.transport().unwrap();
    }

    #[test]
    fn toml_unknown_keys_and_types_are_refused() {
        let e = EmailConfig::from_toml_str("[email]\nbase_ulr = 'x'").unwrap_err();
        assert_eq!(e.key(), Some("email.base_ulr"));
        let e = EmailConfig::from_toml_str("[email]\ntimeout = true").unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.timeout: invalid type: boolean `true`, expected a duration such as \"500ms\", \
             \"10s\", \"5m\" or \"7d\""
        );
        let c = EmailConfig::from_toml_str("[email]\ntimeout_secs = 2.5").unwrap();
        assert_eq!(c.timeout, Some(Duration::from_millis(2500)));
        let e = EmailConfig::from_toml_str("[search]\n").unwrap_err();
        assert_eq!(e.key(), Some("email"));
    }

    #[test]
    fn serde_embedding_works() {
        #[derive(Deserialize)]
        struct App {
            email: EmailConfig,
        }
        let app: App = toml::from_str("[email]\ntransport = 'file'\ndir = 'outbox-mail'").unwrap();
        assert_eq!(app.email.transport.as_deref(), Some("file"));
    }
}
