//! Parsing of the attribute arguments: `#[outbox_event(topic = "...", crate = "...")]`.
//!
//! Every value is kept with its span so that later checks can point at what the user wrote.

use proc_macro2::TokenStream;
use syn::meta::ParseNestedMeta;
use syn::parse::Parser;
use syn::{Expr, ExprLit, Lit, LitStr, Path};

/// The arguments of one `#[outbox_event(...)]`, each `None` when not given.
#[derive(Default)]
pub(crate) struct Args {
    /// `topic = "..."`: the pinned topic, as written.
    pub(crate) topic: Option<LitStr>,
    /// `crate = "..."`: the path to `outbox`, parsed from the string literal.
    pub(crate) krate: Option<Path>,
    /// `idempotency_key = "field"`: the payload field whose value is the idempotency key.
    pub(crate) idempotency_key: Option<syn::Ident>,
    /// `ordering_key = "field"`: the payload field whose value is the ordering key.
    pub(crate) ordering_key: Option<syn::Ident>,
    /// `dead_releases_key`: a dead message of this event lets later ones of its key go on.
    pub(crate) dead_releases_key: Option<Path>,
    /// `version = N`: the version of the event's shape, as written.
    pub(crate) version: Option<syn::LitInt>,
    /// `previous = Type`: the type of the version before this one.
    pub(crate) previous: Option<syn::Type>,
    /// `retain = "180d"`: how long delivered events stay in the log, in seconds, with the
    /// literal the user wrote.
    pub(crate) retain: Option<(u64, LitStr)>,
}

/// Parses the tokens between the parentheses of `#[outbox_event(...)]`.
pub(crate) fn parse(args: TokenStream) -> syn::Result<Args> {
    let mut parsed = Args::default();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("topic") {
            let topic = string_value(&meta, "topic", "booking.created")?;
            set_once(&meta, "topic", &mut parsed.topic, topic)
        } else if meta.path.is_ident("idempotency_key") {
            let field = field_value(&meta, "idempotency_key")?;
            set_once(&meta, "idempotency_key", &mut parsed.idempotency_key, field)
        } else if meta.path.is_ident("ordering_key") {
            let field = field_value(&meta, "ordering_key")?;
            set_once(&meta, "ordering_key", &mut parsed.ordering_key, field)
        } else if meta.path.is_ident("dead_releases_key") {
            if !meta.input.is_empty() && !meta.input.peek(syn::Token![,]) {
                return Err(syn::Error::new_spanned(
                    &meta.path,
                    "`dead_releases_key` takes no value: write `dead_releases_key`",
                ));
            }
            let path = meta.path.clone();
            set_once(
                &meta,
                "dead_releases_key",
                &mut parsed.dead_releases_key,
                path,
            )
        } else if meta.path.is_ident("version") {
            let version = version_value(&meta)?;
            set_once(&meta, "version", &mut parsed.version, version)
        } else if meta.path.is_ident("previous") {
            let usage = "`previous` names the type of the previous version: write \
                         `previous = BookingCreatedV1`";
            if meta.input.is_empty() || meta.input.peek(syn::Token![,]) {
                return Err(syn::Error::new_spanned(&meta.path, usage));
            }
            let ty = meta.value()?.parse::<syn::Type>()?;
            set_once(&meta, "previous", &mut parsed.previous, ty)
        } else if meta.path.is_ident("retain") {
            let lit = string_value(&meta, "retain", "180d")?;
            let secs = retain_secs(&lit)?;
            set_once(&meta, "retain", &mut parsed.retain, (secs, lit))
        } else if meta.path.is_ident("crate") {
            let lit = string_value(&meta, "crate", "::outbox")?;
            let path = parse_path(&lit)?;
            set_once(&meta, "crate", &mut parsed.krate, path)
        } else {
            Err(syn::Error::new_spanned(
                &meta.path,
                format_args!(
                    "unknown key `{}`; valid keys are `topic`, `idempotency_key`, `ordering_key`, `dead_releases_key`, `version`, `previous`, `retain` and `crate`",
                    path_to_string(&meta.path),
                ),
            ))
        }
    });
    parser.parse2(args)?;
    Ok(parsed)
}

/// Reads `version = N`: an integer literal from 1 to `i32::MAX` (the column's range).
fn version_value(meta: &ParseNestedMeta<'_>) -> syn::Result<syn::LitInt> {
    let usage = "`version` takes a whole number from 1: write `version = 2`";
    if meta.input.is_empty() || meta.input.peek(syn::Token![,]) {
        return Err(syn::Error::new_spanned(&meta.path, usage));
    }
    let mut expr = meta.value()?.parse::<Expr>()?;
    while let Expr::Group(group) = expr {
        expr = *group.expr;
    }
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => match lit.base10_parse::<i32>() {
            Ok(n) if n >= 1 => Ok(lit),
            _ => Err(syn::Error::new(lit.span(), usage)),
        },
        other => Err(syn::Error::new_spanned(other, usage)),
    }
}

/// The seconds of a `retain` window: a whole number followed by `d` (days), `h` (hours), `m`
/// (minutes) or `s` (seconds), e.g. `180d`; at least a minute and at most 100 years.
fn retain_secs(lit: &LitStr) -> syn::Result<u64> {
    let usage = || {
        syn::Error::new(
            lit.span(),
            format_args!(
                "`retain` takes a whole number and a unit, `d`, `h`, `m` or `s`, from one minute \
                 to 100 years: write `retain = \"180d\"`; `{}` is not one",
                lit.value()
            ),
        )
    };
    let text = lit.value();
    let unit = text.chars().last().ok_or_else(usage)?;
    let scale = match unit {
        'd' => 86_400,
        'h' => 3_600,
        'm' => 60,
        's' => 1,
        _ => return Err(usage()),
    };
    let number: u64 = text[..text.len() - 1].parse().map_err(|_| usage())?;
    match number.checked_mul(scale) {
        Some(secs) if (60..=100 * 365 * 86_400).contains(&secs) => Ok(secs),
        _ => Err(usage()),
    }
}

/// Reads `key = "field"`: a string literal that names a field of the payload.
fn field_value(meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<syn::Ident> {
    let lit = string_value(meta, key, "booking_id")?;
    let field = lit.parse::<syn::Ident>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format_args!(
                "`{key}` names a field of the payload, e.g. `{key} = \"booking_id\"`; \
                 `{}` is not a field name",
                lit.value()
            ),
        )
    })?;
    Ok(syn::Ident::new(&field.to_string(), lit.span()))
}

/// Reads the `= "..."` after `key`, insisting on a string literal.
fn string_value(meta: &ParseNestedMeta<'_>, key: &str, example: &str) -> syn::Result<LitStr> {
    let usage = format!("`{key}` takes a string literal: write `{key} = \"{example}\"`");
    if meta.input.is_empty() || meta.input.peek(syn::Token![,]) {
        return Err(syn::Error::new_spanned(&meta.path, usage));
    }
    let value = meta.value()?;
    let mut expr = value.parse::<Expr>()?;
    // A `$topic:literal` of a `macro_rules!` arrives wrapped in an invisible group.
    while let Expr::Group(group) = expr {
        expr = *group.expr;
    }
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(lit),
        other => Err(syn::Error::new_spanned(other, usage)),
    }
}

/// Parses the path held by the string literal of `crate = "..."`.
fn parse_path(lit: &LitStr) -> syn::Result<Path> {
    lit.parse::<Path>().map_err(|_| {
        syn::Error::new(
            lit.span(),
            format_args!(
                "`crate` must name the path to `outbox`, e.g. `crate = \"::outbox\"` \
                 or `crate = \"::my_reexport::outbox\"`; `{}` is not a path",
                lit.value(),
            ),
        )
    })
}

/// Stores `value` into `slot`, or points at the repeated key if `slot` is already taken.
fn set_once<T>(
    meta: &ParseNestedMeta<'_>,
    key: &str,
    slot: &mut Option<T>,
    value: T,
) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new_spanned(
            &meta.path,
            format_args!("`{key}` specified more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

/// Renders a key path the way the user wrote it, e.g. `foo` or `foo::bar`.
fn path_to_string(path: &Path) -> String {
    let segments: Vec<String> = path
        .segments
        .iter()
        .map(|segment| segment.ident.to_string())
        .collect();
    let joined = segments.join("::");
    if path.leading_colon.is_some() {
        format!("::{joined}")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn error_of(args: TokenStream) -> String {
        match parse(args) {
            Ok(_) => panic!("expected an error"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn empty_arguments_leave_everything_unset() {
        let args = parse(TokenStream::new()).expect("empty arguments parse");
        assert!(args.topic.is_none());
        assert!(args.krate.is_none());
    }

    #[test]
    fn both_keys_are_read() {
        let args = parse(quote!(topic = "a.b", crate = "::re::outbox")).expect("valid");
        assert_eq!(args.topic.map(|lit| lit.value()).as_deref(), Some("a.b"));
        let krate = args.krate.expect("crate is set");
        assert_eq!(quote!(#krate).to_string(), quote!(::re::outbox).to_string());
    }

    #[test]
    fn ordering_keys_are_read() {
        let args = parse(quote!(ordering_key = "booking_id", dead_releases_key)).expect("valid");
        assert_eq!(
            args.ordering_key.map(|f| f.to_string()).as_deref(),
            Some("booking_id")
        );
        assert!(args.dead_releases_key.is_some());
        assert_eq!(
            error_of(quote!(dead_releases_key = "yes")),
            "`dead_releases_key` takes no value: write `dead_releases_key`"
        );
        assert_eq!(
            error_of(quote!(ordering_key = "not a field")),
            "`ordering_key` names a field of the payload, e.g. `ordering_key = \"booking_id\"`; \
             `not a field` is not a field name"
        );
    }

    #[test]
    fn versions_are_read() {
        let args = parse(quote!(version = 3, previous = v2::Booking)).expect("valid");
        assert_eq!(args.version.map(|v| v.to_string()).as_deref(), Some("3"));
        let previous = args.previous.expect("previous is set");
        assert_eq!(
            quote!(#previous).to_string(),
            quote!(v2::Booking).to_string()
        );
        for args in [quote!(version = 0), quote!(version = "2"), quote!(version)] {
            assert_eq!(
                error_of(args),
                "`version` takes a whole number from 1: write `version = 2`"
            );
        }
    }

    #[test]
    fn retention_windows_are_read_in_seconds() {
        let args = parse(quote!(retain = "180d")).expect("valid");
        assert_eq!(args.retain.map(|(secs, _)| secs), Some(180 * 86_400));
        let args = parse(quote!(retain = "90m")).expect("valid");
        assert_eq!(args.retain.map(|(secs, _)| secs), Some(5_400));
        for wrong in ["", "d", "10", "10 d", "10w", "-1d", "30s", "101000d"] {
            let message = error_of(quote!(retain = #wrong));
            assert!(
                message.starts_with("`retain` takes a whole number and a unit"),
                "{wrong}: {message}"
            );
        }
    }

    #[test]
    fn a_literal_passed_through_macro_rules_is_read() {
        // What `macro_rules! m { ($t:literal) => { #[outbox_event(topic = $t)] ... } }` hands on.
        let wrapped = proc_macro2::Group::new(proc_macro2::Delimiter::None, quote!("a.b"));
        let args = parse(quote!(topic = #wrapped)).expect("valid");
        assert_eq!(args.topic.map(|lit| lit.value()).as_deref(), Some("a.b"));
        let wrapped = proc_macro2::Group::new(proc_macro2::Delimiter::None, quote!(42));
        assert_eq!(
            error_of(quote!(topic = #wrapped)),
            "`topic` takes a string literal: write `topic = \"booking.created\"`"
        );
    }

    #[test]
    fn mistakes_are_explained() {
        let cases = [
            (
                quote!(topc = "a"),
                "unknown key `topc`; valid keys are `topic`, `idempotency_key`, `ordering_key`, `dead_releases_key`, `version`, `previous`, `retain` and `crate`",
            ),
            (
                quote!(topic = "a", topic = "b"),
                "`topic` specified more than once",
            ),
            (
                quote!(crate = "::a", crate = "::b"),
                "`crate` specified more than once",
            ),
            (
                quote!(topic = booking.created),
                "`topic` takes a string literal: write `topic = \"booking.created\"`",
            ),
            (
                quote!(topic),
                "`topic` takes a string literal: write `topic = \"booking.created\"`",
            ),
            (
                quote!(crate = "not a path"),
                "`crate` must name the path to `outbox`, e.g. `crate = \"::outbox\"` \
                 or `crate = \"::my_reexport::outbox\"`; `not a path` is not a path",
            ),
        ];
        for (args, expected) in cases {
            assert_eq!(error_of(args.clone()), expected, "arguments: {args}");
        }
    }
}
