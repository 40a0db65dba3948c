//! The pieces of a worker binary: arguments, logging, signals and exit codes.
//!
//! A user's worker `main` is a few lines:
//!
//! ```no_run
//! // use my_handlers as _; // link the crates whose handlers this worker runs
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     outbox::cli::run_worker(|_args, builder| builder).await
//! }
//! ```
//!
//! It then understands `--once`, `--list-topics`, `--database-url` (or `DATABASE_URL`) and the
//! tuning flags of [`WorkerArgs`], stops cleanly on SIGTERM or SIGINT, and exits with one of the
//! codes in [`exit`].

mod args;
mod events;
pub mod exit;
pub mod ops;
mod pauses;
mod print;
mod replay;
mod run;
mod workers;

pub(crate) use self::args::duration;
pub use self::args::{redact_url, WorkerArgs, MAX_DURATION};
pub use self::print::{error_line, print_stats};
pub use self::run::{
    connect, init_logging, init_logging_with, run_worker, run_worker_with, shutdown_signal,
};
