//! The error type of library operations.

use std::time::Duration;

/// The error returned by `outbox-core` operations: enqueue, migrations, the worker and
/// operations calls.
///
/// Handlers do not return this type; they return [`HandlerError`](crate::HandlerError), which
/// says whether a failure should be retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database returned an error or could not be reached.
    #[error("database error; check that the database is reachable and the outbox schema is migrated (outbox::migrate)")]
    Database(#[source] sqlx::Error),

    /// A payload could not be turned into JSON.
    #[error("could not serialize the payload of topic `{topic}` to JSON")]
    Serialize {
        /// The topic of the event.
        topic: &'static str,
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },

    /// A payload is larger than the configured limit; nothing was written.
    #[error("payload of topic `{topic}` is {size} bytes, over the limit of {limit} bytes; store large data elsewhere and enqueue its id, or raise EnqueueOptions::max_payload_bytes")]
    PayloadTooLarge {
        /// The topic of the event.
        topic: &'static str,
        /// The size of the serialized payload in bytes.
        size: usize,
        /// The limit in force.
        limit: usize,
    },

    /// An idempotency key is empty or too long.
    #[error("invalid idempotency key for topic `{topic}`: {reason}")]
    InvalidIdempotencyKey {
        /// The topic of the event.
        topic: &'static str,
        /// Why the key was refused.
        reason: &'static str,
    },

    /// A delay is too large to represent as a timestamp.
    #[error("delay of {0:?} is out of range; use a delay under 100 years")]
    DelayOutOfRange(Duration),

    /// A migration that was already applied has changed since.
    #[error("outbox migration {version} was applied with a different checksum; the schema in the database does not match this version of outbox-core")]
    MigrationChanged {
        /// The version of the migration.
        version: i64,
    },

    /// The database holds outbox migrations newer than this build knows.
    #[error("the database has outbox migration {version}, newer than this build of outbox-core knows; upgrade outbox-core")]
    MigrationUnknown {
        /// The version found in the database.
        version: i64,
    },

    /// The handler registry failed its checks.
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),

    /// A handler could not be built from the worker's resources.
    #[error(transparent)]
    Resource(#[from] crate::resources::ResourceError),

    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The worker itself failed: its thread could not start, or it ended by a panic (a bug;
    /// the log has the panic message). Restart the process.
    #[error("the worker failed: {0}")]
    Worker(String),
}

impl Error {
    /// True when the error came from the database (connection lost, query failed).
    pub fn is_database(&self) -> bool {
        matches!(self, Error::Database(_))
    }

    /// True when a payload was refused for its size.
    pub fn is_payload_too_large(&self) -> bool {
        matches!(self, Error::PayloadTooLarge { .. })
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

/// A `Result` with [`Error`] as its error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
