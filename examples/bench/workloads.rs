//! The workloads W1..W6, W9 and W10, the peer's W1 and the peak-RSS run, each returning its
//! raw figures.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _, Result};
use outbox::{
    enqueue, enqueue_many, outbox_event, Context, Handler, HandlerError, Wakeup, Worker,
    WorkerConfig,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};

use crate::cpu::{CpuMeter, CpuPer};
use crate::db::{on_pool, Db, Kind, Orders as _, Pool};

/// The message of every workload: ~200 bytes of JSON.
#[outbox_event(topic = "bench.message")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct BenchMessage {
    pub(crate) seq: u64,
    pub(crate) order_id: String,
    pub(crate) customer: String,
    pub(crate) amount_cents: u64,
    pub(crate) currency: String,
    pub(crate) note: String,
}

impl BenchMessage {
    /// Message number `seq`.
    pub(crate) fn new(seq: u64) -> Self {
        BenchMessage {
            seq,
            order_id: format!("ord-{seq:012}"),
            customer: format!("customer-{}@example.com", seq % 1000),
            amount_cents: seq % 100_000,
            currency: "EUR".into(),
            note: "x".repeat(64),
        }
    }
}

/// Messages `0..n`.
pub(crate) fn messages(n: u64) -> Vec<BenchMessage> {
    (0..n).map(BenchMessage::new).collect()
}

/// W9's message: a [`BenchMessage`] with an ordering key, on the same topic (the probe reads
/// it as a `BenchMessage` and ignores the key field).
#[outbox_event(topic = "bench.message", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct KeyedBenchMessage {
    key: String,
    seq: u64,
    order_id: String,
    customer: String,
    amount_cents: u64,
    currency: String,
    note: String,
}

/// Messages `0..n` over `keys` ordering keys, interleaved (message `i` has key `i % keys`), as
/// the events of many aggregates arrive.
pub(crate) fn keyed_messages(n: u64, keys: u64) -> Vec<KeyedBenchMessage> {
    (0..n)
        .map(|seq| KeyedBenchMessage::new(seq, format!("bench:{}", seq % keys.max(1))))
        .collect()
}

impl KeyedBenchMessage {
    fn new(seq: u64, key: String) -> KeyedBenchMessage {
        let m = BenchMessage::new(seq);
        KeyedBenchMessage {
            key,
            seq: m.seq,
            order_id: m.order_id,
            customer: m.customer,
            amount_cents: m.amount_cents,
            currency: m.currency,
            note: m.note,
        }
    }
}

/// The topic of [`BenchMessage`].
pub(crate) const TOPIC: &str = "bench.message";

/// A topic the bench worker has no handler for (W5); W10's idle worker serves it.
#[outbox_event(topic = "bench.unhandled")]
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Unhandled {
    seq: u64,
    note: String,
}

/// What the probe handler records.
pub(crate) struct ProbeState {
    handled: AtomicU64,
    target: u64,
    all: Notify,
    /// Handler start per `seq` (W3 only).
    starts: Vec<OnceLock<Instant>>,
    /// Handler start per `seq` on the system clock (W3 across processes only: the producer's
    /// process reads the same clock at its commits).
    wall: Vec<OnceLock<SystemTime>>,
    /// W9 with one key: the last `seq` handled (plus one), and calls that came out of order.
    serial: Option<(AtomicU64, AtomicU64)>,
}

impl ProbeState {
    /// Expects `target` calls; records start times of the first `record` sequence numbers.
    pub(crate) fn new(target: u64, record: usize) -> Arc<Self> {
        Arc::new(ProbeState {
            handled: AtomicU64::new(0),
            target,
            all: Notify::new(),
            starts: (0..record).map(|_| OnceLock::new()).collect(),
            wall: Vec::new(),
            serial: None,
        })
    }

    /// Expects `target` calls; records the system-clock start times of the first `record`
    /// sequence numbers.
    pub(crate) fn wall(target: u64, record: usize) -> Arc<Self> {
        Arc::new(ProbeState {
            handled: AtomicU64::new(0),
            target,
            all: Notify::new(),
            starts: Vec::new(),
            wall: (0..record).map(|_| OnceLock::new()).collect(),
            serial: None,
        })
    }

    /// Expects `target` calls of one ordering key, and counts those that come out of order.
    pub(crate) fn serial(target: u64) -> Arc<Self> {
        Arc::new(ProbeState {
            handled: AtomicU64::new(0),
            target,
            all: Notify::new(),
            starts: Vec::new(),
            wall: Vec::new(),
            serial: Some((AtomicU64::new(0), AtomicU64::new(0))),
        })
    }

    /// Calls that came out of order (W9 with one key).
    pub(crate) fn out_of_order(&self) -> u64 {
        self.serial
            .as_ref()
            .map_or(0, |(_, bad)| bad.load(Ordering::SeqCst))
    }

    fn handled(&self) -> u64 {
        self.handled.load(Ordering::SeqCst)
    }

    /// Waits until `target` calls were made, or `limit` passed (then `false`).
    pub(crate) async fn wait_all(&self, limit: Duration) -> bool {
        if self.handled() >= self.target {
            return true;
        }
        tokio::time::timeout(limit, self.all.notified())
            .await
            .is_ok()
    }
}

/// The no-op handler: counts calls and, for W3, notes when each one started.
pub(crate) struct Probe(pub(crate) Arc<ProbeState>);

#[outbox::async_trait]
impl Handler for Probe {
    type Event = BenchMessage;
    const NAME: &'static str = "bench-probe";

    async fn handle(&self, event: BenchMessage, _ctx: &Context) -> Result<(), HandlerError> {
        self.0.record(event.seq);
        Ok(())
    }
}

impl ProbeState {
    /// Notes the call for message `seq`: when it started, whether it came in order (serial
    /// runs), and whether it was the last one awaited.
    pub(crate) fn record(&self, seq: u64) {
        let now = Instant::now();
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| self.starts.get(i)) {
            let _ = slot.set(now);
        }
        if let Some(slot) = usize::try_from(seq).ok().and_then(|i| self.wall.get(i)) {
            let _ = slot.set(SystemTime::now());
        }
        if let Some((last, bad)) = &self.serial {
            if last.swap(seq + 1, Ordering::SeqCst) > seq {
                bad.fetch_add(1, Ordering::SeqCst);
            }
        }
        if self.handled.fetch_add(1, Ordering::SeqCst) + 1 == self.target {
            self.all.notify_one();
        }
    }
}

/// The handler of W10's idle worker, which serves another topic than the producers write.
struct IdleProbe;

#[outbox::async_trait]
impl Handler for IdleProbe {
    type Event = Unhandled;
    const NAME: &'static str = "bench-idle";

    async fn handle(&self, _event: Unhandled, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A worker setting: handler calls in flight and messages per claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Setting {
    /// `WorkerConfig::concurrency`.
    pub(crate) concurrency: usize,
    /// `WorkerConfig::batch_size`.
    pub(crate) batch_size: usize,
}

impl Setting {
    /// The worker config of this setting (defaults otherwise).
    pub(crate) fn config(self) -> WorkerConfig {
        WorkerConfig::default()
            .concurrency(self.concurrency)
            .batch_size(self.batch_size)
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c={} b={}", self.concurrency, self.batch_size)
    }
}

impl std::str::FromStr for Setting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (c, b) = s
            .split_once('x')
            .ok_or_else(|| format!("`{s}`: expected CONCURRENCYxBATCH, e.g. 32x100"))?;
        let parse = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("`{s}`: {v} is not a positive number"))
        };
        Ok(Setting {
            concurrency: parse(c)?,
            batch_size: parse(b)?,
        })
    }
}

/// The default worker config, for the workloads that ask only for "a worker running" (W2, W3).
pub(crate) const DEFAULT_SETTING: Setting = Setting {
    concurrency: 32,
    batch_size: 100,
};

/// A generous bound for a drain of `n` messages, so a stuck run ends with an error.
pub(crate) fn limit_for(n: u64) -> Duration {
    Duration::from_secs(60 + n / 200)
}

/// Builds the bench worker on `pool`.
/// Builds the worker of a timed drain: its handler records each call in the probe state.
pub(crate) type BuildWorker = fn(&Pool, &Arc<ProbeState>, WorkerConfig) -> Result<Worker>;

fn worker(pool: &Pool, state: &Arc<ProbeState>, config: WorkerConfig) -> Result<Worker> {
    Ok(Worker::builder(pool.store())
        .handler(Probe(state.clone()))
        .config(config)
        .build()?)
}

/// Runs a worker with `setting` until `n` more messages are done; returns the seconds from
/// worker start until the last outcome is written (the worker has stopped by then).
pub(crate) async fn drain(pool: &Pool, n: u64, setting: Setting) -> Result<f64> {
    let state = ProbeState::new(n, 0);
    let w = worker(pool, &state, setting.config())?;
    let limit = limit_for(n);
    let start = Instant::now();
    w.run_until(async {
        state.wait_all(limit).await;
    })
    .await?;
    let secs = start.elapsed().as_secs_f64();
    if state.handled() < n {
        bail!(
            "drain stopped after {limit:?} with {} of {n} messages handled",
            state.handled()
        );
    }
    Ok(secs)
}

/// A rate and the CPU time per unit behind it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// Units (messages or transactions) per second.
    pub(crate) rate: f64,
    /// CPU per unit.
    pub(crate) cpu: CpuPer,
}

/// Waits until the probe has seen its `target` calls and then until `leave` live messages of
/// `topics` are left (the last outcome is written; those left are blocked), within `limit`.
async fn until_drained(
    db: &Db,
    topics: &[&str],
    state: &ProbeState,
    limit: Duration,
    leave: i64,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    if !state.wait_all(limit).await {
        bail!(
            "drain stopped after {limit:?} with {} of {} messages handled",
            state.handled(),
            state.target
        );
    }
    loop {
        let left = db.remaining(topics).await? - leave;
        if left <= 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("all messages were handled but {left} are still live after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// W1 and its variants, timed the way the peer times its drain: `n` pending messages
/// inserted up front; then the clock runs from building a new pool and worker (as a worker
/// binary starts) until no live message of the topic is left.
pub(crate) async fn w1(db: &Db, n: u64, config: WorkerConfig) -> Result<Sample> {
    db.seed(&messages(n)).await?;
    timed_drain(db, n, config, ProbeState::new(n, 0), 0, worker).await
}

/// W9: W1's drain of `n` messages with ordering keys, `keys` of them, timed the same way. With
/// one key the drain is serial, and every call is checked to come in enqueue order.
pub(crate) async fn w9(db: &Db, n: u64, keys: u64, config: WorkerConfig) -> Result<Sample> {
    db.seed(&keyed_messages(n, keys)).await?;
    let state = if keys == 1 {
        ProbeState::serial(n)
    } else {
        ProbeState::new(n, 0)
    };
    let sample = timed_drain(db, n, config, state.clone(), 0, worker).await?;
    if state.out_of_order() > 0 {
        bail!(
            "{} of {n} messages of one key were handled out of enqueue order",
            state.out_of_order()
        );
    }
    Ok(sample)
}

/// W9B: W9's drain beside `blocked` keys that a dead letter holds, each with a message of the
/// drained topic waiting behind it, as after an outage of one downstream: every walk over the
/// keys meets them, and every head claimed asks whether a dead letter holds its key.
pub(crate) async fn w9_blocked(
    db: &Db,
    n: u64,
    keys: u64,
    blocked: u64,
    config: WorkerConfig,
) -> Result<Sample> {
    db.insert_done(blocked, "bench.doomed", &sample_payload(), Some(BLOCKED))
        .await?;
    let waiting: Vec<_> = (1..=blocked)
        .map(|i| KeyedBenchMessage::new(n + i, format!("{BLOCKED}{i}")))
        .collect();
    db.seed(&waiting).await?;
    db.seed(&keyed_messages(n, keys)).await?;
    let sample = timed_drain(db, n, config, ProbeState::new(n, 0), blocked, worker).await?;
    let left = db.remaining(&[TOPIC]).await?;
    if left != i64::try_from(blocked)? {
        bail!("{left} messages are live after the drain; the {blocked} blocked ones should be");
    }
    Ok(sample)
}

/// The key prefix of W9B's dead letters and of the messages they block.
const BLOCKED: &str = "blocked:";

/// The timed part of W1, W9 and W11, on messages already seeded: `n` to handle, and `blocked`
/// more that stay live; the worker built by `build`.
pub(crate) async fn timed_drain(
    db: &Db,
    n: u64,
    config: WorkerConfig,
    state: Arc<ProbeState>,
    blocked: u64,
    build: BuildWorker,
) -> Result<Sample> {
    let leave = i64::try_from(blocked)?;
    db.analyze().await?;
    // Every run starts right after a checkpoint, so none pays for one the seeding left due.
    db.checkpoint().await?;
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    let pool = db.cold_pool(COLD_POOL_SIZE).await?;
    let w = build(&pool, &state, config)?;
    let mut timed = None;
    let ran = w
        .run_until(async {
            let drained = until_drained(db, &[TOPIC], &state, limit_for(n), leave).await;
            let secs = start.elapsed().as_secs_f64();
            timed = Some((drained.map(|()| secs), meter.stop(db).await));
        })
        .await;
    pool.close().await;
    ran?;
    let (secs, cpu) = timed.ok_or_else(|| anyhow!("the worker stopped before the drain ended"))?;
    Ok(Sample {
        rate: n as f64 / secs?,
        cpu: cpu.per(n),
    })
}

/// The size of the pools the bench opens cold: `outbox::cli::connect`'s.
pub(crate) const COLD_POOL_SIZE: u32 = 10;

/// The peer's W1: `node bench.js drain N CONCURRENCY batched` in `dir` (a graphile-worker
/// bench folder prepared with `npm ci`), against the database at `url`. Returns jobs/s from
/// its `RESULT` line.
pub(crate) async fn peer_w1(dir: &Path, url: &str, n: u64, concurrency: usize) -> Result<f64> {
    let args = [
        "bench.js",
        "drain",
        &n.to_string(),
        &concurrency.to_string(),
        "batched",
    ];
    peer_result(dir, url, args.map(String::from).to_vec(), "W1 drain").await
}

/// The peer's W9: graphile-worker draining `n` jobs over `keys` queues (`queue_name`), run by
/// the bench's own script (`bench/peer/keyed.js`) with the packages of the peer folder `dir`.
pub(crate) async fn peer_w9(
    dir: &Path,
    url: &str,
    n: u64,
    concurrency: usize,
    keys: u64,
) -> Result<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/peer/keyed.js");
    let args = [
        script,
        &n.to_string(),
        &concurrency.to_string(),
        &keys.to_string(),
    ];
    peer_result(dir, url, args.map(String::from).to_vec(), "W9 keyed drain").await
}

/// Runs `node ARGS` in the peer folder `dir` (its packages on `NODE_PATH`) against `url`, and
/// returns the rate of its `RESULT` line for `workload`.
async fn peer_result(
    dir: &Path,
    url: &str,
    args: Vec<String>,
    workload: &'static str,
) -> Result<f64> {
    let dir = dir.to_path_buf();
    let url = url.to_string();
    tokio::task::spawn_blocking(move || -> Result<f64> {
        let out = Command::new("node")
            .args(&args)
            .current_dir(&dir)
            .env("DATABASE_URL", &url)
            .env("NODE_PATH", dir.join("node_modules"))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `node` in {}", dir.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&"RESULT") && f.get(2) == Some(&workload));
        match line.and_then(|f| f.get(4).and_then(|v| v.parse::<f64>().ok())) {
            Some(rate) => Ok(rate),
            None => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
                bail!(
                    "the peer ({}) printed no {workload} result; stderr ends: {}",
                    out.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                )
            }
        }
    })
    .await?
}

/// Whether W2's transactions run in a span of their own (a request's). Only W2T, with the
/// `opentelemetry` feature, traces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) enum Traced {
    /// No span.
    No,
    /// The business statements and the commit in the request's span, `enqueue` outside it:
    /// the application is traced, the message carries no context (as without the feature).
    RequestOnly,
    /// The whole transaction in the request's span, so `enqueue` stores its context.
    Full,
    /// Each producer's transactions take turns: `Full`, then `RequestOnly`, then `Full`...,
    /// each timed, so that the two variants meet the same disk, the same worker and the same
    /// other producers (see [`w2t_interleaved`]).
    Alternating,
}

/// One producer's transaction timings under [`Traced::Alternating`]: its `k`-th pair is its
/// `2k`-th transaction (`Full`) and its `2k + 1`-th (`RequestOnly`), in seconds.
pub(crate) type Pairs = Vec<(f64, f64)>;

/// Awaits `f` in `span`, if there is one.
async fn in_span<F: std::future::Future>(span: Option<&tracing::Span>, f: F) -> F::Output {
    use tracing::Instrument;
    match span {
        Some(span) => f.instrument(span.clone()).await,
        None => f.await,
    }
}

/// `total` transactions from `producers` connections of `pool`, as fast as they go: a business
/// INSERT, plus `enqueue` of a message of the new order when `with_enqueue`, and COMMIT; in a
/// request's span as `traced` says. Returns the seconds they took.
async fn produce(
    pool: &Pool,
    producers: u32,
    total: u64,
    with_enqueue: bool,
    traced: Traced,
) -> Result<(f64, Vec<Pairs>)> {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let pool = pool.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut pairs = Pairs::new();
            let mut full_secs = None;
            for k in 0u64.. {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let this = match traced {
                    Traced::Alternating if k % 2 == 0 => Traced::Full,
                    Traced::Alternating => Traced::RequestOnly,
                    t => t,
                };
                let amount = i64::try_from(i % 100_000)?;
                let customer = format!("customer-{}@example.com", i % 1000);
                let started = Instant::now();
                let request = match this {
                    Traced::No => None,
                    _ => Some(tracing::info_span!("POST /orders")),
                };
                let (business, outbox) = match this {
                    Traced::Full => (request.as_ref(), request.as_ref()),
                    _ => (request.as_ref(), None),
                };
                on_pool!(&pool, p => {
                    let mut tx = in_span(business, p.begin()).await?;
                    let id: i64 = in_span(business, tx.insert_order(&customer, amount)).await?;
                    if with_enqueue {
                        let mut m = BenchMessage::new(i);
                        m.order_id = format!("ord-{id:012}");
                        in_span(outbox, enqueue(&mut *tx, &m)).await?;
                    }
                    in_span(business, tx.commit()).await?;
                });
                // The span ends here, as a request's would, so closing it is in the time.
                drop(request);
                let secs = started.elapsed().as_secs_f64();
                if traced == Traced::Alternating {
                    match full_secs.take() {
                        None => full_secs = Some(secs),
                        Some(full) => pairs.push((full, secs)),
                    }
                }
            }
            Ok::<_, anyhow::Error>(pairs)
        }));
    }
    let mut failure = None;
    let mut all = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(pairs)) => all.push(pairs),
            Ok(Err(e)) => failure = Some(e),
            Err(e) => failure = Some(anyhow!("producer task failed: {e}")),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    match failure {
        Some(e) => Err(e),
        None => Ok((secs, all)),
    }
}

/// W2T's interleaved run: `total` transactions from `producers` connections with a default
/// worker running, each producer's transactions alternating between the context stored
/// ([`Traced::Full`]) and not ([`Traced::RequestOnly`]), every one timed. Returns, for each run
/// of `block` consecutive pairs of one producer, the ratio of the time its `RequestOnly`
/// transactions took to the time its `Full` ones took (the throughput of `Full` relative to
/// `RequestOnly` over that stretch), and the two sums over every pair. Drift (a checkpoint, the disk's speed over a minute) meets
/// both halves of a pair alike, which separate runs of each variant cannot promise.
#[cfg(feature = "opentelemetry")]
pub(crate) async fn w2t_interleaved(
    db: &Db,
    producers: u32,
    total: u64,
    block: usize,
) -> Result<Interleaved> {
    let (_, per_producer) = w2_run(db, producers, total, true, true, Traced::Alternating).await?;
    let sums = |pairs: &[(f64, f64)]| {
        pairs
            .iter()
            .fold((0.0, 0.0), |(f, r), (a, b)| (f + a, r + b))
    };
    let blocks = per_producer
        .iter()
        .flat_map(|pairs| pairs.chunks_exact(block.max(1)))
        .map(|b| {
            let (full, request) = sums(b);
            request / full
        })
        .collect();
    let (full, request) = per_producer
        .iter()
        .map(|p| sums(p))
        .fold((0.0, 0.0), |(f, r), (a, b)| (f + a, r + b));
    Ok(Interleaved {
        blocks,
        full,
        request,
    })
}

/// What [`w2t_interleaved`] measured.
#[cfg(feature = "opentelemetry")]
pub(crate) struct Interleaved {
    /// Each block's ratio: its `RequestOnly` seconds to its `Full` seconds.
    pub(crate) blocks: Vec<f64>,
    /// Seconds all `Full` transactions of complete pairs took, summed over the producers.
    pub(crate) full: f64,
    /// The same for their `RequestOnly` partners.
    pub(crate) request: f64,
}

/// One W2 run: `total` transactions (business INSERT, plus `enqueue` when `with_enqueue`) from
/// `producers` connections while a default worker runs (or, with `with_worker` false, none:
/// the cost of the `enqueue` statement alone); in a request's span as `traced` says. Returns
/// transactions per second.
pub(crate) async fn w2(
    db: &Db,
    producers: u32,
    total: u64,
    with_enqueue: bool,
    with_worker: bool,
    traced: Traced,
) -> Result<Sample> {
    Ok(
        w2_run(db, producers, total, with_enqueue, with_worker, traced)
            .await?
            .0,
    )
}

/// [`w2`], with each producer's transaction pairs when `traced` is [`Traced::Alternating`].
async fn w2_run(
    db: &Db,
    producers: u32,
    total: u64,
    with_enqueue: bool,
    with_worker: bool,
    traced: Traced,
) -> Result<(Sample, Vec<Pairs>)> {
    let handled = with_enqueue && with_worker;
    let state = ProbeState::new(if handled { total } else { u64::MAX }, 0);
    let stop = Arc::new(Notify::new());
    let running = if with_worker {
        let w = worker(&db.pool, &state, DEFAULT_SETTING.config())?;
        let stop = stop.clone();
        Some(tokio::spawn(async move {
            w.run_until(async move { stop.notified().await }).await
        }))
    } else {
        None
    };
    let pool = db.extra_pool(producers).await?;
    // Let the worker start and settle into its idle wait, as in a quiet service.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let meter = CpuMeter::start(db).await;
    let produced = produce(&pool, producers, total, with_enqueue, traced).await;
    let cpu = meter.stop(db).await;
    let drained = !handled || produced.is_err() || state.wait_all(limit_for(total)).await;
    stop.notify_one();
    if let Some(running) = running {
        running.await??;
    }
    pool.close().await;
    let (secs, pairs) = produced?;
    if !drained {
        bail!("the worker handled {} of {total} messages", state.handled());
    }
    let sample = Sample {
        rate: total as f64 / secs,
        cpu: cpu.per(total),
    };
    Ok((sample, pairs))
}

/// W3's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    /// Messages measured.
    pub(crate) count: usize,
    /// Median of (handler start - commit), in ms.
    pub(crate) p50_ms: f64,
    /// 99th percentile, in ms.
    pub(crate) p99_ms: f64,
    /// Largest, in ms.
    pub(crate) max_ms: f64,
    /// Every message's figure, sorted (W14 pools the rounds' figures).
    #[serde(skip)]
    pub(crate) all_ms: Vec<f64>,
}

impl Latency {
    /// The figures of `ms` (any order).
    pub(crate) fn of(mut ms: Vec<f64>) -> Latency {
        ms.sort_by(f64::total_cmp);
        Latency {
            count: ms.len(),
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or(0.0),
            all_ms: ms,
        }
    }
}

/// How long W3's fresh worker gets to start and reach its idle wait before the first message.
const W3_START: Duration = Duration::from_millis(250);

/// W3: a fresh default worker (a new pool, a new `Worker`, started [`W3_START`] before the
/// first message and given no message before the measured ones, so a cold pool shows); one
/// message enqueued (and committed) every 10 ms for `duration`; handler start minus the moment
/// `commit()` returned, same clock, same process.
pub(crate) async fn w3(db: &Db, duration: Duration) -> Result<Latency> {
    Pickup::start(db, duration, |pool, state| {
        worker(pool, state, WorkerConfig::default())
    })
    .await?
    .measure()
    .await
}

/// W3's measurement in two steps, so that W14 can start a replay on the worker between them:
/// [`Pickup::start`] starts the fresh worker and lets it reach its idle wait;
/// [`Pickup::measure`] commits the messages, one every 10 ms, and stops the worker.
pub(crate) struct Pickup {
    n: usize,
    state: Arc<ProbeState>,
    /// The producer's pool.
    pool: Pool,
    worker_pool: Pool,
    stop: Arc<Notify>,
    running: tokio::task::JoinHandle<Result<(), outbox::Error>>,
}

impl Pickup {
    /// Opens the producer's connection, then a cold pool and the worker `build` makes on it
    /// (its handler records each call in the probe state it is given), and gives the worker
    /// [`W3_START`] to start.
    pub(crate) async fn start(
        db: &Db,
        duration: Duration,
        build: impl FnOnce(&Pool, &Arc<ProbeState>) -> Result<Worker>,
    ) -> Result<Pickup> {
        let interval = W3_INTERVAL;
        let n = usize::try_from((duration.as_millis() / interval.as_millis()).max(1))?;
        let state = ProbeState::new(u64::try_from(n)?, n);
        // The producer's connection is opened first: the worker's side is what is measured.
        let pool = db.extra_pool(1).await?;
        let worker_pool = db.cold_pool(COLD_POOL_SIZE).await?;
        let w = build(&worker_pool, &state)?;
        let stop = Arc::new(Notify::new());
        let running = {
            let stop = stop.clone();
            tokio::spawn(async move { w.run_until(async move { stop.notified().await }).await })
        };
        // Idle: started and asleep on its wake-up channel, having handled nothing yet.
        tokio::time::sleep(W3_START).await;
        Ok(Pickup {
            n,
            state,
            pool,
            worker_pool,
            stop,
            running,
        })
    }

    /// Commits the messages, one every 10 ms, waits until each was handled, stops the worker
    /// and returns the pickup latencies.
    pub(crate) async fn measure(self) -> Result<Latency> {
        let Pickup {
            n,
            state,
            pool,
            worker_pool,
            stop,
            running,
        } = self;
        let interval = W3_INTERVAL;
        let mut commits: Vec<Instant> = Vec::with_capacity(n);
        let t0 = tokio::time::Instant::now() + interval;
        for i in 0..n {
            tokio::time::sleep_until(t0 + interval * u32::try_from(i)?).await;
            let m = BenchMessage::new(u64::try_from(i)?);
            on_pool!(&pool, p => {
                let mut tx = p.begin().await?;
                enqueue(&mut *tx, &m).await?;
                tx.commit().await?;
            });
            commits.push(Instant::now());
        }
        let drained = state.wait_all(limit_for(u64::try_from(n)?)).await;
        stop.notify_one();
        running.await??;
        pool.close().await;
        worker_pool.close().await;
        if !drained {
            bail!("the worker handled {} of {n} messages", state.handled());
        }
        let lat: Vec<f64> = commits
            .iter()
            .zip(&state.starts)
            .map(|(commit, start)| {
                let start = start.get().copied().unwrap_or(*commit);
                // Signed: a handler may start before commit() has returned to the producer.
                if start >= *commit {
                    (start - *commit).as_secs_f64() * 1e3
                } else {
                    -((*commit - start).as_secs_f64() * 1e3)
                }
            })
            .collect();
        Ok(Latency::of(lat))
    }
}

/// W3's pace: one message committed every 10 ms.
const W3_INTERVAL: Duration = Duration::from_millis(10);

/// W3 across processes: what [`w3_cross`] measured.
#[derive(Debug, Clone)]
pub(crate) struct CrossPickup {
    /// The messages committed once the worker had found the first one: messages flowing, the
    /// worker polling at its claim interval.
    pub(crate) flowing: Latency,
    /// The first message and those committed before the worker found it: the worker idle,
    /// polling at its poll interval.
    pub(crate) idle: Latency,
}

/// W3 with the worker in another process (MariaDB/MySQL, where nothing tells a worker of
/// another process about a commit: it polls, every claim interval while messages flow and
/// every poll interval when idle). The producer's connection is opened here first; then a
/// child process (this binary with `--pickup-child`) connects as a worker binary does
/// (`outbox::cli::connect`), starts a fresh default worker, gives it [`W3_START`] and says it
/// is ready; one message is committed here every 10 ms for `duration`. Latency is the child's
/// handler start minus the moment `commit()` returned here, both read from the system clock of
/// this machine. The messages committed before the worker found the first one (it was idle,
/// and finds the first at its next poll) are reported apart from those committed after
/// (messages flowing).
pub(crate) async fn w3_cross(db: &Db, duration: Duration) -> Result<CrossPickup> {
    let interval = W3_INTERVAL;
    let n = usize::try_from((duration.as_millis() / interval.as_millis()).max(1))?;
    let pool = db.extra_pool(1).await?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--pickup-child", "--backend", db.kind.name()])
        .args(["--child-url", &db.url, "--child-count", &n.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the pickup child")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no child stdout"))?;
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let produced = async {
        let ready = tokio::time::timeout(Duration::from_secs(60), lines.recv())
            .await
            .map_err(|_| anyhow!("the pickup child was not ready within 60 s"))?
            .ok_or_else(|| anyhow!("the pickup child exited before it was ready"))??;
        if ready.trim() != PICKUP_READY {
            bail!("the pickup child said `{}`", ready.trim());
        }
        let mut commits: Vec<SystemTime> = Vec::with_capacity(n);
        let t0 = tokio::time::Instant::now() + interval;
        for i in 0..n {
            tokio::time::sleep_until(t0 + interval * u32::try_from(i)?).await;
            let m = BenchMessage::new(u64::try_from(i)?);
            on_pool!(&pool, p => {
                let mut tx = p.begin().await?;
                enqueue(&mut *tx, &m).await?;
                tx.commit().await?;
            });
            commits.push(SystemTime::now());
        }
        let limit = limit_for(u64::try_from(n)?) + Duration::from_secs(10);
        let line = tokio::time::timeout(limit, lines.recv())
            .await
            .map_err(|_| anyhow!("the pickup child did not report within {limit:?}"))?
            .ok_or_else(|| anyhow!("the pickup child exited without a report"))??;
        let report: PickupReport = serde_json::from_str(line.trim())
            .with_context(|| format!("the pickup child said `{}`", line.trim()))?;
        Ok((commits, report))
    }
    .await;
    pool.close().await;
    if produced.is_err() {
        let _ = child.kill();
    }
    let exit = tokio::task::spawn_blocking(move || child.wait()).await??;
    let (commits, report) = produced?;
    if let Some(e) = report.error {
        bail!("the pickup child ({exit}): {e}");
    }
    let ns = |t: &SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    let first_start = report
        .starts_unix_ns
        .first()
        .copied()
        .flatten()
        .map_or(0, u128::from);
    let (mut flowing, mut idle) = (Vec::new(), Vec::new());
    for (commit, start) in commits.iter().zip(&report.starts_unix_ns) {
        let commit = ns(commit);
        let start = start.map_or(commit, u128::from);
        // Signed: a handler may start before commit() has returned to the producer.
        let ms = (start as f64 - commit as f64) / 1e6;
        if commit > first_start {
            flowing.push(ms);
        } else {
            idle.push(ms);
        }
    }
    Ok(CrossPickup {
        flowing: Latency::of(flowing),
        idle: Latency::of(idle),
    })
}

/// What the pickup child prints once it is ready to be measured.
const PICKUP_READY: &str = "ready";

/// What the pickup child prints when its messages were handled (or it gave up).
#[derive(Debug, Serialize, Deserialize)]
struct PickupReport {
    /// Handler start of message `seq` (index), Unix nanoseconds; `None` if never handled.
    starts_unix_ns: Vec<Option<u64>>,
    /// Why it gave up, if it did.
    error: Option<String>,
}

/// The `--pickup-child` mode: connect to `url` as a worker binary does, run a fresh default
/// worker, print [`PICKUP_READY`] once it had [`W3_START`] to start, wait for `n` messages to
/// be handled, print a [`PickupReport`], exit.
pub(crate) async fn pickup_child(url: &str, n: u64) -> Result<()> {
    let store = outbox::cli::connect(url).await?;
    let record = usize::try_from(n)?;
    let state = ProbeState::wall(n, record);
    let w = Worker::builder(store)
        .handler(Probe(state.clone()))
        .config(WorkerConfig::default())
        .build()?;
    let stop = Arc::new(Notify::new());
    let running = {
        let stop = stop.clone();
        tokio::spawn(async move { w.run_until(async move { stop.notified().await }).await })
    };
    tokio::time::sleep(W3_START).await;
    let say = |line: &str| -> Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")?;
        out.flush()?;
        Ok(())
    };
    say(PICKUP_READY)?;
    let drained = state.wait_all(limit_for(n)).await;
    stop.notify_one();
    let ran = running.await;
    let error = match (drained, ran) {
        (false, _) => Some(format!(
            "the worker handled {} of {n} messages",
            state.handled()
        )),
        (true, Ok(Err(e))) => Some(format!("the worker failed: {e}")),
        (true, Err(e)) => Some(format!("the worker task failed: {e}")),
        (true, Ok(Ok(_))) => None,
    };
    let starts_unix_ns = state
        .wall
        .iter()
        .map(|s| {
            s.get().map(|t| {
                u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos())
                    .unwrap_or(u64::MAX)
            })
        })
        .collect();
    say(&serde_json::to_string(&PickupReport {
        starts_unix_ns,
        error,
    })?)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One W10 run's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct W10Run {
    /// Producer transactions per second, with the CPU behind each.
    pub(crate) sample: Sample,
    /// Producer transactions.
    pub(crate) transactions: u64,
    /// Notifications received on the wake-up channel while they ran: one per notifying
    /// transaction.
    pub(crate) notifies: u64,
    /// How many different payloads (addressed workers) the notifications had.
    pub(crate) payloads: usize,
    /// Messages the workers had handled when they were stopped.
    pub(crate) handled: u64,
}

/// The wake-up channel of the PostgreSQL backend, listened to by W10 to count NOTIFYs.
const WAKEUP_CHANNEL: &str = "outbox_wakeup";

/// W10 (PostgreSQL): `producers` connections commit `total` business transactions with
/// `enqueue` as fast as they can, while `workers` default workers with `wakeup` serve the
/// topic, each on a pool of its own (plus, with `idle_other`, one more worker that serves
/// another topic and so idles throughout). A separate connection LISTENs on the wake-up
/// channel and counts the notifications sent meanwhile. Returns the producers' rate; the
/// workers are stopped once the producers are done.
pub(crate) async fn w10(
    db: &Db,
    producers: u32,
    total: u64,
    workers: usize,
    idle_other: bool,
    wakeup: Wakeup,
    settle: Duration,
) -> Result<W10Run> {
    let state = ProbeState::new(total, 0);
    let (stop, stopped) = watch::channel(false);
    let mut pools = Vec::new();
    let mut running = Vec::new();
    for i in 0..workers + usize::from(idle_other) {
        let pool = db.cold_pool(W10_POOL_SIZE).await?;
        let config = WorkerConfig::default()
            .name(format!("bench-w10-{i}"))
            .wakeup(wakeup);
        let builder = Worker::builder(pool.store()).config(config);
        let w = if i < workers {
            builder.handler(Probe(state.clone())).build()?
        } else {
            builder.handler(IdleProbe).build()?
        };
        let mut stopped = stopped.clone();
        running.push(tokio::spawn(async move {
            w.run_until(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
        }));
        pools.push(pool);
    }

    let mut listener = sqlx::postgres::PgListener::connect(&db.url).await?;
    listener.listen(WAKEUP_CHANNEL).await?;
    let notifies = Arc::new(AtomicU64::new(0));
    let payloads = Arc::new(Mutex::new(HashSet::new()));
    let counting = {
        let (notifies, payloads) = (notifies.clone(), payloads.clone());
        tokio::spawn(async move {
            while let Ok(n) = listener.recv().await {
                notifies.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut p) = payloads.lock() {
                    p.insert(n.payload().to_string());
                }
            }
        })
    };
    let producer_pool = db.extra_pool(producers).await?;
    // Let the workers start and settle into their idle wait, as in a quiet service.
    tokio::time::sleep(settle).await;

    let meter = CpuMeter::start(db).await;
    let produced = produce(&producer_pool, producers, total, true, Traced::No).await;
    let cpu = meter.stop(db).await;
    // Notifications go out at commit; give the last ones time to arrive. The workers are not
    // waited for: the next run starts from an empty table, and a poll-mode worker would take
    // up to its poll interval to notice the last messages.
    tokio::time::sleep(Duration::from_millis(50)).await;
    counting.abort();
    let _ = stop.send(true);
    let mut failure = None;
    for r in running {
        match r.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = Some(anyhow!("a worker failed: {e}")),
            Err(e) => failure = Some(anyhow!("a worker task failed: {e}")),
        }
    }
    producer_pool.close().await;
    for p in pools {
        p.close().await;
    }
    let (secs, _) = produced?;
    if let Some(e) = failure {
        return Err(e);
    }
    let payloads = payloads.lock().map(|p| p.len()).unwrap_or(0);
    Ok(W10Run {
        sample: Sample {
            rate: total as f64 / secs,
            cpu: cpu.per(total),
        },
        transactions: total,
        notifies: notifies.load(Ordering::SeqCst),
        payloads,
        handled: state.handled(),
    })
}

/// The pool size of each W10 worker: 8 of them stay well within PostgreSQL's default 100
/// connections beside the producers and the bench's own.
const W10_POOL_SIZE: u32 = 5;

/// W6: `enqueue_many` of `total` messages, `batch` per transaction, one connection. The
/// events are built before the clock starts. Returns msgs/s.
pub(crate) async fn w6(db: &Db, total: u64, batch: usize) -> Result<Sample> {
    let all = messages(total);
    let meter = CpuMeter::start(db).await;
    let start = Instant::now();
    for chunk in all.chunks(batch) {
        on_pool!(&db.pool, p => {
            let mut tx = p.begin().await?;
            enqueue_many(&mut *tx, chunk).await?;
            tx.commit().await?;
        });
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = meter.stop(db).await;
    let pending = db.remaining(&[TOPIC]).await?;
    if pending != i64::try_from(total)? {
        bail!("{pending} messages pending after W6, expected {total}");
    }
    Ok(Sample {
        rate: total as f64 / secs,
        cpu: cpu.per(total),
    })
}

/// W16's figures: the seconds of each `Store::stats` call over the keyed backlog, with no
/// worker, then while a default worker drains the keys.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatsTimes {
    pub(crate) idle: Vec<f64>,
    pub(crate) draining: Vec<f64>,
}

/// W16: `n` pending messages over `keys` ordering keys, then `calls` timed calls of
/// `Store::stats` with no worker, then as many while a default worker drains them (from its
/// first hundred messages on). The idle figures are checked: each key's head is ready, the
/// rest blocked.
pub(crate) async fn w16(db: &Db, n: u64, keys: u64, calls: usize) -> Result<StatsTimes> {
    db.seed(&keyed_messages(n, keys)).await?;
    db.analyze().await?;
    let store = db.pool.store();
    let mut times = StatsTimes::default();
    for _ in 0..calls {
        let start = Instant::now();
        let stats = store.stats().await?;
        times.idle.push(start.elapsed().as_secs_f64());
        let t = stats
            .topics
            .iter()
            .find(|t| t.topic == TOPIC)
            .ok_or_else(|| anyhow!("no statistics of {TOPIC}"))?;
        let (heads, behind) = (
            i64::try_from(keys.min(n))?,
            i64::try_from(n)? - i64::try_from(keys.min(n))?,
        );
        if (t.ready, t.blocked) != (heads, behind) {
            bail!(
                "W16 stats say {} ready and {} blocked, expected {heads} and {behind}",
                t.ready,
                t.blocked
            );
        }
    }
    let state = ProbeState::new(n, 0);
    let pool = db.cold_pool(COLD_POOL_SIZE).await?;
    let w = worker(&pool, &state, WorkerConfig::default())?;
    let mut timed: Result<()> = Ok(());
    w.run_until(async {
        let deadline = Instant::now() + limit_for(n);
        while state.handled() < 100.min(n) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for _ in 0..calls {
            let start = Instant::now();
            if let Err(e) = store.stats().await {
                timed = Err(e.into());
                return;
            }
            times.draining.push(start.elapsed().as_secs_f64());
        }
    })
    .await?;
    pool.close().await;
    timed?;
    Ok(times)
}

/// The peak-RSS run's figures.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Rss {
    /// VmHWM of the worker process, in MB (10^6 bytes).
    pub(crate) peak_mb: f64,
    /// The child's drain rate, msgs/s.
    pub(crate) rate: f64,
}

/// Peak RSS: `n` pending messages, drained by a worker in a child process (this binary with
/// `--worker-child`); its VmHWM is read from `/proc/<pid>/status` once it has drained them.
pub(crate) async fn rss(db: &Db, n: u64, setting: Setting) -> Result<Rss> {
    db.seed(&messages(n)).await?;
    db.analyze().await?;
    let exe = std::env::current_exe()?;
    let kind = db.kind.name().to_string();
    let url = db.url.clone();
    tokio::task::spawn_blocking(move || -> Result<Rss> {
        let mut child = Command::new(exe)
            .args(["--worker-child", "--backend", &kind, "--child-url", &url])
            .args(["--child-count", &n.to_string()])
            .args([
                "--child-setting",
                &format!("{}x{}", setting.concurrency, setting.batch_size),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the worker child")?;
        let pid = child.id();
        let mut line = String::new();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("no child stdout"))?;
        BufReader::new(stdout).read_line(&mut line)?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
        // Closing stdin lets the child exit.
        drop(child.stdin.take());
        let exit = child.wait()?;
        let report: ChildReport = serde_json::from_str(line.trim())
            .with_context(|| format!("worker child ({exit}) said `{}`", line.trim()))?;
        let kib = status
            .ok()
            .as_deref()
            .and_then(vm_hwm_kib)
            .unwrap_or(report.vm_hwm_kib);
        Ok(Rss {
            peak_mb: kib as f64 * 1024.0 / 1e6,
            rate: n as f64 / report.secs,
        })
    })
    .await?
}

/// What the worker child prints when it has drained its messages.
#[derive(Debug, Serialize, Deserialize)]
struct ChildReport {
    secs: f64,
    vm_hwm_kib: u64,
}

/// `VmHWM` (peak resident set) in KiB from the text of `/proc/<pid>/status`.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The `--worker-child` mode: drain `n` messages, print a [`ChildReport`], wait for stdin to
/// close, exit.
pub(crate) async fn worker_child(kind: Kind, url: &str, n: u64, setting: Setting) -> Result<()> {
    let pool = match kind {
        Kind::Postgres => Pool::Pg(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(10)
                .connect(url)
                .await?,
        ),
        Kind::Sqlite => Pool::Sqlite(outbox::sqlite_pool(url).await?),
        Kind::Mysql => Pool::My(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(10)
                .connect(url)
                .await?,
        ),
    };
    let secs = drain(&pool, n, setting).await?;
    let own = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let report = ChildReport {
        secs,
        vm_hwm_kib: vm_hwm_kib(&own).unwrap_or(0),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&report)?)?;
    out.flush()?;
    drop(out);
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {
            sink.clear();
        }
    })
    .await?;
    pool.close().await;
    Ok(())
}

/// The ~200-byte payload of W4's done rows, the same shape as [`BenchMessage`].
pub(crate) fn sample_payload() -> String {
    serde_json::to_string(&BenchMessage::new(123_456)).unwrap_or_default()
}

/// The unhandled messages of W5.
pub(crate) fn unhandled(n: u64) -> Vec<Unhandled> {
    (0..n)
        .map(|seq| Unhandled {
            seq,
            note: "y".repeat(150),
        })
        .collect()
}

/// W17's figures, in seconds, one per round: from `Store::pause` returning to the last handler
/// call that any of the workers started (an upper bound of its last claim: a message claimed
/// before the pause may wait in its worker for a handler slot), and from `Store::resume`
/// returning to the first call on each worker, the slowest of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct PauseTimes {
    pub(crate) paused: Vec<f64>,
    pub(crate) resumed: Vec<f64>,
}

/// The calls of each of W17's workers, when they started.
struct PacedCalls(Vec<Mutex<Vec<Instant>>>);

impl PacedCalls {
    /// The last call worker `i` started, if any.
    fn last(&self, i: usize) -> Option<Instant> {
        self.0[i].lock().ok().and_then(|c| c.last().copied())
    }

    /// The first call worker `i` started after `t`, if any.
    fn first_after(&self, i: usize, t: Instant) -> Option<Instant> {
        self.0[i]
            .lock()
            .ok()
            .and_then(|c| c.iter().rev().take_while(|at| **at > t).last().copied())
    }
}

/// W17's handler: notes the call under its worker's index and takes 20 ms, as a call to a
/// provider would, so that four workers drain the backlog steadily rather than at once.
struct Paced(Arc<PacedCalls>, usize);

#[outbox::async_trait]
impl Handler for Paced {
    type Event = BenchMessage;
    const NAME: &'static str = "bench-paced";

    async fn handle(&self, _event: BenchMessage, _ctx: &Context) -> Result<(), HandlerError> {
        if let Ok(mut calls) = self.0 .0[self.1].lock() {
            calls.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(())
    }
}

/// How long W17 waits after a pause before it reads when the last call started: twice the
/// target, so that a pause that takes longer than the target shows as such.
const W17_OBSERVE: Duration = Duration::from_secs(2);

/// W17: `n` pending messages drained by `workers` default workers (a task and a pool each);
/// in each of `rounds` rounds, while all of them are handling messages, the topic is paused,
/// then resumed (see [`PauseTimes`]).
pub(crate) async fn w17(db: &Db, n: u64, workers: usize, rounds: usize) -> Result<PauseTimes> {
    db.seed(&messages(n)).await?;
    db.analyze().await?;
    let calls = Arc::new(PacedCalls(
        (0..workers).map(|_| Mutex::new(Vec::new())).collect(),
    ));
    let (stop, stopped) = watch::channel(false);
    let mut pools = Vec::new();
    let mut running = Vec::new();
    for i in 0..workers {
        let pool = db.cold_pool(COLD_POOL_SIZE).await?;
        let w = Worker::builder(pool.store())
            .handler(Paced(calls.clone(), i))
            .config(WorkerConfig::default().name(format!("bench-w17-{i}")))
            .build()?;
        let mut stopped = stopped.clone();
        running.push(tokio::spawn(async move {
            w.run_until(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
        }));
        pools.push(pool);
    }
    let store = db.pool.store();
    let target = outbox::PauseTarget::topic(TOPIC);
    let mut times = PauseTimes::default();
    let measured = async {
        for _ in 0..rounds {
            // Every worker is handling messages: each started a call in the last 200 ms.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !(0..workers).all(|i| {
                calls
                    .last(i)
                    .is_some_and(|at| at.elapsed() < Duration::from_millis(200))
            }) {
                if Instant::now() > deadline {
                    bail!("W17: not every worker was handling messages within 30 s");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            store.pause(&target, None).await?;
            let paused = Instant::now();
            tokio::time::sleep(W17_OBSERVE).await;
            let last = (0..workers)
                .filter_map(|i| calls.last(i))
                .filter(|at| *at > paused)
                .max()
                .map_or(0.0, |at| (at - paused).as_secs_f64());
            if db.remaining(&[TOPIC]).await? == 0 {
                bail!("W17: the backlog ran out during a pause; seed more messages");
            }
            store.resume(&target).await?;
            let resumed = Instant::now();
            let deadline = resumed + Duration::from_secs(10);
            let mut slowest = 0.0f64;
            for i in 0..workers {
                loop {
                    if let Some(at) = calls.first_after(i, resumed) {
                        slowest = slowest.max((at - resumed).as_secs_f64());
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("W17: worker {i} took no message within 10 s of the resume");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            times.paused.push(last);
            times.resumed.push(slowest);
        }
        Ok(())
    }
    .await;
    let _ = stop.send(true);
    for r in running {
        match r.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => bail!("a W17 worker failed: {e}"),
            Err(e) => bail!("a W17 worker task failed: {e}"),
        }
    }
    for p in pools {
        p.close().await;
    }
    measured?;
    Ok(times)
}
