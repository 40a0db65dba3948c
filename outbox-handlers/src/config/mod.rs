//! Configuration shared by the handlers: [`ConfigError`], [`Secret`], and (in `read`) reading a
//! section from environment variables or a TOML document through serde.

use std::fmt;
use std::path::PathBuf;

use serde::de::{self, Deserializer};
use serde::Deserialize;

// The section readers serve the configuration types of the HTTP handlers and of dedup.
#[cfg(any(
    feature = "http",
    feature = "dedup",
    feature = "dedup-sqlite",
    feature = "dedup-mysql"
))]
mod read;
#[cfg(any(
    feature = "http",
    feature = "dedup",
    feature = "dedup-sqlite",
    feature = "dedup-mysql"
))]
pub(crate) use read::{duration, from_lookup, from_toml_file, from_toml_str, section_constructors};

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
    /// A value is refused: it does not read as the key's type, or it would print a secret to
    /// repeat it. The reason says what was expected, and quotes the value only when it is no
    /// secret.
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
}

// Without a handler that reads a configuration section or checks a builder's settings, nothing
// builds these errors.
#[cfg(any(
    feature = "http",
    feature = "dedup",
    feature = "dedup-sqlite",
    feature = "dedup-mysql"
))]
impl ConfigError {
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
/// to the value. It is `Deserialize`, to be read from configuration; a value of the wrong type
/// is refused without repeating it.
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
#[derive(Clone, PartialEq, Eq)]
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

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // serde's own message would quote the value (`invalid type: integer `12345`...`).
        String::deserialize(d).map(Secret).map_err(|_| {
            de::Error::custom("expected a string (the value is not repeated: it is a secret)")
        })
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
