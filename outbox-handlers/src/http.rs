//! The HTTP plumbing shared by the email and search handlers: the client, how a status becomes
//! a retry or a dead letter, `Retry-After`, bounded response bodies and secret scrubbing.

use std::sync::Arc;
use std::time::Duration;

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
    let error = error.without_url();
    let mut detail = error.to_string();
    let mut next = std::error::Error::source(&error);
    while let Some(e) = next {
        let s = e.to_string();
        if !detail.ends_with(&s) {
            detail.push_str(": ");
            detail.push_str(&s);
        }
        next = e.source();
    }
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
}
