//! The HTTP plumbing shared by the email and search handlers: the checks of their settings
//! (base URL, credentials over plain HTTP, timeout), the client, how a status becomes a retry or
//! a dead letter, `Retry-After`, bounded response bodies and secret scrubbing.

use std::sync::Arc;
use std::time::Duration;

use outbox::diagnostics;
use outbox::HandlerError;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use crate::config::ConfigError;

/// The most bytes of a response body kept in an error (and so in `last_error`).
pub(crate) const MAX_BODY_BYTES: usize = 1024;

/// The most bytes of a response body read at all.
const READ_LIMIT: usize = 16 * 1024;

/// The longest `Retry-After` honoured; a longer one is cut to this.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What replaces a secret in errors.
const REDACTED: &str = "[redacted]";

/// The longest timeout a handler accepts: anything longer is a typo.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// A failed call to an HTTP service: the source of the [`HandlerError`] that a handler returns.
///
/// The text never holds an API key or a password: the handlers scrub them from response bodies
/// and client errors, and leave the URL out of client errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The service answered with a status that is not a success.
    #[error("{service} answered {}: {body}", status_text(*status))]
    Status {
        /// Which service (`email provider`, `search index`).
        service: &'static str,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body (at most 1 KiB), or `(empty body)`.
        body: String,
    },
    /// The service did not answer in time.
    #[error("{service} did not answer within {timeout:?} (timeout)")]
    Timeout {
        /// Which service.
        service: &'static str,
        /// The timeout in force.
        timeout: Duration,
    },
    /// The request could not be sent, or the answer not read (connection refused, reset, DNS).
    #[error("{service} request failed: {detail}")]
    Request {
        /// Which service.
        service: &'static str,
        /// The client's error chain, without the URL and with secrets removed.
        detail: String,
    },
}

impl HttpError {
    /// The HTTP status, when the service answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            HttpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn status_text(code: u16) -> String {
    match StatusCode::from_u16(code) {
        Ok(s) => s.to_string(),
        Err(_) => code.to_string(),
    }
}

/// Checks a timeout: above zero, at most an hour.
pub(crate) fn check_timeout(key: &str, d: Duration) -> Result<Duration, ConfigError> {
    if d.is_zero() || d > MAX_TIMEOUT {
        return Err(ConfigError::invalid(
            key,
            "not a timeout: use a duration above 0 and at most 1 hour",
            &format!("{d:?}"),
        ));
    }
    Ok(d)
}

/// Checks a base URL: `http` or `https`, a host, no credentials, query or fragment.
pub(crate) fn base_url(key: &str, raw: &str) -> Result<reqwest::Url, ConfigError> {
    let url = reqwest::Url::parse(raw.trim())
        .map_err(|_| ConfigError::invalid(key, "not a valid URL", raw))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ConfigError::invalid(
            key,
            "use an http:// or https:// URL",
            raw,
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(key, "the URL has no host", raw));
    }
    if !url.username().is_empty() || url.password().is_some() {
        // Do not echo the URL: it holds a credential.
        return Err(ConfigError::rejected(
            key,
            "the URL holds credentials; give them as the API key or username/password settings instead",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ConfigError::invalid(
            key,
            "the URL must have no query or fragment",
            raw,
        ));
    }
    Ok(url)
}

/// A base URL as given, for `Debug`: any user information (`user:password@`) is replaced by
/// `[redacted]@`. Such a URL is refused when the client is built, but a configuration holding
/// it can still be printed before that.
pub(crate) fn debug_base_url(raw: &Option<String>) -> Option<String> {
    raw.as_deref().map(diagnostics::redact_userinfo)
}

/// Refuses to send credentials over plain `http://` to a host that is not this machine, unless
/// `allowed` (the builder's `allow_insecure_http(true)`, `allow_insecure_http = true`).
///
/// Loopback hosts (`127.0.0.0/8`, `::1`, `localhost`) are allowed: their traffic never leaves the
/// machine, and local test servers and sidecars speak plain HTTP there.
pub(crate) fn check_credentials_over_http(
    section: &str,
    url: &reqwest::Url,
    credential: &str,
    allowed: bool,
) -> Result<(), ConfigError> {
    let local = url.host_str().is_some_and(diagnostics::is_loopback_host);
    if url.scheme() != "http" || allowed || local {
        return Ok(());
    }
    // The URL holds no credentials (base_url refused those), so it may be shown.
    Err(ConfigError::invalid(
        format!("{section}.base_url"),
        format!(
            "plain http:// would send the {credential} unencrypted to a host that is not this              machine; use https://, or set allow_insecure_http (`allow_insecure_http = true` in              [{section}], OUTBOX_{}_ALLOW_INSECURE_HTTP=true, or the builder's              allow_insecure_http(true)) if the network in between is trusted",
            section.to_ascii_uppercase()
        ),
        url.as_str(),
    ))
}

/// A client for the handlers: rustls with the `ring` provider (or the process default if one is
/// installed) and the platform's certificate verifier, no redirects.
pub(crate) fn client(section: &str) -> Result<reqwest::Client, ConfigError> {
    use rustls_platform_verifier::BuilderVerifierExt;

    let key = format!("{section}.client");
    let provider = rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::rejected(&key, format!("TLS setup failed: {e}")))?
        .with_platform_verifier()
        .map_err(|e| ConfigError::rejected(&key, format!("TLS verifier setup failed: {e}")))?
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("outbox-handlers/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| {
            ConfigError::rejected(&key, format!("the HTTP client could not be built: {e}"))
        })
}

/// Statuses worth another try: 408, 429 and 5xx.
pub(crate) fn is_retryable(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

/// The failure for a status that is not a success: a retry (after `Retry-After` if the service
/// sent one) for 408, 429 and 5xx, a dead letter otherwise. Reads at most a bounded part of the
/// body, and scrubs `secrets` from it.
pub(crate) async fn status_failure(
    service: &'static str,
    response: reqwest::Response,
    secrets: &[&str],
) -> HandlerError {
    let status = response.status();
    let after = retry_after(response.headers());
    let body = body_excerpt(response, secrets).await;
    let error = HttpError::Status {
        service,
        status: status.as_u16(),
        body,
    };
    if is_retryable(status) {
        match after {
            Some(delay) => HandlerError::retry_after(delay, error),
            None => HandlerError::retry(error),
        }
    } else {
        HandlerError::permanent(error)
    }
}

/// The failure for a request that got no answer: a retry, except for a request that could not
/// even be built.
pub(crate) fn request_failure(
    service: &'static str,
    error: reqwest::Error,
    timeout: Duration,
    secrets: &[&str],
) -> HandlerError {
    if error.is_timeout() {
        return HandlerError::retry(HttpError::Timeout { service, timeout });
    }
    let permanent = error.is_builder();
    let detail = diagnostics::error_chain(&error.without_url());
    let error = HttpError::Request {
        service,
        detail: scrub(&detail, secrets),
    };
    if permanent {
        HandlerError::permanent(error)
    } else {
        HandlerError::retry(error)
    }
}

/// The delay a `Retry-After` header asks for: delta-seconds, or an HTTP date. Capped at a day.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let delay = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else if let Ok(date) = chrono::DateTime::parse_from_rfc2822(value) {
        (date.with_timezone(&chrono::Utc) - chrono::Utc::now())
            .to_std()
            .unwrap_or(Duration::ZERO)
    } else {
        return None;
    };
    Some(delay.min(MAX_RETRY_AFTER))
}

/// At most [`MAX_BODY_BYTES`] of the body as text, on one line, with `secrets` replaced.
async fn body_excerpt(mut response: reqwest::Response, secrets: &[&str]) -> String {
    let mut buf: Vec<u8> = Vec::new();
    let mut more = false;
    while let Ok(Some(chunk)) = response.chunk().await {
        buf.extend_from_slice(&chunk);
        if buf.len() >= READ_LIMIT {
            more = true;
            break;
        }
    }
    let text = String::from_utf8_lossy(&buf);
    // Scrub before cutting, so a secret is never half kept.
    let text = scrub(&text, secrets);
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_string();
    }
    if text.len() <= MAX_BODY_BYTES && !more {
        return text.to_string();
    }
    let mut end = MAX_BODY_BYTES.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} ... [truncated]", &text[..end])
}

/// `text` with every occurrence of each secret replaced by `[redacted]`.
pub(crate) fn scrub(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
    }
    out
}

/// Standard base64 with padding, as in an `Authorization: Basic` header: a service that echoes
/// that header back must not get the credentials into an error in that form either.
#[cfg_attr(not(feature = "search"), allow(dead_code))] // only search has basic auth
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_reads_seconds_and_dates_and_caps_them() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("99999999"));
        assert_eq!(retry_after(&h), Some(MAX_RETRY_AFTER));
        h.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), Some(Duration::ZERO), "a date in the past");
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(60)).to_rfc2822();
        h.insert(RETRY_AFTER, HeaderValue::from_str(&soon).unwrap());
        let d = retry_after(&h).unwrap();
        assert!(
            d > Duration::from_secs(55) && d <= Duration::from_secs(60),
            "{d:?}"
        );
        h.insert(RETRY_AFTER, HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn retryable_statuses() {
        for s in [408, 429, 500, 502, 503, 504] {
            assert!(is_retryable(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 409, 422] {
            assert!(!is_retryable(StatusCode::from_u16(s).unwrap()), "{s}");
        }
    }

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        for (raw, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("indexer:s3cret-pw", "aW5kZXhlcjpzM2NyZXQtcHc="),
            ("\u{ff}\u{fe}", "w7/Dvg=="),
        ] {
            assert_eq!(base64(raw.as_bytes()), encoded, "{raw:?}");
        }
    }

    #[test]
    fn scrub_replaces_every_occurrence() {
        assert_eq!(
            scrub("key sk_1 and sk_1 again, pw", &["sk_1", "", "pw"]),
            "key [redacted] and [redacted] again, [redacted]"
        );
    }

    #[test]
    fn status_errors_read_well() {
        let e = HttpError::Status {
            service: "email provider",
            status: 503,
            body: "down".into(),
        };
        assert_eq!(
            e.to_string(),
            "email provider answered 503 Service Unavailable: down"
        );
        assert_eq!(e.status(), Some(503));
    }

    #[test]
    fn timeouts_are_bounded() {
        assert!(check_timeout("t", Duration::ZERO).is_err());
        assert!(check_timeout("t", Duration::from_secs(7200)).is_err());
        assert_eq!(
            check_timeout("t", Duration::from_millis(1500)).unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn base_urls_are_checked() {
        assert_eq!(
            base_url("email.base_url", "foo").unwrap_err().to_string(),
            "email.base_url: not a valid URL (got `foo`)"
        );
        assert!(base_url("k", "ftp://x").is_err());
        assert!(base_url("k", "http://x/?a=1").is_err());
        let e = base_url("k", "https://user:hunter2@x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(base_url("k", "https://api.example.com/v1/").is_ok());
    }

    #[test]
    fn credentials_over_plain_http_need_a_loopback_host_or_an_explicit_allowance() {
        let check = |raw: &str, allowed: bool| {
            check_credentials_over_http("search", &base_url("k", raw).unwrap(), "API key", allowed)
        };
        let e = check("http://search.internal:9200", false).unwrap_err();
        assert_eq!(e.key(), Some("search.base_url"));
        let text = e.to_string();
        assert!(text.contains("allow_insecure_http"), "{text}");
        assert!(text.contains("OUTBOX_SEARCH_ALLOW_INSECURE_HTTP"), "{text}");
        assert!(check("http://10.0.0.7", false).is_err());
        assert!(check("http://127.0.0.2.example", false).is_err());
        assert!(check("http://search.internal:9200", true).is_ok());
        assert!(check("https://search.internal:9200", false).is_ok());
        for local in [
            "http://127.0.0.1:9200",
            "http://127.1.2.3",
            "http://[::1]:9200",
            "http://localhost:9200",
            "http://LOCALHOST",
        ] {
            assert!(check(local, false).is_ok(), "{local}");
        }
    }
}
