//! The error type of library operations.

use std::time::Duration;

/// The error returned by `outbox-core` operations: enqueue, migrations, the worker and
/// operations calls.
///
/// Handlers do not return this type; they return [`HandlerError`](crate::HandlerError), which
/// says whether a failure should be retried.
///
/// Match on what a caller can act on, and keep a catch-all arm: the enum grows.
///
/// ```no_run
/// use outbox::{enqueue, outbox_event, DatabaseErrorKind, Error};
///
/// #[outbox_event]
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct ReportRequested { pdf: Vec<u8> }
///
/// # async fn run(pool: sqlx::PgPool, event: ReportRequested) -> Result<(), Error> {
/// let mut tx = pool.begin().await?;
/// match enqueue(&mut *tx, &event).await {
///     Ok(_) => tx.commit().await?,
///     Err(e) if e.is_payload_too_large() => {
///         // Store the PDF elsewhere and enqueue its id instead.
///     }
///     Err(e) if e.database_kind() == Some(DatabaseErrorKind::Connection) => {
///         // Worth another try later.
///         return Err(e);
///     }
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// ```
///
/// Its `Debug` is the same one line as [`Error::line`], so that a `main` returning
/// `Result<(), Box<dyn std::error::Error>>` prints what happened and what to do, not a dump of
/// the database driver's structures.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database returned an error or could not be reached. Its message says which of the
    /// [`DatabaseErrorKind`]s it is and what to do; [`Error::database_kind`] tells a program.
    #[error("{}", advice(.0))]
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

    /// An insert is larger than the MySQL server's `max_allowed_packet`: it was not sent (the
    /// server would have closed the connection, and the transaction with it), and the
    /// caller's transaction is still usable.
    #[error("the insert of topic `{topic}` is about {size} bytes, over the server's max_allowed_packet of {limit} bytes; nothing was sent and the transaction is still usable; enqueue smaller payloads (store large data elsewhere and enqueue its id) or raise max_allowed_packet on the server")]
    PacketTooLarge {
        /// The topic of the (first) event.
        topic: &'static str,
        /// The size of the largest statement it would have sent, in bytes, about.
        size: usize,
        /// The server's `max_allowed_packet`.
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

    /// An ordering key is empty or too long.
    #[error("invalid ordering key for topic `{topic}`: {reason}")]
    InvalidOrderingKey {
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

    /// An argument of the call is invalid or out of range (a replay's window or rate, a
    /// retention window, a purge batch, a database URL of an unknown kind): nothing was done.
    /// The message says what is allowed. The command line exits with
    /// 2, a usage error on it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A replay of the event log was refused: the topic retains nothing, the handler never ran
    /// on it, the window holds no event, or the replay is not in a state to pause, resume or
    /// cancel. The message says which, and what to do.
    #[error("replay refused: {0}")]
    ReplayRefused(String),

    /// A pause or a resume was refused: an unknown handler, an empty name, a duration out of
    /// range. The [`PauseError`](crate::PauseError) says which, and what to do; nothing was
    /// changed.
    #[error(transparent)]
    Pause(#[from] crate::pause::PauseError),

    /// The worker could not start its own thread or runtime. Restart the process.
    #[error("the worker failed: {0}")]
    Worker(String),

    /// The worker's own loop panicked: a bug in outbox, not a configuration error (a handler's
    /// panic is only a failed attempt of its message). The messages it held are claimed again
    /// once their leases run out. Restart the process, and report the panic message.
    #[error("the worker's loop panicked: {0}")]
    WorkerPanicked(String),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.line())
    }
}

impl Error {
    /// The error on one line: what happened and what to do, then its causes; for a database
    /// error, the server's own message (without the server's source position that the
    /// driver's text appends).
    ///
    /// ```
    /// let e = outbox::Error::from(outbox::sqlx::Error::PoolTimedOut);
    /// assert!(e.line().starts_with("cannot reach the database"));
    /// assert_eq!(format!("{e:?}"), e.line());
    /// ```
    pub fn line(&self) -> String {
        match self {
            Error::Database(sqlx::Error::Database(db)) => format!("{self}: {}", db.message()),
            _ => crate::diagnostics::error_chain(self),
        }
    }

    /// True when the error came from the database (connection lost, query failed).
    pub fn is_database(&self) -> bool {
        matches!(self, Error::Database(_))
    }

    /// What kind of database failure this is, when it is one.
    ///
    /// ```
    /// use outbox::{DatabaseErrorKind, Error};
    ///
    /// let e = Error::from(outbox::sqlx::Error::PoolTimedOut);
    /// assert_eq!(e.database_kind(), Some(DatabaseErrorKind::Connection));
    /// assert!(e.to_string().starts_with("cannot reach the database"));
    /// ```
    pub fn database_kind(&self) -> Option<DatabaseErrorKind> {
        match self {
            Error::Database(e) => Some(DatabaseErrorKind::of(e)),
            _ => None,
        }
    }

    /// True when the worker's own loop panicked ([`Error::WorkerPanicked`]).
    pub fn is_worker_panic(&self) -> bool {
        matches!(self, Error::WorkerPanicked(_))
    }

    /// True when a payload was refused for its size.
    pub fn is_payload_too_large(&self) -> bool {
        matches!(
            self,
            Error::PayloadTooLarge { .. } | Error::PacketTooLarge { .. }
        )
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

/// What went wrong in the database, and so what to do about it: the classes of
/// [`Error::Database`].
///
/// | kind | PostgreSQL | SQLite | MySQL, MariaDB | others |
/// |---|---|---|---|---|
/// | [`Connection`](Self::Connection) | SQLSTATE class `08`, `57P01`-`57P03`, `53300` | cannot open the file | 2002, 2003, 2006, 2013, 1040, 1044, 1045, 1049, 1053, 1927 | I/O, TLS, pool timed out or closed |
/// | [`Busy`](Self::Busy) | | `SQLITE_BUSY`, `SQLITE_LOCKED` ("database is locked") | | |
/// | [`Conflict`](Self::Conflict) | | | 1213 deadlock, 1205 lock wait timeout | |
/// | [`MissingSchema`](Self::MissingSchema) | `42P01` undefined table, `42703` undefined column | "no such table", "no such column" | 1146, 1054 | |
/// | [`Constraint`](Self::Constraint) | class `23` | `SQLITE_CONSTRAINT` | 1062, 1451, 1452, 1048, 3819, 4025 | |
/// | [`Data`](Self::Data) | class `22` | `SQLITE_TOOBIG`, `SQLITE_MISMATCH`, `SQLITE_RANGE` | 1406, 1264, 1366, 1292, 1153, 3140 | |
/// | [`InvalidArgument`](Self::InvalidArgument) | | | | a malformed database URL or option |
/// | [`Other`](Self::Other) | anything else | | | |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseErrorKind {
    /// The database could not be reached, or the connection was lost or shut down.
    Connection,
    /// Another connection holds the (SQLite) database's write lock for too long.
    Busy,
    /// The outbox tables or columns are missing: the schema is not migrated (or is older than
    /// this build).
    MissingSchema,
    /// A write broke a constraint (unique, foreign key, not null, check, exclusion).
    Constraint,
    /// The database refused a value: out of range, malformed, too long.
    Data,
    /// The database URL or a connection option is malformed.
    InvalidArgument,
    /// MySQL or MariaDB ended the statement on a deadlock (1213: the server rolled the whole
    /// transaction back) or a lock wait timeout (1205: the server rolled back only the
    /// statement, unless it runs with `innodb_rollback_on_timeout = ON`): roll the transaction
    /// back and run the whole transaction again. [`enqueue`](crate::enqueue) has already rolled
    /// the caller's transaction back when it returns this (see its errors).
    Conflict,
    /// Any other database error.
    Other,
}

impl DatabaseErrorKind {
    /// The kind of `e`.
    pub fn of(e: &sqlx::Error) -> Self {
        use sqlx::Error as E;
        match e {
            E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
                DatabaseErrorKind::Connection
            }
            E::Configuration(_) | E::InvalidArgument(_) => DatabaseErrorKind::InvalidArgument,
            E::Database(db) => Self::of_database(&**db),
            _ => DatabaseErrorKind::Other,
        }
    }

    fn of_database(db: &dyn sqlx::error::DatabaseError) -> Self {
        use sqlx::error::ErrorKind;
        if !matches!(db.kind(), ErrorKind::Other) {
            return DatabaseErrorKind::Constraint;
        }
        let code = db.code().unwrap_or_default();
        if let Some(n) = mysql_number(db) {
            return match n {
                1213 | 1205 => DatabaseErrorKind::Conflict,
                // Server gone or lost, too many connections, access denied, unknown database,
                // shutdown in progress, connection killed.
                2002 | 2003 | 2006 | 2013 | 1040 | 1044 | 1045 | 1049 | 1053 | 1927 => {
                    DatabaseErrorKind::Connection
                }
                1146 | 1054 => DatabaseErrorKind::MissingSchema,
                1062 | 1451 | 1452 | 1048 | 3819 | 4025 => DatabaseErrorKind::Constraint,
                // Data too long, out of range, incorrect value, packet too large.
                1406 | 1264 | 1366 | 1292 | 1153 | 3140 => DatabaseErrorKind::Data,
                _ => DatabaseErrorKind::Other,
            };
        }
        if let Some(n) = sqlite_code(db) {
            return match n & 0xff {
                5 | 6 => DatabaseErrorKind::Busy,
                14 | 26 => DatabaseErrorKind::Connection, // CANTOPEN, NOTADB
                19 => DatabaseErrorKind::Constraint,
                18 | 20 | 25 => DatabaseErrorKind::Data, // TOOBIG, MISMATCH, RANGE
                _ if db.message().starts_with("no such table")
                    || db.message().starts_with("no such column") =>
                {
                    DatabaseErrorKind::MissingSchema
                }
                _ => DatabaseErrorKind::Other,
            };
        }
        match &*code {
            c if c.starts_with("08") => DatabaseErrorKind::Connection,
            "57P01" | "57P02" | "57P03" | "53300" => DatabaseErrorKind::Connection,
            "42P01" | "42703" => DatabaseErrorKind::MissingSchema,
            c if c.starts_with("23") => DatabaseErrorKind::Constraint,
            c if c.starts_with("22") => DatabaseErrorKind::Data,
            _ => DatabaseErrorKind::Other,
        }
    }

    /// What happened and what to do, in one sentence: the message of an [`Error::Database`] of
    /// this kind (the database's own words follow as its source).
    pub fn advice(self) -> &'static str {
        match self {
            DatabaseErrorKind::Connection => {
                "cannot reach the database (refused, lost, shut down or timed out); check the URL, \
                 that the server is up and accepts connections, and the network"
            }
            DatabaseErrorKind::Busy => {
                "the database is locked by another writer; retry, and begin SQLite transactions \
                 that read before they write with outbox::sqlite_begin_immediate"
            }
            DatabaseErrorKind::MissingSchema => {
                "the outbox tables are missing or older than this build; run `outbox migrate` \
                 (or outbox::migrate) on this database"
            }
            DatabaseErrorKind::Constraint => {
                "the database refused the write because it breaks a constraint; retrying will \
                 not help, fix the data"
            }
            DatabaseErrorKind::Data => {
                "the database refused a value as invalid or out of range; check the arguments"
            }
            DatabaseErrorKind::InvalidArgument => {
                "the database URL or a connection option is invalid; fix it"
            }
            DatabaseErrorKind::Conflict => {
                "the database ended a statement on a deadlock or a lock wait timeout; roll the \
                 transaction back and run the whole transaction again"
            }
            DatabaseErrorKind::Other => "the database returned an error",
        }
    }
}

/// The message of an [`Error::Database`]: its kind's [`advice`](DatabaseErrorKind::advice),
/// or for MySQL's two conflicts, what each left of the transaction.
fn advice(e: &sqlx::Error) -> &'static str {
    match e.as_database_error().and_then(mysql_number) {
        Some(1213) => {
            "the database chose this transaction as a deadlock's victim (1213) and rolled all \
             of it back: nothing of it was kept; run the whole transaction again"
        }
        Some(1205) => {
            "a lock wait timed out (1205): the server rolled back only that statement (the \
             whole transaction only with innodb_rollback_on_timeout=ON), so what the \
             transaction wrote before it is still there; roll the transaction back and run the \
             whole transaction again (enqueue has already rolled it back: a commit now stores \
             nothing)"
        }
        _ => DatabaseErrorKind::of(e).advice(),
    }
}

/// The error number of a MySQL or MariaDB error; `None` for other databases.
fn mysql_number(db: &dyn sqlx::error::DatabaseError) -> Option<u16> {
    #[cfg(feature = "mysql")]
    if let Some(e) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return Some(e.number());
    }
    let _ = db;
    None
}

/// The (extended) result code of a SQLite error; `None` for other databases.
fn sqlite_code(db: &dyn sqlx::error::DatabaseError) -> Option<u32> {
    #[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        return db.code()?.parse().ok();
    }
    let _ = db;
    None
}

/// A `Result` with [`Error`] as its error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
