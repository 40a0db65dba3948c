//! The header value encoding of the CloudEvents NATS binding: printable ASCII passes, everything
//! else is percent-encoded as UTF-8 bytes; decoding also undoes an RFC 7230 quoted string.

use std::fmt::Write;

/// `value` with space, `"`, `%` and every character outside printable ASCII percent-encoded
/// (upper-case hex), as the binding requires of header values.
pub(crate) fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_ascii_graphic() && c != '"' && c != '%' {
            out.push(c);
        } else {
            let mut bytes = [0u8; 4];
            for b in c.encode_utf8(&mut bytes).bytes() {
                // Writing to a String cannot fail.
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// A header value read back: a double-quoted value unquoted (backslash escapes included), then
/// one round of percent-decoding. `None` when an escape is cut short, is not hex, or the bytes
/// are not UTF-8.
pub(crate) fn decode(value: &str) -> Option<String> {
    let value = value.trim();
    let unquoted;
    let value = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                out.push(if c == '\\' { chars.next()? } else { c });
            }
            unquoted = out;
            unquoted.as_str()
        }
        None => value,
    };
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail.get(..2)?;
            let hex = std::str::from_utf8(hex).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::{decode, encode};

    #[test]
    fn the_bindings_example_round_trips() {
        let value = "Euro \u{20AC} \u{1F600}";
        assert_eq!(encode(value), "Euro%20%E2%82%AC%20%F0%9F%98%80");
        assert_eq!(decode(&encode(value)).as_deref(), Some(value));
    }

    #[test]
    fn percent_and_quote_are_encoded() {
        assert_eq!(encode("a%b\"c"), "a%25b%22c");
        assert_eq!(encode("/orders/v1?x=1"), "/orders/v1?x=1");
    }

    #[test]
    fn decoding_accepts_lower_case_and_quoted_values() {
        assert_eq!(decode("a%2fb").as_deref(), Some("a/b"));
        assert_eq!(decode("\"a b\\\"c\"").as_deref(), Some("a b\"c"));
    }

    #[test]
    fn decoding_refuses_bad_escapes_and_overlong_utf8() {
        assert_eq!(decode("a%2"), None);
        assert_eq!(decode("a%zz"), None);
        assert_eq!(decode("%C0%A0"), None);
        assert_eq!(decode("\"a\\\""), None);
    }
}
