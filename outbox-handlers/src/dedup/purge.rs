//! Retention of processed records: [`purge_processed`], [`Retention`] and [`DedupConfig`].

use std::time::Duration;

use outbox::Store;
use serde::Deserialize;

use crate::config::{self, ConfigError};

/// The default retention of processed records: a week.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default number of records deleted per statement: the outbox's own purge batch.
pub const DEFAULT_PURGE_BATCH: usize = outbox::DEFAULT_PURGE_BATCH;

/// The largest purge batch accepted.
const MAX_PURGE_BATCH: usize = 100_000;

/// Deletes the processed records older than `older_than`, `batch` rows per statement, until none
/// is left; returns how many were deleted. `pool` is a `PgPool` or a `SqlitePool` (or a
/// reference to one, or a [`Store`]).
///
/// The same as [`outbox::Store::purge_processed`]: each statement deletes at most `batch`
/// rows, so locks and transactions stay short however many records have piled up.
///
/// A record purged while its message can still be redelivered no longer protects it: keep
/// `older_than` above the lease plus the sum of all retry delays (the default retry policy adds
/// up to under an hour; [`DEFAULT_RETENTION`] is a week).
///
/// # Errors
///
/// [`outbox::Error::Config`] when `batch` is 0; [`outbox::Error::Database`] when a
/// statement fails (the rows deleted before stay deleted).
///
/// # Cancellation safety
///
/// Cancellation safe: each batch commits on its own; a dropped call leaves the rest for the next.
///
/// # Example
///
/// ```no_run
/// use outbox_handlers::dedup::purge_processed;
/// use std::time::Duration;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let deleted = purge_processed(&pool, Duration::from_secs(7 * 24 * 3600), 1000).await?;
/// println!("purged {deleted} processed records");
/// # Ok(()) }
/// ```
pub async fn purge_processed(
    pool: impl Into<Store>,
    older_than: Duration,
    batch: usize,
) -> outbox::Result<u64> {
    pool.into().purge_processed(older_than, batch).await
}

/// How long processed records are kept, and how many a purge deletes per statement.
///
/// ```
/// use outbox_handlers::dedup::Retention;
/// use std::time::Duration;
///
/// let retention = Retention::new(Duration::from_secs(3 * 24 * 3600), 500)?;
/// assert_eq!(retention.batch(), 500);
/// assert!(Retention::new(Duration::from_secs(1), 0).is_err());
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    older_than: Duration,
    batch: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            older_than: DEFAULT_RETENTION,
            batch: DEFAULT_PURGE_BATCH,
        }
    }
}

impl Retention {
    /// Keep records for `older_than`; purge `batch` per statement.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for `dedup.retention` when `older_than` is zero, and for
    /// `dedup.purge_batch` unless `batch` is between 1 and 100000.
    pub fn new(older_than: Duration, batch: usize) -> Result<Self, ConfigError> {
        if older_than.is_zero() {
            return Err(ConfigError::invalid(
                "dedup.retention",
                "keep records for more than 0 seconds (longer than a message can be redelivered)",
                "0",
            ));
        }
        if batch == 0 || batch > MAX_PURGE_BATCH {
            return Err(ConfigError::invalid(
                "dedup.purge_batch",
                "use a batch between 1 and 100000",
                &batch.to_string(),
            ));
        }
        Ok(Retention { older_than, batch })
    }

    /// How long records are kept.
    pub fn older_than(&self) -> Duration {
        self.older_than
    }

    /// Records deleted per statement.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Runs [`purge_processed`] with these settings.
    ///
    /// # Errors
    ///
    /// As [`purge_processed`].
    ///
    /// # Cancellation safety
    ///
    /// As [`purge_processed`].
    pub async fn purge(&self, pool: impl Into<Store>) -> outbox::Result<u64> {
        purge_processed(pool, self.older_than, self.batch).await
    }
}

/// The retention settings, read from environment variables or a TOML `[dedup]` table;
/// [`retention`](Self::retention) checks them.
///
/// | key | environment | meaning |
/// |-----|-------------|---------|
/// | `retention` | `OUTBOX_DEDUP_RETENTION` | how long records are kept, such as `3d` or `12h`, default `7d`; `retention_secs` (`OUTBOX_DEDUP_RETENTION_SECS`), a number of seconds, is its old name and still read |
/// | `purge_batch` | `OUTBOX_DEDUP_PURGE_BATCH` | records deleted per statement, default 1000 |
///
/// ```
/// use outbox_handlers::dedup::DedupConfig;
/// use std::time::Duration;
///
/// let config = DedupConfig::from_toml_str("[dedup]\nretention = '1d'\npurge_batch = 200")?;
/// let retention = config.retention()?;
/// assert_eq!(retention.older_than(), Duration::from_secs(86400));
///
/// let err = DedupConfig::from_toml_str("[dedup]\npurge_batch = 0")?.retention().unwrap_err();
/// assert_eq!(err.to_string(), "dedup.purge_batch: use a batch between 1 and 100000 (got `0`)");
/// # Ok::<(), outbox_handlers::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DedupConfig {
    /// How long records are kept (key `retention`, or its old name `retention_secs`).
    #[serde(
        default,
        deserialize_with = "config::duration",
        alias = "retention_secs"
    )]
    pub retention: Option<Duration>,
    /// Records deleted per statement.
    pub purge_batch: Option<u64>,
}

config::section_constructors!(DedupConfig, section = "dedup", env_prefix = "OUTBOX_DEDUP_");

impl DedupConfig {
    /// Checks the settings; unset ones take their defaults.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `dedup.retention` or `dedup.purge_batch`.
    pub fn retention(&self) -> Result<Retention, ConfigError> {
        let older_than = self.retention.unwrap_or(DEFAULT_RETENTION);
        let batch = match self.purge_batch {
            None => DEFAULT_PURGE_BATCH,
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Retention::new(older_than, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_defaults() {
        let c = DedupConfig::from_lookup("D_", |_| None).unwrap();
        assert_eq!(c.retention().unwrap(), Retention::default());
        let c = DedupConfig::from_lookup("D_", |n| (n == "D_PURGE_BATCH").then(|| "x".into()))
            .unwrap_err();
        assert_eq!(c.key(), Some("dedup.purge_batch"));
        let c =
            DedupConfig::from_lookup("D_", |n| (n == "D_RETENTION").then(|| "0s".into())).unwrap();
        assert_eq!(c.retention().unwrap_err().key(), Some("dedup.retention"));
        let e = DedupConfig::from_lookup("D_", |n| (n == "D_RETENTION").then(|| "-5".into()))
            .unwrap_err();
        assert_eq!(e.key(), Some("dedup.retention"));
        let c = DedupConfig::from_lookup("D_", |n| (n == "D_RETENTION_SECS").then(|| "60".into()))
            .unwrap();
        assert_eq!(c.retention().unwrap().older_than(), Duration::from_secs(60));
        let e =
            DedupConfig::from_toml_str("[dedup]\nretention = '7d'\npurge_bacth = 5").unwrap_err();
        assert_eq!(
            e.to_string(),
            "dedup.purge_bacth: unknown key; expected one of retention, retention_secs, purge_batch"
        );
    }
}
