//! The generated code: the `Event` impl and the registration of the event type.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::ext::IdentExt;
use syn::{Item, LitStr, Path};

use crate::{attr, validate};

/// Expands `#[outbox_event(args)] input`.
///
/// On success the original item is emitted unchanged, followed by
///
/// ```text
/// #[automatically_derived]
/// impl ::outbox::Event for BookingCreated {
///     const TOPIC: &'static str = "booking.created";
/// }
/// const _: () = {
///     ::outbox::__private::inventory::submit! {
///         ::outbox::__private::EventDescriptor::__new(
///             "booking.created",
///             1u32,
///             ::core::concat!(::core::module_path!(), "::", "BookingCreated"),
///         )
///     }
/// };
/// ```
///
/// Mistakes in the arguments and in the item are all reported, not only the first one.
pub(crate) fn outbox_event(args: TokenStream, input: TokenStream) -> syn::Result<TokenStream> {
    let args = attr::parse(args);
    let event_type =
        syn::parse2::<Item>(input.clone()).and_then(|item| validate::event_type(&item).cloned());
    let (args, ident) = both(args, event_type)?;
    let topic = validate::topic(args.topic.as_ref(), &ident)?;

    let krate = args.krate.unwrap_or_else(default_crate_path);
    let topic = LitStr::new(&topic, Span::call_site());
    let type_name = LitStr::new(&ident.unraw().to_string(), ident.span());
    // The key method is spanned on the field name the user wrote, so a missing field or a
    // field without `Display` is reported there.
    let idempotency_key = args.idempotency_key.map(|field| {
        quote::quote_spanned! {field.span()=>
            fn idempotency_key(&self) -> ::core::option::Option<::std::string::String> {
                ::core::option::Option::Some(::std::string::ToString::to_string(&self.#field))
            }
        }
    });

    let ordering_key = args.ordering_key.map(|field| {
        quote::quote_spanned! {field.span()=>
            fn ordering_key(&self) -> ::core::option::Option<::std::string::String> {
                ::core::option::Option::Some(::std::string::ToString::to_string(&self.#field))
            }
        }
    });
    let dead_releases_key = args.dead_releases_key.map(|path| {
        quote::quote_spanned! {syn::spanned::Spanned::span(&path)=>
            const DEAD_RELEASES_KEY: bool = true;
        }
    });
    let (retain, retain_descriptor) = match &args.retain {
        Some((secs, lit)) => (
            Some(quote::quote_spanned! {lit.span()=>
                const RETAIN: ::core::option::Option<::core::time::Duration> =
                    ::core::option::Option::Some(::core::time::Duration::from_secs(#secs));
            }),
            Some(quote!(.__retain(#secs))),
        ),
        None => (None, None),
    };
    let version_number = validate::version(args.version.as_ref(), args.previous.as_ref())?;
    let version = args.version.as_ref().map(|lit| {
        quote::quote_spanned! {lit.span()=>
            const VERSION: u32 = #lit;
        }
    });
    let (decode, previous_checks) = match &args.previous {
        Some(previous) => previous_version(&krate, &ident, previous),
        None => (None, None),
    };

    Ok(quote! {
        #input

        #[automatically_derived]
        impl #krate::Event for #ident {
            const TOPIC: &'static str = #topic;
            #idempotency_key
            #ordering_key
            #dead_releases_key
            #version
            #retain
            #decode
        }

        #previous_checks

        const _: () = {
            #krate::__private::inventory::submit! {
                #krate::__private::EventDescriptor::__new(
                    #topic,
                    #version_number,
                    ::core::concat!(::core::module_path!(), "::", #type_name),
                )
                #retain_descriptor
            }
        };
    })
}

/// The decoding of older versions through `previous`, and the constant checks that the
/// previous type is the version just before, of the same topic.
///
/// A payload of this type's version is parsed directly; an older one is decoded by `previous`
/// (recursively down its own chain) and converted with `From`, spanned on the `previous` the
/// user wrote so that a missing `impl From<Previous> for Current` is reported there.
fn previous_version(
    krate: &Path,
    ident: &syn::Ident,
    previous: &syn::Type,
) -> (Option<TokenStream>, Option<TokenStream>) {
    let span = syn::spanned::Spanned::span(previous);
    let from = quote::quote_spanned! {span=>
        |previous: #previous| <Self as ::core::convert::From<#previous>>::from(previous)
    };
    let decode = quote! {
        fn decode_versioned(
            version: u32,
            json: &str,
        ) -> ::core::result::Result<Self, #krate::DecodeError> {
            if version >= <Self as #krate::Event>::VERSION {
                #krate::__private::decode_current::<Self>(version, json)
            } else {
                <#previous as #krate::Event>::decode_versioned(version, json).map(#from)
            }
        }

        fn __versions(out: &mut ::std::vec::Vec<(u32, &'static str)>) {
            out.push((<Self as #krate::Event>::VERSION, ::core::any::type_name::<Self>()));
            <#previous as #krate::Event>::__versions(out);
        }
    };
    let type_names = quote!(
        ::core::stringify!(#ident),
        "` and `",
        ::core::stringify!(#previous)
    );
    let checks = quote::quote_spanned! {span=>
        const _: () = {
            ::core::assert!(
                <#ident as #krate::Event>::VERSION > <#previous as #krate::Event>::VERSION
                    && <#ident as #krate::Event>::VERSION - 1
                        == <#previous as #krate::Event>::VERSION,
                ::core::concat!(
                    "`version` of `", #type_names,
                    "`: the current type's version must be one above its previous type's \
                     (a gap leaves versions that no type decodes); set `version` to the \
                     previous one's plus 1, or name the right `previous`"
                ),
            );
            ::core::assert!(
                #krate::__private::same_topic(
                    <#ident as #krate::Event>::TOPIC,
                    <#previous as #krate::Event>::TOPIC,
                ),
                ::core::concat!(
                    "topics of `", #type_names,
                    "`: versions of an event share its topic; pin the same \
                     `topic = \"...\"` on both"
                ),
            );
        };
    };
    (Some(decode), Some(checks))
}

/// Both values, or every error of the two.
fn both<A, B>(a: syn::Result<A>, b: syn::Result<B>) -> syn::Result<(A, B)> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (Err(mut error), Err(other)) => {
            error.combine(other);
            Err(error)
        }
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => Err(error),
    }
}

/// `::outbox`, the path used when `crate = "..."` is not given.
fn default_crate_path() -> Path {
    syn::parse_quote!(::outbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(args: TokenStream, input: TokenStream) -> String {
        outbox_event(args, input).expect("valid input").to_string()
    }

    #[test]
    fn derives_the_topic_and_registers_the_type() {
        let expanded = expand(
            TokenStream::new(),
            quote!(
                #[derive(Serialize)]
                pub struct BookingCreated {
                    id: i64,
                }
            ),
        );
        let expected = quote! {
            #[derive(Serialize)]
            pub struct BookingCreated {
                id: i64,
            }

            #[automatically_derived]
            impl ::outbox::Event for BookingCreated {
                const TOPIC: &'static str = "booking.created";
            }

            const _: () = {
                ::outbox::__private::inventory::submit! {
                    ::outbox::__private::EventDescriptor::__new(
                        "booking.created",
                        1u32,
                        ::core::concat!(::core::module_path!(), "::", "BookingCreated"),
                    )
                }
            };
        };
        assert_eq!(expanded, expected.to_string());
    }

    #[test]
    fn uses_the_pinned_topic_and_crate_path() {
        let expanded = expand(
            quote!(topic = "booking.made", crate = "::app::outbox"),
            quote!(
                enum R {
                    A,
                }
            ),
        );
        assert!(expanded.contains("impl :: app :: outbox :: Event for R"));
        assert!(expanded.contains("const TOPIC : & 'static str = \"booking.made\""));
        assert!(expanded.contains(":: app :: outbox :: __private :: inventory :: submit !"));
    }

    #[test]
    fn raw_type_names_are_registered_without_the_prefix() {
        let expanded = expand(
            TokenStream::new(),
            quote!(
                struct r#Type;
            ),
        );
        assert!(expanded.contains("impl :: outbox :: Event for r#Type"));
        assert!(expanded.contains("\"::\" , \"Type\""));
    }

    #[test]
    fn a_retention_window_is_declared_and_registered() {
        let expanded = expand(
            quote!(retain = "30d"),
            quote!(
                struct BookingCreated;
            ),
        );
        assert!(
            expanded.contains("const RETAIN : :: core :: option :: Option < :: core :: time :: Duration > = :: core :: option :: Option :: Some (:: core :: time :: Duration :: from_secs (2592000u64))"),
            "{expanded}"
        );
        assert!(expanded.contains(". __retain (2592000u64)"), "{expanded}");
    }

    #[test]
    fn a_previous_version_is_decoded_and_checked() {
        let expanded = expand(
            quote!(version = 2, previous = BookingCreatedV1),
            quote!(
                struct BookingCreated;
            ),
        );
        assert!(expanded.contains("const VERSION : u32 = 2 ;"), "{expanded}");
        assert!(expanded.contains("fn decode_versioned"), "{expanded}");
        assert!(
            expanded.contains("< BookingCreatedV1 as :: outbox :: Event > :: decode_versioned"),
            "{expanded}"
        );
        assert!(
            expanded.contains("\"booking.created\" , 2u32 ,"),
            "{expanded}"
        );
        let error = outbox_event(
            quote!(previous = BookingCreatedV1),
            quote!(
                struct B;
            ),
        )
        .expect_err("previous needs version 2 or above")
        .to_string();
        assert!(error.contains("needs `version = 2` or above"), "{error}");
    }

    #[test]
    fn reports_argument_and_item_mistakes_together() {
        let error =
            outbox_event(quote!(topc = "a"), quote!(union U { a: u8 })).expect_err("two mistakes");
        assert_eq!(error.into_iter().count(), 2);
    }
}
