//! [`SearchConfig`]: the search client from environment variables or TOML.

use std::time::Duration;

use serde::Deserialize;

use super::SearchClient;
use crate::config::{self, ConfigError, Secret};

/// The search client's settings, read from environment variables or a TOML `[search]` table;
/// [`client`](Self::client) checks them and builds the client.
///
/// | key | environment | meaning |
/// |-----|-------------|---------|
/// | `base_url` | `OUTBOX_SEARCH_BASE_URL` | the index server's base URL (required) |
/// | `index` | `OUTBOX_SEARCH_INDEX` | the default index |
/// | `api_key` | `OUTBOX_SEARCH_API_KEY` | an API key (`Authorization: ApiKey ...`) |
/// | `username` | `OUTBOX_SEARCH_USERNAME` | basic-auth user |
/// | `password` | `OUTBOX_SEARCH_PASSWORD` | basic-auth password |
/// | `timeout` | `OUTBOX_SEARCH_TIMEOUT` | request timeout, such as `10s` or `500ms`, default `10s`; `timeout_secs` (`OUTBOX_SEARCH_TIMEOUT_SECS`), a number of seconds, is its old name and still read |
/// | `allow_insecure_http` | `OUTBOX_SEARCH_ALLOW_INSECURE_HTTP` | `true` to send credentials over plain `http://` to a host other than this machine; default `false` |
///
/// ```
/// use outbox_handlers::search::SearchConfig;
///
/// let config = SearchConfig::from_toml_str(r#"
///     [search]
///     base_url = "http://127.0.0.1:9200"
///     index = "hotels"
///     timeout = "2500ms"
/// "#)?;
/// assert_eq!(config.client()?.index(), Some("hotels"));
///
/// let err = SearchConfig::from_toml_str("[search]\nbase_url = 'http://x'\nindex = 'Hotels'")?
///     .client().unwrap_err();
/// assert_eq!(err.key(), Some("search.index"));
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct SearchConfig {
    /// The index server's base URL.
    pub base_url: Option<String>,
    /// The default index.
    pub index: Option<String>,
    /// An API key.
    pub api_key: Option<Secret>,
    /// A basic-auth user.
    pub username: Option<String>,
    /// A basic-auth password.
    pub password: Option<Secret>,
    /// The request timeout (key `timeout`, or its old name `timeout_secs`).
    #[serde(default, deserialize_with = "config::duration", alias = "timeout_secs")]
    pub timeout: Option<Duration>,
    /// Allow credentials over a plain `http://` base URL on a host other than this machine.
    pub allow_insecure_http: Option<bool>,
}

impl std::fmt::Debug for SearchConfig {
    /// The secrets print as `[redacted]`, and so does any user information in `base_url`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SearchConfig {
            base_url,
            index,
            api_key,
            username,
            password,
            timeout,
            allow_insecure_http,
        } = self;
        f.debug_struct("SearchConfig")
            .field("base_url", &crate::http::debug_base_url(base_url))
            .field("index", index)
            .field("api_key", api_key)
            .field("username", username)
            .field("password", password)
            .field("timeout", timeout)
            .field("allow_insecure_http", allow_insecure_http)
            .finish()
    }
}

config::section_constructors!(
    SearchConfig,
    section = "search",
    env_prefix = "OUTBOX_SEARCH_"
);

impl SearchConfig {
    /// Checks the settings and builds the client.
    ///
    /// # Errors
    ///
    /// As [`SearchClientBuilder::build`](super::SearchClientBuilder::build).
    pub fn client(&self) -> Result<SearchClient, ConfigError> {
        let mut b = SearchClient::builder();
        if let Some(v) = &self.base_url {
            b = b.base_url(v);
        }
        if let Some(v) = &self.index {
            b = b.index(v);
        }
        if let Some(v) = &self.api_key {
            b = b.api_key(v.clone());
        }
        match (&self.username, &self.password) {
            (Some(u), Some(p)) => b = b.basic_auth(u, p.clone()),
            (Some(_), None) => return Err(ConfigError::missing(
                "search.password",
                "a username needs a password (OUTBOX_SEARCH_PASSWORD or `password` in [search])",
            )),
            (None, Some(_)) => return Err(ConfigError::missing(
                "search.username",
                "a password needs a username (OUTBOX_SEARCH_USERNAME or `username` in [search])",
            )),
            (None, None) => {}
        }
        if let Some(timeout) = self.timeout {
            b = b.timeout(timeout);
        }
        if let Some(allow) = self.allow_insecure_http {
            b = b.allow_insecure_http(allow);
        }
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_builds_a_client_and_errors_name_the_key() {
        let vars = [
            ("OUTBOX_SEARCH_BASE_URL", "http://127.0.0.1:9200"),
            ("OUTBOX_SEARCH_INDEX", "hotels"),
            ("OUTBOX_SEARCH_USERNAME", "indexer"),
            ("OUTBOX_SEARCH_PASSWORD", "pw-secret"),
        ];
        let c = SearchConfig::from_lookup("OUTBOX_SEARCH_", |n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_string())
        })
        .unwrap();
        assert!(!format!("{c:?}").contains("pw-secret"));
        let with_userinfo = SearchConfig::from_toml_str(
            "[search]\nbase_url = 'https://indexer:url-secret@search.example'",
        )
        .unwrap();
        let dbg = format!("{with_userinfo:?}");
        assert!(!dbg.contains("url-secret"), "{dbg}");
        assert!(dbg.contains("https://[redacted]@search.example"), "{dbg}");
        assert_eq!(c.client().unwrap().index(), Some("hotels"));

        let c =
            SearchConfig::from_lookup("S_", |n| (n == "S_USERNAME").then(|| "u".into())).unwrap();
        assert_eq!(c.client().unwrap_err().key(), Some("search.password"));
        let e = SearchConfig::from_toml_str("[search]\nbase_url = 'nope'")
            .unwrap()
            .client()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "search.base_url: not a valid URL (got `nope`)"
        );
        let e = SearchConfig::from_toml_str("[search]\nindx = 'x'").unwrap_err();
        assert_eq!(e.key(), Some("search.indx"));

        let remote = "[search]\nbase_url = 'http://search.internal:9200'\napi_key = 'ak-1'\n";
        let e = SearchConfig::from_toml_str(remote)
            .unwrap()
            .client()
            .unwrap_err();
        assert_eq!(e.key(), Some("search.base_url"));
        SearchConfig::from_toml_str(&format!("{remote}allow_insecure_http = true"))
            .unwrap()
            .client()
            .unwrap();
    }
}
