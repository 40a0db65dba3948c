//! Exit codes of a worker binary and of the `outbox` command line, for scripts.
//!
//! | code | meaning | what to do |
//! |---|---|---|
//! | 0 | done | |
//! | 1 | failed while running, or not found / refused, or an unclassified database error | read the message |
//! | 2 | bad command line or argument: refused by the parser, or out of range for the command ([`Error::InvalidArgument`], a malformed or unknown database URL, a worker flag out of range) | fix the arguments |
//! | 3 | the handlers or the configuration are not sound; for `--list-topics`, something it lists as `missing:` | fix the worker's setup |
//! | 4 | the database could not be reached (refused, lost, shut down, timed out), stayed locked, or ended the transaction on a deadlock or lock wait timeout | check the server and the URL; retrying later may work |
//! | 5 | the outbox schema is missing, out of date or newer than this build | run `outbox migrate`, or upgrade |
//! | 6 | the database refused a write that breaks a constraint | fix the data; a retry will not help |
//! | 7 | the database refused a value as invalid or out of range | fix the arguments or the data |
//!
//! [`for_error`] maps an [`Error`] to its code.

use crate::{error::DatabaseErrorKind, error::Error};

/// Ran and stopped cleanly (or `--once` finished its batch).
pub const OK: u8 = 0;
/// Failed while running; not found or refused; an unclassified database error.
pub const FAILURE: u8 = 1;
/// Bad command line or argument (clap's own code).
pub const USAGE: u8 = 2;
/// The handlers or the configuration are not sound (missing resource, duplicate name,
/// no handlers, a declared event without a handler, bad setting). A worker binary's
/// `--list-topics` exits with it, after its listing, when it names something missing.
pub const CONFIG: u8 = 3;
/// The database could not be reached, stayed locked, or ended the transaction on a deadlock or
/// lock wait timeout: a retry later may work.
pub const DATABASE: u8 = 4;
/// The outbox schema is missing, out of date, or newer than this build.
pub const SCHEMA: u8 = 5;
/// The database refused a write that breaks a constraint.
pub const CONSTRAINT: u8 = 6;
/// The database refused a value as invalid or out of range.
pub const DATA: u8 = 7;

/// The exit code for `e`.
///
/// ```
/// use outbox::cli::exit;
///
/// let e = outbox::Error::from(outbox::sqlx::Error::PoolTimedOut);
/// assert_eq!(exit::for_error(&e), exit::DATABASE);
/// ```
pub fn for_error(e: &Error) -> u8 {
    match e {
        Error::Database(_) => match e.database_kind() {
            Some(
                DatabaseErrorKind::Connection
                | DatabaseErrorKind::Busy
                | DatabaseErrorKind::Conflict,
            ) => DATABASE,
            Some(DatabaseErrorKind::MissingSchema) => SCHEMA,
            Some(DatabaseErrorKind::Constraint) => CONSTRAINT,
            Some(DatabaseErrorKind::Data) => DATA,
            Some(DatabaseErrorKind::InvalidArgument) => USAGE,
            _ => FAILURE,
        },
        Error::MigrationChanged { .. } | Error::MigrationUnknown { .. } => SCHEMA,
        Error::DelayOutOfRange(_) | Error::InvalidArgument(_) | Error::Pause(_) => USAGE,
        Error::Registry(_) | Error::Resource(_) | Error::Config(_) => CONFIG,
        // A worker that failed by itself is not misconfigured: a plain failure.
        Error::Worker(_) | Error::WorkerPanicked(_) => FAILURE,
        _ => FAILURE,
    }
}
