//! Checks on the annotated item and on the topic, each error pointing at what must change.

use proc_macro2::Span;
use syn::{Ident, Item, LitStr};

use crate::case;

/// The longest topic accepted, in characters. `outbox` stores topics with the same limit.
pub(crate) const MAX_TOPIC_LEN: usize = 64;

/// The characters a topic may use, as said in error messages.
const ALLOWED: &str = "topics use lowercase letters, digits, `.`, `_` and `-`";

/// How to pin a topic, as said in error messages about a derived one.
const PIN: &str = "pin a topic with `#[outbox_event(topic = \"...\")]`";

/// Returns the name of the event type, or why `item` cannot be an event.
///
/// Structs (named, tuple and unit) and enums without generic parameters are accepted.
pub(crate) fn event_type(item: &Item) -> syn::Result<&Ident> {
    let (ident, generics) = match item {
        Item::Struct(item) => (&item.ident, &item.generics),
        Item::Enum(item) => (&item.ident, &item.generics),
        Item::Union(item) => {
            return Err(syn::Error::new_spanned(
                item.union_token,
                "`#[outbox_event]` does not support unions: payloads are serialized with serde; \
                 use a struct",
            ));
        }
        other => return Err(not_a_type(other)),
    };
    if !generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            generics,
            "`#[outbox_event]` does not support generic types: a topic names one concrete \
             payload type; define a concrete struct per event",
        ));
    }
    Ok(ident)
}

/// The error for an item that is not a type at all, pointing at its keyword where it has one.
fn not_a_type(item: &Item) -> syn::Error {
    let span = match item {
        Item::Fn(item) => item.sig.fn_token.span,
        Item::Trait(item) => item.trait_token.span,
        Item::Impl(item) => item.impl_token.span,
        Item::Type(item) => item.type_token.span,
        Item::Mod(item) => item.mod_token.span,
        Item::Const(item) => item.const_token.span,
        Item::Static(item) => item.static_token.span,
        _ => Span::call_site(),
    };
    syn::Error::new(
        span,
        "`#[outbox_event]` goes on a struct or an enum: the payload type of an event",
    )
}

/// Returns the topic of the event type `ident`: the pinned one if given, else a derived one.
pub(crate) fn topic(pinned: Option<&LitStr>, ident: &Ident) -> syn::Result<String> {
    match pinned {
        Some(lit) => pinned_topic(lit),
        None => derived_topic(ident),
    }
}

/// Returns the version of the event (1 when not given), or why `previous` cannot be used.
///
/// `previous` names an older version, so it needs `version = 2` or above.
pub(crate) fn version(
    version: Option<&syn::LitInt>,
    previous: Option<&syn::Type>,
) -> syn::Result<syn::LitInt> {
    let number = match version {
        Some(lit) => lit.base10_parse::<u32>()?,
        None => 1,
    };
    if let (Some(previous), true) = (previous, number < 2) {
        return Err(syn::Error::new_spanned(
            previous,
            "`previous` names the type of an older version, so this type needs `version = 2` \
             or above: write `version = 2, previous = ...`",
        ));
    }
    Ok(syn::LitInt::new(&format!("{number}u32"), Span::call_site()))
}

/// What is wrong with a topic.
#[derive(Debug, PartialEq, Eq)]
enum Problem {
    Empty,
    TooLong(usize),
    BadChar(char),
}

/// Checks `topic` against the rules shared with `outbox`.
fn check(topic: &str) -> Result<(), Problem> {
    if topic.is_empty() {
        return Err(Problem::Empty);
    }
    let len = topic.chars().count();
    if len > MAX_TOPIC_LEN {
        return Err(Problem::TooLong(len));
    }
    match topic.chars().find(|&c| !is_allowed(c)) {
        Some(c) => Err(Problem::BadChar(c)),
        None => Ok(()),
    }
}

/// Whether `c` may appear in a topic: `[a-z0-9._-]`.
fn is_allowed(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-')
}

/// Checks a topic written as `topic = "..."`, pointing errors at the literal.
fn pinned_topic(lit: &LitStr) -> syn::Result<String> {
    let topic = lit.value();
    let message = match check(&topic) {
        Ok(()) => return Ok(topic),
        Err(Problem::Empty) => "topic must not be empty; write \
             `#[outbox_event(topic = \"booking.created\")]` or remove `topic` to derive it from \
             the type name"
            .to_owned(),
        Err(Problem::TooLong(len)) => format!(
            "topic is {len} characters long, over the limit of {MAX_TOPIC_LEN}; shorten it to \
             at most {MAX_TOPIC_LEN} characters"
        ),
        Err(Problem::BadChar(c)) => {
            let mut message = format!("topic `{topic}` contains {c:?}; {ALLOWED}");
            if let Some(suggestion) = suggest(&topic) {
                message.push_str(&format!(": write `topic = \"{suggestion}\"`"));
            }
            message
        }
    };
    Err(syn::Error::new(lit.span(), message))
}

/// A valid spelling of `topic` when only case and ASCII separators are wrong, e.g.
/// `Booking Created` -> `booking.created`.
fn suggest(topic: &str) -> Option<String> {
    let suggestion: String = topic
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii() && !is_allowed(c) {
                '.'
            } else {
                c
            }
        })
        .collect();
    check(&suggestion).is_ok().then_some(suggestion)
}

/// Derives the topic from the type name and checks it, pointing errors at the name.
fn derived_topic(ident: &Ident) -> syn::Result<String> {
    let name = ident.to_string();
    let topic = case::topic_from_type_name(&name);
    let message = match check(&topic) {
        Ok(()) => return Ok(topic),
        Err(Problem::Empty) => format!("cannot derive a topic from the type name `{name}`; {PIN}"),
        Err(Problem::TooLong(len)) => format!(
            "the topic derived from the type name, `{topic}`, is {len} characters long, over \
             the limit of {MAX_TOPIC_LEN}; {PIN}"
        ),
        Err(Problem::BadChar(c)) => format!(
            "the topic derived from the type name, `{topic}`, contains {c:?}; {ALLOWED}: {PIN}"
        ),
    };
    Err(syn::Error::new(ident.span(), message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_rules() {
        let cases: &[(&str, Result<(), Problem>)] = &[
            ("booking.created", Ok(())),
            ("a-b_c.0", Ok(())),
            ("", Err(Problem::Empty)),
            (&"a".repeat(64), Ok(())),
            (&"a".repeat(65), Err(Problem::TooLong(65))),
            ("Booking.created", Err(Problem::BadChar('B'))),
            ("booking created", Err(Problem::BadChar(' '))),
            ("über", Err(Problem::BadChar('ü'))),
            ("booking/created", Err(Problem::BadChar('/'))),
        ];
        for (topic, expected) in cases {
            assert_eq!(&check(topic), expected, "topic: {topic:?}");
        }
    }

    #[test]
    fn suggestions_fix_case_and_separators_only() {
        let cases = [
            ("Booking.Created", Some("booking.created")),
            ("booking created", Some("booking.created")),
            (" booking.created ", Some("booking.created")),
            ("billing/Invoice:paid", Some("billing.invoice.paid")),
            ("über.created", None),
        ];
        for (topic, expected) in cases {
            assert_eq!(suggest(topic).as_deref(), expected, "topic: {topic:?}");
        }
    }

    #[test]
    fn items_that_cannot_be_events() {
        let cases = [
            ("union U { a: u8 }", "does not support unions"),
            ("struct S<T> { t: T }", "does not support generic types"),
            (
                "struct S<'a> { t: &'a str }",
                "does not support generic types",
            ),
            (
                "enum E<const N: usize> { A }",
                "does not support generic types",
            ),
            ("fn f() {}", "goes on a struct or an enum"),
        ];
        for (source, expected) in cases {
            let item: Item = syn::parse_str(source).expect("valid item");
            let error = event_type(&item).expect_err(source).to_string();
            assert!(error.contains(expected), "{source}: {error}");
        }
    }

    #[test]
    fn derived_topics_are_checked_too() {
        let ident = Ident::new("Ünïcode", Span::call_site());
        let error = topic(None, &ident)
            .expect_err("non-ASCII topic")
            .to_string();
        assert!(error.contains("`ünïcode`, contains 'ü'"), "{error}");
        assert!(error.contains("topic = \"...\""), "{error}");
    }
}
