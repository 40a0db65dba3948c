//! A CloudEvent read from a NATS message: binary mode (`ce-` headers, the payload is the data)
//! or structured mode (`Content-Type: application/cloudevents+json`, one JSON document).

use std::collections::HashMap;

use async_nats::HeaderMap;
use chrono::DateTime;
use serde_json::value::RawValue;

use super::{
    attributes, percent, CloudEvent, CloudEventError, ContentMode, NATS_PREFIX, STRUCTURED_JSON,
};

/// A CloudEvent as received.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) event: CloudEvent,
    /// The data when it is not the payload as received (structured mode).
    pub(crate) data: Option<Vec<u8>>,
    /// The `traceparent` attribute, when the event carries one.
    pub(crate) traceparent: Option<String>,
    /// The `tracestate` attribute.
    pub(crate) tracestate: Option<String>,
}

/// The value of header `name`, whatever the case of its name (NATS header names are
/// case-insensitive).
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| AsRef::<str>::as_ref(n).eq_ignore_ascii_case(name))
        .and_then(|(_, values)| values.first())
        .map(|v| v.as_str())
}

/// The CloudEvent in a message with `headers` and `payload`; `None` when the message has no
/// CloudEvents headers and is not a structured-mode CloudEvent.
pub(crate) fn from_nats(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Option<Result<Received, CloudEventError>> {
    let headers = headers?;
    if let Some(content_type) = header(headers, "content-type") {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        if media == STRUCTURED_JSON || media == "application/cloudevents" {
            return Some(structured(payload));
        }
        if media.starts_with("application/cloudevents") {
            return Some(Err(CloudEventError::UnsupportedFormat {
                content_type: content_type.chars().take(100).collect(),
            }));
        }
    }
    let attrs: HashMap<String, &str> = headers
        .iter()
        .filter_map(|(name, values)| {
            let name = AsRef::<str>::as_ref(name).to_ascii_lowercase();
            let attribute = name.strip_prefix(NATS_PREFIX)?.to_string();
            Some((attribute, values.first()?.as_str()))
        })
        .collect();
    if attrs.is_empty() {
        return None;
    }
    Some(binary(&attrs, headers))
}

fn binary(attrs: &HashMap<String, &str>, headers: &HeaderMap) -> Result<Received, CloudEventError> {
    let get = |name: &str| match attrs.get(name) {
        None => Ok(None),
        Some(raw) => {
            percent::decode(raw)
                .map(Some)
                .ok_or_else(|| CloudEventError::InvalidAttribute {
                    attribute: name.to_string(),
                    reason: format!(
                        "header `{NATS_PREFIX}{name}` is not a percent-encoded UTF-8 value: `{}`",
                        raw.chars().take(100).collect::<String>()
                    ),
                })
        }
    };
    let mut event = attributes_from(&get, ContentMode::Binary)?;
    if event.datacontenttype.is_none() {
        event.datacontenttype = header(headers, "content-type").map(str::to_string);
    }
    Ok(Received {
        event,
        data: None,
        traceparent: get(attributes::TRACEPARENT)?,
        tracestate: get(attributes::TRACESTATE)?,
    })
}

fn structured(payload: &[u8]) -> Result<Received, CloudEventError> {
    let members: HashMap<String, &RawValue> =
        serde_json::from_slice(payload).map_err(CloudEventError::NotJson)?;
    let get = |name: &str| match members.get(name) {
        None => Ok(None),
        Some(raw) => serde_json::from_str::<Option<String>>(raw.get()).map_err(|_| {
            CloudEventError::InvalidAttribute {
                attribute: name.to_string(),
                reason: format!(
                    "must be a JSON string, got `{}`",
                    raw.get().chars().take(100).collect::<String>()
                ),
            }
        }),
    };
    let event = attributes_from(&get, ContentMode::Structured)?;
    if members.contains_key("data_base64") {
        return Err(CloudEventError::BinaryData);
    }
    let data = members
        .get("data")
        .map_or_else(|| b"null".to_vec(), |raw| raw.get().as_bytes().to_vec());
    Ok(Received {
        event,
        data: Some(data),
        traceparent: get(attributes::TRACEPARENT)?,
        tracestate: get(attributes::TRACESTATE)?,
    })
}

/// The context attributes, `get` giving each one's value: the required ones checked in the
/// order of [`attributes::REQUIRED`], the specversion 1.x, the time RFC 3339.
fn attributes_from(
    get: &dyn Fn(&str) -> Result<Option<String>, CloudEventError>,
    mode: ContentMode,
) -> Result<CloudEvent, CloudEventError> {
    let required = |attribute: &'static str| {
        get(attribute)?
            .filter(|v| !v.is_empty())
            .ok_or(CloudEventError::MissingAttribute { attribute })
    };
    let specversion = required(attributes::SPECVERSION)?;
    if specversion != "1" && !specversion.starts_with("1.") {
        return Err(CloudEventError::UnsupportedSpecVersion {
            got: specversion.chars().take(100).collect(),
        });
    }
    let id = required(attributes::ID)?;
    let source = required(attributes::SOURCE)?;
    let ty = required(attributes::TYPE)?;
    let time = match get(attributes::TIME)? {
        None => None,
        Some(t) => Some(
            DateTime::parse_from_rfc3339(&t)
                .map_err(|e| CloudEventError::InvalidAttribute {
                    attribute: attributes::TIME.to_string(),
                    reason: format!(
                        "not an RFC 3339 timestamp ({e}): `{}`",
                        t.chars().take(100).collect::<String>()
                    ),
                })?
                .to_utc(),
        ),
    };
    let dataversion = match get(attributes::DATAVERSION)? {
        None => None,
        Some(v) => Some(v.parse::<u32>().ok().filter(|v| *v >= 1).ok_or_else(|| {
            CloudEventError::InvalidAttribute {
                attribute: attributes::DATAVERSION.to_string(),
                reason: format!(
                    "not a version (an integer from 1): `{}`",
                    v.chars().take(100).collect::<String>()
                ),
            }
        })?),
    };
    Ok(CloudEvent {
        specversion,
        id,
        source,
        ty,
        time,
        datacontenttype: get(attributes::DATACONTENTTYPE)?,
        dataversion,
        mode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.insert(*n, *v);
        }
        h
    }

    const FULL: [(&str, &str); 5] = [
        ("ce-specversion", "1.0"),
        ("ce-id", "A-1"),
        ("ce-source", "/orders%20eu"),
        ("ce-type", "order.placed"),
        ("ce-time", "2024-05-01T10:00:00Z"),
    ];

    #[test]
    fn binary_mode_reads_every_attribute_and_keeps_the_payload() {
        let got = from_nats(Some(&headers(&FULL)), b"{}").unwrap().unwrap();
        assert_eq!(got.event.id, "A-1");
        assert_eq!(got.event.source, "/orders eu");
        assert_eq!(got.event.ty, "order.placed");
        assert_eq!(got.event.mode, ContentMode::Binary);
        assert!(got.event.time.is_some());
        assert_eq!(got.data, None);
    }

    #[test]
    fn header_names_are_read_whatever_their_case() {
        let upper: Vec<_> = FULL
            .iter()
            .map(|(n, v)| (n.replace("ce-", "Ce-"), *v))
            .collect();
        let pairs: Vec<_> = upper.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        assert!(from_nats(Some(&headers(&pairs)), b"{}").unwrap().is_ok());
    }

    #[test]
    fn no_cloudevents_headers_is_no_cloudevent() {
        assert!(from_nats(Some(&headers(&[("Outbox-Topic", "t")])), b"{}").is_none());
        assert!(from_nats(None, b"{}").is_none());
    }

    #[test]
    fn each_missing_required_attribute_is_named() {
        for missing in attributes::REQUIRED {
            let pairs: Vec<_> = FULL
                .iter()
                .copied()
                .filter(|(n, _)| *n != format!("ce-{missing}"))
                .collect();
            let err = from_nats(Some(&headers(&pairs)), b"{}")
                .unwrap()
                .unwrap_err();
            assert!(
                matches!(err, CloudEventError::MissingAttribute { attribute } if attribute == missing),
                "{err}"
            );
            assert!(err.to_string().contains(&format!("`{missing}`")), "{err}");
        }
    }

    #[test]
    fn other_spec_versions_and_bad_times_are_refused() {
        let mut pairs = FULL;
        pairs[0] = ("ce-specversion", "0.3");
        let err = from_nats(Some(&headers(&pairs)), b"{}")
            .unwrap()
            .unwrap_err();
        assert!(matches!(
            err,
            CloudEventError::UnsupportedSpecVersion { .. }
        ));
        let mut pairs = FULL;
        pairs[4] = ("ce-time", "yesterday");
        let err = from_nats(Some(&headers(&pairs)), b"{}")
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("`time`"), "{err}");
    }

    #[test]
    fn structured_mode_takes_data_unchanged() {
        let body =
            br#"{"specversion":"1.0","id":"7","source":"/s","type":"t","data":{"b": 1, "a":[2]}}"#;
        let h = headers(&[(
            "Content-Type",
            "application/cloudevents+json; charset=utf-8",
        )]);
        let got = from_nats(Some(&h), body).unwrap().unwrap();
        assert_eq!(got.event.mode, ContentMode::Structured);
        assert_eq!(got.data.as_deref(), Some(&br#"{"b": 1, "a":[2]}"#[..]));
    }

    #[test]
    fn structured_mode_refusals() {
        let h = headers(&[("content-type", "application/cloudevents+json")]);
        let refused = |body: &[u8]| from_nats(Some(&h), body).unwrap().unwrap_err();
        assert!(matches!(refused(b"[1]"), CloudEventError::NotJson(_)));
        assert!(matches!(
            refused(br#"{"specversion":"1.0","id":7,"source":"/s","type":"t"}"#),
            CloudEventError::InvalidAttribute { .. }
        ));
        assert!(matches!(
            refused(
                br#"{"specversion":"1.0","id":"7","source":"/s","type":"t","data_base64":"e30="}"#
            ),
            CloudEventError::BinaryData
        ));
        let avro = headers(&[("content-type", "application/cloudevents+avro")]);
        assert!(matches!(
            from_nats(Some(&avro), b"").unwrap().unwrap_err(),
            CloudEventError::UnsupportedFormat { .. }
        ));
    }
}
