//! The wall clock as the databases store it: Unix milliseconds.

/// Now, in milliseconds since the Unix epoch (0 for a clock before 1970).
pub(crate) fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A stored time (Unix milliseconds), as SQLite and MySQL keep them (the Unix epoch for one out
/// of range).
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled", feature = "mysql"))]
pub(crate) fn time(ms: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms).unwrap_or_default()
}

/// A duration in milliseconds, as SQLite and MySQL store times.
#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled", feature = "mysql"))]
pub(crate) fn ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
