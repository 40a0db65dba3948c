//! The `#[outbox_event]` attribute of the `outbox` transactional-outbox framework.
//!
//! This crate is an implementation detail of `outbox`, which re-exports the attribute as
//! `outbox::outbox_event`. Depend on `outbox` and write `use outbox::outbox_event;`
//! rather than depending on this crate directly: the generated code names items of `outbox`.
//!
//! The crate is split by stage:
//!
//! - `attr` parses the arguments (`topic = "..."`, `version = N`, `crate = "..."`, ...),
//! - `validate` checks the annotated item and the topic,
//! - `case` derives a topic from the type name,
//! - `expand` writes the generated code.
//!
//! Every stage returns [`syn::Error`]; only this file turns errors into `compile_error!`.

mod attr;
mod case;
mod expand;
mod validate;

use proc_macro::TokenStream;

/// Marks a struct or an enum as an outbox event payload.
///
/// The attribute implements `outbox::Event` for the type and registers it, so the worker
/// can name events that no linked handler serves. The type must also derive
/// `serde::Serialize` and `serde::Deserialize`: payloads are stored as JSON.
///
/// # Topic
///
/// Without arguments the topic is derived from the type name, word by word, lowercase and
/// joined with `.`:
///
/// | type name                | topic                     |
/// |--------------------------|---------------------------|
/// | `BookingCreated`         | `booking.created`         |
/// | `PropertyIndexRequested` | `property.index.requested`|
/// | `HTTPCallFailed`         | `http.call.failed`        |
/// | `UserV2Created`          | `user.v2.created`         |
///
/// Renaming the type then changes the topic, and rows already in the outbox table would no
/// longer reach their handlers. Pin the topic to keep it stable:
///
/// ```ignore
/// use outbox::outbox_event;
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event(topic = "booking.created")]
/// #[derive(Serialize, Deserialize)]
/// struct BookingConfirmed {
///     booking_id: i64,
/// }
/// ```
///
/// A topic is checked at compile time: it must not be empty, must be at most 64 characters
/// long, and may only use lowercase ASCII letters, digits, `.`, `_` and `-`.
///
/// # Arguments
///
/// - `topic = "..."`: the topic, instead of the one derived from the type name.
/// - `idempotency_key = "field"`: the payload field (any `Display` type) whose value handlers
///   send downstream as the idempotency key.
/// - `ordering_key = "field"`: the payload field (any `Display` type) whose value is the
///   message's ordering key: messages of one key, across topics, are handled in enqueue order.
/// - `dead_releases_key`: with an ordering key, a dead message of this event lets the later
///   messages of its key go on; without it they wait until the dead message is retried or
///   discarded.
/// - `version = N`: the version of the payload's shape (default 1), stored with every message.
///   A worker takes only the versions it knows; newer ones wait for a worker that does.
/// - `previous = Type`: with `version = 2` or above, the type of the version before this one
///   (same topic, lower version). Write `impl From<Type> for ThisType`: a stored payload of an
///   older version is read as its own type and converted up to this one, so handlers always
///   receive this type. Chains go back any number of versions.
/// - `retain = "180d"`: keep delivered events of this topic in the event log for that long
///   (`d`, `h`, `m` or `s`), to list and replay them; without it a delivered message is
///   deleted. The longest window any worker declares is the one the database keeps.
/// - `crate = "..."`: the path to `outbox`, for crates that reach it through a
///   re-export, e.g. `crate = "::my_app_support::outbox"`. Defaults to `::outbox`.
///
/// # Limits
///
/// Generic types and unions are rejected: a topic names one concrete payload type, and
/// payloads are serialized with serde.
#[proc_macro_attribute]
pub fn outbox_event(args: TokenStream, input: TokenStream) -> TokenStream {
    let input = proc_macro2::TokenStream::from(input);
    match expand::outbox_event(args.into(), input.clone()) {
        Ok(expanded) => expanded.into(),
        Err(error) => {
            // Keep the item itself so that one mistake in the attribute does not turn every
            // use of the type into a "cannot find type" error.
            let mut tokens = error.into_compile_error();
            tokens.extend(input);
            tokens.into()
        }
    }
}
