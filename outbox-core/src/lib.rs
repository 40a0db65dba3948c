//! Transactional outbox for Rust.
//!
//! Write your business change and the event "this must happen" in one database transaction;
//! a worker turns each committed event into handler calls, at least once, with retries,
//! exponential backoff, dead letters and numbers that show whether it keeps up.
//!
//! ```no_run
//! use outbox::{enqueue, outbox_event, Context, Handler, HandlerError, Worker};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_event] // topic "booking.created"
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64, email: String }
//!
//! struct SendConfirmation;
//!
//! #[outbox::async_trait]
//! impl Handler for SendConfirmation {
//!     type Event = BookingCreated;
//!     const NAME: &'static str = "send-confirmation";
//!     async fn handle(&self, e: BookingCreated, ctx: &Context) -> Result<(), HandlerError> {
//!         println!("mail {} about booking {} (key {})", e.email, e.booking_id, ctx.idempotency_key());
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(shutdown: impl std::future::Future<Output = ()> + Send) -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
//! outbox::migrate(&pool).await?;
//!
//! // In the request: the business change and its event, in one transaction.
//! let mut tx = pool.begin().await?;
//! // ... your INSERT INTO bookings ...
//! enqueue(&mut *tx, &BookingCreated { booking_id: 1, email: "guest@example.com".into() }).await?;
//! tx.commit().await?;
//!
//! // In the worker (a task of your service, or a binary of its own): every committed event
//! // reaches the handler until `shutdown` completes (Ctrl-C, SIGTERM); then the messages in
//! // flight get until the shutdown deadline, and what still runs is handed back.
//! let worker = Worker::builder(&pool).handler(SendConfirmation).build()?;
//! worker.run_until(shutdown).await?;
//! # Ok(()) }
//! ```
//!
//! # Details
//!
//! - [`enqueue`] is one `INSERT` on your connection: no `BEGIN`, no `COMMIT`. The event exists
//!   if and only if your transaction commits.
//! - `#[outbox_event]` derives the topic from the type name (`BookingCreated` ->
//!   `booking.created`); `#[outbox_event(topic = "...")]` pins it.
//! - Handlers implement [`Handler`], register at link time with [`register_handler!`] and take
//!   their dependencies from [`Resources`]. [`Registry::check`] names what is missing.
//! - The schema is applied by [`migrate`] and tracked in its own table, apart from your
//!   application's sqlx migrations.
//! - All SQL lives in one folder per database (`backend/<database>/`, the same files in each);
//!   PostgreSQL is the `postgres` feature, SQLite the `sqlite` feature, MariaDB and MySQL
//!   the `mysql` feature.
//! - On SQLite, begin a transaction that reads before it writes with
//!   `outbox::sqlite_begin_immediate` (feature `sqlite`): a plain `pool.begin()` fails such a transaction with
//!   "database is locked" while other connections write.
//!
#![doc = include_str!("docs/guide.md")]
//!
//! # Features
//!
#![doc = include_str!("docs/features.md")]
//!
//! Choose at least one backend, as with sqlx. The README counts the crates each common choice
//! builds.

// The doc examples use a backend: run them with `cargo test -p outbox --doc --features full`
// (`cargo test --workspace` turns those features on through the tests crate).
// On docs.rs (`--cfg docsrs`, nightly), items are marked with the features they need.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]
// Without a backend feature the backend seam has no implementation to use its types.
#![cfg_attr(
    not(any(
        feature = "postgres",
        feature = "sqlite",
        feature = "sqlite-unbundled",
        feature = "mysql"
    )),
    allow(dead_code)
)]

mod backend;
mod breaker;
#[cfg(feature = "cli")]
pub mod cli;
mod clock;
#[cfg(feature = "console")]
pub mod console;
pub mod diagnostics;
pub mod duration;
mod enqueue;
mod error;
mod event;
mod event_log;
mod handler;
mod health;
mod host;
mod message_id;
pub mod metrics;
mod migrate;
mod model;
#[cfg(feature = "prometheus")]
pub mod observe;
mod ops;
mod pause;
mod registry;
mod replay;
mod resources;
mod retention;
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
mod sqlite_tx;
mod store;
pub mod trace;
mod worker;

#[doc(hidden)]
pub mod __private;

pub use async_trait::async_trait;
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
pub use backend::sqlite::{sqlite_options, sqlite_pool};
pub use backend::{Connection, ConnectionMut};
pub use breaker::{Breaker, BreakerInfo};
pub use enqueue::{
    enqueue, enqueue_many, enqueue_many_with, enqueue_with, EnqueueOptions,
    DEFAULT_MAX_PAYLOAD_BYTES, MAX_IDEMPOTENCY_KEY_BYTES, MAX_ORDERING_KEY_BYTES,
};
pub use error::{DatabaseErrorKind, Error, Result};
pub use event::{DecodeError, Event, EventDescriptor};
pub use handler::{BoxError, Context, FailureKind, Handler, HandlerError, RawHandler};
pub use health::{Health, Unhealthy};
pub use message_id::{message_sequence, new_message_id};
pub use migrate::migrate;
pub use model::{
    DeadCursor, DeadLetterFilter, DeadSelection, MessageInfo, MessageStatus, Stats, TopicStats,
    UnknownStatus, WorkerInfo,
};
pub use ops::DEFAULT_PURGE_BATCH;
pub use pause::{PauseError, PauseInfo, PauseTarget, Paused, Resumed, MAX_PAUSE};
pub use registry::{
    assert_all_events_handled, HandlerInfo, HandlerRegistration, Registry, RegistryError,
};
pub use resources::{FromResources, ResourceError, Resources};
pub use retention::{
    EventFilter, LogUpkeep, ReplayFailure, ReplayInfo, ReplayPlan, ReplayRequest,
    ReplayRequestInfo, ReplayState, RetainedEvent, RetainedTopic, Start, DAYS_AHEAD,
    RUNWAY_WARNING,
};
/// The sqlx this crate is built on. Use `outbox::sqlx` (or pin the same version) so that your
/// pools and transactions are the types [`enqueue`] and [`Worker`] take: two sqlx versions in
/// one build give errors such as "the trait `Connection` is not implemented for `PgConnection`".
pub use sqlx;
pub use store::Store;
pub use worker::{BatchReport, RetryPolicy, Wakeup, Worker, WorkerBuilder, WorkerConfig};

#[cfg(feature = "macros")]
pub use outbox_macros::outbox_event;

#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
pub use sqlite_tx::sqlite_begin_immediate;

// The README's examples use PostgreSQL and the CLI pieces: they run where those features are on,
// as in `cargo test --workspace` (the tests crate turns them on).
#[cfg(all(doctest, feature = "postgres", feature = "cli"))]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
