//! Retention of processed records: [`purge_processed`], [`Retention`] and [`DedupConfig`].

use std::time::Duration;

use serde::Deserialize;
use sqlx::PgPool;

use crate::config::{self, ConfigError, Fields};

const KEYS: &[&str] = &["retention_secs", "purge_batch"];

/// The default retention of processed records: a week.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The default number of records deleted per statement: the outbox's own purge batch.
pub const DEFAULT_PURGE_BATCH: usize = outbox::DEFAULT_PURGE_BATCH;

/// The largest purge batch accepted.
const MAX_PURGE_BATCH: usize = 100_000;

/// Deletes the processed records older than `older_than`, `batch` rows per statement, until none
/// is left; returns how many were deleted.
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
    pool: &PgPool,
    older_than: Duration,
    batch: usize,
) -> outbox::Result<u64> {
    outbox::Store::from(pool)
        .purge_processed(older_than, batch)
        .await
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
    /// [`ConfigError`] for `dedup.retention_secs` when `older_than` is zero, and for
    /// `dedup.purge_batch` unless `batch` is between 1 and 100000.
    pub fn new(older_than: Duration, batch: usize) -> Result<Self, ConfigError> {
        if older_than.is_zero() {
            return Err(ConfigError::invalid(
                "dedup.retention_secs",
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
    pub async fn purge(&self, pool: &PgPool) -> outbox::Result<u64> {
        purge_processed(pool, self.older_than, self.batch).await
    }
}

/// The retention settings, read from environment variables or a TOML `[dedup]` table;
/// [`retention`](Self::retention) checks them.
///
/// | key | environment | meaning |
/// |-----|-------------|---------|
/// | `retention_secs` | `OUTBOX_DEDUP_RETENTION_SECS` | how long records are kept, default a week |
/// | `purge_batch` | `OUTBOX_DEDUP_PURGE_BATCH` | records deleted per statement, default 1000 |
///
/// ```
/// use outbox_handlers::dedup::DedupConfig;
/// use std::time::Duration;
///
/// let config = DedupConfig::from_toml_str("[dedup]\nretention_secs = 86400\npurge_batch = 200")?;
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
    /// How long records are kept, in seconds.
    pub retention_secs: Option<f64>,
    /// Records deleted per statement.
    pub purge_batch: Option<u64>,
}

config::loaders!(DedupConfig, "dedup", "OUTBOX_DEDUP_");

impl DedupConfig {
    fn read(mut f: Fields<'_>) -> Result<Self, ConfigError> {
        let config = DedupConfig {
            retention_secs: f.number("retention_secs")?,
            purge_batch: f.count("purge_batch")?,
        };
        f.finish()?;
        Ok(config)
    }

    /// Checks the settings; unset ones take their defaults.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `dedup.retention_secs` or `dedup.purge_batch`.
    pub fn retention(&self) -> Result<Retention, ConfigError> {
        let older_than = match self.retention_secs {
            None => DEFAULT_RETENTION,
            Some(secs) => Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    ConfigError::invalid(
                        "dedup.retention_secs",
                        "use a number of seconds above 0",
                        &secs.to_string(),
                    )
                })?,
        };
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
        let c = DedupConfig::from_lookup("D_", |n| (n == "D_RETENTION_SECS").then(|| "-5".into()))
            .unwrap();
        assert_eq!(
            c.retention().unwrap_err().key(),
            Some("dedup.retention_secs")
        );
    }
}
