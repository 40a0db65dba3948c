//! [`SearchClient`]: the document API of an Elasticsearch/OpenSearch-compatible index.

use std::fmt;
use std::time::Duration;

use outbox::HandlerError;
use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::StatusCode;

use super::IndexOp;
use crate::config::{ConfigError, Secret};
use crate::http::{request_failure, status_failure};

const SERVICE: &str = "search index";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the index took an operation that succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// The document was written or deleted.
    Written,
    /// The index holds this version or a newer one (409): the operation was stale and dropped.
    Stale,
    /// A delete found no document (404).
    Missing,
}

#[derive(Clone)]
enum Auth {
    None,
    ApiKey(Secret, HeaderValue),
    /// The user, the password and `user:password` in base64, as the header carries it.
    Basic(String, Secret, Secret),
}

/// A client of an Elasticsearch- or OpenSearch-compatible document API, with optional API-key
/// (`Authorization: ApiKey <key>`) or basic authentication. Secrets are never logged, never in an
/// error, and `Debug` prints `[redacted]` in their place.
///
/// Credentials are only sent over `https://`, or plain `http://` to this machine (a loopback
/// address or `localhost`): with an API key or basic authentication, any other `http://` base
/// URL is refused by [`build`](SearchClientBuilder::build) unless
/// [`allow_insecure_http(true)`](SearchClientBuilder::allow_insecure_http). Without credentials
/// any `http://` URL is accepted.
///
/// ```
/// use outbox_handlers::search::SearchClient;
///
/// let client = SearchClient::builder()
///     .base_url("https://search.internal:9200")
///     .index("hotels")
///     .basic_auth("indexer", "hunter2")
///     .build()?;
/// assert!(!format!("{client:?}").contains("hunter2"));
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SearchClient {
    client: reqwest::Client,
    base: reqwest::Url,
    index: Option<String>,
    auth: Auth,
    timeout: Duration,
}

impl fmt::Debug for SearchClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none".to_string(),
            Auth::ApiKey(..) => "api key [redacted]".to_string(),
            Auth::Basic(user, ..) => format!("basic {user}:[redacted]"),
        };
        f.debug_struct("SearchClient")
            .field("base_url", &self.base.as_str())
            .field("index", &self.index)
            .field("auth", &auth)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl SearchClient {
    /// Starts building a client.
    pub fn builder() -> SearchClientBuilder {
        SearchClientBuilder::default()
    }

    /// The default index, if one was set.
    pub fn index(&self) -> Option<&str> {
        self.index.as_deref()
    }

    /// The timeout of one request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The URL of one document, with its external version.
    pub fn document_url(&self, index: &str, id: &str, version: u64) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(index).push("_doc").push(id);
        }
        url.query_pairs_mut()
            .append_pair("version", &version.to_string())
            .append_pair("version_type", "external");
        url
    }

    /// Applies one operation to `index`.
    ///
    /// # Errors
    ///
    /// A [`HandlerError`] whose kind follows the table in the [module docs](super): retry for
    /// 408, 429, 5xx, timeouts and connection errors (after `Retry-After` when given), permanent
    /// for other 4xx, an empty id, an id of `.` or `..` (which a URL would read as a path step),
    /// an invalid index name or a version above `i64::MAX`.
    ///
    /// # Cancellation safety
    ///
    /// Dropping the future may leave the operation applied or not; applying it again is safe.
    pub async fn apply(&self, index: &str, op: &IndexOp) -> Result<Applied, HandlerError> {
        check_id(op.id())?;
        if let Err(e) = check_index(index) {
            return Err(HandlerError::permanent(e.to_string()));
        }
        if i64::try_from(op.version()).is_err() {
            return Err(HandlerError::permanent(format!(
                "version {} is above the index's limit of {}",
                op.version(),
                i64::MAX
            )));
        }
        let url = self.document_url(index, op.id(), op.version());
        let request = match op {
            IndexOp::Upsert { document, .. } => self.client.put(url).json(document),
            IndexOp::Delete { .. } => self.client.delete(url),
        };
        let request = match &self.auth {
            Auth::None => request,
            Auth::ApiKey(_, header) => request.header(AUTHORIZATION, header.clone()),
            Auth::Basic(user, password, _) => request.basic_auth(user, Some(password.expose())),
        };
        let secrets = self.secrets();
        let response = request
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| request_failure(SERVICE, e, self.timeout, &secrets))?;
        let status = response.status();
        if status.is_success() {
            return Ok(Applied::Written);
        }
        if status == StatusCode::CONFLICT {
            tracing::debug!(
                index,
                id = op.id(),
                version = op.version(),
                "the index holds a newer version; the stale operation is dropped"
            );
            return Ok(Applied::Stale);
        }
        if status == StatusCode::NOT_FOUND && matches!(op, IndexOp::Delete { .. }) {
            return Ok(Applied::Missing);
        }
        Err(status_failure(SERVICE, response, &secrets).await)
    }

    fn secrets(&self) -> Vec<&str> {
        match &self.auth {
            Auth::None => Vec::new(),
            Auth::ApiKey(key, _) => vec![key.expose()],
            // The header's form too, for a service that echoes the request's headers.
            Auth::Basic(_, password, encoded) => vec![password.expose(), encoded.expose()],
        }
    }
}

/// Builds a [`SearchClient`]; [`build`](Self::build) checks the settings.
///
/// Settings and their configuration keys: `base_url` (required), `index` (the default index),
/// `api_key`, or `username` and `password`, `timeout` (default 10 s), and an
/// optional `reqwest::Client` of your own.
#[derive(Default)]
pub struct SearchClientBuilder {
    base_url: Option<String>,
    index: Option<String>,
    api_key: Option<Secret>,
    username: Option<String>,
    password: Option<Secret>,
    timeout: Option<Duration>,
    allow_insecure_http: bool,
    client: Option<reqwest::Client>,
}

impl fmt::Debug for SearchClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchClientBuilder")
            .field("base_url", &crate::http::debug_base_url(&self.base_url))
            .field("index", &self.index)
            .field("api_key", &self.api_key)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("timeout", &self.timeout)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .finish_non_exhaustive()
    }
}

impl SearchClientBuilder {
    /// The index's base URL, e.g. `http://127.0.0.1:9200` (required).
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// The default index.
    pub fn index(mut self, index: impl Into<String>) -> Self {
        self.index = Some(index.into());
        self
    }

    /// An API key, sent as `Authorization: ApiKey <key>`.
    pub fn api_key(mut self, key: impl Into<Secret>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Basic authentication.
    pub fn basic_auth(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// The timeout of one request, connection included (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Allows a plain `http://` base URL on a host other than this machine together with an API
    /// key or basic authentication, which then travel unencrypted (default: refused; `http://`
    /// to a loopback address or `localhost` is always allowed). Configuration key
    /// `allow_insecure_http`.
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Uses this client instead of a new one; the timeout is still applied to each request.
    pub fn client(mut self, client: reqwest::Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Checks the settings and builds the client.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key (`search.base_url`, `search.index`, `search.api_key`,
    /// `search.username`, `search.password`, `search.timeout`) when a setting is missing,
    /// invalid, or contradicts another, and for `search.base_url` when it is plain `http://` to
    /// another host with credentials but without [`allow_insecure_http`](Self::allow_insecure_http).
    pub fn build(self) -> Result<SearchClient, ConfigError> {
        let raw = self.base_url.ok_or_else(|| {
            ConfigError::missing(
                "search.base_url",
                "set SearchClientBuilder::base_url, OUTBOX_SEARCH_BASE_URL or `base_url` in [search]",
            )
        })?;
        let base = crate::http::base_url("search.base_url", &raw)?;
        if let Some(index) = &self.index {
            check_index(index)?;
        }
        let api_key = self.api_key.filter(|k| !k.expose().is_empty());
        let auth = match (api_key, self.username, self.password) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(ConfigError::rejected(
                    "search.api_key",
                    "set either api_key or username and password, not both",
                ))
            }
            (Some(key), None, None) => {
                let mut header = HeaderValue::from_str(&format!("ApiKey {}", key.expose()))
                    .ok()
                    .filter(|_| !key.expose().contains(char::is_whitespace))
                    .ok_or_else(|| {
                        ConfigError::rejected(
                            "search.api_key",
                            "the key has spaces or characters an HTTP header cannot carry",
                        )
                    })?;
                header.set_sensitive(true);
                Auth::ApiKey(key, header)
            }
            (None, Some(user), Some(password)) => {
                if user.is_empty() || user.contains(':') || user.contains(char::is_control) {
                    return Err(ConfigError::invalid(
                        "search.username",
                        "use a non-empty name without `:` or control characters",
                        &user,
                    ));
                }
                let encoded = Secret::new(crate::http::base64(
                    format!("{user}:{}", password.expose()).as_bytes(),
                ));
                Auth::Basic(user, password, encoded)
            }
            (None, Some(_), None) => return Err(ConfigError::missing(
                "search.password",
                "a username needs a password (OUTBOX_SEARCH_PASSWORD or `password` in [search])",
            )),
            (None, None, Some(_)) => return Err(ConfigError::missing(
                "search.username",
                "a password needs a username (OUTBOX_SEARCH_USERNAME or `username` in [search])",
            )),
            (None, None, None) => Auth::None,
        };
        let credential = match &auth {
            Auth::None => None,
            Auth::ApiKey(..) => Some("API key"),
            Auth::Basic(..) => Some("basic-auth password"),
        };
        if let Some(credential) = credential {
            crate::http::check_credentials_over_http(
                "search",
                &base,
                credential,
                self.allow_insecure_http,
            )?;
        }
        let timeout =
            crate::http::check_timeout("search.timeout", self.timeout.unwrap_or(DEFAULT_TIMEOUT))?;
        let client = match self.client {
            Some(c) => c,
            None => crate::http::client("search")?,
        };
        Ok(SearchClient {
            client,
            base,
            index: self.index,
            auth,
            timeout,
        })
    }
}

/// Refuses the document ids a URL cannot carry as one path segment. Every other character,
/// `/`, `?`, `#` and `%` included, is percent-encoded by [`SearchClient::document_url`].
fn check_id(id: &str) -> Result<(), HandlerError> {
    match id {
        "" => Err(HandlerError::permanent("the document id is empty")),
        "." | ".." => Err(HandlerError::permanent(format!(
            "the document id `{id}` cannot be used: a URL reads it as a path step, so the \
             request would go to another resource; map the event to another id"
        ))),
        _ => Ok(()),
    }
}

/// Checks an index name against Elasticsearch's rules.
pub(crate) fn check_index(index: &str) -> Result<(), ConfigError> {
    let bad = |why: &str| Err(ConfigError::invalid("search.index", why, index));
    if index.is_empty() || index.len() > 255 {
        return bad("use 1 to 255 bytes");
    }
    if index != index.to_lowercase() {
        return bad("use lowercase");
    }
    if index.starts_with(['-', '_', '+']) || index == "." || index == ".." {
        return bad("must not start with `-`, `_` or `+`, nor be `.` or `..`");
    }
    if index.contains(['\\', '/', '*', '?', '"', '<', '>', '|', ' ', ',', '#', ':']) {
        return bad("must not contain \\ / * ? \" < > | space , # :");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> SearchClientBuilder {
        SearchClient::builder().base_url("http://127.0.0.1:9200")
    }

    #[test]
    fn document_urls_encode_the_id_and_carry_the_version() {
        let c = builder().build().unwrap();
        assert_eq!(
            c.document_url("hotels", "a/b c", 7).as_str(),
            "http://127.0.0.1:9200/hotels/_doc/a%2Fb%20c?version=7&version_type=external"
        );
        let c = builder().base_url("http://h/es/").build().unwrap();
        assert_eq!(
            c.document_url("i", "1", 1).as_str(),
            "http://h/es/i/_doc/1?version=1&version_type=external"
        );
    }

    #[test]
    fn document_ids_that_would_change_the_path_are_refused() {
        let c = builder().build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for id in ["", ".", ".."] {
            let op = IndexOp::Delete {
                id: id.into(),
                version: 1,
            };
            let e = rt.block_on(c.apply("hotels", &op)).unwrap_err();
            assert_eq!(e.kind(), outbox::FailureKind::Permanent, "{id:?}: {e}");
        }
        let op = IndexOp::Delete {
            id: "1".into(),
            version: 1,
        };
        let e = rt.block_on(c.apply("..", &op)).unwrap_err();
        assert_eq!(e.kind(), outbox::FailureKind::Permanent, "{e}");
        // The rest stays inside the id's own segment.
        for (id, segment) in [
            ("a/b", "a%2Fb"),
            ("../x", "..%2Fx"),
            ("%2e%2e", "%252e%252e"),
            ("...", "..."),
            ("a?b#c", "a%3Fb%23c"),
            ("a\\b", "a%5Cb"),
        ] {
            let url = c.document_url("hotels", id, 1);
            assert_eq!(
                url.path(),
                format!("/hotels/_doc/{segment}"),
                "{id:?} gave {url}"
            );
        }
    }

    #[test]
    fn credentials_go_over_plain_http_only_to_this_machine_unless_allowed() {
        for b in [
            SearchClient::builder().api_key("ak-1"),
            SearchClient::builder().basic_auth("u", "pw-1"),
        ] {
            let b = b.base_url("http://search.internal:9200");
            let dbg = format!("{b:?}");
            let e = b.build().unwrap_err();
            assert_eq!(e.key(), Some("search.base_url"), "{dbg}");
            assert!(!e.to_string().contains("ak-1") && !e.to_string().contains("pw-1"));
        }
        SearchClient::builder()
            .base_url("http://search.internal:9200")
            .api_key("ak-1")
            .allow_insecure_http(true)
            .build()
            .unwrap();
        SearchClient::builder()
            .base_url("http://search.internal:9200")
            .build()
            .unwrap();
        builder().basic_auth("u", "pw-1").build().unwrap();
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(
            SearchClient::builder().build().unwrap_err().key(),
            Some("search.base_url")
        );
        assert_eq!(
            builder().index("Hotels").build().unwrap_err().key(),
            Some("search.index")
        );
        assert_eq!(
            builder().index("a/b").build().unwrap_err().key(),
            Some("search.index")
        );
        let e = builder()
            .api_key("k")
            .basic_auth("u", "p")
            .build()
            .unwrap_err();
        assert_eq!(e.key(), Some("search.api_key"));
        assert_eq!(
            builder().timeout(Duration::ZERO).build().unwrap_err().key(),
            Some("search.timeout")
        );
        let b = builder().api_key("sekrit-key");
        assert!(!format!("{b:?}").contains("sekrit"));
        let c = b.build().unwrap();
        assert!(!format!("{c:?}").contains("sekrit"));
    }
}
