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

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

pub mod ops;

use crate::registry::Registry;
use crate::worker::{RetryPolicy, Wakeup, Worker, WorkerBuilder, WorkerConfig};

/// Exit codes of a worker binary and of the `outbox` command line, for scripts.
///
/// | code | meaning | what to do |
/// |---|---|---|
/// | 0 | done | |
/// | 1 | failed while running, or not found / refused, or an unclassified database error | read the message |
/// | 2 | bad command line or argument (also a malformed database URL) | fix the arguments |
/// | 3 | the handlers or the configuration are not sound | fix the worker's setup |
/// | 4 | the database could not be reached (refused, lost, shut down, timed out) or stayed locked | check the server and the URL; retrying later may work |
/// | 5 | the outbox schema is missing, out of date or newer than this build | run `outbox migrate`, or upgrade |
/// | 6 | the database refused a write that breaks a constraint | fix the data; a retry will not help |
/// | 7 | the database refused a value as invalid or out of range | fix the arguments or the data |
///
/// [`for_error`](exit::for_error) maps an [`Error`](crate::Error) to its code.
pub mod exit {
    use crate::{DatabaseErrorKind, Error};

    /// Ran and stopped cleanly (or `--once` finished its batch).
    pub const OK: u8 = 0;
    /// Failed while running; not found or refused; an unclassified database error.
    pub const FAILURE: u8 = 1;
    /// Bad command line or argument (clap's own code).
    pub const USAGE: u8 = 2;
    /// The handlers or the configuration are not sound (missing resource, duplicate name,
    /// no handlers, bad setting).
    pub const CONFIG: u8 = 3;
    /// The database could not be reached (or stayed locked): a retry later may work.
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
                Some(DatabaseErrorKind::Connection | DatabaseErrorKind::Busy) => DATABASE,
                Some(DatabaseErrorKind::MissingSchema) => SCHEMA,
                Some(DatabaseErrorKind::Constraint) => CONSTRAINT,
                Some(DatabaseErrorKind::Data) => DATA,
                Some(DatabaseErrorKind::InvalidArgument) => USAGE,
                _ => FAILURE,
            },
            Error::MigrationChanged { .. } | Error::MigrationUnknown { .. } => SCHEMA,
            Error::DelayOutOfRange(_) => USAGE,
            Error::Registry(_) | Error::Resource(_) | Error::Config(_) => CONFIG,
            // A worker that failed by itself is not misconfigured: a plain failure.
            Error::Worker(_) | Error::WorkerPanicked(_) => FAILURE,
            _ => FAILURE,
        }
    }
}

/// The command line of a worker binary.
///
/// Its `Debug` prints the database URL with its password replaced by `***` (see
/// [`redact_url`]), and `--help` names the environment variables without their values.
#[derive(Clone, Parser)]
#[command(about = "Runs outbox handlers until stopped")]
#[non_exhaustive]
pub struct WorkerArgs {
    /// The database URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Claim one batch, run it, write the outcomes and exit.
    #[arg(long)]
    pub once: bool,
    /// Print topic -> handlers, declared events without a handler and pending topics nobody
    /// handles, then exit.
    #[arg(long)]
    pub list_topics: bool,
    /// A topic whose declared event this binary has no handler for, because another service's
    /// workers serve it; without it such a worker refuses to start (repeat the flag, or give a
    /// comma-separated list).
    #[arg(
        long,
        value_name = "TOPIC",
        value_delimiter = ',',
        env = "OUTBOX_SERVED_ELSEWHERE",
        hide_env_values = true
    )]
    pub served_elsewhere: Vec<String>,
    /// Do not apply the outbox migrations at start-up.
    #[arg(long)]
    pub no_migrate: bool,
    /// Handler calls in flight at once.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Messages per claim.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// How long a claim holds a message before another worker may take it (e.g. 5s).
    #[arg(long, value_parser = duration)]
    pub lease: Option<Duration>,
    /// How often an idle worker looks for messages when nothing wakes it (e.g. 1s, 500ms).
    #[arg(long, value_parser = duration)]
    pub poll_interval: Option<Duration>,
    /// Under a steady trickle, the pause between claims that did not fill a batch (e.g. 5ms).
    #[arg(long, value_parser = duration)]
    pub claim_interval: Option<Duration>,
    /// How long one handler call may run (e.g. 60s).
    #[arg(long, value_parser = duration)]
    pub handler_timeout: Option<Duration>,
    /// How long shutdown waits for running handlers before handing their messages back (e.g. 25s).
    #[arg(long, value_parser = duration)]
    pub shutdown_timeout: Option<Duration>,
    /// Attempts before a message is dead-lettered.
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// The first retry delay (e.g. 1s).
    #[arg(long, value_parser = duration)]
    pub retry_base: Option<Duration>,
    /// The longest retry delay (e.g. 1h).
    #[arg(long, value_parser = duration)]
    pub retry_max: Option<Duration>,
    /// Exact retry delays, without jitter.
    #[arg(long)]
    pub no_jitter: bool,
    /// Poll only (no LISTEN), e.g. behind PgBouncer in transaction mode.
    #[arg(long)]
    pub poll_only: bool,
    /// Print the queue statistics, with pending topics no linked handler serves listed apart,
    /// then exit.
    #[arg(long)]
    pub stats: bool,
    /// Serve Prometheus `/metrics` and `/health` on this address (e.g. 127.0.0.1:9464).
    #[cfg(feature = "prometheus")]
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

impl std::fmt::Debug for WorkerArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field, by name, so that a new one is not forgotten: only the URL is redacted.
        let WorkerArgs {
            database_url,
            once,
            list_topics,
            served_elsewhere,
            no_migrate,
            concurrency,
            batch_size,
            lease,
            poll_interval,
            claim_interval,
            handler_timeout,
            shutdown_timeout,
            max_attempts,
            retry_base,
            retry_max,
            no_jitter,
            poll_only,
            stats,
            #[cfg(feature = "prometheus")]
            metrics_addr,
        } = self;
        let mut d = f.debug_struct("WorkerArgs");
        d.field("database_url", &redact_url(database_url))
            .field("once", once)
            .field("list_topics", list_topics)
            .field("served_elsewhere", served_elsewhere)
            .field("no_migrate", no_migrate)
            .field("concurrency", concurrency)
            .field("batch_size", batch_size)
            .field("lease", lease)
            .field("poll_interval", poll_interval)
            .field("claim_interval", claim_interval)
            .field("handler_timeout", handler_timeout)
            .field("shutdown_timeout", shutdown_timeout)
            .field("max_attempts", max_attempts)
            .field("retry_base", retry_base)
            .field("retry_max", retry_max)
            .field("no_jitter", no_jitter)
            .field("poll_only", poll_only)
            .field("stats", stats);
        #[cfg(feature = "prometheus")]
        d.field("metrics_addr", metrics_addr);
        d.finish()
    }
}

/// `url` with the password replaced by `***`, for logs and `Debug`: the one in the user
/// information (`postgres://user:***@host/db`) and a `password` query parameter
/// (`?password=***`). Everything else is kept, so the host and database stay readable.
///
/// ```
/// use outbox::cli::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:s3cret@db.internal:5432/app"),
///     "postgres://app:***@db.internal:5432/app"
/// );
/// assert_eq!(
///     redact_url("postgres://db/app?user=app&password=s3cret&sslmode=require"),
///     "postgres://db/app?user=app&password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("sqlite:outbox.db"), "sqlite:outbox.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // `sqlite:...` and the like: no user information, maybe a query.
        return redact_query(url);
    };
    // The user information ends at the last `@`: a password may hold `/`, `?`, `#` or `@`
    // unencoded. (A later `@`, in the path or the query, hides more than needed, never less.)
    let (userinfo, after) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let mut out = format!("{scheme}://");
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _password)) => {
                out.push_str(user);
                out.push_str(":***");
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    out.push_str(&redact_query(after));
    out
}

/// `rest` with the value of every `password` query parameter replaced by `***`.
fn redact_query(rest: &str) -> String {
    let Some((head, query)) = rest.split_once('?') else {
        return rest.to_string();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

/// The longest duration any flag takes: 100 years (of 365.25 days, as `100y` is read), far
/// beyond any sensible setting and well inside every timestamp type, so an absurd value is
/// refused before it reaches SQL.
pub const MAX_DURATION: Duration = crate::duration::MAX_DURATION;

/// Every duration the command lines take, in the one human format of
/// [`duration::parse`](crate::duration::parse): `500ms`, `30s`, `5m`, `12h`, `7d`; a bare number
/// counts as seconds.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    crate::duration::parse(s)
}

impl WorkerArgs {
    /// Applies the flags to `config`.
    pub fn apply(&self, mut config: WorkerConfig) -> WorkerConfig {
        if let Some(n) = self.concurrency {
            config = config.concurrency(n);
        }
        if let Some(n) = self.batch_size {
            config = config.batch_size(n);
        }
        if let Some(d) = self.lease {
            config = config.lease(d);
        }
        if let Some(d) = self.poll_interval {
            config = config.poll_interval(d);
        }
        if let Some(d) = self.claim_interval {
            config = config.claim_interval(d);
        }
        if let Some(d) = self.handler_timeout {
            config = config.handler_timeout(d);
        }
        if let Some(d) = self.shutdown_timeout {
            config = config.shutdown_timeout(d);
        }
        let mut retry: RetryPolicy = config.retry.clone();
        if let Some(n) = self.max_attempts {
            retry = retry.max_attempts(n);
        }
        if let Some(d) = self.retry_base {
            retry = retry.base(d);
        }
        if let Some(d) = self.retry_max {
            retry = retry.max_delay(d);
        }
        if self.no_jitter {
            retry = retry.jitter(false);
        }
        config = config.retry(retry);
        if self.poll_only {
            config = config.wakeup(Wakeup::Poll);
        }
        config
    }
}

/// Installs a `tracing` subscriber that reads `RUST_LOG` (default `info`), unless one is set.
pub fn init_logging() {
    init_logging_with("info");
}

/// Installs a `tracing` subscriber that reads `RUST_LOG`, or `default` when it is unset.
pub fn init_logging_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Completes on SIGTERM or SIGINT (Ctrl-C).
///
/// # Cancellation safety
///
/// Cancellation safe.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs a worker binary: parses [`WorkerArgs`], connects, migrates, builds a worker from the
/// linked handlers (passed through `configure` to add resources or handlers), then runs until
/// SIGTERM or SIGINT, once, or lists topics.
///
/// # Cancellation safety
///
/// Meant to be the whole of `main`; not cancellation safe.
pub async fn run_worker<F>(configure: F) -> ExitCode
where
    F: FnOnce(&WorkerArgs, WorkerBuilder) -> WorkerBuilder,
{
    init_logging();
    let args = WorkerArgs::parse();
    // Listen for signals from the start, so a stop during connect or migrate is clean too.
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    run_worker_with(args, configure, stop.cancelled_owned()).await
}

/// [`run_worker`] with arguments already parsed and a stop signal of your own.
///
/// # Cancellation safety
///
/// Not cancellation safe.
pub async fn run_worker_with<F>(
    args: WorkerArgs,
    configure: F,
    stop: impl Future<Output = ()> + Send,
) -> ExitCode
where
    F: FnOnce(&WorkerArgs, WorkerBuilder) -> WorkerBuilder,
{
    let stop = stop.shared();
    let start = async {
        let store = connect(&args.database_url)
            .await
            .map_err(|e| (format!("error: {}", error_line(&e)), exit::for_error(&e)))?;
        if !args.no_migrate {
            crate::migrate(store.clone()).await.map_err(|e| {
                (
                    format!(
                        "error: could not apply the outbox migrations: {}",
                        error_line(&e)
                    ),
                    exit::for_error(&e),
                )
            })?;
        }
        Ok::<_, (String, u8)>(store)
    };
    let store = tokio::select! {
        () = stop.clone() => return ExitCode::from(exit::OK),
        r = start => match r {
            Ok(store) => store,
            Err((line, code)) => {
                eprintln!("{line}");
                return ExitCode::from(code);
            }
        },
    };
    let registry = args
        .served_elsewhere
        .iter()
        .fold(Registry::linked(), |r, topic| {
            r.allow_unhandled(topic.clone())
        });
    let builder = Worker::builder(store)
        .registry(registry)
        .config(args.apply(WorkerConfig::default()))
        // Listing topics and statistics must work precisely when a handler is missing.
        .strict(!(args.list_topics || args.stats));
    let worker = match configure(&args, builder).build() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    if args.list_topics {
        return list_topics(&worker).await;
    }
    if args.stats {
        return match worker.store().stats().await {
            Ok(stats) => {
                print_stats(&stats, Some(&Registry::linked()), false);
                ExitCode::from(exit::OK)
            }
            Err(e) => {
                eprintln!("error: {}", error_line(&e));
                ExitCode::from(exit::for_error(&e))
            }
        };
    }
    #[cfg(feature = "prometheus")]
    let _server = match args.metrics_addr {
        None => None,
        Some(addr) => {
            let served = match crate::observe::install_prometheus() {
                Ok(handle) => crate::observe::serve(addr, handle, worker.health())
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match served {
                Ok(server) => {
                    tracing::info!(addr = %server.local_addr(), "serving /metrics and /health");
                    Some(server)
                }
                Err(e) => {
                    eprintln!("error: cannot serve metrics on {addr}: {e}");
                    return ExitCode::from(exit::CONFIG);
                }
            }
        }
    };
    if args.once {
        return match worker.run_once().await {
            Ok(r) => {
                println!(
                    "claimed {} done {} retried {} dead {}",
                    r.claimed, r.done, r.retried, r.dead
                );
                ExitCode::from(exit::OK)
            }
            Err(e) => {
                eprintln!("error: {}", error_line(&e));
                ExitCode::from(exit::for_error(&e))
            }
        };
    }
    let code = match worker.run_until(stop).await {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            exit::for_error(&e)
        }
    };
    let stuck = worker.running_handlers();
    if stuck > 0 {
        // Handlers that block their thread past the deadline cannot be cancelled, and the
        // runtime would wait for them when it is dropped: their messages are already handed
        // back, so exit now instead of outliving the supervisor's grace period.
        tracing::warn!(
            handlers = stuck,
            "handlers still hold their threads after the shutdown deadline; exiting without waiting for them"
        );
        std::process::exit(i32::from(code));
    }
    ExitCode::from(code)
}

async fn list_topics(worker: &Worker) -> ExitCode {
    for (topic, handlers) in worker.topics() {
        println!("{topic}: {}", handlers.join(", "));
    }
    for e in Registry::linked().unhandled_events() {
        println!(
            "warning: declared event {} (topic {}) has no handler",
            e.type_name(),
            e.topic()
        );
    }
    match worker.unhandled_pending_topics().await {
        Ok(topics) => {
            for (topic, n) in topics {
                println!("warning: {n} pending message(s) of topic {topic} have no handler here");
            }
            ExitCode::from(exit::OK)
        }
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::from(exit::for_error(&e))
        }
    }
}

/// Connects to `url` and returns a [`Store`](crate::Store) for it.
///
/// # Errors
///
/// [`Error::Database`](crate::Error::Database) when the URL is bad or the server unreachable;
/// [`Error::Config`](crate::Error::Config) for a database kind this build does not support.
///
/// # Cancellation safety
///
/// Cancellation safe.
pub async fn connect(url: &str) -> crate::Result<crate::Store> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        use sqlx::ConnectOptions;
        let options: sqlx::postgres::PgConnectOptions = url.parse()?;
        // One direct connection first: it fails fast and with the real cause (a pool retries
        // until its timeout and then only says that it timed out).
        sqlx::Connection::close(options.connect().await?).await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        return Ok(crate::Store::postgres(pool));
    }
    #[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
    if url.starts_with("sqlite:") {
        return Ok(crate::Store::sqlite(crate::sqlite_pool(url).await?));
    }
    Err(crate::Error::Config(format!(
        "unsupported database URL `{}`: use postgres:// or sqlite:",
        url.split(':').next().unwrap_or("")
    )))
}

/// An error and its sources on one line, for a binary's `error: ...` message.
pub fn error_line(e: &crate::Error) -> String {
    crate::error::chain_line(e)
}

/// Prints queue statistics as a table (or JSON), with the pending topics that `registry` has
/// no handler for listed apart when a registry is given, and the topics whose ready messages
/// no live worker serves listed apart always.
pub fn print_stats(stats: &crate::Stats, registry: Option<&Registry>, json: bool) {
    let unhandled: Vec<&crate::TopicStats> =
        registry.map(|r| stats.unhandled(r)).unwrap_or_default();
    let unserved: Vec<&crate::TopicStats> = stats.topics.iter().filter(|t| t.unserved()).collect();
    if json {
        let row = |t: &crate::TopicStats| {
            serde_json::json!({
                "topic": t.topic, "ready": t.ready, "scheduled": t.scheduled, "in_flight": t.in_flight,
                "stalled": t.stalled, "dead": t.dead, "done_last_5m": t.done_last_5m,
                "oldest_ready_age_secs": t.oldest_ready_age.map(|d| d.as_secs_f64()),
                "live_workers": t.live_workers, "blocked": t.blocked,
                "blocked_by_dead": t.blocked_by_dead,
                "oldest_blocked_age_secs": t.oldest_blocked_age.map(|d| d.as_secs_f64()),
            })
        };
        let doc = serde_json::json!({
            "topics": stats.topics.iter().map(row).collect::<Vec<_>>(),
            "total": row(&stats.total),
            "unhandled": unhandled.iter().map(|t| row(t)).collect::<Vec<_>>(),
            "unserved": unserved.iter().map(|t| row(t)).collect::<Vec<_>>(),
        });
        println!("{doc}");
        return;
    }
    let line = |t: &crate::TopicStats| {
        let age = t
            .oldest_ready_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let blocked_age = t
            .oldest_blocked_age
            .map(|d| format!("{:.1}s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}",
            t.topic,
            t.ready,
            t.scheduled,
            t.in_flight,
            t.stalled,
            t.dead,
            t.done_last_5m,
            age,
            t.live_workers,
            t.blocked,
            t.blocked_by_dead,
            blocked_age
        );
    };
    println!(
        "{:<32} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8} {:>9} {:>9} {:>12}",
        "topic",
        "ready",
        "scheduled",
        "in flight",
        "stalled",
        "dead",
        "done 5m",
        "oldest",
        "workers",
        "blocked",
        "by dead",
        "blk oldest"
    );
    stats.topics.iter().for_each(line);
    line(&stats.total);
    if !unhandled.is_empty() {
        println!("\npending topics with no handler in this binary (they stay pending):");
        unhandled.iter().for_each(|t| line(t));
    }
    if !unserved.is_empty() {
        println!(
            "\nready messages that no live worker serves (they wait until a worker with their \
             handlers starts: is a handler crate not linked, or its workers down?):"
        );
        unserved.iter().for_each(|t| line(t));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_passwords_wherever_they_are() {
        for (url, want) in [
            (
                "postgres://app:s3cret@db:5432/app",
                "postgres://app:***@db:5432/app",
            ),
            ("postgres://app@db/app", "postgres://app@db/app"),
            ("postgres://db/app", "postgres://db/app"),
            (
                "postgresql://app:p@ss@db/app",
                "postgresql://app:***@db/app",
            ),
            ("postgres://app:pa/ss?@db/app", "postgres://app:***@db/app"),
            (
                "postgres://app:p@ss/w?rd@db/app",
                "postgres://app:***@db/app",
            ),
            (
                "postgres://db/app?password=s3cret&user=app",
                "postgres://db/app?password=***&user=app",
            ),
            (
                "postgres://app:s3cret@db/app?PASSWORD=other",
                "postgres://app:***@db/app?PASSWORD=***",
            ),
            ("sqlite:outbox.db?mode=rwc", "sqlite:outbox.db?mode=rwc"),
            ("sqlite::memory:", "sqlite::memory:"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    #[test]
    fn worker_args_debug_redacts_the_database_url() {
        let args = WorkerArgs::try_parse_from([
            "worker",
            "--database-url",
            "postgres://app:hunter2-db@db.internal/app",
            "--concurrency",
            "4",
        ])
        .unwrap();
        let dbg = format!("{args:?}");
        assert!(!dbg.contains("hunter2-db"), "{dbg}");
        assert!(dbg.contains("postgres://app:***@db.internal/app"), "{dbg}");
        assert!(dbg.contains("concurrency: Some(4)"), "{dbg}");
        assert_eq!(
            args.database_url,
            "postgres://app:hunter2-db@db.internal/app"
        );
    }
}
