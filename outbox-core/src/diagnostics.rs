//! Text about failures and connections that is safe to show: an error with its sources on one
//! line, URLs with their passwords hidden, and whether a host is this machine.
//!
//! The worker, the operations binary and `outbox-handlers` print errors and URLs through these,
//! so a log line reads the same whichever of them wrote it, and a password never reaches one.
//!
//! ```
//! use outbox::diagnostics::{error_chain, is_loopback_host, redact_url};
//!
//! let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
//! assert_eq!(error_chain(&refused), "connection refused");
//! assert_eq!(redact_url("postgres://app:s3cret@db/app"), "postgres://app:***@db/app");
//! assert!(is_loopback_host("127.0.0.1:5432"));
//! ```

// This module sits at the bottom of the crate: it uses the standard library only, so that every
// other module (the error type included) may use it.

use std::error::Error;
use std::net::{IpAddr, Ipv6Addr};

/// An error and its sources on one line, `outer: inner: ...`, leaving out a source whose text
/// the line already holds (an error that prints its source itself).
///
/// ```
/// use outbox::diagnostics::error_chain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot load the configuration")]
/// struct Load(#[source] std::io::Error);
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot start: {0}")]
/// struct Start(#[source] std::io::Error);
///
/// let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
/// assert_eq!(error_chain(&Load(missing())), "cannot load the configuration: no such file");
/// // The source is in the message already: not repeated.
/// assert_eq!(error_chain(&Start(missing())), "cannot start: no such file");
/// ```
pub fn error_chain(error: &dyn Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = inner.source();
    }
    line
}

/// `url` with the password replaced by `***`, for logs and `Debug`: the one in the user
/// information (`postgres://user:***@host/db`) and a `password` query parameter
/// (`?password=***`). Everything else is kept, so the user, host and database stay readable.
///
/// Where the user name may itself be a secret (an API key given as the user), use
/// [`redact_userinfo`].
///
/// ```
/// use outbox::diagnostics::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:s3cret@db.internal:5432/app"),
///     "postgres://app:***@db.internal:5432/app"
/// );
/// assert_eq!(
///     redact_url("postgres://db/app?user=app&password=s3cret&sslmode=require"),
///     "postgres://db/app?user=app&password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("sqlite:outbox.db"), "sqlite:outbox.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(parts) = UrlParts::split(url) else {
        // `sqlite:...` and the like: no user information, maybe a query.
        return redact_query(url);
    };
    let mut out = format!("{}://", parts.scheme);
    if let Some(userinfo) = parts.userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    out.push_str(&redact_query(parts.rest));
    out
}

/// `url` with all its user information, the user name included, replaced by `[redacted]`:
/// for URLs whose user name may be a credential too (an API key given as the user).
///
/// ```
/// use outbox::diagnostics::redact_userinfo;
///
/// assert_eq!(
///     redact_userinfo("https://sk_live_123@api.mail.example/v1"),
///     "https://[redacted]@api.mail.example/v1"
/// );
/// assert_eq!(redact_userinfo("https://api.mail.example/v1"), "https://api.mail.example/v1");
/// ```
pub fn redact_userinfo(url: &str) -> String {
    match UrlParts::split(url) {
        Some(UrlParts {
            scheme,
            userinfo: Some(_),
            rest,
        }) => format!("{scheme}://[redacted]@{rest}"),
        _ => url.to_string(),
    }
}

/// A URL cut around its user information: `{scheme}://{userinfo}@{rest}`.
struct UrlParts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    rest: &'a str,
}

impl<'a> UrlParts<'a> {
    /// `None` for a URL without `://` (`sqlite:outbox.db`), which has no user information.
    fn split(url: &'a str) -> Option<Self> {
        let (scheme, after) = url.split_once("://")?;
        // The user information ends at the last `@`: a password may hold `/`, `?`, `#` or `@`
        // unencoded. (A later `@`, in the path or the query, hides more than needed, never less.)
        Some(match after.rfind('@') {
            Some(at) => UrlParts {
                scheme,
                userinfo: Some(&after[..at]),
                rest: &after[at + 1..],
            },
            None => UrlParts {
                scheme,
                userinfo: None,
                rest: after,
            },
        })
    }
}

/// `rest` with the value of every `password` query parameter replaced by `***`.
fn redact_query(rest: &str) -> String {
    let Some((head, query)) = rest.split_once('?') else {
        return rest.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

/// Whether `host` names this machine: a loopback address (`127.0.0.0/8`, `::1`) or `localhost`.
///
/// `host` is written as a URL or an HTTP `Host` header writes it: a name or an IPv4 address, an
/// IPv6 address in brackets (or bare), each with or without a `:port`. A name that only starts
/// with `localhost` is not this machine.
///
/// ```
/// use outbox::diagnostics::is_loopback_host;
///
/// for local in ["localhost", "LOCALHOST:8080", "127.0.0.1", "127.1.2.3:9200", "[::1]", "[::1]:80"] {
///     assert!(is_loopback_host(local), "{local}");
/// }
/// for remote in ["example.com", "10.0.0.7:80", "localhost.example.com", "127.0.0.2.example", ""] {
///     assert!(!is_loopback_host(remote), "{remote}");
/// }
/// ```
pub fn is_loopback_host(host: &str) -> bool {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    if let Some(bracketed) = host.strip_prefix('[') {
        return match bracketed.split_once(']') {
            Some((ip, "")) => is_loopback_ipv6(ip),
            Some((ip, port)) => port.strip_prefix(':').is_some_and(is_port) && is_loopback_ipv6(ip),
            None => false,
        };
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return false,
        None => host,
    };
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => name.eq_ignore_ascii_case("localhost") || name.eq_ignore_ascii_case("localhost."),
    }
}

fn is_loopback_ipv6(ip: &str) -> bool {
    ip.parse::<Ipv6Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether `digits` is a port number's text.
fn is_port(digits: &str) -> bool {
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Cuts `error` to at most `max` bytes on a character boundary, with a marker.
pub(crate) fn bound_error(error: &str, max: usize) -> String {
    if error.len() <= max {
        return error.to_string();
    }
    let marker = format!(" ... [truncated, {} bytes in all]", error.len());
    let mut end = max.saturating_sub(marker.len());
    while end > 0 && !error.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{marker}", &error[..end])
}

/// The message of a caught panic's payload (`&str` or `String`), or a placeholder.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_skips_sources_the_line_already_holds() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl std::fmt::Display for Layer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.0)
            }
        }
        impl Error for Layer {
            fn source(&self) -> Option<&(dyn Error + 'static)> {
                self.1.as_deref().map(|e| e as &(dyn Error + 'static))
            }
        }
        let e = Layer(
            "request failed: connect",
            Some(Box::new(Layer(
                "connect",
                Some(Box::new(Layer("connection refused", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "request failed: connect: connection refused"
        );
    }

    #[test]
    fn redact_url_hides_passwords_wherever_they_are() {
        for (url, want) in [
            (
                "postgres://app:s3cret@db:5432/app",
                "postgres://app:***@db:5432/app",
            ),
            ("postgres://app@db/app", "postgres://app@db/app"),
            ("postgres://db/app", "postgres://db/app"),
            (
                "postgresql://app:p@ss@db/app",
                "postgresql://app:***@db/app",
            ),
            ("postgres://app:pa/ss?@db/app", "postgres://app:***@db/app"),
            (
                "postgres://app:p@ss/w?rd@db/app",
                "postgres://app:***@db/app",
            ),
            (
                "postgres://db/app?password=s3cret&user=app",
                "postgres://db/app?password=***&user=app",
            ),
            (
                "postgres://app:s3cret@db/app?PASSWORD=other",
                "postgres://app:***@db/app?PASSWORD=***",
            ),
            ("sqlite:outbox.db?mode=rwc", "sqlite:outbox.db?mode=rwc"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn redact_userinfo_hides_the_user_too() {
        assert_eq!(
            redact_userinfo("https://u:hunter2@x.example/v1"),
            "https://[redacted]@x.example/v1"
        );
        assert_eq!(
            redact_userinfo("https://u:p@ss/w?rd@x.example"),
            "https://[redacted]@x.example"
        );
        assert_eq!(
            redact_userinfo("https://x.example/v1"),
            "https://x.example/v1"
        );
        assert_eq!(redact_userinfo("foo"), "foo");
    }

    #[test]
    fn loopback_hosts() {
        for local in [
            "localhost",
            "localhost.",
            "localhost:8080",
            "127.0.0.1:1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "[::1]:80",
        ] {
            assert!(is_loopback_host(local), "{local}");
        }
        for remote in [
            "example.com",
            "10.0.0.1:80",
            "localhost.evil.com",
            "[::2]:80",
            "[localhost]",
            "[::1]x",
            "localhost:http",
            "127.0.0.2.example",
            "",
        ] {
            assert!(!is_loopback_host(remote), "{remote}");
        }
    }
}
