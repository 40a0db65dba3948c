//! Running a worker binary: logging, the stop signal, connecting to the database, and the
//! run itself with its exit code.

use std::future::Future;
use std::process::ExitCode;

use clap::Parser;
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;

use super::print::{error_line, list_topics, print_stats};
use super::{exit, WorkerArgs};
use crate::registry::Registry;
use crate::worker::{Worker, WorkerBuilder, WorkerConfig};

/// Installs a `tracing` subscriber that reads `RUST_LOG` (default `info,lapin=off`: the
/// RabbitMQ client logs each lost connection per channel, which the relay reports once), unless
/// one is set.
pub fn init_logging() {
    init_logging_with("info,lapin=off");
}

/// Installs a `tracing` subscriber that reads `RUST_LOG`, or `default` when it is unset. It
/// writes to stderr, with colours only when stderr is a terminal.
pub fn init_logging_with(default: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
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
    // Flags out of range are bad arguments (exit 2), refused before touching the database;
    // what `configure` sets in code is checked when the worker is built (exit 3).
    if let Err(e) = args
        .apply(WorkerConfig::default())
        .validate(std::time::Duration::ZERO)
    {
        eprintln!("error: a flag is out of range: {}", error_line(&e));
        return ExitCode::from(exit::USAGE);
    }
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
    if args.stats {
        // Statistics need the database only: no handler is built, so they print precisely when
        // a handler is missing or cannot be built.
        return match store.stats().await {
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
    let registry = args
        .served_elsewhere
        .iter()
        .fold(Registry::linked(), |r, topic| {
            r.allow_unhandled(topic.clone())
        });
    let builder = Worker::builder(store.clone())
        .registry(registry)
        .config(args.apply(WorkerConfig::default()));
    // Built as a run would build it, so `--list-topics` names exactly what would stop a run.
    let built = configure(&args, builder).build();
    if args.list_topics {
        return list_topics(&built, &args.served_elsewhere, &store).await;
    }
    let worker = match built {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
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

/// Connects to `url` and returns a [`Store`](crate::store::Store) for it.
///
/// # Errors
///
/// [`Error::Database`](crate::error::Error::Database) when the URL is bad or the server unreachable;
/// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument) for a database kind this
/// build does not support.
///
/// # Cancellation safety
///
/// Cancellation safe.
pub async fn connect(url: &str) -> crate::error::Result<crate::store::Store> {
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        use sqlx::ConnectOptions;
        let options: sqlx::postgres::PgConnectOptions = url.parse()?;
        // One direct connection first: it fails fast and with the real cause (a pool retries
        // until its timeout and then only says that it timed out).
        sqlx::Connection::close(options.connect().await?).await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_lazy_with(options);
        return Ok(crate::store::Store::postgres(pool));
    }
    #[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
    if url.starts_with("sqlite:") {
        return Ok(crate::store::Store::sqlite(
            crate::backend::sqlite::sqlite_pool(url).await?,
        ));
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql://") || url.starts_with("mariadb://") {
        use sqlx::ConnectOptions;
        let options: sqlx::mysql::MySqlConnectOptions = url.parse()?;
        // As for PostgreSQL: one direct connection first, failing fast with the real cause.
        sqlx::Connection::close(options.connect().await?).await?;
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(std::time::Duration::from_secs(10))
            .connect_lazy_with(options);
        return Ok(crate::store::Store::mysql(pool));
    }
    Err(crate::error::Error::InvalidArgument(format!(
        "unsupported database URL `{}`: use postgres://, mysql:// or sqlite:",
        url.split(':').next().unwrap_or("")
    )))
}
