//! W13, W14 and W15, PostgreSQL only: the event log's replays and its upkeep. W13 replays a
//! drained topic's events to W1's probe (paired with W1's drain); W14 measures W3's pickup
//! latency while a replay of a large backlog runs on the same worker (beside W3, idle, in the
//! same run); W15 drops one day's partition of a million events through the log's upkeep,
//! against a `DELETE` of the same rows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use chrono::{DateTime, Utc};
use outbox::{
    Context, Handler, HandlerError, LogUpkeep, ReplayInfo, ReplayRequest, ReplayState, Store,
    Worker, WorkerConfig,
};
use sqlx::{AssertSqlSafe, PgPool};

use crate::cpu::CpuMeter;
use crate::db::{Db, Pool};
use crate::report::{Report, Target};
use crate::workloads::{
    self, limit_for, messages, BenchMessage, Latency, Pickup, Probe, ProbeState, Sample, Setting,
    COLD_POOL_SIZE, TOPIC,
};
use crate::{median, push_paired, Args, MIN_PAIRS};

/// The retained events W13 replays (the size), beside W1's drain of its usual `n`.
const REPLAYED: u64 = 100_000;

/// How long W13's and W14's topic keeps its events: W12's window.
const RETAIN: Duration = Duration::from_secs(30 * 86_400);

/// The PostgreSQL pool of `db` (W13-W15 run there only).
fn pg(db: &Db) -> Result<&PgPool> {
    match &db.pool {
        Pool::Pg(p) => Ok(p),
        Pool::Sqlite(_) | Pool::My(_) => bail!("the event log workloads run on PostgreSQL only"),
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

/// Inserts `n` delivered events of W1's topic (`topic_id`) into `table` (`outbox_events` or
/// one of its day partitions) in one statement, as the done write would have logged them: W1's
/// payloads with `seq` from `first_seq`, UUID v7-shaped ids, delivered from `from` (now when
/// `None`) over `spread_secs`, each enqueued a second before its delivery.
async fn insert_events(
    db: &Db,
    table: &str,
    topic_id: i32,
    n: u64,
    first_seq: u64,
    from: Option<DateTime<Utc>>,
    spread_secs: f64,
) -> Result<()> {
    let sql = format!(
        "INSERT INTO {table} (topic_id, delivered_at, id, topic, payload, version, created_at) \
         SELECT $2, t.at, \
                (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint - 1000), 12, '0') || '7' \
                 || substr(t.h, 1, 3) || '8' || substr(t.h, 4, 15))::uuid, \
                $3, json_build_object('seq', $4 + t.g, 'order_id', 'ord-' || lpad(($4 + t.g)::text, 12, '0'), \
                    'customer', 'customer-' || (($4 + t.g) % 1000) || '@example.com', \
                    'amount_cents', ($4 + t.g) % 100000, 'currency', 'EUR', 'note', repeat('x', 64)), \
                1, t.at - interval '1 second' \
         FROM (SELECT g - 1 AS g, md5(g::text) AS h, \
                      coalesce($5, now()) + ((g - 1)::float8 / $1 * $6) * interval '1 second' AS at \
               FROM generate_series(1, $1) AS g) AS t"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(i64::try_from(n)?)
        .bind(topic_id)
        .bind(TOPIC)
        .bind(i64::try_from(first_seq)?)
        .bind(from)
        .bind(spread_secs)
        .execute(pg(db)?)
        .await
        .with_context(|| format!("inserting {n} events into {table}"))?;
    Ok(())
}

/// Starts a replay of `request`, trying again for a while when it is refused because the
/// worker that was just started has not recorded its handler yet.
async fn start_replay(store: &Store, request: &ReplayRequest) -> Result<ReplayInfo> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.start_replay(request).await {
            Ok(info) => return Ok(info),
            Err(outbox::Error::ReplayRefused(why)) if Instant::now() < deadline => {
                tracing::debug!(%why, "replay refused; trying again");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
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
                    // The worker looks for replays every 200 ms, counted from its start: a
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
                replayed = Some(replay_run(db, args.scaled(REPLAYED), setting.config()).await);
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
    let replayed = args.scaled(REPLAYED);
    push_paired(
        report,
        "W13",
        &format!(
            "replay of {replayed} retained events to the probe, start_replay to done ({setting}), \
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
        "start_replay (at a random moment) to the worker's lease (it looks every 200 ms), median",
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

/// The `seq` from which W14's replayed events are numbered: above any live message's, so the
/// probe tells them apart.
const REPLAYED_FROM: u64 = 1_000_000_000;

/// W3's probe, counting the replayed events apart from the live messages it times.
struct PickupProbe {
    live: Arc<ProbeState>,
    replayed: Arc<AtomicU64>,
}

#[outbox::async_trait]
impl Handler for PickupProbe {
    type Event = BenchMessage;
    const NAME: &'static str = Probe::NAME;

    async fn handle(&self, event: BenchMessage, _ctx: &Context) -> Result<(), HandlerError> {
        if event.seq >= REPLAYED_FROM {
            self.replayed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.live.record(event.seq);
        }
        Ok(())
    }
}

/// One W14 run with a replay: the pickup latencies, and the replay's pace meanwhile.
pub(crate) struct DuringReplay {
    /// W3's figures.
    pub(crate) latency: Latency,
    /// Replayed events per second while the live messages were committed and handled.
    pub(crate) replay_rate: f64,
}

/// W14's run: `backlog` events of the retained topic in the log; W3's fresh default worker
/// started, a replay of the backlog to its probe (at most `rate` events a second) made and
/// taken up, then W3's messages committed one every 10 ms. The replay must still be running
/// when the last live message was handled.
pub(crate) async fn during_replay(
    db: &Db,
    duration: Duration,
    backlog: u64,
    rate: Option<u32>,
) -> Result<DuringReplay> {
    let store = db.pool.store();
    let topic_id = retain(db, RETAIN).await?;
    insert_events(
        db,
        "outbox_events",
        topic_id,
        backlog,
        REPLAYED_FROM,
        None,
        0.0,
    )
    .await?;
    db.exec("ANALYZE outbox_events").await?;
    db.checkpoint().await?;
    let replayed = Arc::new(AtomicU64::new(0));
    let pickup = {
        let replayed = replayed.clone();
        Pickup::start(db, duration, move |pool, live| {
            Ok(Worker::builder(pool.store())
                .handler(PickupProbe {
                    live: live.clone(),
                    replayed,
                })
                .config(WorkerConfig::default())
                .build()?)
        })
        .await?
    };
    let mut request = ReplayRequest::new(TOPIC, Probe::NAME);
    request.rate = rate;
    let made = start_replay(&store, &request).await?;
    // The live messages start once the replay's events flow.
    let deadline = Instant::now() + Duration::from_secs(10);
    while replayed.load(Ordering::Relaxed) == 0 {
        if Instant::now() >= deadline {
            bail!("no worker took the replay up within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (before, start) = (replayed.load(Ordering::Relaxed), Instant::now());
    let latency = pickup.measure().await?;
    let replay_rate =
        (replayed.load(Ordering::Relaxed) - before) as f64 / start.elapsed().as_secs_f64();
    let info = store
        .replay(made.id)
        .await?
        .ok_or_else(|| anyhow!("replay {} vanished", made.id))?;
    if info.state != ReplayState::Running {
        bail!(
            "the replay was {} ({} of {} events) before the live messages were all handled: give \
             it more events or a lower rate",
            info.state,
            info.delivered,
            info.total
        );
    }
    let _ = store.cancel_replay(made.id).await;
    Ok(DuringReplay {
        latency,
        replay_rate,
    })
}

/// W14: W3 on an idle worker and W3 with a replay of `backlog` events running on the same
/// worker, alternating, `--repeat` pairs up to 3 (one below scale 0.1); each side's p50 and p99
/// over the pooled messages of its runs, and the ratio of the p99s.
pub(crate) async fn w14(args: &Args, db: &mut Db, report: &mut Report) -> Result<()> {
    let duration = Duration::from_secs_f64((5.0 * args.scale).max(0.01));
    let backlog = args.scaled(100_000);
    // Unpaced, a default worker replays the backlog faster than W3's messages come (10,000
    // events within W3's half second at scale 0.1): paced to last twice W3's window and 2 s more.
    let rate = Some(
        u32::try_from((backlog as f64 / (2.0 * duration.as_secs_f64() + 2.0)).ceil() as u64)?
            .max(1),
    );
    let rounds = if args.scale < 0.1 {
        1
    } else {
        args.repeat.min(3)
    };
    let (mut idle, mut busy, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    let mut failure = None;
    for i in 0..rounds {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for replaying in order {
            db.reset().await?;
            if replaying {
                match during_replay(db, duration, backlog, rate).await {
                    Ok(r) => {
                        eprintln!(
                            "  W14 round {}, replay running ({:.0} events/s): p50 {:.2} ms, p99 {:.2} ms",
                            i + 1,
                            r.replay_rate,
                            r.latency.p50_ms,
                            r.latency.p99_ms
                        );
                        busy.extend(r.latency.all_ms);
                        rates.push(Ok(r.replay_rate));
                    }
                    Err(e) => failure = Some(e),
                }
            } else {
                match workloads::w3(db, duration).await {
                    Ok(l) => {
                        eprintln!(
                            "  W14 round {}, idle: p50 {:.2} ms, p99 {:.2} ms",
                            i + 1,
                            l.p50_ms,
                            l.p99_ms
                        );
                        idle.extend(l.all_ms);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
    }
    db.reset().await?;
    if let Some(e) = failure {
        report.push("W14", "pickup while a replay runs", Err(e), "ms", None);
        return Ok(());
    }
    let (idle, busy) = (Latency::of(idle), Latency::of(busy));
    let paced = match rate {
        Some(r) => format!(" at most {r}/s"),
        None => String::new(),
    };
    let of = |l: &Latency| format!("{} msgs over {rounds} runs", l.count);
    report.push(
        "W14",
        format!("W3 pickup p50, idle worker, {}", of(&idle)),
        Ok(idle.p50_ms),
        "ms",
        None,
    );
    report.push(
        "W14",
        format!("W3 pickup p99, idle worker, {}", of(&idle)),
        Ok(idle.p99_ms),
        "ms",
        None,
    );
    report.push(
        "W14",
        format!(
            "pickup p50, a replay of {backlog} events{paced} running on the worker, {}",
            of(&busy)
        ),
        Ok(busy.p50_ms),
        "ms",
        None,
    );
    report.push(
        "W14",
        format!(
            "pickup p99, a replay of {backlog} events{paced} running on the worker, {}",
            of(&busy)
        ),
        Ok(busy.p99_ms),
        "ms",
        Target::at_most(5.0),
    );
    report.push(
        "W14",
        format!("pickup max, replay running (idle: {:.2} ms)", idle.max_ms),
        Ok(busy.max_ms),
        "ms",
        None,
    );
    report.push(
        "W14",
        "ratio of the p99s, replay running / idle",
        Ok(busy.p99_ms / idle.p99_ms),
        "x",
        Target::at_most(2.0),
    );
    report.push(
        "W14",
        "replayed meanwhile, median of the runs",
        median(rates),
        "msgs/s",
        None,
    );
    Ok(())
}

/// One side of W15: how long the removal of one day's events took (ms), and what it did.
struct Removal {
    ms: f64,
    what: String,
}

/// W1's topic retained for one day, its partition for today (UTC) filled with `events`
/// events delivered over the day; returns the topic's number, the partition's name and the
/// end of the day.
async fn one_full_day(db: &Db, events: u64) -> Result<(i32, String, DateTime<Utc>)> {
    let topic_id = retain(db, Duration::from_secs(86_400)).await?;
    let (day, start): (String, DateTime<Utc>) = sqlx::query_as(
        "SELECT to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD'), \
                ((now() AT TIME ZONE 'UTC')::date)::timestamp AT TIME ZONE 'UTC'",
    )
    .fetch_one(pg(db)?)
    .await?;
    let partition = format!("outbox_events_t{topic_id}_{day}");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&partition)
        .fetch_one(pg(db)?)
        .await?;
    if !exists {
        bail!("the library made no partition {partition} for today");
    }
    // Spread over 22 of the day's 24 hours.
    insert_events(
        db,
        &partition,
        topic_id,
        events,
        0,
        Some(start),
        22.0 * 3600.0,
    )
    .await?;
    db.exec(&format!("ANALYZE {partition}")).await?;
    db.checkpoint().await?;
    Ok((topic_id, partition, start + chrono::Duration::days(1)))
}

/// The events of topic `topic_id` in the log.
async fn logged(db: &Db, topic_id: i32) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE topic_id = $1")
            .bind(topic_id)
            .fetch_one(pg(db)?)
            .await?,
    )
}

/// W15's drop: the log's upkeep as a worker runs it, three days on (the one-day window of
/// today's events has ended), after the days it would create were made beforehand, so that
/// it only drops.
async fn by_upkeep(db: &Db, events: u64) -> Result<Removal> {
    let store = db.pool.store();
    let (topic_id, partition, _) = one_full_day(db, events).await?;
    let now = Utc::now();
    let at = now + chrono::Duration::days(3);
    store.__log_upkeep_at(now, 10).await?;
    db.checkpoint().await?;
    let start = Instant::now();
    let done: Option<LogUpkeep> = store.__log_upkeep_at(at, 7).await?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let done = done.ok_or_else(|| anyhow!("another process held the log's lock"))?;
    let left = logged(db, topic_id).await?;
    let gone: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NULL")
        .bind(&partition)
        .fetch_one(pg(db)?)
        .await?;
    if left != 0 || !gone {
        bail!("the upkeep left {left} events and {partition} (dropped: {gone})");
    }
    Ok(Removal {
        ms,
        what: format!(
            "{} day partitions dropped, {} created",
            done.dropped, done.created
        ),
    })
}

/// W15's `DELETE` of the same rows, in a second identical setup; then the `VACUUM` it leaves
/// owed, timed apart.
async fn by_delete(db: &Db, events: u64) -> Result<(Removal, f64)> {
    let (topic_id, partition, end) = one_full_day(db, events).await?;
    let start = Instant::now();
    let deleted =
        sqlx::query("DELETE FROM outbox_events WHERE topic_id = $1 AND delivered_at < $2")
            .bind(topic_id)
            .bind(end)
            .execute(pg(db)?)
            .await?
            .rows_affected();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    if deleted != events {
        bail!("the DELETE removed {deleted} events of {events}");
    }
    let start = Instant::now();
    db.exec(&format!("VACUUM {partition}")).await?;
    let vacuum_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((
        Removal {
            ms,
            what: format!("{deleted} rows deleted"),
        },
        vacuum_ms,
    ))
}

/// W15: one day's partition of `events` events dropped by the log's upkeep, against a
/// `DELETE` of the same rows in a second identical setup (then its `VACUUM`).
pub(crate) async fn w15(args: &Args, db: &mut Db, report: &mut Report) -> Result<()> {
    let events = args.scaled(1_000_000);
    db.reset().await?;
    eprintln!("  W15 filling a day partition with {events} events");
    let dropped = by_upkeep(db, events).await;
    db.reset().await?;
    eprintln!("  W15 filling a second one");
    let deleted = by_delete(db, events).await;
    db.reset().await?;
    let (deleted, vacuum) = match deleted {
        Ok((d, v)) => (Ok(d), Ok(v)),
        Err(e) => (Err(anyhow!("{e:#}")), Err(e)),
    };
    for (side, r) in [("upkeep", &dropped), ("DELETE", &deleted)] {
        if let Ok(r) = r {
            eprintln!("  W15 {side}: {}", r.what);
        }
    }
    let ratio = match (&dropped, &deleted) {
        (Ok(a), Ok(b)) => Ok(b.ms / a.ms),
        (Err(e), _) | (_, Err(e)) => Err(anyhow!("{e:#}")),
    };
    report.push(
        "W15",
        format!("drop of one day's partition of {events} events by the log's upkeep"),
        dropped.map(|r| r.ms),
        "ms",
        Target::at_most(1000.0),
    );
    report.push(
        "W15",
        format!("DELETE of the same {events} events (second identical setup)"),
        deleted.map(|r| r.ms),
        "ms",
        None,
    );
    report.push(
        "W15",
        "VACUUM of the partition after the DELETE",
        vacuum,
        "ms",
        None,
    );
    report.push("W15", "ratio DELETE / drop", ratio, "x", None);
    Ok(())
}
