//! The outbox benchmark: the workloads of the README's Performance table, each figure beside its target.
//!
//! Run with `cargo run --release -p outbox-examples --example bench`
//! (`-- --backend postgres|sqlite|mysql|all --json --scale 1.0`). PostgreSQL is the server at
//! `DATABASE_URL` (default `postgres://postgres@127.0.0.1:5432/test`); the bench creates a
//! database of its own there (`outbox_bench_*`) and drops it at the end. SQLite runs in a
//! temporary file. MariaDB (or MySQL) is the server at `MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306`), in a database of its own as for PostgreSQL. `--backend all`
//! runs PostgreSQL, then SQLite, then MariaDB.
//!
//! | row | workload |
//! |-----|----------|
//! | W1  | drain 20,000 pending ~200-byte messages with a no-op handler, timed from building a new pool and worker (a cold start, as a worker binary's) until no live message is left: concurrency 1, a sweep of settings, the default `WorkerConfig` and the best setting (median of `--repeat` runs, every run's figure and the largest deviation from the median); with `--peer`, the peer's drain alternates with the default's (after one untimed round of each) and their ratio is reported |
//! | W2  | 5,000 transactions (business `INSERT` + `enqueue`) from 1 and 8 producers with a worker running, against the same transactions without `enqueue`, and their ratio |
//! | W3  | a fresh default worker (new pool, nothing handled before), idle; one message committed every 10 ms for 5 s: p50 and p99 of handler start - commit; on MariaDB/MySQL also across processes: the worker in a child process (a fresh default worker connected as a worker binary connects), the producer in the bench process, so no commit wakes the worker and it finds messages by polling; handler start - commit on the machine's system clock; the messages committed once the worker had found the first (messages flowing: it polls at its claim interval) apart from the first and those committed before the worker found it (idle: it polls at its poll interval) |
//! | W4  | W1 (best setting) with 2,000,000 done rows in the table (a second database); ratio to W1 as the median of at least 5 pairs' ratios, each pair's order alternating |
//! | W5  | W1 (best setting) with 10,000 pending messages of an unhandled topic due earlier; ratio to W1 as the median of at least 5 pairs' ratios, each pair's order alternating |
//! | W6  | `enqueue_many` of 100,000 messages in batches of 1,000 |
//! | W7  | PostgreSQL and NATS: 20,000 pending messages relayed into a file-backed JetStream stream by a default worker (the publisher as a raw handler), timed from worker start until none is live; beside W1's default drain and raw async-nats publishing of the same payloads (as many awaiting their acknowledgement at once as the worker's concurrency), alternating (`--repeat` rounds); the ratio relay/raw, and the relay's ratio to the composed bound 1 / (1/W1 + 1/raw) of the same rounds, the target |
//! | W8  | the inbox consuming the 20,000 messages W7's relay left in the stream, each in a transaction with its processed-id record, until all are acknowledged |
//! | W7R | PostgreSQL and RabbitMQ: 20,000 pending messages relayed into a durable queue by a default worker (a confirm-mode channel per publish in flight); beside raw lapin publishing of the same payloads from one task on one channel, 32 awaiting their confirm; alternating, and their ratio (no target) |
//! | W9  | W1 (best setting) of 20,000 messages with ordering keys, 1,000 keys interleaved; ratio to W1 as the median of at least 5 pairs' ratios, each pair's order alternating; and one key of 20,000 messages, drained serially (default `WorkerConfig`), every call checked to come in enqueue order; with `--peer`, the keyed drain alternating with graphile-worker's over as many queues (`queue_name`, `bench/peer/keyed.js`), and their ratio |
//! | W9B | W9 beside 1,000 keys that dead letters hold, each with a message of the drained topic waiting behind its dead letter; ratio to W1 as for W9 (no target: it shows what blocked keys cost the others) |
//! | W10 | PostgreSQL: 8 producers, 2,000 transactions each (business `INSERT` + `enqueue`), against 1, 4 and 8 default workers (a pool each) and against 4 beside an idle worker of another topic; `Wakeup::Listen` alternating with `Wakeup::Poll` (`--repeat` pairs, at most 3): producer tx/s, the ratio listen/poll and the share of transactions that sent a NOTIFY (counted by a LISTENer on the wake-up channel) |
//! | W11 | W1 (best setting) where every message is stored as version 1 and the handler takes version 3 (each payload decoded as version 1 and converted `From` v1 -> v2 -> v3); ratio to W1 (no versions) as the median of at least 5 pairs' ratios, each pair's order alternating |
//! | W12 | W1 (best setting) with the topic retained (`retain`: every done write also copies its messages into the event log, on PostgreSQL into the topic's day partition); ratio to W1 (not retained) as the median of at least 5 pairs' ratios, each pair's order alternating |
//! | W13 | PostgreSQL: 100,000 messages of a retained topic drained by W1's worker (best setting; without W1 in the run, the largest of `--settings`), then, on that worker, a replay of all of them to the probe, timed from `start_replay` until the probe has had every call and the replay is done; ratio to W1 as the median of at least 5 pairs' ratios, each pair's order alternating; beside it, how long the worker took to take the replay up (it looks every 500 ms) and the rate from then on (database clock) |
//! | W14 | PostgreSQL: W3 with a replay of 100,000 retained events running on the same worker (paced to outlast the measured messages), alternating with W3 on an idle worker (`--repeat` pairs, at most 3); p50 and p99 of each side's pooled messages, and the ratio of the p99s |
//! | W15 | PostgreSQL: 1,000,000 events in today's partition of a topic retained for a day, dropped by the log's upkeep run as if three days later (`__log_upkeep_at`), against a `DELETE` of the same rows in a second identical setup (and the `VACUUM` it leaves owed) |
//! | W16 | every backend: 100,000 pending messages over 1,000 ordering keys (each key's first ready, the rest blocked behind it); `Store::stats` timed 5 times with no worker, then 5 times while a default worker drains the keys (from its first hundred messages on); the slowest of each five |
//! | W17 | every backend: 100,000 pending messages (at least 30,000 at any scale) drained by 4 default workers (a task and a pool each; the handler takes 20 ms); in `--repeat` rounds (5 by default; at least 3, at most 5), while every worker is handling messages, `Store::pause` of the topic, then `Store::resume`: from the pause returning to the last handler call started on any worker (an upper bound of the last claim), and from the resume returning to the first call on each worker; the slowest round of each |
//! | RSS | peak RSS (VmHWM) of a worker process draining a 100,000-message backlog |
//! | W2T | with `--features opentelemetry` only: W2's enqueue transactions (1 and 8 producers, a worker running), in at least 9 rounds of three variants, each round starting with the next: OpenTelemetry recording nothing; each transaction's business statements in a recorded request span, `enqueue` outside it (no context stored, as without the feature); the whole transaction in the span, its context stored and continued by the worker (spans and events at INFO and above, batch-exported to a sink that drops them); the ratios of the last to the other two, each the median of the rounds' ratios; then the target's figure: as many rounds in which each producer's transactions alternate between the context stored and not, every one timed, and the median over runs of 50 such pairs of the time without to the time with (pairs of neighbouring transactions meet the same disk and server, which separate runs do not), beside the ratio of all pairs' time summed |
//!
//! `--peer DIR` names a graphile-worker 0.17 bench folder prepared with `npm ci` (its `bench.js`
//! prints a `RESULT` line); its W1 runs with `node` in a database of its own on the same server.
//! Without it nothing of the peer runs.
//!
//! Targets are for PostgreSQL on a 2-core machine with the server on the same machine; SQLite
//! figures are printed without targets. MariaDB/MySQL has targets of its own on four figures
//! only: W1 default at least 20,000 msgs/s and at least 0.4 x PostgreSQL's W1 default of the
//! same run (when both ran), W2 with `enqueue` at least 0.7 x without, pickup across processes
//! p99 at most 50 ms, RSS at most 50 MB; it skips the PostgreSQL-only workloads (W7, W8, W10,
//! W13-W15), as SQLite does. `--scale 0.01` shrinks every workload (CI runs it so
//! that the bench keeps compiling and running). Nothing here asserts on timing: a missed target
//! is reported, not failed; the exit status is non-zero only when a workload could not run.
//! The pgbench scripts of the SQL reference figures are in `examples/bench/pgbench/`.

/// OpenTelemetry for W2T: a tracer whose spans are batch-exported to a sink that drops them,
/// behind a switch, so that one run measures the transactions untraced and traced.
#[cfg(feature = "opentelemetry")]
mod traces {
    use std::sync::atomic::{AtomicBool, Ordering};

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use tracing_subscriber::filter::DynFilterFn;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    static RECORDING: AtomicBool = AtomicBool::new(false);

    /// Drops every batch: what a collector costs is not the outbox's.
    #[derive(Debug)]
    struct Sink;

    impl SpanExporter for Sink {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            Ok(())
        }
    }

    /// Installs the tracer as the global subscriber, recording nothing until [`record`], then
    /// spans and events at INFO and above, as a service's usual filter does: with every level,
    /// each statement's DEBUG event from sqlx is attached to the span it runs in, so moving
    /// `enqueue` into the request's span would add its event to the measure.
    pub(crate) fn install() -> SdkTracerProvider {
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Sink)
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("bench"))
            .with_filter(DynFilterFn::new(|m, _| {
                RECORDING.load(Ordering::Relaxed) && *m.level() <= tracing::Level::INFO
            }));
        tracing_subscriber::registry().with(layer).init();
        provider
    }

    /// Turns recording on or off: off, spans are disabled, as without the feature.
    pub(crate) fn record(on: bool) {
        RECORDING.store(on, Ordering::Relaxed);
    }
}

#[path = "bench/broker.rs"]
mod broker;
#[path = "bench/cpu.rs"]
mod cpu;
#[path = "bench/db.rs"]
mod db;
#[path = "bench/log.rs"]
mod log;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/versions.rs"]
mod versions;
#[path = "bench/workloads.rs"]
mod workloads;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use cpu::CpuPer;
use db::{Db, Kind, PeerDb};
use outbox::{Wakeup, WorkerConfig};
use report::{Report, Target};
use workloads::{Sample, Setting, Traced, DEFAULT_SETTING};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "bench",
    about = "Benchmark the outbox on PostgreSQL, SQLite and MariaDB/MySQL"
)]
struct Args {
    /// Which database to run on.
    #[arg(long, value_enum, default_value = "all")]
    backend: BackendArg,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Multiply every workload's size by this (0.01 for a quick check).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Runs per figure (W1 default and best, W2, W4, W5, W6, W10 pairs), whose median is
    /// reported.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Worker settings W1 tries besides concurrency 1, as CONCURRENCYxBATCH.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "32x100,64x100,128x200,256x500,512x500,1000x1000"
    )]
    settings: Vec<Setting>,
    /// Only these workloads (w1..w15, w2t, w7r, rss); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// A graphile-worker 0.17 bench folder prepared with `npm ci`: its W1 drain runs (with
    /// `node`) alternating with ours on PostgreSQL, and the report compares them.
    #[arg(long, value_name = "DIR")]
    peer: Option<PathBuf>,
    /// The NATS server (JetStream enabled) of W7 and W8; they are skipped, saying so, when it
    /// does not answer.
    #[arg(long, env = "NATS_URL", default_value = "127.0.0.1:4222")]
    nats_url: String,
    /// The RabbitMQ of W7R; it is skipped, saying so, when it does not answer.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// The PostgreSQL server to create the bench database on.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    database_url: String,
    /// The MariaDB (or MySQL) server to create the bench database on.
    #[arg(long, env = "MYSQL_URL", default_value = "mysql://root@127.0.0.1:3306")]
    mysql_url: String,

    /// Internal: run as the worker process of the RSS measurement.
    #[arg(long, hide = true)]
    worker_child: bool,
    /// Internal: run as the worker process of W3 across processes (MariaDB/MySQL).
    #[arg(long, hide = true)]
    pickup_child: bool,
    /// Internal: the database URL of the worker child.
    #[arg(long, hide = true, default_value = "")]
    child_url: String,
    /// Internal: how many messages the worker child drains.
    #[arg(long, hide = true, default_value_t = 0)]
    child_count: u64,
    /// Internal: the worker child's setting.
    #[arg(long, hide = true, default_value = "32x100")]
    child_setting: Setting,
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendArg {
    /// PostgreSQL only.
    Postgres,
    /// SQLite only.
    Sqlite,
    /// MariaDB (or MySQL) only.
    Mysql,
    /// All three: PostgreSQL, then SQLite, then MariaDB.
    All,
}

impl Args {
    fn wants(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o.eq_ignore_ascii_case(id))
    }

    fn scaled(&self, n: u64) -> u64 {
        ((n as f64 * self.scale).round() as u64).max(1)
    }

    /// The server URL of `kind` (unused for SQLite).
    fn url_of(&self, kind: Kind) -> &str {
        match kind {
            Kind::Mysql => &self.mysql_url,
            Kind::Postgres | Kind::Sqlite => &self.database_url,
        }
    }
}

/// MariaDB/MySQL's W1 default target, msgs/s.
const MYSQL_W1_DEFAULT: f64 = 20_000.0;

/// MariaDB/MySQL's W1 default against PostgreSQL's of the same run, at least.
const MYSQL_W1_OF_PG: f64 = 0.4;

/// MariaDB/MySQL's W2 target: transactions with `enqueue` against those without, at least.
const MYSQL_W2_RATIO: f64 = 0.7;

/// MariaDB/MySQL's target for the p99 of pickup across processes while messages flow, ms.
const MYSQL_PICKUP_P99_MS: f64 = 50.0;

/// W16's target on every backend: the slowest `Store::stats` call, in seconds.
const STATS_MAX_S: f64 = 0.5;

/// W17's target on every backend: a pause or a resume in force on every worker, in seconds.
const PAUSE_MAX_S: f64 = 1.0;

/// W17's workers, each a task with a pool of its own.
const W17_WORKERS: usize = 4;

/// MariaDB/MySQL's peak RSS target, MB (PostgreSQL's too).
const MYSQL_RSS_MB: f64 = 50.0;

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.pickup_child {
        return workloads::pickup_child(&args.child_url, args.child_count).await;
    }
    if args.worker_child {
        let kind = match args.backend {
            BackendArg::Postgres => Kind::Postgres,
            BackendArg::Sqlite => Kind::Sqlite,
            BackendArg::Mysql => Kind::Mysql,
            BackendArg::All => bail!("--worker-child needs --backend postgres, sqlite or mysql"),
        };
        return workloads::worker_child(
            kind,
            &args.child_url,
            args.child_count,
            args.child_setting,
        )
        .await;
    }
    if !args.scale.is_finite() || args.scale <= 0.0 || args.repeat == 0 {
        bail!("--scale must be above 0 and --repeat at least 1");
    }
    if let Some(dir) = &args.peer {
        if !dir.join("bench.js").is_file() || !dir.join("node_modules").is_dir() {
            bail!(
                "--peer {}: expected a graphile-worker bench folder (bench.js) prepared with `npm ci` (node_modules)",
                dir.display()
            );
        }
    }
    #[cfg(feature = "opentelemetry")]
    let _tracer = traces::install();
    let kinds: &[Kind] = match args.backend {
        BackendArg::Postgres => &[Kind::Postgres],
        BackendArg::Sqlite => &[Kind::Sqlite],
        BackendArg::Mysql => &[Kind::Mysql],
        BackendArg::All => &[Kind::Postgres, Kind::Sqlite, Kind::Mysql],
    };
    let mut reports = Vec::new();
    let mut failed = false;
    for &kind in kinds {
        eprintln!("== {}", kind.name());
        let mut db = Db::create(kind, args.url_of(kind)).await?;
        let mut report = Report {
            backend: kind.name(),
            server: db.server.clone(),
            scale: args.scale,
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            targets: kind == Kind::Postgres,
            load: [report::load_average(), None],
            rows: Vec::new(),
        };
        // PostgreSQL's W1 default of this run, which MariaDB's is held against.
        let pg_w1 = reports
            .iter()
            .filter(|r: &&Report| r.backend == Kind::Postgres.name())
            .flat_map(|r| &r.rows)
            .find(|r| r.id == "W1" && r.unit == "msgs/s" && r.name.starts_with(W1_DEFAULT))
            .and_then(|r| r.value);
        let outcome = run(&args, &mut db, &mut report, pg_w1).await;
        report.load[1] = report::load_average();
        db.drop_all().await;
        outcome?;
        failed |= report.rows.iter().any(|r| r.value.is_none());
        if !args.json {
            println!("{}", report.table());
        }
        reports.push(report);
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "runs": reports }))?
        );
    }
    if failed {
        bail!("some workloads could not run; see the notes");
    }
    Ok(())
}

/// The median of the figures, or the first error.
fn median(runs: Vec<Result<f64>>) -> Result<f64> {
    let mut v = runs.into_iter().collect::<Result<Vec<f64>>>()?;
    if v.is_empty() {
        bail!("no runs");
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Ok(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// The median rate and the median CPU figures of the runs, or the first error.
fn median_sample(runs: Vec<Result<Sample>>) -> Result<Sample> {
    let runs = runs.into_iter().collect::<Result<Vec<Sample>>>()?;
    let server: Vec<Result<f64>> = runs
        .iter()
        .filter_map(|s| s.cpu.server_us)
        .map(Ok)
        .collect();
    Ok(Sample {
        rate: median(runs.iter().map(|s| Ok(s.rate)).collect())?,
        cpu: CpuPer {
            client_us: median(runs.iter().map(|s| Ok(s.cpu.client_us)).collect())?,
            server_us: median(server).ok(),
        },
    })
}

/// The ratio of two rates, or the first error.
fn ratio(a: &Result<Sample>, b: &Result<Sample>) -> Result<f64> {
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.rate / b.rate),
        (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("{e:#}")),
    }
}

/// What a W1 run is paired with: W4's database holding done rows, W5's unhandled messages due
/// earlier, W9's ordering keys, W11's upcasts, W12's retained topic.
#[derive(Clone, Copy)]
enum Against<'a> {
    /// W4: the same drain on this database, which holds many done rows.
    DoneRows(&'a Db),
    /// W5: the same drain behind this many messages of a topic nobody handles.
    Unhandled(u64),
    /// W9: the drain with ordering keys, this many keys interleaved.
    Keys(u64),
    /// W9B: W9's drain beside `blocked` keys held by dead letters.
    BlockedKeys { keys: u64, blocked: u64 },
    /// W11: the drain of version 1 messages by a handler of version 3.
    Upcast,
    /// W12: the drain of a topic that retains its delivered events.
    Retained,
}

/// The fewest rounds behind W2T's ratios: the effect it looks for (3 %) is smaller than the
/// spread of single runs on this machine, so it takes more rounds than [`MIN_PAIRS`] to see.
#[cfg(feature = "opentelemetry")]
const W2T_ROUNDS: usize = 9;

/// The pairs of neighbouring transactions (one with the context stored, one without) behind each
/// of the interleaved W2T ratios whose median is the target's figure: long enough that a
/// transaction's own jitter averages out, short enough that a stall (a checkpoint's fsync) spoils
/// few of them.
#[cfg(feature = "opentelemetry")]
const W2T_BLOCK: u64 = 50;

/// The fewest pairs behind a paired ratio, whatever `--repeat` says: one pair decides nothing on
/// a disk whose speed drifts by a third over a minute.
const MIN_PAIRS: usize = 5;

/// Runs W1 at `setting` and the workload it is `against` in pairs, at least [`MIN_PAIRS`] of
/// them, alternating which of the two goes first, so a drift within a pair (a checkpoint, a
/// cache warming) favours each side equally often.
async fn paired(
    db: &mut Db,
    n: u64,
    setting: Setting,
    repeat: usize,
    against: Against<'_>,
) -> Result<Vec<(Result<Sample>, Result<Sample>)>> {
    let mut pairs = Vec::new();
    for i in 0..repeat.max(MIN_PAIRS) {
        let (mut alone, mut with) = (None, None);
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for paired_side in order {
            if !paired_side {
                db.reset().await?;
                alone = Some(workloads::w1(db, n, setting.config()).await);
                continue;
            }
            with = Some(match against {
                Against::DoneRows(big) => workloads::w1(big, n, setting.config()).await,
                Against::Unhandled(ahead) => {
                    db.reset().await?;
                    db.seed(&workloads::unhandled(ahead)).await?;
                    db.push_ahead("bench.unhandled").await?;
                    workloads::w1(db, n, setting.config()).await
                }
                Against::Keys(keys) => {
                    db.reset().await?;
                    workloads::w9(db, n, keys, setting.config()).await
                }
                Against::BlockedKeys { keys, blocked } => {
                    db.reset().await?;
                    workloads::w9_blocked(db, n, keys, blocked, setting.config()).await
                }
                Against::Upcast => {
                    db.reset().await?;
                    versions::w11(db, n, setting.config()).await
                }
                Against::Retained => {
                    db.reset().await?;
                    db.pool
                        .store()
                        .declare_retention(&[(workloads::TOPIC, Duration::from_secs(30 * 86_400))])
                        .await?;
                    workloads::w1(db, n, setting.config()).await
                }
            });
        }
        if let (Some(alone), Some(with)) = (alone, with) {
            pairs.push((alone, with));
        }
    }
    Ok(pairs)
}

/// Reports a workload compared with W1 at the same setting, run in (W1, workload) pairs: the
/// median of each side, and the median of the pairs' ratios (each pair ran within seconds, so
/// its ratio is free of the drift between pairs).
fn push_paired(
    report: &mut Report,
    id: &'static str,
    what: &str,
    pairs: Result<Vec<(Result<Sample>, Result<Sample>)>>,
    setting: Setting,
    target: Option<Target>,
) {
    let (alone, with, ratio) = match pairs {
        Ok(pairs) => {
            let ratios = pairs.iter().map(|(a, w)| ratio(w, a)).collect();
            let (a, w): (Vec<_>, Vec<_>) = pairs.into_iter().unzip();
            (median_sample(a), median_sample(w), median(ratios))
        }
        Err(e) => (
            Err(anyhow::anyhow!("{e:#}")),
            Err(anyhow::anyhow!("{e:#}")),
            Err(e),
        ),
    };
    report.push_sample(
        "W1",
        format!("drain, paired with {id} ({setting})"),
        alone,
        "msgs/s",
        None,
    );
    report.push_sample(id, what.to_string(), with, "msgs/s", None);
    report.push(id, "ratio to W1, median of the pairs", ratio, "x", target);
}

/// W9 beside the peer's keyed drain (graphile-worker, one queue per key), alternating, in a
/// database of the peer's own: ours at `setting`, the peer at its W1 concurrency with its
/// batching preset; the ratio of the medians is held against W9's target of twice the peer.
async fn w9_peer(
    args: &Args,
    db: &mut Db,
    report: &mut Report,
    dir: &std::path::Path,
    n: u64,
    keys: u64,
    setting: Setting,
) -> Result<()> {
    let peer_db = PeerDb::create(&args.database_url).await?;
    let concurrency = DEFAULT_SETTING.concurrency;
    // One untimed round of the peer: it installs its schema in its new database.
    let _ = workloads::peer_w9(dir, &peer_db.url, n, concurrency, keys).await;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..args.repeat.max(3) {
        db.reset().await?;
        ours.push(workloads::w9(db, n, keys, setting.config()).await);
        let r = workloads::peer_w9(dir, &peer_db.url, n, concurrency, keys).await;
        match &r {
            Ok(v) => eprintln!("  W9 peer keyed run {}: {v:.0} jobs/s", i + 1),
            Err(e) => eprintln!("  W9 peer keyed run {}: FAILED: {e:#}", i + 1),
        }
        theirs.push(r.map(|rate| Sample {
            rate,
            cpu: CpuPer {
                client_us: 0.0,
                server_us: None,
            },
        }));
    }
    peer_db.drop_all().await;
    let ours = report.push_runs(
        "W9",
        format!("keyed drain, {n} msgs over {keys} keys ({setting}), alternating with the peer"),
        ours,
        "msgs/s",
        None,
        false,
    );
    let theirs = report.push_runs(
        "W9",
        format!("peer graphile-worker (node), {keys} queues, concurrency {concurrency}, batched"),
        theirs,
        "jobs/s",
        None,
        false,
    );
    report.push(
        "W9",
        "keyed drain / peer keyed drain",
        ratio(&ours, &theirs),
        "x",
        Target::at_least(2.0),
    );
    Ok(())
}

/// The name of W1's default drain row (before its setting), which MariaDB's run looks up in
/// PostgreSQL's report.
const W1_DEFAULT: &str = "drain, default WorkerConfig";

/// W1 with the default `WorkerConfig`, `--repeat` runs; with `--peer` (on PostgreSQL), each
/// followed by one of the peer's, and the peer's median and the ratio reported beside ours. On
/// MariaDB/MySQL, its targets, and the ratio to PostgreSQL's W1 default of the run (`pg_w1`)
/// when PostgreSQL ran first.
async fn w1_default(
    args: &Args,
    db: &mut Db,
    report: &mut Report,
    n: u64,
    pg_w1: Option<f64>,
) -> Result<()> {
    let peer = match (&args.peer, db.kind) {
        (Some(dir), Kind::Postgres) => Some((dir, PeerDb::create(&args.database_url).await?)),
        _ => None,
    };
    // One untimed round of each first: the timed runs then start alike, rather than the first
    // of ours paying for the peer database just created (a CREATE DATABASE writes a copy of
    // the template) and for what the sweep before it left behind.
    db.reset().await?;
    workloads::w1(db, n, WorkerConfig::default()).await?;
    if let Some((dir, peer_db)) = &peer {
        let _ = workloads::peer_w1(dir, &peer_db.url, n, DEFAULT_SETTING.concurrency).await;
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut outcome = Ok(());
    for i in 0..args.repeat {
        if let Err(e) = db.reset().await {
            outcome = Err(e);
            break;
        }
        ours.push(workloads::w1(db, n, WorkerConfig::default()).await);
        if let Some((dir, peer_db)) = &peer {
            let r = workloads::peer_w1(dir, &peer_db.url, n, DEFAULT_SETTING.concurrency).await;
            match &r {
                Ok(v) => eprintln!("  W1 peer run {}: {v:.0} jobs/s", i + 1),
                Err(e) => eprintln!("  W1 peer run {}: FAILED: {e:#}", i + 1),
            }
            theirs.push(r.map(|rate| Sample {
                rate,
                cpu: CpuPer {
                    client_us: 0.0,
                    server_us: None,
                },
            }));
        }
    }
    if let Some((_, peer_db)) = peer {
        peer_db.drop_all().await;
    }
    outcome?;
    let what = |w: &str| {
        if args.repeat > 1 {
            format!("{w}, median of {}", args.repeat)
        } else {
            w.to_string()
        }
    };
    let row = report.rows.len();
    let ours = report.push_runs(
        "W1",
        what(&format!("{W1_DEFAULT} ({DEFAULT_SETTING})")),
        ours,
        "msgs/s",
        None,
        true,
    );
    if db.kind == Kind::Mysql {
        report.set_target(row, Target::at_least(MYSQL_W1_DEFAULT));
        if let Some(pg) = pg_w1 {
            report.push(
                "W1",
                "default WorkerConfig / PostgreSQL's of this run",
                ours.as_ref()
                    .map(|s| s.rate / pg)
                    .map_err(|e| anyhow::anyhow!("{e:#}")),
                "x",
                None,
            );
            report.set_target(report.rows.len() - 1, Target::at_least(MYSQL_W1_OF_PG));
        }
    }
    if args.peer.is_some() && db.kind == Kind::Postgres {
        let row = report.rows.len();
        let theirs = report.push_runs(
            "W1",
            what(&format!(
                "peer graphile-worker (node), concurrency {}, batched",
                DEFAULT_SETTING.concurrency
            )),
            theirs,
            "msgs/s",
            None,
            true,
        );
        // The peer's CPU is not measured.
        if let Some(row) = report.rows.get_mut(row) {
            row.cpu = None;
        }
        report.push(
            "W1",
            "default WorkerConfig / peer",
            ratio(&ours, &theirs),
            "x",
            Target::at_least(1.1),
        );
    }
    Ok(())
}

/// W10's transactions per producer at scale 1: a run takes about 8 s at 2,000 tx/s.
const W10_PER_PRODUCER: u64 = 2_000;

/// W10's (listen, poll) pairs per case at most: 8 runs make one round of the four cases.
const W10_MAX_PAIRS: usize = 3;

/// W10: 8 producers against 1, 4 and 8 workers of their topic, and 4 beside an idle worker of
/// another; each case in (listen, poll) pairs, `--repeat` of them up to [`W10_MAX_PAIRS`] (one
/// below scale 0.1, where the figures only show that the workload runs).
/// W7 (relay beside raw publishing, alternating) and W8 (the inbox on what the relay left).
async fn w7_w8(args: &Args, db: &mut Db, report: &mut Report) -> Result<()> {
    if !broker::reachable(&args.nats_url).await {
        eprintln!(
            "  W7/W8 skipped: no NATS server answers at {} (--nats-url)",
            args.nats_url
        );
        report.push(
            "W7",
            "relay to JetStream",
            Err(anyhow::anyhow!("no NATS server at {}", args.nats_url)),
            "msgs/s",
            None,
        );
        return Ok(());
    }
    let n = args.scaled(20_000);
    // As many publishes awaiting their acknowledgement as the default worker runs handlers.
    let in_flight = 32;
    let stream = broker::BenchStream::create(&args.nats_url).await?;
    let (mut relay, mut raw, mut inbox) = (Vec::new(), Vec::new(), Vec::new());
    let mut drain = Vec::new();
    for _ in 0..args.repeat.max(1) {
        // The relay's bound: W1's drain and raw publishing, measured in the same rounds.
        db.reset().await?;
        drain.push(workloads::w1(db, n, WorkerConfig::default()).await);
        db.reset().await?;
        raw.push(broker::w7_raw(db, &stream, n, in_flight).await);
        let r = broker::w7_relay(db, &stream, n).await;
        let relayed = r.is_ok();
        relay.push(r);
        if relayed && args.wants("w8") {
            inbox.push(broker::w8_inbox(db, &stream, n).await);
        }
    }
    stream.delete().await;
    let rl = report.push_runs(
        "W7",
        format!("relay {n} to JetStream (default worker)"),
        relay,
        "msgs/s",
        None,
        true,
    );
    let rw = report.push_runs(
        "W7",
        format!("raw async-nats publish of {n}, {in_flight} in flight"),
        raw,
        "msgs/s",
        None,
        false,
    );
    let rd = report.push_runs(
        "W7",
        format!("W1 drain of {n} (default worker), in the same rounds"),
        drain,
        "msgs/s",
        None,
        false,
    );
    report.push("W7", "ratio relay/raw", ratio(&rl, &rw), "x", None);
    // A relayed message is a drained message plus a publish, on the same cores: the relay can
    // at best reach 1 / (1/W1 + 1/raw).
    let bound = match (&rd, &rw) {
        (Ok(d), Ok(r)) => Ok(1.0 / (1.0 / d.rate + 1.0 / r.rate)),
        (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("{e:#}")),
    };
    let bound_sample = bound.map(|rate| Sample {
        rate,
        cpu: CpuPer {
            client_us: 0.0,
            server_us: None,
        },
    });
    report.push(
        "W7",
        "composed bound 1/(1/W1 + 1/raw), msgs/s",
        bound_sample
            .as_ref()
            .map(|b| b.rate)
            .map_err(|e| anyhow::anyhow!("{e:#}")),
        "msgs/s",
        None,
    );
    report.push(
        "W7",
        "ratio relay/composed bound",
        ratio(&rl, &bound_sample),
        "x",
        Target::at_least(0.8),
    );
    if args.wants("w8") {
        let _ = report.push_runs(
            "W8",
            format!("inbox consuming {n} with dedup, 32 at once"),
            inbox,
            "msgs/s",
            None,
            false,
        );
    }
    Ok(())
}

/// W7R: the RabbitMQ relay beside raw lapin publishing, alternating.
async fn w7r(args: &Args, db: &mut Db, report: &mut Report) -> Result<()> {
    let queue = match broker::BenchQueue::create(&args.amqp_url).await {
        Ok(queue) => queue,
        Err(e) => {
            eprintln!("  W7R skipped: {e:#} (--amqp-url)");
            report.push("W7R", "relay to RabbitMQ", Err(e), "msgs/s", None);
            return Ok(());
        }
    };
    let n = args.scaled(20_000);
    // As many publishes awaiting their confirm as the default worker runs handlers.
    let in_flight = 32;
    let (mut relay, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..args.repeat.max(1) {
        db.reset().await?;
        raw.push(broker::w7r_raw(db, &queue, n, in_flight).await);
        relay.push(broker::w7r_relay(db, &queue, n).await);
    }
    queue.delete().await;
    let rl = report.push_runs(
        "W7R",
        format!("relay {n} to RabbitMQ (default worker)"),
        relay,
        "msgs/s",
        None,
        true,
    );
    let rw = report.push_runs(
        "W7R",
        format!("raw lapin publish of {n}, one channel, {in_flight} in flight"),
        raw,
        "msgs/s",
        None,
        false,
    );
    report.push("W7R", "ratio relay/raw", ratio(&rl, &rw), "x", None);
    Ok(())
}

async fn w10(args: &Args, db: &mut Db, report: &mut Report) -> Result<()> {
    let producers = 8u32;
    let total = u64::from(producers) * args.scaled(W10_PER_PRODUCER);
    let pairs = if args.scale < 0.1 {
        1
    } else {
        args.repeat.min(W10_MAX_PAIRS)
    };
    let settle = Duration::from_secs_f64((0.5 * args.scale).clamp(0.1, 0.5));
    let label = |n: usize| {
        if n == 1 {
            "1 worker".to_string()
        } else {
            format!("{n} workers")
        }
    };
    for (workers, idle_other) in [(1usize, false), (4, false), (8, false), (4, true)] {
        let case = if idle_other {
            format!("{} + 1 idle of another topic", label(workers))
        } else {
            label(workers)
        };
        let (mut listen, mut poll) = (Vec::new(), Vec::new());
        for _ in 0..pairs {
            for (mode, runs) in [(Wakeup::Listen, &mut listen), (Wakeup::Poll, &mut poll)] {
                db.reset().await?;
                let r =
                    workloads::w10(db, producers, total, workers, idle_other, mode, settle).await;
                match &r {
                    Ok(r) => eprintln!(
                        "  W10 {case}, {mode:?}: {:.0} tx/s, {} NOTIFYs for {} tx ({} payloads), \
                         {} handled by then",
                        r.sample.rate, r.notifies, r.transactions, r.payloads, r.handled
                    ),
                    Err(e) => eprintln!("  W10 {case}, {mode:?}: FAILED: {e:#}"),
                }
                runs.push(r);
            }
        }
        let share = |runs: &[Result<workloads::W10Run>]| -> Result<f64> {
            let ok = runs
                .iter()
                .map(|r| r.as_ref().map_err(|e| anyhow::anyhow!("{e:#}")))
                .collect::<Result<Vec<_>>>()?;
            let tx: u64 = ok.iter().map(|r| r.transactions).sum();
            let notifies: u64 = ok.iter().map(|r| r.notifies).sum();
            Ok(notifies as f64 * 100.0 / tx.max(1) as f64)
        };
        let (listen_share, poll_share) = (share(&listen), share(&poll));
        let samples = |runs: Vec<Result<workloads::W10Run>>| -> Vec<Result<Sample>> {
            runs.into_iter().map(|r| r.map(|r| r.sample)).collect()
        };
        let n = if pairs > 1 {
            format!(", median of {pairs}")
        } else {
            String::new()
        };
        let l = report.push_runs(
            "W10",
            format!("8 producers, {case}, listen{n}"),
            samples(listen),
            "tx/s",
            None,
            false,
        );
        let p = report.push_runs(
            "W10",
            format!("8 producers, {case}, poll{n}"),
            samples(poll),
            "tx/s",
            None,
            false,
        );
        report.push(
            "W10",
            format!("ratio listen/poll, {case}"),
            ratio(&l, &p),
            "x",
            Target::at_least(0.95),
        );
        report.push(
            "W10",
            format!("tx that sent a NOTIFY, {case}, listen"),
            listen_share,
            "%",
            Target::at_most(1.0),
        );
        report.push(
            "W10",
            format!("tx that sent a NOTIFY, {case}, poll"),
            poll_share,
            "%",
            None,
        );
    }
    Ok(())
}

/// W3 across processes (MariaDB/MySQL): the worker in a child process, polling.
async fn w3_cross(db: &Db, report: &mut Report, duration: Duration) {
    match workloads::w3_cross(db, duration).await {
        Ok(c) => {
            let (n, l) = (c.flowing.count, &c.flowing);
            let what = |p: &str| {
                format!("pickup across processes {p}, {n} msgs committed while messages flow")
            };
            if n > 0 {
                report.push("W3", what("p50"), Ok(l.p50_ms), "ms", None);
                report.push("W3", what("p99"), Ok(l.p99_ms), "ms", None);
                report.set_target(report.rows.len() - 1, Target::at_most(MYSQL_PICKUP_P99_MS));
                report.push("W3", what("max"), Ok(l.max_ms), "ms", None);
            }
            report.push(
                "W3",
                format!(
                    "pickup across processes max, {} msgs committed before the worker found \
                     the first (idle, polling)",
                    c.idle.count
                ),
                Ok(c.idle.max_ms),
                "ms",
                None,
            );
        }
        Err(e) => report.push("W3", "pickup across processes", Err(e), "ms", None),
    }
}

/// Every workload on one database, in order; each figure lands in `report`.
async fn run(args: &Args, db: &mut Db, report: &mut Report, pg_w1: Option<f64>) -> Result<()> {
    let n1 = args.scaled(20_000);
    let repeat = args.repeat;
    let runs = |what: &str| {
        if repeat > 1 {
            format!("{what}, median of {repeat}")
        } else {
            what.to_string()
        }
    };

    // W1, every run from a cold start: concurrency 1 and the sweep once each; then the default
    // config (alternating with the peer's drain, when there is one) and the best setting of
    // the sweep, each for a median.
    let mut best_setting = args.settings.first().copied().unwrap_or(DEFAULT_SETTING);
    if args.wants("w1") {
        let one = Setting {
            concurrency: 1,
            batch_size: DEFAULT_SETTING.batch_size,
        };
        db.reset().await?;
        let r = workloads::w1(db, n1, one.config()).await;
        report.push_sample(
            "W1",
            format!("drain, concurrency 1 ({one})"),
            r,
            "msgs/s",
            None,
        );
        let mut sweep = Vec::new();
        for &s in &args.settings {
            db.reset().await?;
            let r = workloads::w1(db, n1, s.config()).await;
            if let Ok(v) = &r {
                sweep.push((s, *v));
            }
            report.push_sample("W1", format!("drain, sweep {s}"), r, "msgs/s", None);
        }

        w1_default(args, db, report, n1, pg_w1).await?;

        // Runs of their own: the sweep's run was picked for being the fastest, so counting it
        // would lift the median and widen the spread.
        if let Some(&(s, _)) = sweep.iter().max_by(|a, b| a.1.rate.total_cmp(&b.1.rate)) {
            let mut all = Vec::new();
            for _ in 0..repeat {
                db.reset().await?;
                all.push(workloads::w1(db, n1, s.config()).await);
            }
            best_setting = s;
            let _ = report.push_runs(
                "W1",
                runs(&format!("drain, best setting ({s})")),
                all,
                "msgs/s",
                Target::at_least(15_000.0),
                true,
            );
        }
    }

    // W2: producers with a worker running, with and without enqueue, alternating; and with
    // enqueue but no worker, which tells the statement's own cost from the worker's.
    if args.wants("w2") {
        let total = args.scaled(5_000);
        for producers in [1u32, 8] {
            let (mut with, mut without, mut alone) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..repeat {
                db.reset().await?;
                without.push(workloads::w2(db, producers, total, false, true, Traced::No).await);
                db.reset().await?;
                with.push(workloads::w2(db, producers, total, true, true, Traced::No).await);
                db.reset().await?;
                alone.push(workloads::w2(db, producers, total, true, false, Traced::No).await);
            }
            let (with, without, alone) = (
                median_sample(with),
                median_sample(without),
                median_sample(alone),
            );
            let ratio = ratio(&with, &without);
            let p = if producers == 1 {
                "1 producer".to_string()
            } else {
                format!("{producers} producers")
            };
            report.push_sample("W2", runs(&format!("enqueue tx, {p}")), with, "tx/s", None);
            report.push_sample(
                "W2",
                runs(&format!("no-enqueue tx, {p}")),
                without,
                "tx/s",
                None,
            );
            report.push_sample(
                "W2",
                runs(&format!("enqueue tx, no worker running, {p}")),
                alone,
                "tx/s",
                None,
            );
            let target = if producers == 1 { 0.9 } else { 0.85 };
            report.push(
                "W2",
                format!("ratio with/without, {p}"),
                ratio,
                "x",
                Target::at_least(target),
            );
            if db.kind == Kind::Mysql {
                report.set_target(report.rows.len() - 1, Target::at_least(MYSQL_W2_RATIO));
            }
        }
    }

    // W2T: the cost of tracing. W2's enqueue transactions, a worker running, in three
    // variants: recording off (no span: as a service without OpenTelemetry); the request
    // traced but `enqueue` outside its span (the application traced, the message with no
    // context: as without the feature); and `enqueue` in the request's span, its context
    // stored and continued by the worker. Each round runs the three once, each round starting
    // with the next variant, so that no variant always runs last in a round (after the most
    // WAL of it); the ratios are the medians of the rounds' ratios, as for W4 and W5.
    #[cfg(feature = "opentelemetry")]
    if args.wants("w2t") {
        let total = args.scaled(5_000);
        const VARIANTS: [Traced; 3] = [Traced::No, Traced::RequestOnly, Traced::Full];
        let rounds = repeat.max(W2T_ROUNDS);
        for producers in [1u32, 8] {
            let mut samples: [Vec<Result<Sample>>; 3] = Default::default();
            let (mut own, mut all) = (Vec::new(), Vec::new());
            for round in 0..rounds {
                let mut this: [Option<Result<Sample>>; 3] = Default::default();
                for k in 0..VARIANTS.len() {
                    let v = (round + k) % VARIANTS.len();
                    db.reset().await?;
                    traces::record(VARIANTS[v] != Traced::No);
                    this[v] =
                        Some(workloads::w2(db, producers, total, true, true, VARIANTS[v]).await);
                    traces::record(false);
                }
                let [off, request, full] =
                    this.map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("did not run"))));
                own.push(ratio(&full, &request));
                all.push(ratio(&full, &off));
                for (runs, r) in samples.iter_mut().zip([off, request, full]) {
                    runs.push(r);
                }
            }
            let [off, request, full] = samples.map(median_sample);
            let (own, all) = (median(own), median(all));
            let p = if producers == 1 {
                "1 producer".to_string()
            } else {
                format!("{producers} producers")
            };
            report.push_sample(
                "W2T",
                format!("enqueue in the traced request, {p}, median of {rounds}"),
                full,
                "tx/s",
                None,
            );
            report.push_sample(
                "W2T",
                format!("traced request, enqueue outside it, {p}, median of {rounds}"),
                request,
                "tx/s",
                None,
            );
            report.push_sample(
                "W2T",
                format!("nothing traced, {p}, median of {rounds}"),
                off,
                "tx/s",
                None,
            );
            report.push(
                "W2T",
                format!("ratio context stored / not, {p}, median of {rounds} rounds"),
                own,
                "x",
                None,
            );
            // The same two variants taking turns within each producer, every transaction
            // timed: the target's figure, since pairs of neighbouring transactions share
            // whatever the disk and the server do, while separate runs straddle a 3 % effect.
            // Shrunk with the workload, so that a small `--scale` still fills some runs.
            let block = usize::try_from(args.scaled(W2T_BLOCK)).unwrap_or(usize::MAX);
            let (mut blocks, mut full_secs, mut request_secs) = (Vec::new(), 0.0, 0.0);
            let mut failed = None;
            for _ in 0..rounds {
                db.reset().await?;
                traces::record(true);
                let r = workloads::w2t_interleaved(db, producers, total, block).await;
                traces::record(false);
                match r {
                    Ok(i) => {
                        blocks.extend(i.blocks);
                        full_secs += i.full;
                        request_secs += i.request;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            let n_blocks = blocks.len();
            let (interleaved, summed) = match failed {
                Some(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
                None => (
                    median(blocks.into_iter().map(Ok).collect()),
                    Ok(request_secs / full_secs),
                ),
            };
            report.push(
                "W2T",
                format!(
                    "ratio context stored / not, {p}, interleaved, median of {n_blocks} runs of {block} pairs"
                ),
                interleaved,
                "x",
                Target::at_least(0.97),
            );
            report.push(
                "W2T",
                format!("ratio context stored / not, {p}, interleaved, all pairs' time summed"),
                summed,
                "x",
                None,
            );
            report.push(
                "W2T",
                format!("ratio traced / nothing traced, {p}, median of {rounds} rounds"),
                all,
                "x",
                None,
            );
        }
    }

    // W3: pickup latency on an idle worker.
    if args.wants("w3") {
        db.reset().await?;
        let duration = Duration::from_secs_f64((5.0 * args.scale).max(0.01));
        // On MariaDB/MySQL the producer's enqueue wakes the workers of its own process: this
        // is the pickup within one process, and the one across processes follows.
        let within = if db.kind == Kind::Mysql {
            " (producer in the worker's process)"
        } else {
            ""
        };
        match workloads::w3(db, duration).await {
            Ok(l) => {
                let n = l.count;
                report.push(
                    "W3",
                    format!("pickup p50, {n} msgs{within}"),
                    Ok(l.p50_ms),
                    "ms",
                    Target::at_most(1.5),
                );
                report.push(
                    "W3",
                    format!("pickup p99, {n} msgs{within}"),
                    Ok(l.p99_ms),
                    "ms",
                    Target::at_most(5.0),
                );
                report.push(
                    "W3",
                    format!("pickup max, {n} msgs{within}"),
                    Ok(l.max_ms),
                    "ms",
                    None,
                );
            }
            Err(e) => report.push("W3", "pickup latency", Err(e), "ms", None),
        }
        if db.kind == Kind::Mysql {
            db.reset().await?;
            w3_cross(db, report, duration).await;
        }
    }

    let pairs_n = repeat.max(MIN_PAIRS);
    // W4, W5 and W9 compare with W1 at the same setting, run in pairs (see `paired`), so that
    // drift over the bench (a warming cache, a checkpoint) cancels out.
    if args.wants("w4") {
        let done = args.scaled(2_000_000);
        eprintln!("  W4 inserting {done} done rows into a second database");
        let big = Db::create(db.kind, args.url_of(db.kind)).await;
        let pairs = match &big {
            Ok(big) => {
                let filled = async {
                    big.insert_done(done, "bench.message", &workloads::sample_payload(), None)
                        .await?;
                    big.analyze().await
                };
                match filled.await {
                    Ok(()) => paired(db, n1, best_setting, repeat, Against::DoneRows(big)).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        };
        if let Ok(big) = big {
            big.drop_all().await;
        }
        push_paired(
            report,
            "W4",
            &format!("drain with {done} done rows ({best_setting}), median of {pairs_n} pairs"),
            pairs,
            best_setting,
            Target::at_least(0.9),
        );
    }
    if args.wants("w5") {
        let ahead = args.scaled(10_000);
        let pairs = paired(db, n1, best_setting, repeat, Against::Unhandled(ahead)).await;
        push_paired(
            report,
            "W5",
            &format!("drain behind {ahead} unhandled ({best_setting}), median of {pairs_n} pairs"),
            pairs,
            best_setting,
            Target::at_least(0.9),
        );
    }

    // W9: ordered messages, many keys (paired with W1 like W4 and W5), then one key.
    if args.wants("w9") {
        let keys = args.scaled(1_000);
        let pairs = paired(db, n1, best_setting, repeat, Against::Keys(keys)).await;
        push_paired(
            report,
            "W9",
            &format!(
                "keyed drain, {n1} msgs over {keys} keys ({best_setting}), median of {pairs_n} pairs"
            ),
            pairs,
            best_setting,
            Target::at_least(0.65),
        );
        if let (Some(dir), Kind::Postgres) = (&args.peer, db.kind) {
            w9_peer(args, db, report, dir, n1, keys, best_setting).await?;
        }
        // The same beside keys that dead letters hold, each with a message waiting: what an
        // outage of one downstream leaves for the other keys to drain past.
        let blocked = args.scaled(1_000);
        let pairs = paired(
            db,
            n1,
            best_setting,
            repeat,
            Against::BlockedKeys { keys, blocked },
        )
        .await;
        push_paired(
            report,
            "W9B",
            &format!(
                "W9 beside {blocked} keys blocked by dead letters ({best_setting}), median of \
                 {pairs_n} pairs"
            ),
            pairs,
            best_setting,
            None,
        );
        // One key drains one message at a time (claim, handler, done write, claim), as many
        // messages as W9 spreads over its keys.
        let serial = n1;
        db.reset().await?;
        let r = workloads::w9(db, serial, 1, WorkerConfig::default()).await;
        report.push_sample(
            "W9",
            format!("one key, {serial} msgs in order (serial, default WorkerConfig)"),
            r,
            "msgs/s",
            None,
        );
    }

    // W11: every message stored as version 1 and upcast to version 3 (paired with W1).
    if args.wants("w11") {
        let pairs = paired(db, n1, best_setting, repeat, Against::Upcast).await;
        push_paired(
            report,
            "W11",
            &format!(
                "drain of version 1 messages upcast to version 3 ({best_setting}), median of \
                 {pairs_n} pairs"
            ),
            pairs,
            best_setting,
            Target::at_least(0.95),
        );
    }

    // W12: the drained topic retains its events (paired with W1, which does not).
    if args.wants("w12") {
        let pairs = paired(db, n1, best_setting, repeat, Against::Retained).await;
        push_paired(
            report,
            "W12",
            &format!(
                "drain of a topic that retains its events ({best_setting}), median of {pairs_n} pairs"
            ),
            pairs,
            best_setting,
            Target::at_least(0.8),
        );
    }

    // W13-W15, PostgreSQL: the event log's replay rate (paired with W1), pickup latency while
    // a replay runs (beside W3 idle), and the drop of a day's partition against a DELETE.
    if args.wants("w13") && db.kind == Kind::Postgres {
        // W1's best setting; without W1 in this run, the largest of `--settings` (1,000 x
        // 1,000 by default, W1's best setting in every recorded run).
        let setting = if args.wants("w1") {
            best_setting
        } else {
            args.settings
                .iter()
                .copied()
                .max_by_key(|s| (s.concurrency, s.batch_size))
                .unwrap_or(best_setting)
        };
        log::w13(args, db, report, n1, setting).await?;
    }
    if args.wants("w14") && db.kind == Kind::Postgres {
        log::w14(args, db, report).await?;
    }
    if args.wants("w15") && db.kind == Kind::Postgres {
        log::w15(args, db, report).await?;
    }

    // W10: producers at full speed against workers in listen and in poll mode, alternating.
    if args.wants("w10") && db.kind == Kind::Postgres {
        w10(args, db, report).await?;
    }

    // W7 and W8: the JetStream relay and the inbox; W7R: the RabbitMQ relay.
    if (args.wants("w7") || args.wants("w8")) && db.kind == Kind::Postgres {
        w7_w8(args, db, report).await?;
    }
    if args.wants("w7r") && db.kind == Kind::Postgres {
        w7r(args, db, report).await?;
    }

    // W6: bulk enqueue.
    if args.wants("w6") {
        let total = args.scaled(100_000);
        let mut all = Vec::new();
        for _ in 0..repeat {
            db.reset().await?;
            all.push(workloads::w6(db, total, 1000).await);
        }
        report.push_sample(
            "W6",
            runs(&format!("enqueue_many {total} in batches of 1,000")),
            median_sample(all),
            "msgs/s",
            Target::at_least(50_000.0),
        );
    }

    // W16: statistics over a keyed backlog, idle and while its keys drain.
    if args.wants("w16") {
        db.reset().await?;
        let (n, keys) = (args.scaled(100_000), args.scaled(1_000));
        match workloads::w16(db, n, keys, 5).await {
            Ok(t) => {
                let most = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
                let idle =
                    format!("Store::stats over {n} keyed messages ({keys} keys), slowest of 5");
                let draining = "the same while a default worker drains the keys, slowest of 5";
                for (name, times) in [(idle, &t.idle), (draining.to_string(), &t.draining)] {
                    report.push("W16", name, Ok(most(times)), "s", None);
                    // The target is every backend's, not only PostgreSQL's.
                    let row = report.rows.len() - 1;
                    report.set_target(row, Target::at_most(STATS_MAX_S));
                }
            }
            Err(e) => report.push(
                "W16",
                "Store::stats over a keyed backlog",
                Err(e),
                "s",
                None,
            ),
        }
    }

    // W17: a pause and a resume of a topic, seen by four workers draining it.
    if args.wants("w17") {
        db.reset().await?;
        let n = args.scaled(100_000).max(30_000);
        let rounds = repeat.clamp(3, 5);
        match workloads::w17(db, n, W17_WORKERS, rounds).await {
            Ok(t) => {
                let most = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
                let paused = format!(
                    "Store::pause to the last call on any of {W17_WORKERS} draining workers, slowest of {rounds}"
                );
                let resumed = format!(
                    "Store::resume to the first call on each of the {W17_WORKERS}, slowest of {rounds}"
                );
                for (name, times) in [(paused, &t.paused), (resumed, &t.resumed)] {
                    report.push("W17", name, Ok(most(times)), "s", None);
                    // The target is every backend's, not only PostgreSQL's.
                    let row = report.rows.len() - 1;
                    report.set_target(row, Target::at_most(PAUSE_MAX_S));
                }
            }
            Err(e) => report.push("W17", "pause and resume on four workers", Err(e), "s", None),
        }
    }

    // Peak RSS of a worker process on a 100,000-message backlog.
    if args.wants("rss") {
        db.reset().await?;
        let n = args.scaled(100_000);
        match workloads::rss(db, n, best_setting).await {
            Ok(r) => {
                report.push(
                    "RSS",
                    format!("worker peak RSS, {n} backlog ({best_setting})"),
                    Ok(r.peak_mb),
                    "MB",
                    Target::at_most(50.0),
                );
                if db.kind == Kind::Mysql {
                    report.set_target(report.rows.len() - 1, Target::at_most(MYSQL_RSS_MB));
                }
                report.push("RSS", "worker child drain rate", Ok(r.rate), "msgs/s", None);
            }
            Err(e) => report.push("RSS", "worker peak RSS", Err(e), "MB", None),
        }
    }
    Ok(())
}
