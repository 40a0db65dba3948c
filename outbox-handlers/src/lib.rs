//! Ready-made handlers for [`outbox`]: email, search index, processed-id dedup, and relays to
//! NATS JetStream and RabbitMQ with an inbox for the consuming side.
//!
//! ```no_run
//! use outbox::{outbox_event, Worker};
//! use outbox_handlers::email::{Email, EmailConfig, EmailHandler};
//! use serde::{Deserialize, Serialize};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64, guest_email: String }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! # let shutdown = std::future::pending::<()>();
//! // OUTBOX_EMAIL_BASE_URL, OUTBOX_EMAIL_API_KEY, OUTBOX_EMAIL_FROM, OUTBOX_EMAIL_TIMEOUT (10s)
//! let transport = EmailConfig::from_env()?.transport()?;
//! let confirmation = EmailHandler::from_fn(transport, |e: &BookingCreated, _ctx| {
//!     Email::new(&e.guest_email, "Your booking", format!("Booking {} is confirmed.", e.booking_id))
//! });
//! Worker::builder(&pool)
//!     .handler(confirmation)
//!     .build()?
//!     .run_until(shutdown)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Details
//!
//! - Each handler maps an event through your code (a closure, or a trait when it needs a name of
//!   its own or registration with `register_handler!`) and performs one idempotent effect.
//! - Sends carry [`Context::idempotency_key`](outbox::Context::idempotency_key), the same
//!   on every retry; index writes carry an external version, so a late event never wins.
//! - Answers are classified once for all: 2xx is done, 408/429/5xx/timeouts/connection errors
//!   retry (honouring `Retry-After`), other 4xx dead-letter now with the service's message.
//! - Secrets (API keys, passwords) are [`Secret`]s: never logged, never in `last_error`,
//!   redacted by `Debug`, with no `Display` and no `Serialize`. They are sent over `https://`,
//!   or plain `http://` only to this machine (a loopback address or `localhost`); another
//!   `http://` host with credentials is refused at construction unless `allow_insecure_http`
//!   is set.
//! - Everything is constructible in code (builders that validate and return `Result`) and from
//!   configuration: environment variables with a prefix (`OUTBOX_EMAIL_*`, `OUTBOX_SEARCH_*`,
//!   `OUTBOX_DEDUP_*`) or a TOML table (`[email]`, `[search]`, `[dedup]`), read through the
//!   configuration type's `Deserialize`. Durations take the outbox's one human format
//!   (`timeout = "10s"`, `retention = "7d"`). Errors name the key:
//!   `email.base_url: not a valid URL (got `foo`)`.
//! - The relays (`relay`, features `nats` and `rabbitmq`) ride out a broker outage: publishes
//!   wait for the reconnect instead of failing one by one, and the outage is logged once when it
//!   starts and once when it ends, at WARN, with counts. Their counters are listed in
//!   [`metrics`].
//! - HTTP goes through `reqwest` with rustls (the `ring` provider, or the process default if one
//!   is installed) and the platform's certificate verifier; bring your own `reqwest::Client` with
//!   the builders' `client` method.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---------|---------|--------------|
//! | `email` | yes | [`email`]: the email handler, the HTTP provider transport and the file transport |
//! | `search` | yes | [`search`]: the search-index handler (Elasticsearch/OpenSearch, external versions) |
//! | `dedup` | no | [`dedup`]: the processed-id wrapper and its purge, for PostgreSQL (turns on `outbox/postgres`) |
//! | `dedup-sqlite` | no | [`dedup`] for SQLite (turns on `outbox/sqlite`); with `dedup` too, both databases |
//! | `dedup-mysql` | no | [`dedup`] for MariaDB and MySQL (turns on `outbox/mysql`); with the others, each database |
//! | `nats` | no | `relay::nats`: the JetStream relay; `inbox`: the JetStream inbox (with `dedup`; on MariaDB/MySQL or SQLite too with `dedup-mysql` or `dedup-sqlite`) |
//! | `rabbitmq` | no | `relay::rabbitmq`: the RabbitMQ relay with publisher confirms |

#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub mod cloudevents;
mod config;
#[cfg(feature = "http")]
mod http;

#[cfg(any(feature = "dedup", feature = "dedup-sqlite", feature = "dedup-mysql"))]
pub mod dedup;
#[cfg(feature = "email")]
pub mod email;
#[cfg(feature = "nats")]
pub mod inbox;
pub mod metrics;
#[cfg(any(feature = "nats", feature = "rabbitmq"))]
pub mod relay;
#[cfg(feature = "search")]
pub mod search;

/// The NATS client the relay and the inbox are built on: connect with `outbox_handlers::async_nats`
/// (or pin the same version) so the types match.
#[cfg(feature = "nats")]
pub use async_nats;
pub use config::{ConfigError, Secret};
#[cfg(feature = "http")]
pub use http::HttpError;
/// The AMQP client the RabbitMQ relay is built on: connect with `outbox_handlers::lapin` (or pin
/// the same version) so the types match.
#[cfg(feature = "rabbitmq")]
pub use lapin;
#[cfg(feature = "http")]
pub use reqwest;
