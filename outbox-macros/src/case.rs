//! Deriving a topic from a type name: `BookingCreated` -> `booking.created`.
//!
//! The name is cut into words, each word is lowercased, and the words are joined with `.`.
//! A new word starts:
//!
//! - at every `_` (which is dropped), so `already_snake_case` -> `already.snake.case`;
//! - at an uppercase letter that follows a lowercase letter or a digit, so
//!   `UserV2Created` -> `user.v2.created` (digits stay with the word before them);
//! - at the last uppercase letter of a run of capitals that is followed by a lowercase letter,
//!   so `HTTPCallFailed` -> `http.call.failed` and `IOError` -> `io.error`.
//!
//! The result is not checked here; `validate` applies the same rules as to a pinned topic.

/// Derives the topic for a type called `type_name`, as written (a raw `r#` prefix is dropped).
pub(crate) fn topic_from_type_name(type_name: &str) -> String {
    let name = type_name.strip_prefix("r#").unwrap_or(type_name);
    let mut words: Vec<String> = Vec::new();
    for segment in name.split('_') {
        split_camel_case(segment, &mut words);
    }
    words.join(".")
}

/// Appends the lowercased words of one `_`-free `segment` to `words`.
fn split_camel_case(segment: &str, words: &mut Vec<String>) {
    let chars: Vec<char> = segment.chars().collect();
    let mut word = String::new();
    for (index, &current) in chars.iter().enumerate() {
        if index > 0 && starts_word(chars[index - 1], current, chars.get(index + 1).copied()) {
            words.push(std::mem::take(&mut word));
        }
        word.extend(current.to_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
}

/// Whether `current`, preceded by `previous` and followed by `next`, begins a new word.
fn starts_word(previous: char, current: char, next: Option<char>) -> bool {
    if !current.is_uppercase() {
        return false;
    }
    let after_word = previous.is_lowercase() || previous.is_numeric();
    let ends_acronym = previous.is_uppercase() && next.is_some_and(char::is_lowercase);
    after_word || ends_acronym
}

#[cfg(test)]
mod tests {
    use super::topic_from_type_name;

    const CASES: &[(&str, &str)] = &[
        ("Booking", "booking"),
        ("BookingCreated", "booking.created"),
        ("PropertyIndexRequested", "property.index.requested"),
        ("HTTPCallFailed", "http.call.failed"),
        ("IOError", "io.error"),
        ("XMLHttpRequest", "xml.http.request"),
        ("UserV2Created", "user.v2.created"),
        ("X509CertIssued", "x509.cert.issued"),
        ("Oauth2", "oauth2"),
        ("HTTP", "http"),
        ("A", "a"),
        ("AB", "ab"),
        ("already_snake_case", "already.snake.case"),
        ("Mixed_CaseName", "mixed.case.name"),
        ("_Leading", "leading"),
        ("Trailing_", "trailing"),
        ("double__underscore", "double.underscore"),
        ("event_2fa_enabled", "event.2fa.enabled"),
        ("lowercase", "lowercase"),
        ("ÜberCreated", "über.created"),
        ("r#Type", "type"),
        ("r#BookingCreated", "booking.created"),
    ];

    #[test]
    fn derives_topics_from_type_names() {
        for &(type_name, expected) in CASES {
            assert_eq!(
                topic_from_type_name(type_name),
                expected,
                "type name: {type_name}"
            );
        }
    }

    #[test]
    fn raw_identifiers_lose_their_prefix() {
        let ident: syn::Ident = syn::parse_str("r#Type").expect("a raw identifier");
        assert_eq!(topic_from_type_name(&ident.to_string()), "type");
    }
}
