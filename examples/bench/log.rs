//! The event log's workloads, PostgreSQL only. W13 replays a drained topic's events to W1's
//! probe, paired with W1's drain.
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use chrono::{DateTime, Utc};
use outbox::{Handler, ReplayRequest, ReplayState, Worker, WorkerConfig};
use sqlx::PgPool;

use crate::cpu::CpuMeter;
use crate::db::{Db, Pool};
use crate::report::{Report, Target};
use crate::workloads::{
    self, limit_for, messages, Probe, ProbeState, Sample, Setting, COLD_POOL_SIZE, TOPIC,
};
use crate::{median, push_paired, Args, MIN_PAIRS};

/// How long W13's topic keeps its events: W12's window.
const RETAIN: Duration = Duration::from_secs(30 * 86_400);

/// The PostgreSQL pool of `db` (the event log's workloads run there only).
fn pg(db: &Db) -> Result<&PgPool> {
    match &db.pool {
        Pool::Pg(p) => Ok(p),
        Pool::Sqlite(_) => bail!("the event log workloads run on PostgreSQL only"),
    }
}

/// Declares the retention of W1's topic for `window`; returns its number in
/// `outbox_retention`, which names its partitions.
async fn retain(db: &Db, window: Duration) -> Result<i32> {
    db.pool
        .store()
        .declare_retention(&[(TOPIC, window)])
        .await?;
    Ok(
        sqlx::query_scalar("SELECT id FROM outbox_retention WHERE topic = $1")
            .bind(TOPIC)
            .fetch_one(pg(db)?)
            .await?,
    )
}

/// How often an idle worker looks for a replay to take up (the library's `LOOK_EVERY`).
const REPLAY_LOOK: Duration = Duration::from_millis(500);

/// A random duration below `d`.
fn random_below(d: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    d.mul_f64((r % 1_000_000) as f64 / 1e6)
}

/// Milliseconds from `a` to `b` on the database's clock.
fn ms_between(a: DateTime<Utc>, b: Option<DateTime<Utc>>) -> Result<f64> {
    let b = b.ok_or_else(|| anyhow!("the replay has no such time"))?;
    Ok((b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e3)
}

/// One W13 replay: the rate from `start_replay` until it is done, and its parts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Replayed {
    /// Events per second from `start_replay` until the replay was seen done, with the CPU
    /// behind each.
    pub(crate) sample: Sample,
    /// From the replay's creation until a worker took it up (its lease), database clock.
    pub(crate) pickup_ms: f64,
    /// Events per second from the lease until done, database clock.
    pub(crate) taken_up_rate: f64,
}

/// W13's replay run: the retained topic's `n` messages drained by W1's worker (probe handler,
/// `config`); then, on the same worker, now idle, a replay of all `n` to the probe, timed from
/// `start_replay` until the probe has had all `n` calls and the replay is done.
pub(crate) async fn replay_run(db: &Db, n: u64, config: WorkerConfig) -> Result<Replayed> {
    let store = db.pool.store();
    retain(db, RETAIN).await?;
    db.seed(&messages(n)).await?;
    db.analyze().await?;
    let state = ProbeState::new(2 * n, 0);
    let pool = db.cold_pool(COLD_POOL_SIZE).await?;
    let w = Worker::builder(pool.store())
        .handler(Probe(state.clone()))
        .config(config)
        .build()?;
    let mut out = None;
    let ran = w
        .run_until(async {
            out = Some(
                async {
                    // The drain: W12's, untimed.
                    let deadline = Instant::now() + limit_for(n);
                    while db.remaining(&[TOPIC]).await? > 0 {
                        if Instant::now() >= deadline {
                            bail!("the drain before the replay did not end");
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    // As before W1's drains: fresh statistics (here those of the log, which
                    // a replay reads), and a checkpoint.
                    db.exec("ANALYZE outbox_events").await?;
                    db.checkpoint().await?;
                    // The worker looks for replays every 500 ms, counted from its start: a
                    // replay made at a fixed time after the drain would always wait as long.
                    // Made at a random moment of that period, it waits what an operator's does.
                    tokio::time::sleep(random_below(REPLAY_LOOK)).await;
                    let meter = CpuMeter::start(db).await;
                    let start = Instant::now();
                    let made = store
                        .start_replay(&ReplayRequest::new(TOPIC, Probe::NAME))
                        .await?;
                    if !state.wait_all(limit_for(n)).await {
                        bail!(
                            "the replay's calls did not all come within {:?}",
                            limit_for(n)
                        );
                    }
                    // Every call was made: the replay is done at its next write.
                    let info = loop {
                        let info = store
                            .replay(made.id)
                            .await?
                            .ok_or_else(|| anyhow!("replay {} vanished", made.id))?;
                        match info.state {
                            ReplayState::Done => break info,
                            ReplayState::Running if start.elapsed() < limit_for(n) => {
                                tokio::time::sleep(Duration::from_millis(2)).await;
                            }
                            s => bail!("the replay is {s} after all its calls"),
                        }
                    };
                    let secs = start.elapsed().as_secs_f64();
                    let cpu = meter.stop(db).await;
                    if info.total != i64::try_from(n)?
                        || info.delivered != info.total
                        || info.failed > 0
                    {
                        bail!(
                            "the replay delivered {} of {} events ({} failed); {n} expected",
                            info.delivered,
                            info.total,
                            info.failed
                        );
                    }
                    let started = info
                        .started_at
                        .ok_or_else(|| anyhow!("the replay has no start"))?;
                    let delivering = ms_between(started, info.finished_at)?;
                    Ok(Replayed {
                        sample: Sample {
                            rate: n as f64 / secs,
                            cpu: cpu.per(n),
                        },
                        pickup_ms: ms_between(info.created_at, info.started_at)?,
                        taken_up_rate: n as f64 / (delivering / 1e3),
                    })
                }
                .await,
            );
        })
        .await;
    pool.close().await;
    ran?;
    out.ok_or_else(|| anyhow!("the worker stopped before the replay ended"))?
}

/// W13: W1's drain and the replay run, in pairs like W12's (at least [`MIN_PAIRS`], each
/// pair's order alternating); the replay's rate from `start_replay`, its ratio to W1, and how
/// long the worker took to take the replay up and how fast it went from then on.
pub(crate) async fn w13(
    args: &Args,
    db: &mut Db,
    report: &mut Report,
    n: u64,
    setting: Setting,
) -> Result<()> {
    let rounds = args.repeat.max(MIN_PAIRS);
    let mut pairs = Vec::new();
    let (mut pickups, mut taken_up, mut taken_up_ratios) = (Vec::new(), Vec::new(), Vec::new());
    let mut failure = None;
    for i in 0..rounds {
        let (mut alone, mut replayed) = (None, None);
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for replay_side in order {
            db.reset().await?;
            if replay_side {
                replayed = Some(replay_run(db, n, setting.config()).await);
            } else {
                alone = Some(workloads::w1(db, n, setting.config()).await);
            }
        }
        let (Some(alone), Some(replayed)) = (alone, replayed) else {
            continue;
        };
        match (&alone, &replayed) {
            (Ok(a), Ok(r)) => {
                eprintln!(
                    "  W13 pair {}: W1 {:.0} msgs/s; replay {:.0} msgs/s from start_replay, \
                     taken up after {:.0} ms, {:.0} msgs/s from then",
                    i + 1,
                    a.rate,
                    r.sample.rate,
                    r.pickup_ms,
                    r.taken_up_rate
                );
                pickups.push(Ok(r.pickup_ms));
                taken_up.push(Ok(r.taken_up_rate));
                taken_up_ratios.push(Ok(r.taken_up_rate / a.rate));
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("  W13 pair {}: FAILED: {e:#}", i + 1);
                failure = Some(anyhow!("{e:#}"));
            }
        }
        pairs.push((alone, replayed.map(|r| r.sample)));
    }
    db.reset().await?;
    push_paired(
        report,
        "W13",
        &format!(
            "replay of {n} retained events to the probe, start_replay to done ({setting}), \
             median of {rounds} pairs"
        ),
        Ok(pairs),
        setting,
        Target::at_least(0.8),
    );
    let or_failure = |v: Vec<Result<f64>>| match &failure {
        Some(e) => Err(anyhow!("{e:#}")),
        None => median(v),
    };
    report.push(
        "W13",
        "start_replay (at a random moment) to the worker's lease (it looks every 500 ms), median",
        or_failure(pickups),
        "ms",
        None,
    );
    report.push(
        "W13",
        "replay rate from the lease to done, median",
        or_failure(taken_up),
        "msgs/s",
        None,
    );
    report.push(
        "W13",
        "the same, ratio to W1, median of the pairs",
        or_failure(taken_up_ratios),
        "x",
        None,
    );
    Ok(())
}
