//! Items the code that `#[outbox_event]` and `register_handler!` generate names. Not public
//! API: no stability guarantees.

pub use crate::event::{decode_current, same_topic, EventDescriptor};
pub use crate::registry::HandlerRegistration;
pub use inventory;

/// Applies the outbox migrations up to `version` only: the schema of an earlier release, for
/// the tests of an upgrade.
///
/// # Errors
///
/// As [`migrate`](crate::migrate::migrate).
pub async fn migrate_up_to(
    store: impl Into<crate::store::Store>,
    version: i64,
) -> crate::error::Result<()> {
    store.into().backend().migrate(Some(version)).await
}

/// The unordered claim's locking select on MySQL, for the test that checks its plan.
#[cfg(feature = "mysql")]
pub const MYSQL_CLAIM_UNKEYED: &str = crate::backend::mysql::CLAIM_UNKEYED;
/// The walk over the ordering keys on MySQL, for the test that checks its plan.
#[cfg(feature = "mysql")]
pub const MYSQL_WALK_KEYS: &str = crate::backend::mysql::WALK_KEYS;
/// The head of one ordering key on MySQL, for the test that counts its index reads.
#[cfg(feature = "mysql")]
pub const MYSQL_KEY_HEAD: &str = crate::backend::mysql::KEY_HEAD;
/// The statistics statement on MySQL (one `?`: how long workers count as alive, in ms), for
/// the test that checks its plan.
#[cfg(feature = "mysql")]
pub const MYSQL_STATS: &str = crate::backend::mysql::STATS;
/// The statistics statement on PostgreSQL, for the test that checks its plan.
#[cfg(feature = "postgres")]
pub const POSTGRES_STATS: &str = crate::backend::postgres::STATS;
/// The statistics statement on SQLite (`?1` now, `?2` how long workers count as alive, both
/// in ms), for the test that checks its plan.
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
pub const SQLITE_STATS: &str = crate::backend::sqlite::STATS;
