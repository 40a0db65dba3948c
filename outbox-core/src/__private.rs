//! Items used by generated code and by the backend seam. Not public API: no stability guarantees.

use std::time::Duration;

pub use crate::event::EventDescriptor;
pub use crate::registry::HandlerRegistration;
pub use inventory;

/// One message about to be inserted.
#[derive(Debug, Clone)]
pub struct NewMessage {
    /// Its id (UUID v7).
    pub id: uuid::Uuid,
    /// Its topic.
    pub topic: &'static str,
    /// Its payload as JSON text.
    pub payload: String,
    /// The idempotency key, if one was given.
    pub idempotency_key: Option<String>,
    /// The delay before it is available.
    pub delay: Duration,
    /// The ordering key, if the message is ordered.
    pub ordering_key: Option<String>,
    /// Whether the message, once dead, lets later messages of its key go on.
    pub releases_key: bool,
    /// The trace context of the span that enqueued it (feature `opentelemetry`).
    pub trace: Option<crate::trace::TraceContext>,
}

/// Now, in Unix milliseconds (0 before 1970, `i64::MAX` after the year 292 million).
pub fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// FNV-1a, 64 bits: a stable hash (migration checksums, file names), the same on every
/// platform and release.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Reads a duration in the outbox's one human format (`500ms`, `5m`, `7d`; a bare number is
/// seconds), at most 100 years: the parser of the command-line flags, for the handlers'
/// configuration.
///
/// # Errors
///
/// A message naming the value and how to write it.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}
