//! The command line of a worker binary, what its flags change in the worker's configuration,
//! and the redaction that keeps the database password out of logs.

use std::time::Duration;

use clap::Parser;

use crate::worker::{RetryPolicy, Wakeup, WorkerConfig};

/// The command line of a worker binary.
///
/// Its `Debug` prints the database URL with its password replaced by `***` (see
/// [`redact_url`]), and `--help` names the environment variables without their values.
#[derive(Clone, Parser)]
// `long_about = None`: `--help` says what the binary does, not what this type's rustdoc says.
#[command(about = "Runs outbox handlers until stopped", long_about = None)]
#[non_exhaustive]
pub struct WorkerArgs {
    /// The database URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Claim one batch, run it, write the outcomes and exit.
    #[arg(long)]
    pub once: bool,
    /// Print topic -> handlers, then what is missing (declared events without a handler,
    /// handlers that cannot be built, and why) and the pending topics nobody here handles; exit
    /// 0 when the worker would start, 3 when something is missing.
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

pub use crate::diagnostics::redact_url;

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

/// The flags of `command` and its subcommands that read an environment variable and would
/// show its value in `--help`: clap prints `[env: NAME=value]`, and `[env: NAME=]` when it is
/// unset, unless the flag hides it.
#[cfg(test)]
pub(super) fn env_values_shown(command: &clap::Command) -> Vec<String> {
    let mut shown: Vec<String> = command
        .get_arguments()
        .filter(|a| a.get_env().is_some() && !a.is_hide_env_values_set())
        .map(|a| format!("{} --{}", command.get_name(), a.get_id()))
        .collect();
    for sub in command.get_subcommands() {
        shown.extend(env_values_shown(sub));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_names_every_environment_variable_without_its_value() {
        use clap::CommandFactory;
        let shown = env_values_shown(&WorkerArgs::command());
        assert!(shown.is_empty(), "--help shows the values of {shown:?}");
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
