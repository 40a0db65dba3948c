//! Processed-id dedup: exactly-once effects for handlers whose effect is a write to the same
//! database as the outbox, PostgreSQL (feature `dedup`) or SQLite (feature `dedup-sqlite`).
//!
//! [`Dedup`] wraps a [`TxHandler`]. For each delivery it begins a transaction, inserts
//! `(handler name, message id)` into `outbox_processed` unless it is there (the statement lives
//! in the `outbox` crate's backend for each database), and then:
//!
//! - if no row was inserted, the message was already processed: it skips the inner handler and
//!   reports success;
//! - otherwise it runs the inner handler on the same transaction and commits, so the effect and
//!   the record commit together or not at all. If the inner handler fails, the transaction rolls
//!   back (the record with it) and the error goes to the worker, which retries as usual.
//!
//! A worker that dies after the commit but before the message is marked done leads to a
//! redelivery that finds the record and skips: the effect happens once. Two workers holding the
//! same message at once (a lease ran out) serialize on the record: the second waits for the
//! first to commit, then skips (on PostgreSQL and MariaDB/MySQL on the record's primary key,
//! on SQLite on the database's write lock, up to the pool's busy timeout).
//!
//! The database is [`TxHandler`]'s type parameter, which the handler names:
//! `impl TxHandler<sqlx::Postgres> for X` (feature `dedup`), `impl TxHandler<sqlx::Sqlite> for
//! X` (feature `dedup-sqlite`) or `impl TxHandler<sqlx::MySql> for X` (feature `dedup-mysql`);
//! with several features, each is there. [`Dedup`] and [`DedupLayer`]
//! take the handler's: `Dedup<X, sqlx::Postgres>`, inferred from the pool or the handler where
//! there is one choice.
//!
//! The table is created by `outbox::migrate`. Records are kept for a retention period and
//! removed by [`purge_processed`] (or [`Retention::purge`]); keep them longer than a message can
//! be redelivered (the lease plus all retry delays), a week by default.
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Context, HandlerError, Worker};
//! use outbox_handlers::dedup::{Dedup, TxHandler};
//! use serde::{Deserialize, Serialize};
//! use sqlx::{PgConnection, Postgres};
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct PaymentCaptured { booking_id: i64, cents: i64 }
//!
//! struct AddToLedger;
//!
//! #[outbox::async_trait]
//! impl TxHandler<Postgres> for AddToLedger {
//!     type Event = PaymentCaptured;
//!     const NAME: &'static str = "ledger";
//!
//!     async fn handle(&self, e: PaymentCaptured, _ctx: &Context, tx: &mut PgConnection)
//!         -> Result<(), HandlerError>
//!     {
//!         sqlx::query("INSERT INTO ledger (booking_id, cents) VALUES ($1, $2)")
//!             .bind(e.booking_id)
//!             .bind(e.cents)
//!             .execute(&mut *tx)
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder(&pool)
//!     .handler(Dedup::with_pool(AddToLedger, pool.clone()))
//!     .build()?;
//! # Ok(()) }
//! ```

mod purge;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use outbox::{
    Connection, Context, Event, FromResources, Handler, HandlerError, ResourceError, Resources,
};
use sqlx::{Database, Pool};

pub use purge::{purge_processed, DedupConfig, Retention, DEFAULT_PURGE_BATCH, DEFAULT_RETENTION};
/// The layer trait of tower, which [`DedupLayer`] implements.
pub use tower_layer::Layer;

/// A handler whose effect is a write to the database, done on the transaction it is given.
///
/// Like [`Handler`], with a transaction: wrap it in [`Dedup`] to run it at most once per message.
/// Do every write of the effect on `tx`, and nothing outside the database that cannot be undone
/// (an email, an HTTP call): those are not rolled back when the transaction is.
///
/// `Event` is the payload type, a type with `#[outbox_event]`; its topic decides which messages
/// reach the handler.
///
/// # About type parameter `DB`
///
/// The database the effect is written to, `sqlx::Postgres` (feature `dedup`), `sqlx::Sqlite`
/// (feature `dedup-sqlite`) or `sqlx::MySql` (feature `dedup-mysql`): the one of the outbox
/// tables. `tx` is its connection type (`PgConnection`, `SqliteConnection`,
/// `MySqlConnection`). The handler always names it, so which database a
/// handler writes to never depends on the features some other crate of the build turns on.
///
/// # Example
///
/// ```no_run
/// use outbox::{outbox_event, Context, HandlerError, Worker};
/// use outbox_handlers::dedup::{Dedup, TxHandler};
/// use serde::{Deserialize, Serialize};
/// use sqlx::{PgConnection, Postgres};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct PaymentReceived { account_id: i64, cents: i64 }
///
/// struct CreditAccount;
///
/// #[outbox::async_trait]
/// impl TxHandler<Postgres> for CreditAccount {
///     type Event = PaymentReceived;
///     const NAME: &'static str = "credit-account";
///
///     async fn handle(
///         &self,
///         e: PaymentReceived,
///         _ctx: &Context,
///         tx: &mut PgConnection,
///     ) -> Result<(), HandlerError> {
///         // Committed together with the processed-id record: a redelivery finds the record
///         // and skips, so the account is credited once.
///         sqlx::query("UPDATE accounts SET balance = balance + $1 WHERE id = $2")
///             .bind(e.cents)
///             .bind(e.account_id)
///             .execute(&mut *tx)
///             .await
///             .map_err(HandlerError::retry)?;
///         Ok(())
///     }
/// }
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let worker = Worker::builder(&pool)
///     .handler(Dedup::with_pool(CreditAccount, pool.clone()))
///     .build()?;
/// # Ok(()) }
/// ```
///
/// On SQLite (feature `dedup-sqlite`):
///
#[cfg_attr(feature = "dedup-sqlite", doc = "```no_run")]
#[cfg_attr(not(feature = "dedup-sqlite"), doc = "```ignore")]
/// # use outbox::{outbox_event, Context, HandlerError, Worker};
/// # use outbox_handlers::dedup::{Dedup, TxHandler};
/// # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)]
/// # struct PaymentReceived { account_id: i64, cents: i64 }
/// # struct CreditAccount;
/// #[outbox::async_trait]
/// impl TxHandler<sqlx::Sqlite> for CreditAccount {
///     type Event = PaymentReceived;
///     const NAME: &'static str = "credit-account";
///
///     async fn handle(&self, e: PaymentReceived, _ctx: &Context, tx: &mut sqlx::SqliteConnection)
///         -> Result<(), HandlerError>
///     {
///         sqlx::query("UPDATE accounts SET balance = balance + ?1 WHERE id = ?2")
///             .bind(e.cents)
///             .bind(e.account_id)
///             .execute(&mut *tx)
///             .await?;
///         Ok(())
///     }
/// }
///
/// # async fn run(pool: sqlx::SqlitePool) -> Result<(), outbox::Error> {
/// let worker = Worker::builder(&pool)
///     .handler(Dedup::with_pool(CreditAccount, pool.clone()))
///     .build()?;
/// # Ok(()) }
/// ```
#[async_trait]
pub trait TxHandler<DB: Database>: Send + Sync + 'static {
    /// The event type this handler reacts to.
    type Event: Event;

    /// The handler's stable name: the key of its processed records, with the message id.
    /// Renaming it makes already-processed messages look new.
    const NAME: &'static str;

    /// Handles one delivery inside `tx`; the caller commits.
    ///
    /// # Errors
    ///
    /// As [`Handler::handle`]: the transaction is then rolled back.
    async fn handle(
        &self,
        event: Self::Event,
        ctx: &Context,
        tx: &mut DB::Connection,
    ) -> Result<(), HandlerError>;

    /// See [`Handler::max_attempts`].
    fn max_attempts(&self) -> Option<u32> {
        None
    }

    /// See [`Handler::timeout`].
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// See [`Handler::backoff`].
    fn backoff(&self, attempt: u32) -> Option<Duration> {
        let _ = attempt;
        None
    }

    /// See [`Handler::breaker`].
    fn breaker(&self) -> Option<outbox::Breaker> {
        None
    }
}

/// Runs a [`TxHandler`] at most once per message: records the message id in `outbox_processed`
/// in the same transaction as the effect, and skips messages already recorded.
///
/// Its [`Handler::NAME`] is the inner handler's.
///
/// The pool is the one given to [`with_pool`](Self::with_pool), else the `sqlx::Pool<DB>`
/// (`PgPool`, `SqlitePool`) among the worker's resources (looked up at each delivery), and must
/// reach the database of the outbox tables.
///
/// # About type parameter `H`
///
/// The wrapped [`TxHandler`].
///
/// # About type parameter `DB`
///
/// The database, `sqlx::Postgres` or `sqlx::Sqlite`: the one `H` is a [`TxHandler`] for. Rust
/// infers it from the pool given to [`with_pool`](Self::with_pool), or from `H` when `H` is a
/// [`TxHandler`] for one database only; else name it, as in `Dedup::<_, sqlx::Postgres>::new(h)`.
///
/// ```no_run
/// # use outbox::{outbox_event, Context, HandlerError, Worker};
/// # use outbox_handlers::dedup::{Dedup, TxHandler};
/// # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)] struct Ping;
/// # struct Record;
/// # #[outbox::async_trait]
/// # impl TxHandler<sqlx::Postgres> for Record {
/// #     type Event = Ping;
/// #     const NAME: &'static str = "record";
/// #     async fn handle(&self, _: Ping, _: &Context, _: &mut sqlx::PgConnection) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// # fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// // The pool from the worker's resources:
/// let worker = Worker::builder(&pool)
///     .resource(pool.clone())
///     .handler(Dedup::new(Record))
///     .build()?;
/// # Ok(()) }
/// ```
pub struct Dedup<H, DB: Database> {
    inner: H,
    pool: Option<Pool<DB>>,
}

impl<H, DB: Database> Dedup<H, DB> {
    /// Wraps `inner`, using the `sqlx::Pool<DB>` among the worker's resources.
    pub fn new(inner: H) -> Self {
        Dedup { inner, pool: None }
    }

    /// Wraps `inner`, using `pool`.
    pub fn with_pool(inner: H, pool: Pool<DB>) -> Self {
        Dedup {
            inner,
            pool: Some(pool),
        }
    }

    /// The inner handler.
    pub fn get_ref(&self) -> &H {
        &self.inner
    }

    /// The inner handler, mutably.
    pub fn get_mut(&mut self) -> &mut H {
        &mut self.inner
    }

    /// Unwraps the inner handler.
    pub fn into_inner(self) -> H {
        self.inner
    }
}

impl<H: fmt::Debug, DB: Database> fmt::Debug for Dedup<H, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dedup")
            .field("inner", &self.inner)
            .field("pool", &self.pool.as_ref().map(|_| "given"))
            .finish()
    }
}

/// Records `(handler, message_id)` as processed on `tx`, a connection of any of the outbox's
/// databases; false when it already was (the caller then skips the effect). The statement is
/// the `outbox` backend's.
#[cfg(feature = "nats")]
pub(crate) async fn record<C: Connection>(
    tx: &mut C,
    handler: &str,
    message_id: uuid::Uuid,
) -> Result<bool, sqlx::Error> {
    tx.__record_processed(handler, message_id).await
}

/// The error of a delivery whose pool is missing.
fn no_pool<H, DB: Database>() -> HandlerError {
    HandlerError::retry(format!(
        "Dedup<{}> has no database pool: use Dedup::with_pool, or add the {} to the \
         worker with WorkerBuilder::resource",
        std::any::type_name::<H>(),
        std::any::type_name::<Pool<DB>>()
    ))
}

#[async_trait]
impl<H, DB> Handler for Dedup<H, DB>
where
    H: TxHandler<DB>,
    DB: Database,
    DB::Connection: Connection,
{
    type Event = H::Event;
    const NAME: &'static str = H::NAME;

    async fn handle(&self, event: H::Event, ctx: &Context) -> Result<(), HandlerError> {
        let pool = match &self.pool {
            Some(p) => p,
            None => ctx
                .resources()
                .get::<Pool<DB>>()
                .ok_or_else(no_pool::<H, DB>)?,
        };
        let mut tx = pool.begin().await?;
        if !tx.__record_processed(H::NAME, ctx.message_id()).await? {
            tx.rollback().await?;
            tracing::debug!("message already processed by this handler; skipped");
            return Ok(());
        }
        if let Err(e) = self.inner.handle(event, ctx, &mut tx).await {
            if let Err(rollback) = tx.rollback().await {
                // The connection is closed instead; the transaction is not committed either way.
                tracing::debug!(error = %rollback, "rollback after a failed handler did not complete");
            }
            return Err(e);
        }
        tx.commit().await?;
        Ok(())
    }

    fn max_attempts(&self) -> Option<u32> {
        self.inner.max_attempts()
    }

    fn timeout(&self) -> Option<Duration> {
        self.inner.timeout()
    }

    fn backoff(&self, attempt: u32) -> Option<Duration> {
        self.inner.backoff(attempt)
    }

    fn breaker(&self) -> Option<outbox::Breaker> {
        self.inner.breaker()
    }
}

/// Built from resources: the inner handler from its own `FromResources`, the pool from the
/// `sqlx::Pool<DB>` resource.
impl<H, DB> FromResources for Dedup<H, DB>
where
    H: TxHandler<DB> + FromResources,
    DB: Database,
    DB::Connection: Connection,
{
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        let pool = resources.require::<Pool<DB>>()?.clone();
        Ok(Dedup::with_pool(H::from_resources(resources)?, pool))
    }
}

/// Wraps handlers in [`Dedup`]: a [`tower_layer::Layer`] (re-exported as [`Layer`]), so it
/// composes with other layers the way tower's do.
///
/// ```
/// use outbox_handlers::dedup::{DedupLayer, Layer};
/// # use outbox::{outbox_event, Context, HandlerError};
/// # use outbox_handlers::dedup::{Dedup, TxHandler};
/// # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)] struct Paid { id: i64 }
/// # struct Credit;
/// # #[outbox::async_trait]
/// # impl TxHandler<sqlx::Postgres> for Credit {
/// #     type Event = Paid;
/// #     const NAME: &'static str = "credit";
/// #     async fn handle(&self, _: Paid, _: &Context, _: &mut sqlx::PgConnection) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// let layer = DedupLayer::new(); // the pool from the worker's resources
/// let handler: Dedup<Credit, sqlx::Postgres> = Layer::layer(&layer, Credit);
/// # let _ = handler;
/// ```
///
/// # About type parameter `DB`
///
/// The database of the handlers it wraps, `sqlx::Postgres` or `sqlx::Sqlite`; inferred as for
/// [`Dedup`].
pub struct DedupLayer<DB: Database> {
    pool: Option<Pool<DB>>,
}

impl<DB: Database> DedupLayer<DB> {
    /// A layer whose handlers use the `sqlx::Pool<DB>` among the worker's resources.
    pub fn new() -> Self {
        DedupLayer { pool: None }
    }

    /// A layer whose handlers use `pool`.
    pub fn with_pool(pool: Pool<DB>) -> Self {
        DedupLayer { pool: Some(pool) }
    }

    /// Wraps `inner` (the same as [`Layer::layer`], callable without importing the trait).
    pub fn layer<H>(&self, inner: H) -> Dedup<H, DB> {
        Dedup {
            inner,
            pool: self.pool.clone(),
        }
    }
}

impl<DB: Database> Default for DedupLayer<DB> {
    fn default() -> Self {
        Self::new()
    }
}

impl<DB: Database> Clone for DedupLayer<DB> {
    fn clone(&self) -> Self {
        DedupLayer {
            pool: self.pool.clone(),
        }
    }
}

impl<DB: Database> fmt::Debug for DedupLayer<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DedupLayer")
            .field("pool", &self.pool.as_ref().map(|_| "given"))
            .finish()
    }
}

impl<H, DB: Database> Layer<H> for DedupLayer<DB> {
    type Service = Dedup<H, DB>;

    fn layer(&self, inner: H) -> Dedup<H, DB> {
        DedupLayer::layer(self, inner)
    }
}
