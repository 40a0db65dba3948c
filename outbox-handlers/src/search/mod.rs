//! The search-index handler: turns an event into an upsert or a delete of one document in an
//! Elasticsearch- or OpenSearch-compatible index, with external versions.
//!
//! Requests:
//!
//! - upsert: `PUT /{index}/_doc/{id}?version={v}&version_type=external` with the document as body
//! - delete: `DELETE /{index}/_doc/{id}?version={v}&version_type=external`
//!
//! The version must grow with each change of the document: the message id's timestamp and
//! counter ([`message_version`]), or better a field of the event (a row version bumped in the same
//! `UPDATE`). The index refuses a version that is not above the one it holds, so an older event
//! that arrives late can never overwrite a newer document.
//!
//! | answer | outcome |
//! |--------|---------|
//! | 2xx | written |
//! | 409 (version conflict: the index holds a newer version) | success: the stale event is dropped |
//! | 404 on a delete (no such document) | success |
//! | 408, 429, 5xx, timeout, connection error | retry, after `Retry-After` if given |
//! | any other 4xx | dead letter now, with the index's message in `last_error` |
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Worker};
//! use outbox_handlers::search::{IndexOp, SearchClient, SearchHandler};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct HotelChanged { hotel_id: i64, version: u64, name: String, deleted: bool }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let client = SearchClient::builder()
//!     .base_url("http://127.0.0.1:9200")
//!     .index("hotels")
//!     .build()?;
//! let indexer = SearchHandler::from_fn(client, |e: &HotelChanged, _ctx| {
//!     let id = e.hotel_id.to_string();
//!     if e.deleted {
//!         IndexOp::Delete { id, version: e.version }
//!     } else {
//!         IndexOp::Upsert { id, version: e.version, document: serde_json::json!({ "name": e.name }) }
//!     }
//! })?;
//! let worker = Worker::builder(&pool).handler(indexer).build()?;
//! # Ok(()) }
//! ```

mod client;
mod config;

use std::fmt;
use std::marker::PhantomData;

use async_trait::async_trait;
use outbox::{Context, Event, FromResources, Handler, HandlerError, ResourceError, Resources};

pub use client::{Applied, SearchClient, SearchClientBuilder};
pub use config::SearchConfig;

use crate::config::ConfigError;

/// What to do to one document.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum IndexOp {
    /// Create or replace the document, unless the index holds this version or a newer one.
    Upsert {
        /// The document id.
        id: String,
        /// The external version: must grow with each change of the document.
        version: u64,
        /// The document.
        document: serde_json::Value,
    },
    /// Delete the document, unless the index holds this version or a newer one.
    Delete {
        /// The document id.
        id: String,
        /// The external version: must grow with each change of the document.
        version: u64,
    },
}

impl IndexOp {
    /// The document id.
    pub fn id(&self) -> &str {
        match self {
            IndexOp::Upsert { id, .. } | IndexOp::Delete { id, .. } => id,
        }
    }

    /// The external version.
    pub fn version(&self) -> u64 {
        match self {
            IndexOp::Upsert { version, .. } | IndexOp::Delete { version, .. } => *version,
        }
    }
}

/// A version from the message id ([`outbox::message_sequence`]): its millisecond timestamp
/// followed by its 20-bit counter, so a message enqueued later by the same process has a
/// higher version, even in the same millisecond. It is below 2^63, as an external version
/// must be.
///
/// The order is the order of the `enqueue` calls, not of the commits, and across processes it
/// is only as good as the clocks. When that matters, carry a version in the event (a column
/// incremented in the same `UPDATE` as the change) and use it instead.
///
/// ```
/// use outbox::{Context, Resources};
/// use outbox_handlers::search::message_version;
///
/// let ctx = Context::for_test("hotel.changed", "search-index", Resources::new());
/// let now_ms = std::time::SystemTime::now()
///     .duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
/// assert!(now_ms.abs_diff(message_version(&ctx) >> 20) < 60_000);
/// assert!(i64::try_from(message_version(&ctx)).is_ok());
/// ```
pub fn message_version(ctx: &Context) -> u64 {
    outbox::message_sequence(ctx.message_id())
}

/// How an event becomes an [`IndexOp`], and the handler's name.
///
/// Implement it on a type of yours for a handler name of your own, a fallible mapping, an index
/// per mapping, or registration with [`register_handler!`](outbox::register_handler);
/// otherwise use [`SearchHandler::from_fn`].
///
/// ```
/// use outbox::{outbox_event, Context, HandlerError};
/// use outbox_handlers::search::{message_version, IndexOp, SearchMapping};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct RoomChanged { room_id: i64, beds: u8 }
///
/// #[derive(Default)]
/// struct RoomsIndex;
///
/// impl SearchMapping for RoomsIndex {
///     type Event = RoomChanged;
///     const NAME: &'static str = "rooms-index";
///
///     fn index_op(&self, e: &RoomChanged, ctx: &Context) -> Result<IndexOp, HandlerError> {
///         Ok(IndexOp::Upsert {
///             id: e.room_id.to_string(),
///             version: message_version(ctx),
///             document: serde_json::to_value(e)?,
///         })
///     }
///
///     fn index(&self) -> Option<&str> {
///         Some("rooms")
///     }
/// }
/// ```
pub trait SearchMapping: Send + Sync + 'static {
    /// The event type, whose topic decides which messages reach the handler.
    type Event: Event;

    /// The handler's stable name (see [`Handler::NAME`]).
    const NAME: &'static str;

    /// The operation for one event.
    ///
    /// # Errors
    ///
    /// Whatever the mapping decides; [`HandlerError::permanent`] dead-letters the message.
    fn index_op(&self, event: &Self::Event, ctx: &Context) -> Result<IndexOp, HandlerError>;

    /// The index this mapping writes to, overriding the client's (default: the client's).
    fn index(&self) -> Option<&str> {
        None
    }
}

/// A closure `Fn(&E, &Context) -> IndexOp` as a [`SearchMapping`], named `"search-index"`; made
/// by [`SearchHandler::from_fn`].
///
/// # About type parameter `E`
///
/// The event type the closure takes.
pub struct SearchFn<E, F> {
    f: F,
    _event: PhantomData<fn() -> E>,
}

impl<E, F> SearchFn<E, F> {
    /// Wraps a closure.
    pub fn new(f: F) -> Self {
        SearchFn {
            f,
            _event: PhantomData,
        }
    }
}

impl<E, F> fmt::Debug for SearchFn<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchFn")
            .field("event", &std::any::type_name::<E>())
            .finish_non_exhaustive()
    }
}

impl<E, F> SearchMapping for SearchFn<E, F>
where
    E: Event,
    F: Fn(&E, &Context) -> IndexOp + Send + Sync + 'static,
{
    type Event = E;
    const NAME: &'static str = "search-index";

    fn index_op(&self, event: &E, ctx: &Context) -> Result<IndexOp, HandlerError> {
        Ok((self.f)(event, ctx))
    }
}

/// The search-index handler: maps each event to an [`IndexOp`] and applies it with external
/// versioning through a [`SearchClient`].
///
/// Its [`Handler::NAME`] is the mapping's `NAME` (`"search-index"` for
/// [`from_fn`](Self::from_fn)).
///
/// # About type parameter `M`
///
/// The [`SearchMapping`]: the event type, the handler name and how an event becomes an
/// operation.
///
/// # Registration
///
/// With a mapping that is `Default`, the handler can be registered with
/// [`register_handler!`](outbox::register_handler); it is then built from a
/// [`SearchClient`] or a [`SearchConfig`] among the worker's resources.
pub struct SearchHandler<M> {
    client: SearchClient,
    index: String,
    mapping: M,
}

impl<M: SearchMapping> SearchHandler<M> {
    /// A handler applying `mapping`'s operations through `client`, to the mapping's index or
    /// else the client's.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for `search.index` when neither names an index, or the mapping's is
    /// invalid.
    pub fn new(client: SearchClient, mapping: M) -> Result<Self, ConfigError> {
        let index = match mapping.index() {
            Some(i) => {
                client::check_index(i)?;
                i.to_string()
            }
            None => client.index().map(str::to_string).ok_or_else(|| {
                ConfigError::missing(
                    "search.index",
                    "set SearchClientBuilder::index, OUTBOX_SEARCH_INDEX or `index` in [search], \
                     or override SearchMapping::index",
                )
            })?,
        };
        Ok(SearchHandler {
            client,
            index,
            mapping,
        })
    }

    /// The index written to.
    pub fn index(&self) -> &str {
        &self.index
    }

    /// The mapping.
    pub fn mapping(&self) -> &M {
        &self.mapping
    }
}

impl<E, F> SearchHandler<SearchFn<E, F>>
where
    E: Event,
    F: Fn(&E, &Context) -> IndexOp + Send + Sync + 'static,
{
    /// A handler named `"search-index"` whose mapping is a closure, writing to the client's
    /// index.
    ///
    /// The closure cannot fail, as with `EmailHandler::from_fn`: a mapping that can implements
    /// [`SearchMapping`], whose `index_op` returns a [`HandlerError`]. Only building the handler
    /// can fail, when the client has no index.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for `search.index` when the client has no index.
    pub fn from_fn(client: SearchClient, f: F) -> Result<Self, ConfigError> {
        SearchHandler::new(client, SearchFn::new(f))
    }
}

impl<M> fmt::Debug for SearchHandler<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SearchHandler")
            .field("client", &self.client)
            .field("index", &self.index)
            .field("mapping", &std::any::type_name::<M>())
            .finish()
    }
}

#[async_trait]
impl<M: SearchMapping> Handler for SearchHandler<M> {
    type Event = M::Event;
    const NAME: &'static str = M::NAME;

    async fn handle(&self, event: M::Event, ctx: &Context) -> Result<(), HandlerError> {
        let op = self.mapping.index_op(&event, ctx)?;
        let applied = self.client.apply(&self.index, &op).await?;
        tracing::debug!(
            index = %self.index,
            id = op.id(),
            version = op.version(),
            ?applied,
            "search index updated"
        );
        Ok(())
    }
}

impl<M: SearchMapping + Default> FromResources for SearchHandler<M> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        let invalid = |e: ConfigError| ResourceError::Invalid {
            handler: M::NAME,
            message: e.to_string(),
        };
        let client = match resources.get::<SearchClient>() {
            Some(c) => c.clone(),
            None => resources
                .get::<SearchConfig>()
                .ok_or(ResourceError::Missing {
                    type_name: "outbox_handlers::search::SearchConfig (or a SearchClient)",
                })?
                .client()
                .map_err(invalid)?,
        };
        SearchHandler::new(client, M::default()).map_err(invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_versions_grow_with_the_message_id() {
        let a = Context::for_test("t", "h", Resources::new());
        std::thread::sleep(std::time::Duration::from_millis(3));
        let b = Context::for_test("t", "h", Resources::new());
        assert!(message_version(&b) > message_version(&a));
        let ts = a.message_id().get_timestamp().unwrap().to_unix();
        assert_eq!(
            message_version(&a) >> 20,
            ts.0 * 1000 + u64::from(ts.1 / 1_000_000)
        );
    }

    #[test]
    fn versions_strictly_increase_in_a_tight_loop() {
        let versions: Vec<u64> = (0..1000)
            .map(|_| message_version(&Context::for_test("t", "h", Resources::new())))
            .collect();
        for (i, pair) in versions.windows(2).enumerate() {
            assert!(
                pair[0] < pair[1],
                "version {} is {} after {}",
                i + 1,
                pair[1],
                pair[0]
            );
        }
        assert!(versions.iter().all(|v| i64::try_from(*v).is_ok()));
    }
}
