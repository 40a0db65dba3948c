//! SQLite transactions that read before they write.

use sqlx::{Sqlite, SqlitePool, Transaction};

/// Begins a SQLite transaction that takes the database's write lock at once
/// (`BEGIN IMMEDIATE`): the way to start a producer's transaction that reads before it writes.
///
/// # Why
///
/// `pool.begin()` starts a *deferred* transaction: its first `SELECT` takes a read snapshot,
/// and only its first write asks for the write lock. If another connection committed in
/// between, SQLite cannot upgrade the stale snapshot and fails the write at once with
/// "database is locked" (`SQLITE_BUSY`); the busy timeout does not help, because waiting
/// cannot make the snapshot current. With several producers (or a worker) writing, a
/// SELECT-then-INSERT-and-[`enqueue`](crate::enqueue) transaction then fails now and then.
///
/// `BEGIN IMMEDIATE` asks for the write lock first, waiting up to the busy timeout (10 s with
/// [`sqlite_pool`](crate::backend::sqlite::sqlite_pool)) while another writer finishes, so everything the
/// transaction reads is current and its writes cannot be refused for a lock. SQLite has one
/// writer at a time in any case; readers outside transactions are not blocked (WAL).
///
/// A transaction whose first statement is a write needs nothing special, but using this for
/// every write transaction costs nothing and keeps the rule simple.
///
/// # Errors
///
/// [`Error::Database`](crate::error::Error::Database) when no connection can be had or the lock is
/// not granted within the busy timeout ([`DatabaseErrorKind::Busy`](crate::error::DatabaseErrorKind::Busy)).
///
/// # Cancellation safety
///
/// Cancellation safe: a transaction dropped before it commits is rolled back.
///
/// # Example
///
/// ```no_run
/// use outbox::{enqueue, outbox_event, sqlite_begin_immediate};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct BookingCreated { booking_id: i64 }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = outbox::sqlite_pool("sqlite://app.sqlite").await?;
/// let mut tx = sqlite_begin_immediate(&pool).await?;
/// let taken: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings WHERE room = ?1")
///     .bind(7)
///     .fetch_one(&mut *tx)
///     .await?;
/// if taken == 0 {
///     let id: i64 = sqlx::query_scalar("INSERT INTO bookings (room) VALUES (?1) RETURNING id")
///         .bind(7)
///         .fetch_one(&mut *tx)
///         .await?;
///     enqueue(&mut *tx, &BookingCreated { booking_id: id }).await?;
/// }
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn sqlite_begin_immediate(
    pool: &SqlitePool,
) -> crate::error::Result<Transaction<'static, Sqlite>> {
    Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
}
