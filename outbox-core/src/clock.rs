//! The wall clock as the databases store it: Unix milliseconds.

/// Now, in milliseconds since the Unix epoch (0 for a clock before 1970).
pub(crate) fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
