//! Configuration shared by the handlers: [`ConfigError`], [`Secret`], and reading a section from
//! environment variables or a TOML document.
//!
//! Every handler's configuration has the same two sources, with the same key names:
//!
//! | TOML (`[email]` table) | environment (prefix `OUTBOX_EMAIL_`) |
//! |------------------------|--------------------------------------|
//! | `base_url = "..."`     | `OUTBOX_EMAIL_BASE_URL=...`          |
//! | `timeout_secs = 10`    | `OUTBOX_EMAIL_TIMEOUT_SECS=10`       |
//!
//! Errors name the key as `section.key` (`email.base_url: not a valid URL (got `foo`)`), whichever
//! source it came from. Empty environment variables count as unset.

// Without the HTTP handlers, some helpers have no user.
#![cfg_attr(not(feature = "http"), allow(dead_code))]

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// The longest timeout a handler accepts: anything longer is a typo.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// A configuration value was missing, malformed or contradictory.
///
/// The message names the key as `section.key`, e.g. `email.base_url`.
///
/// ```
/// use outbox_handlers::{ConfigError, email::HttpTransport};
///
/// let err = HttpTransport::builder().base_url("foo").api_key("k").build().unwrap_err();
/// assert_eq!(err.to_string(), "email.base_url: not a valid URL (got `foo`)");
/// assert_eq!(err.key(), Some("email.base_url"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value is present but not acceptable.
    #[error("{key}: {reason} (got `{got}`)")]
    Invalid {
        /// The key, as `section.key`.
        key: String,
        /// What is wrong, and how to fix it.
        reason: String,
        /// The value that was given (cut to 100 characters).
        got: String,
    },
    /// A value is refused, and repeating it would print a secret (or there is no single value).
    #[error("{key}: {reason}")]
    Rejected {
        /// The key, as `section.key`.
        key: String,
        /// What is wrong, and how to fix it.
        reason: String,
    },
    /// A required value is absent.
    #[error("{key}: missing; {hint}")]
    Missing {
        /// The key, as `section.key`.
        key: String,
        /// Where to set it.
        hint: String,
    },
    /// A TOML section holds a key that is not known.
    #[error("{key}: unknown key; expected one of {expected}")]
    Unknown {
        /// The key, as `section.key`.
        key: String,
        /// The known keys of the section.
        expected: String,
    },
    /// The TOML document does not parse.
    #[error("the configuration is not valid TOML")]
    Syntax(#[source] toml::de::Error),
    /// A configuration file could not be read.
    #[error("cannot read the configuration file `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

impl ConfigError {
    /// The `section.key` the error is about, if it is about one key.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. }
            | ConfigError::Rejected { key, .. }
            | ConfigError::Missing { key, .. }
            | ConfigError::Unknown { key, .. } => Some(key),
            ConfigError::Syntax(_) | ConfigError::Read { .. } => None,
        }
    }

    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>, got: &str) -> Self {
        let mut cut: String = got.chars().take(100).collect();
        if got.chars().count() > 100 {
            cut.push('…');
        }
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
            got: cut,
        }
    }

    pub(crate) fn rejected(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Rejected {
            key: key.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn missing(key: impl Into<String>, hint: impl Into<String>) -> Self {
        ConfigError::Missing {
            key: key.into(),
            hint: hint.into(),
        }
    }
}

/// A secret string (an API key, a password): its `Debug` prints `[redacted]`, it is never logged,
/// and the handlers scrub it from every error.
///
/// It has no `Display` and is not `Serialize`, so it cannot end up in a log line, a JSON dump
/// of a configuration or an error message by accident: [`expose`](Self::expose) is the one way
/// to the value. It is `Deserialize`, to be read from configuration.
///
/// ```
/// use outbox_handlers::Secret;
///
/// let key = Secret::new("sk_live_123");
/// assert_eq!(format!("{key:?}"), "Secret([redacted])");
/// assert_eq!(key.expose(), "sk_live_123");
/// ```
///
/// ```compile_fail
/// // Not Serialize: a configuration holding it cannot be dumped with its secrets.
/// let _ = serde_json::to_string(&outbox_handlers::Secret::new("sk_live_123"));
/// ```
///
/// ```compile_fail
/// // No Display.
/// let _ = format!("{}", outbox_handlers::Secret::new("sk_live_123"));
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, to put in a request header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret(value.to_owned())
    }
}

/// Where a section's values come from.
enum Source<'a> {
    Env {
        prefix: &'a str,
        lookup: &'a dyn Fn(&str) -> Option<String>,
    },
    Toml(toml::Table),
}

/// One section of configuration (`email`, `search`, `dedup`) being read key by key.
pub(crate) struct Fields<'a> {
    section: &'static str,
    known: &'static [&'static str],
    source: Source<'a>,
}

impl<'a> Fields<'a> {
    /// Reads `{prefix}{KEY}` variables through `lookup` (empty values count as unset).
    pub(crate) fn env(
        section: &'static str,
        known: &'static [&'static str],
        prefix: &'a str,
        lookup: &'a dyn Fn(&str) -> Option<String>,
    ) -> Self {
        Fields {
            section,
            known,
            source: Source::Env { prefix, lookup },
        }
    }

    /// Reads the `[section]` table of a TOML document.
    pub(crate) fn toml(
        section: &'static str,
        known: &'static [&'static str],
        document: &str,
    ) -> Result<Self, ConfigError> {
        let mut doc: toml::Table = toml::from_str(document).map_err(ConfigError::Syntax)?;
        let table = match doc.remove(section) {
            Some(toml::Value::Table(t)) => t,
            Some(other) => {
                return Err(ConfigError::invalid(
                    section,
                    format!("expected a table `[{section}]`"),
                    &other.to_string(),
                ))
            }
            None => {
                return Err(ConfigError::missing(
                    section,
                    format!("add a `[{section}]` table to the configuration"),
                ))
            }
        };
        Ok(Fields {
            section,
            known,
            source: Source::Toml(table),
        })
    }

    /// The `section.name` of a key.
    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    fn env_name(prefix: &str, name: &str) -> String {
        format!("{prefix}{}", name.to_ascii_uppercase())
    }

    /// A string value.
    pub(crate) fn string(&mut self, name: &str) -> Result<Option<String>, ConfigError> {
        match &mut self.source {
            Source::Env { prefix, lookup } => {
                Ok(lookup(&Self::env_name(prefix, name)).filter(|v| !v.is_empty()))
            }
            Source::Toml(t) => match t.remove(name) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => Err(ConfigError::invalid(
                    self.key(name),
                    "expected a string",
                    &other.to_string(),
                )),
            },
        }
    }

    /// A secret string value; a wrong type is reported without the value.
    pub(crate) fn secret(&mut self, name: &str) -> Result<Option<Secret>, ConfigError> {
        let key = self.key(name);
        match &mut self.source {
            Source::Toml(t) => match t.remove(name) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(Secret(s))),
                Some(_) => Err(ConfigError::rejected(key, "expected a string")),
            },
            Source::Env { .. } => Ok(self.string(name)?.map(Secret)),
        }
    }

    /// A number (integer or float).
    pub(crate) fn number(&mut self, name: &str) -> Result<Option<f64>, ConfigError> {
        match &mut self.source {
            Source::Env { .. } => match self.string(name)? {
                None => Ok(None),
                Some(s) => s
                    .trim()
                    .parse::<f64>()
                    .map(Some)
                    .map_err(|_| ConfigError::invalid(self.key(name), "not a number", &s)),
            },
            Source::Toml(t) => match t.remove(name) {
                None => Ok(None),
                #[allow(clippy::cast_precision_loss)]
                Some(toml::Value::Integer(i)) => Ok(Some(i as f64)),
                Some(toml::Value::Float(f)) => Ok(Some(f)),
                Some(other) => Err(ConfigError::invalid(
                    self.key(name),
                    "not a number",
                    &other.to_string(),
                )),
            },
        }
    }

    /// A boolean: `true` or `false` in TOML; `true`/`false`/`1`/`0`/`yes`/`no` in the environment.
    #[cfg_attr(not(feature = "http"), allow(dead_code))] // only the HTTP handlers have flags
    pub(crate) fn boolean(&mut self, name: &str) -> Result<Option<bool>, ConfigError> {
        match &mut self.source {
            Source::Env { .. } => match self.string(name)? {
                None => Ok(None),
                Some(s) => match s.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" => Ok(Some(true)),
                    "false" | "0" | "no" => Ok(Some(false)),
                    _ => Err(ConfigError::invalid(
                        self.key(name),
                        "not a boolean: use true or false",
                        &s,
                    )),
                },
            },
            Source::Toml(t) => match t.remove(name) {
                None => Ok(None),
                Some(toml::Value::Boolean(b)) => Ok(Some(b)),
                Some(other) => Err(ConfigError::invalid(
                    self.key(name),
                    "not a boolean: use true or false",
                    &other.to_string(),
                )),
            },
        }
    }

    /// A whole number of zero or more.
    #[cfg_attr(not(feature = "dedup"), allow(dead_code))] // only dedup has counts
    pub(crate) fn count(&mut self, name: &str) -> Result<Option<u64>, ConfigError> {
        match &mut self.source {
            Source::Env { .. } => match self.string(name)? {
                None => Ok(None),
                Some(s) => s.trim().parse::<u64>().map(Some).map_err(|_| {
                    ConfigError::invalid(self.key(name), "not a whole number of 0 or more", &s)
                }),
            },
            Source::Toml(t) => match t.remove(name) {
                None => Ok(None),
                Some(toml::Value::Integer(i)) if i >= 0 => Ok(Some(i.unsigned_abs())),
                Some(other) => Err(ConfigError::invalid(
                    self.key(name),
                    "not a whole number of 0 or more",
                    &other.to_string(),
                )),
            },
        }
    }

    /// Fails on keys of a TOML table that were not read.
    pub(crate) fn finish(self) -> Result<(), ConfigError> {
        if let Source::Toml(t) = &self.source {
            if let Some(name) = t.keys().next() {
                return Err(ConfigError::Unknown {
                    key: self.key(name),
                    expected: self.known.join(", "),
                });
            }
        }
        Ok(())
    }
}

/// Reads a configuration file to a string.
pub(crate) fn read_file(path: &std::path::Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Checks a timeout given in seconds: above zero, at most an hour.
pub(crate) fn timeout_from_secs(key: &str, secs: f64) -> Result<Duration, ConfigError> {
    let bad = || {
        ConfigError::invalid(
            key,
            "not a timeout in seconds: use a number above 0 and at most 3600",
            &secs.to_string(),
        )
    };
    let d = Duration::try_from_secs_f64(secs).map_err(|_| bad())?;
    check_timeout(key, d).map_err(|_| bad())
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
#[cfg(feature = "http")]
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
#[cfg(feature = "http")]
pub(crate) fn redact_userinfo(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_string();
    };
    // The user information ends at the last `@`: a password may hold `/`, `?`, `#` or `@`
    // unencoded, and hiding too much of a URL that is refused anyway costs nothing.
    match rest.rfind('@') {
        None => raw.to_string(),
        Some(at) => format!("{scheme}://[redacted]@{}", &rest[at + 1..]),
    }
}

/// `Option<String>` of a base URL, for `Debug`, through [`redact_userinfo`].
#[cfg(feature = "http")]
pub(crate) fn debug_base_url(raw: &Option<String>) -> Option<String> {
    raw.as_deref().map(redact_userinfo)
}

/// Refuses to send credentials over plain `http://` to a host that is not this machine, unless
/// `allowed` (the builder's `allow_insecure_http(true)`, `allow_insecure_http = true`).
///
/// Loopback hosts (`127.0.0.0/8`, `::1`, `localhost`) are allowed: their traffic never leaves the
/// machine, and local test servers and sidecars speak plain HTTP there.
#[cfg(feature = "http")]
pub(crate) fn check_credentials_over_http(
    section: &str,
    url: &reqwest::Url,
    credential: &str,
    allowed: bool,
) -> Result<(), ConfigError> {
    if url.scheme() != "http" || allowed || is_loopback(url) {
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

/// Whether the URL's host is this machine: a loopback address or `localhost`.
#[cfg(feature = "http")]
fn is_loopback(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost."),
    }
}

/// Writes the loaders every configuration section shares: `from_env`, `from_env_prefixed`,
/// `from_lookup`, `from_toml_str` and `from_toml_file`, all ending in the type's own
/// `fn read(Fields) -> Result<Self, ConfigError>`.
#[cfg_attr(
    not(any(feature = "email", feature = "search", feature = "dedup")),
    allow(unused_macros)
)]
macro_rules! loaders {
    ($ty:ident, $section:literal, $prefix:literal) => {
        impl $ty {
            #[doc = concat!("Reads the `", $prefix, "*` environment variables.")]
            ///
            /// # Errors
            ///
            /// A [`ConfigError`] naming the variable whose value does not parse.
            pub fn from_env() -> Result<Self, ConfigError> {
                Self::from_env_prefixed($prefix)
            }

            /// Reads the variables `{prefix}KEY` (the keys in upper case) from the environment.
            ///
            /// # Errors
            ///
            /// As [`from_env`](Self::from_env).
            pub fn from_env_prefixed(prefix: &str) -> Result<Self, ConfigError> {
                Self::from_lookup(prefix, |name| std::env::var(name).ok())
            }

            /// Reads the variables `{prefix}KEY` through `lookup`, for tests or other sources of
            /// variables.
            ///
            /// # Errors
            ///
            /// As [`from_env`](Self::from_env).
            pub fn from_lookup(
                prefix: &str,
                lookup: impl Fn(&str) -> Option<String>,
            ) -> Result<Self, ConfigError> {
                Self::read($crate::config::Fields::env($section, KEYS, prefix, &lookup))
            }

            #[doc = concat!("Reads the `[", $section, "]` table of a TOML document.")]
            ///
            /// # Errors
            ///
            /// [`ConfigError::Syntax`] when the document does not parse, and a [`ConfigError`]
            /// naming the key for a missing table, an unknown key or a value of the wrong type.
            pub fn from_toml_str(document: &str) -> Result<Self, ConfigError> {
                Self::read($crate::config::Fields::toml($section, KEYS, document)?)
            }

            #[doc = concat!("Reads the `[", $section, "]` table of a TOML file.")]
            ///
            /// # Errors
            ///
            /// [`ConfigError::Read`] when the file cannot be read, then as
            /// [`from_toml_str`](Self::from_toml_str).
            pub fn from_toml_file(path: impl AsRef<std::path::Path>) -> Result<Self, ConfigError> {
                Self::from_toml_str(&$crate::config::read_file(path.as_ref())?)
            }
        }
    };
}
#[cfg_attr(
    not(any(feature = "email", feature = "search", feature = "dedup")),
    allow(unused_imports)
)]
pub(crate) use loaders;

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn env_values_are_read_with_the_prefix_and_empty_counts_as_unset() {
        let vars = [
            ("P_BASE_URL", "http://x"),
            ("P_FROM", ""),
            ("P_TIMEOUT_SECS", "2.5"),
        ];
        let lookup = env(&vars);
        let mut f = Fields::env("email", &["base_url"], "P_", &lookup);
        assert_eq!(f.string("base_url").unwrap().as_deref(), Some("http://x"));
        assert_eq!(f.string("from").unwrap(), None);
        assert_eq!(f.number("timeout_secs").unwrap(), Some(2.5));
        f.finish().unwrap();
    }

    #[test]
    fn env_numbers_that_do_not_parse_name_the_key() {
        let vars = [("P_TIMEOUT_SECS", "ten")];
        let lookup = env(&vars);
        let mut f = Fields::env("email", &[], "P_", &lookup);
        let e = f.number("timeout_secs").unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.timeout_secs: not a number (got `ten`)"
        );
    }

    #[test]
    fn toml_types_and_unknown_keys_name_the_key() {
        let mut f = Fields::toml(
            "email",
            &["base_url", "timeout_secs"],
            "[email]\nbase_url = 3\ntimeout_secs = 4\nbsae_url = 'x'\n",
        )
        .unwrap();
        let e = f.string("base_url").unwrap_err();
        assert_eq!(e.to_string(), "email.base_url: expected a string (got `3`)");
        assert_eq!(f.number("timeout_secs").unwrap(), Some(4.0));
        let e = f.finish().unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.bsae_url: unknown key; expected one of base_url, timeout_secs"
        );
    }

    #[test]
    fn toml_secrets_of_the_wrong_type_are_not_echoed() {
        let mut f = Fields::toml("email", &[], "[email]\napi_key = 12345678\n").unwrap();
        let e = f.secret("api_key").unwrap_err().to_string();
        assert!(!e.contains("12345678"), "{e}");
    }

    #[test]
    fn a_missing_section_and_bad_syntax_are_reported() {
        let e = Fields::toml("search", &[], "[email]\n").err().unwrap();
        assert_eq!(e.key(), Some("search"));
        assert!(matches!(
            Fields::toml("search", &[], "[search").err().unwrap(),
            ConfigError::Syntax(_)
        ));
    }

    #[test]
    fn timeouts_are_bounded() {
        assert!(timeout_from_secs("t", 0.0).is_err());
        assert!(timeout_from_secs("t", -1.0).is_err());
        assert!(timeout_from_secs("t", f64::NAN).is_err());
        assert!(timeout_from_secs("t", 7200.0).is_err());
        assert_eq!(
            timeout_from_secs("t", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[cfg(feature = "http")]
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

    #[cfg(feature = "http")]
    #[test]
    fn userinfo_is_redacted_for_debug() {
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

    #[cfg(feature = "http")]
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

    #[test]
    fn booleans_are_read_from_both_sources() {
        let vars = [("P_A", "true"), ("P_B", "0"), ("P_C", "maybe")];
        let lookup = env(&vars);
        let mut f = Fields::env("email", &[], "P_", &lookup);
        assert_eq!(f.boolean("a").unwrap(), Some(true));
        assert_eq!(f.boolean("b").unwrap(), Some(false));
        assert_eq!(f.boolean("d").unwrap(), None);
        assert_eq!(f.boolean("c").unwrap_err().key(), Some("email.c"));
        let mut f = Fields::toml("email", &[], "[email]\na = true\nb = 'yes'\n").unwrap();
        assert_eq!(f.boolean("a").unwrap(), Some(true));
        assert_eq!(f.boolean("b").unwrap_err().key(), Some("email.b"));
    }
}
