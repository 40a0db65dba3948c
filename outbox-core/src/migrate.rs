//! The outbox schema, embedded, applied by [`migrate`].
//!
//! Our migrations are tracked in their own table, `outbox_migrations`, never in sqlx's
//! `_sqlx_migrations`: the host application keeps its own `sqlx::migrate!()` folder and version
//! numbers, and the two never collide. Call [`migrate`] at start-up, before or after the
//! application's own migrations; it is idempotent and safe to run from several processes at once
//! (a lock serialises them). Applications that manage all DDL themselves can copy the files
//! under `migrations/` of this crate instead, and skip the call.

use crate::error::Result;
use crate::store::Store;

/// Creates or upgrades the outbox tables. Idempotent; safe to call from several processes at once.
///
/// # Errors
///
/// [`Error::Database`](crate::error::Error::Database) when the database cannot be reached or refuses
/// the DDL; [`Error::MigrationChanged`](crate::error::Error::MigrationChanged) and
/// [`Error::MigrationUnknown`](crate::error::Error::MigrationUnknown) when the database's outbox schema
/// does not match this build.
///
/// # Cancellation safety
///
/// Each migration runs in its own transaction; dropping the future leaves the schema at a
/// migration boundary, and the next call carries on. On PostgreSQL the lock is held by a
/// connection taken out of the pool for the purpose, which closes if the future is dropped: no
/// pooled connection is ever left holding it.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
/// // sqlx::migrate!().run(&pool).await?;  // the application's own, in _sqlx_migrations
/// outbox::migrate(&pool).await?;       // ours, in outbox_migrations
/// # Ok(()) }
/// ```
pub async fn migrate(store: impl Into<Store>) -> Result<()> {
    store.into().backend().migrate(None).await
}
