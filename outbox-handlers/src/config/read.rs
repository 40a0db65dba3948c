//! Reading a configuration section from environment variables or a TOML document through serde,
//! and [`section_constructors!`], which gives each section type its constructors.
//!
//! Every handler's configuration has the same two sources, with the same key names:
//!
//! | TOML (`[email]` table) | environment (prefix `OUTBOX_EMAIL_`) |
//! |------------------------|--------------------------------------|
//! | `base_url = "..."`     | `OUTBOX_EMAIL_BASE_URL=...`          |
//! | `timeout = "10s"`      | `OUTBOX_EMAIL_TIMEOUT=10s`           |
//!
//! Both go through the configuration type's `Deserialize`, so a key reads the same way from
//! either, and errors name the key as `section.key` (`email.base_url: not a valid URL (got
//! `foo`)`) whichever source it came from. Durations take the outbox's one human format
//! (`500ms`, `10s`, `5m`, `7d`; a bare number is seconds). Empty environment variables count as
//! unset.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::de::{self, value, DeserializeOwned, Deserializer, IntoDeserializer, Visitor};

use super::ConfigError;

/// Writes the constructors of a configuration section type, the same for every section:
/// `from_env`, `from_env_prefixed`, `from_lookup`, `from_toml_str` and `from_toml_file`, reading
/// the `[section]` TOML table or the environment variables `{env_prefix}KEY` through the type's
/// `Deserialize`.
///
/// ```text
/// section_constructors!(EmailConfig, section = "email", env_prefix = "OUTBOX_EMAIL_");
/// ```
macro_rules! section_constructors {
    ($config:ty, section = $section:literal, env_prefix = $prefix:literal) => {
        impl $config {
            #[doc = concat!(
                "Reads the `", $prefix, "KEY` environment variables (empty ones count as unset); \
                 the [`ConfigError`](crate::ConfigError) of a value that does not read names its \
                 key (`", $section, ".key`)."
            )]
            pub fn from_env() -> Result<Self, $crate::ConfigError> {
                Self::from_env_prefixed($prefix)
            }

            /// As [`from_env`](Self::from_env), with the variables `{prefix}KEY`.
            pub fn from_env_prefixed(prefix: &str) -> Result<Self, $crate::ConfigError> {
                Self::from_lookup(prefix, |name| std::env::var(name).ok())
            }

            /// As [`from_env_prefixed`](Self::from_env_prefixed), with the variables read through
            /// `lookup` (tests, other sources of variables).
            pub fn from_lookup(
                prefix: &str,
                lookup: impl Fn(&str) -> Option<String>,
            ) -> Result<Self, $crate::ConfigError> {
                $crate::config::from_lookup($section, prefix, lookup)
            }

            #[doc = concat!(
                "Reads the `[", $section, "]` table of a TOML document: \
                 [`ConfigError::Syntax`](crate::ConfigError::Syntax) when it does not parse, else \
                 a [`ConfigError`](crate::ConfigError) naming the key of a missing table, an \
                 unknown key (with the known ones) or a value that does not read."
            )]
            pub fn from_toml_str(document: &str) -> Result<Self, $crate::ConfigError> {
                $crate::config::from_toml_str($section, document)
            }

            /// As [`from_toml_str`](Self::from_toml_str), from a file
            /// ([`ConfigError::Read`](crate::ConfigError::Read) when it cannot be read).
            pub fn from_toml_file(
                path: impl AsRef<std::path::Path>,
            ) -> Result<Self, $crate::ConfigError> {
                $crate::config::from_toml_file($section, path.as_ref())
            }
        }
    };
}
pub(crate) use section_constructors;

/// Reads `T` from the variables `{prefix}{FIELD}` (each field name of `T` in upper case) through
/// `lookup`; empty values count as unset. Errors name the key as `section.field`.
pub(crate) fn from_lookup<T: DeserializeOwned>(
    section: &str,
    prefix: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<T, ConfigError> {
    let vars = field_names::<T>().iter().filter_map(|name| {
        let value = lookup(&format!("{prefix}{}", name.to_ascii_uppercase()))?;
        (!value.is_empty()).then_some((*name, EnvValue(value)))
    });
    let map = value::MapDeserializer::<_, value::Error>::new(vars);
    deserialize(section, map, |e| e.to_string())
}

/// Reads `T` from the `[section]` table of a TOML document.
pub(crate) fn from_toml_str<T: DeserializeOwned>(
    section: &str,
    document: &str,
) -> Result<T, ConfigError> {
    let mut doc: toml::Table = toml::from_str(document).map_err(ConfigError::Syntax)?;
    match doc.remove(section) {
        Some(toml::Value::Table(table)) => deserialize(section, table, |e| e.message().to_owned()),
        Some(other) => Err(ConfigError::invalid(
            section,
            format!("expected a table `[{section}]`"),
            &other.to_string(),
        )),
        None => Err(ConfigError::missing(
            section,
            format!("add a `[{section}]` table to the configuration"),
        )),
    }
}

/// Reads `T` from the `[section]` table of a TOML file.
pub(crate) fn from_toml_file<T: DeserializeOwned>(
    section: &str,
    path: &Path,
) -> Result<T, ConfigError> {
    let document = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    from_toml_str(section, &document)
}

/// Deserializes `T`, turning an error into a [`ConfigError`] on the key path it happened at.
/// `message` gives the error's text alone (a TOML error's `Display` would quote the document).
fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
    section: &str,
    from: D,
    message: impl Fn(&D::Error) -> String,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(from).map_err(|e| {
        let fields = field_names::<T>();
        let name = match e.path().iter().next_back() {
            Some(serde_path_to_error::Segment::Map { key }) => Some(key.as_str()),
            _ => None,
        };
        // serde names the primitive types as Rust does; say it for whoever writes the file.
        let reason = message(e.inner())
            .replace("expected u64", "expected a whole number of 0 or more")
            .replace("expected f64", "expected a number");
        match name {
            Some(name) if !fields.contains(&name) => ConfigError::Unknown {
                key: format!("{section}.{name}"),
                expected: fields.join(", "),
            },
            Some(name) => ConfigError::rejected(format!("{section}.{name}"), reason),
            // Errors of the whole table, such as a key given under its old name and its new.
            None => ConfigError::rejected(section, reason),
        }
    })
}

/// The field names of a struct `T` (aliases included), as its derived `Deserialize` gives them
/// to `deserialize_struct`: the keys looked up in the environment and listed for unknown ones.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);

    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = value::Error;

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _visitor: V,
        ) -> Result<V::Value, value::Error> {
            *self.0 = fields;
            Err(de::Error::custom("only the field names were asked for"))
        }

        fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, value::Error> {
            Err(de::Error::custom("not a struct"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
            option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
            ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// An environment variable's value: text that reads as whatever type its key asks for (a
/// number, `true`/`false`/`1`/`0`/`yes`/`no`, a string).
struct EnvValue(String);

impl IntoDeserializer<'_, value::Error> for EnvValue {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

/// `deserialize_*` methods that parse the text as a number of their type.
macro_rules! env_numbers {
    ($($method:ident $visit:ident $ty:ty),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, value::Error> {
            match self.0.trim().parse::<$ty>() {
                Ok(n) => visitor.$visit(n),
                Err(_) => Err(de::Error::invalid_value(de::Unexpected::Str(&self.0), &visitor)),
            }
        }
    )*};
}

impl<'de> Deserializer<'de> for EnvValue {
    type Error = value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, value::Error> {
        visitor.visit_string(self.0)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, value::Error> {
        match self.0.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => visitor.visit_bool(true),
            "false" | "0" | "no" => visitor.visit_bool(false),
            _ => Err(de::Error::invalid_value(
                de::Unexpected::Str(&self.0),
                &"true or false",
            )),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, value::Error> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, value::Error> {
        visitor.visit_newtype_struct(self)
    }

    env_numbers!(deserialize_i64 visit_i64 i64, deserialize_u64 visit_u64 u64,
        deserialize_u32 visit_u32 u32, deserialize_f64 visit_f64 f64);

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u128 f32 char str string bytes byte_buf unit unit_struct seq
        tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// Reads an optional duration in the outbox's human format (`500ms`, `10s`, `5m`, `7d`), or a
/// number of seconds (so that the old `timeout_secs = 10` still reads); use with
/// `#[serde(default, deserialize_with = "crate::config::duration")]`.
pub(crate) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct Human;

    impl Visitor<'_> for Human {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as \"500ms\", \"10s\", \"5m\" or \"7d\"")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            outbox::duration::parse(v).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            self.visit_str(&v.to_string())
        }
    }

    d.deserialize_any(Human).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Secret;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Section {
        base_url: Option<String>,
        api_key: Option<Secret>,
        #[serde(default, deserialize_with = "duration", alias = "timeout_secs")]
        timeout: Option<Duration>,
        flag: Option<bool>,
        batch: Option<u64>,
    }

    fn env(vars: &[(&str, &str)]) -> Result<Section, ConfigError> {
        from_lookup("email", "P_", |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        })
    }

    #[test]
    fn env_values_read_as_their_types_with_the_prefix_and_empty_counts_as_unset() {
        let s = env(&[
            ("P_BASE_URL", "http://x"),
            ("P_API_KEY", ""),
            ("P_TIMEOUT", "2500ms"),
            ("P_FLAG", "yes"),
            ("P_BATCH", " 20 "),
            ("P_OTHER", "ignored"),
        ])
        .unwrap();
        assert_eq!(s.base_url.as_deref(), Some("http://x"));
        assert!(s.api_key.is_none());
        assert_eq!(s.timeout, Some(Duration::from_millis(2500)));
        assert_eq!((s.flag, s.batch), (Some(true), Some(20)));
        let old = env(&[("P_TIMEOUT_SECS", "2.5")]).unwrap();
        assert_eq!(old.timeout, Some(Duration::from_millis(2500)));
    }

    #[test]
    fn env_values_that_do_not_read_name_the_key() {
        let e = env(&[("P_TIMEOUT", "soon")]).unwrap_err();
        assert_eq!(e.key(), Some("email.timeout"));
        assert!(e.to_string().contains("write e.g. 500ms"), "{e}");
        let e = env(&[("P_FLAG", "maybe")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.flag: invalid value: string \"maybe\", expected true or false"
        );
        let e = env(&[("P_BATCH", "-5")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.batch: invalid value: string \"-5\", expected a whole number of 0 or more"
        );
        let e = from_toml_str::<Section>("email", "[email]\nbatch = -5").unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.batch: invalid value: integer `-5`, expected a whole number of 0 or more"
        );
        let e = env(&[("P_TIMEOUT", "1s"), ("P_TIMEOUT_SECS", "1")]).unwrap_err();
        assert_eq!(e.to_string(), "email: duplicate field `timeout`");
    }

    #[test]
    fn toml_types_and_unknown_keys_name_the_key() {
        let s: Section = from_toml_str(
            "email",
            "[email]\ntimeout = '5m'\nflag = true\n[other]\nx = 1",
        )
        .unwrap();
        assert_eq!(s.timeout, Some(Duration::from_secs(300)));
        let s: Section = from_toml_str("email", "[email]\ntimeout_secs = 4").unwrap();
        assert_eq!(s.timeout, Some(Duration::from_secs(4)));
        let e = from_toml_str::<Section>("email", "[email]\nbase_url = 3").unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.base_url: invalid type: integer `3`, expected a string"
        );
        let e = from_toml_str::<Section>("email", "[email]\nbsae_url = 'x'").unwrap_err();
        assert_eq!(
            e.to_string(),
            "email.bsae_url: unknown key; expected one of base_url, api_key, timeout, \
             timeout_secs, flag, batch"
        );
    }

    #[test]
    fn secrets_of_the_wrong_type_are_not_echoed() {
        let e = from_toml_str::<Section>("email", "[email]\napi_key = 12345678\n").unwrap_err();
        assert_eq!(e.key(), Some("email.api_key"));
        assert!(!format!("{e} {e:?}").contains("12345678"), "{e:?}");
    }

    #[test]
    fn a_missing_section_and_bad_syntax_are_reported() {
        let e = from_toml_str::<Section>("search", "[email]\n").unwrap_err();
        assert_eq!(e.key(), Some("search"));
        assert!(matches!(
            from_toml_str::<Section>("search", "[search").unwrap_err(),
            ConfigError::Syntax(_)
        ));
        let e = from_toml_file::<Section>("search", Path::new("no/such/file.toml")).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    }
}
