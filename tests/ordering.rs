//! Per-key ordering, on every backend: messages with an ordering key are handled in
//! enqueue order with the earlier messages of their key, across topics and handlers, through
//! retries, delays and dead letters; unkeyed messages beside them are never held back.
//!
//! The multi-process chaos run (worker processes SIGKILLed while they drain thousands of keys)
//! is in tests/ordering_chaos.rs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    enqueue, enqueue_many, enqueue_with, outbox_event, Context, DeadSelection, EnqueueOptions,
    Handler, HandlerError, RetryPolicy, Store, Worker, WorkerConfig,
};
use outbox_tests::{start, stop, wait_until};
use serde::{Deserialize, Serialize};

/// One step of an aggregate's history, on topic `ord.a`.
#[outbox_event(topic = "ord.a", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepA {
    key: String,
    seq: i64,
    /// Attempts that fail before one succeeds (`-1`: every attempt fails).
    #[serde(default)]
    fails: i64,
}

/// The same aggregate's steps on a second topic.
#[outbox_event(topic = "ord.b", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepB {
    key: String,
    seq: i64,
    #[serde(default)]
    fails: i64,
}

/// A step whose dead letter releases its key.
#[outbox_event(topic = "ord.loose", ordering_key = "key", dead_releases_key)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LooseStep {
    key: String,
    seq: i64,
    #[serde(default)]
    fails: i64,
}

/// An unordered message.
#[outbox_event(topic = "ord.plain")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plain {
    n: i64,
}

/// Every handler call that started: (handler, key, seq), in the order they started.
#[derive(Default)]
struct Log(
    Mutex<Vec<(&'static str, String, i64)>>,
    std::sync::atomic::AtomicBool,
);

impl Log {
    fn push(&self, handler: &'static str, key: &str, seq: i64) {
        self.0.lock().unwrap().push((handler, key.to_string(), seq));
    }
    fn calls(&self) -> Vec<(&'static str, String, i64)> {
        self.0.lock().unwrap().clone()
    }
    /// Per (handler, key), the sequence numbers in the order the calls started.
    fn by_key(&self) -> BTreeMap<(&'static str, String), Vec<i64>> {
        let mut out: BTreeMap<(&'static str, String), Vec<i64>> = BTreeMap::new();
        for (h, k, s) in self.calls() {
            out.entry((h, k)).or_default().push(s);
        }
        out
    }
}

/// Fails the first `fails` attempts; every attempt when `fails` is negative, until `healed`.
fn outcome(fails: i64, healed: bool, ctx: &Context) -> Result<(), HandlerError> {
    if (fails < 0 && !healed) || i64::from(ctx.attempt()) <= fails {
        return Err(HandlerError::retry(format!(
            "injected failure, attempt {}",
            ctx.attempt()
        )));
    }
    Ok(())
}

macro_rules! step_handler {
    ($handler:ident, $event:ty, $name:literal) => {
        struct $handler(Arc<Log>);

        #[outbox::async_trait]
        impl Handler for $handler {
            type Event = $event;
            const NAME: &'static str = $name;
            async fn handle(&self, e: $event, ctx: &Context) -> Result<(), HandlerError> {
                self.0.push($name, &e.key, e.seq);
                // A little work, so a worker with several handler slots would overlap them.
                tokio::time::sleep(Duration::from_millis(1)).await;
                outcome(
                    e.fails,
                    self.0 .1.load(std::sync::atomic::Ordering::SeqCst),
                    ctx,
                )
            }
        }
    };
}

step_handler!(AuditA, StepA, "audit-a");
step_handler!(MailA, StepA, "mail-a");
step_handler!(IndexB, StepB, "index-b");
step_handler!(LooseH, LooseStep, "loose");

struct PlainH(Arc<Log>);

#[outbox::async_trait]
impl Handler for PlainH {
    type Event = Plain;
    const NAME: &'static str = "plain";
    async fn handle(&self, e: Plain, _: &Context) -> Result<(), HandlerError> {
        self.0.push("plain", "-", e.n);
        Ok(())
    }
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(
            RetryPolicy::default()
                .jitter(false)
                .base(Duration::from_millis(20))
                .max_delay(Duration::from_millis(100))
                .max_attempts(4),
        )
        .handler_timeout(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .concurrency(16)
        .batch_size(16)
        .poll_interval(Duration::from_millis(20))
        .stats_interval(Duration::from_millis(100))
}

fn worker(store: Store, log: &Arc<Log>) -> Worker {
    Worker::builder(store)
        .handler(AuditA(log.clone()))
        .handler(MailA(log.clone()))
        .handler(IndexB(log.clone()))
        .handler(LooseH(log.clone()))
        .handler(PlainH(log.clone()))
        .config(config())
        .build()
        .expect("the ordering worker builds")
}

async fn live(store: &Store) -> i64 {
    let s = store.stats().await.unwrap().total;
    s.pending()
}

/// The step of `key` with number `seq`: topic a or b by turns, some failing at first.
fn plan(key: &str, seq: i64) -> (bool, i64) {
    let on_a = (seq + key.len() as i64) % 3 != 0;
    let fails = if (seq * 7 + key.len() as i64) % 5 == 0 {
        1
    } else {
        0
    };
    (on_a, fails)
}

/// Asserts that each (handler, key) saw its steps in increasing order, each step at least once,
/// none skipped: a repeat (a retry) may only repeat the step just seen.
fn assert_in_order(log: &Log, keys: &[String], steps: i64) {
    let by_key = log.by_key();
    for key in keys {
        let handlers: &[&str] = &["audit-a", "mail-a", "index-b"];
        let mut seen_steps = std::collections::BTreeSet::new();
        for h in handlers {
            let Some(seqs) = by_key.get(&(*h, key.clone())) else {
                continue;
            };
            for pair in seqs.windows(2) {
                assert!(pair[0] <= pair[1], "{h} saw {key} out of order: {seqs:?}");
            }
            seen_steps.extend(seqs.iter().copied());
        }
        assert_eq!(
            seen_steps.len() as i64,
            steps,
            "{key}: every step handled: {seen_steps:?}"
        );
    }
    // Across handlers too: a step's first call comes after every call of the previous step.
    let calls = log.calls();
    for key in keys {
        let order: Vec<i64> = calls.iter().filter(|c| &c.1 == key).map(|c| c.2).collect();
        for pair in order.windows(2) {
            assert!(
                pair[0] <= pair[1],
                "{key} started a later step before an earlier one ended: {order:?}"
            );
        }
    }
}

/// A step of a key's history, on topic `ord.watched`, whose handler watches what is live.
#[outbox_event(topic = "ord.watched", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct WatchedStep {
    key: String,
    seq: i64,
    /// Its first attempt fails (and is retried).
    #[serde(default)]
    fail_once: bool,
    /// Its first attempt holds its thread past the handler timeout (and is retried).
    #[serde(default)]
    block_once: bool,
    /// How long each attempt takes.
    #[serde(default)]
    ms: u64,
}

/// How many live messages a key has, read by a handler as it starts.
#[outbox::async_trait]
trait KeyCount: Send + Sync {
    async fn live_of(&self, key: &str) -> i64;
}

#[outbox::async_trait]
impl KeyCount for sqlx::PgPool {
    async fn live_of(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE ordering_key = $1")
            .bind(key)
            .fetch_one(self)
            .await
            .unwrap()
    }
}

#[outbox::async_trait]
impl KeyCount for sqlx::MySqlPool {
    async fn live_of(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE ordering_key = ?")
            .bind(key)
            .fetch_one(self)
            .await
            .unwrap()
    }
}

#[outbox::async_trait]
impl KeyCount for sqlx::SqlitePool {
    async fn live_of(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_messages WHERE ordering_key = ?1")
            .bind(key)
            .fetch_one(self)
            .await
            .unwrap()
    }
}

/// One call of [`WatchingH`].
#[derive(Debug, Clone)]
struct WatchedCall {
    key: String,
    seq: i64,
    attempt: u32,
    /// The key's live messages as the call started; `None` if the call was cut before it read
    /// them.
    live: Option<i64>,
    /// The handler returned (`Ok` or its injected failure). `false`: the worker's deadline cut
    /// the call, which is a failure of that attempt as any other and is retried.
    returned: bool,
    /// This attempt was to fail on purpose (`fail_once`, first attempt).
    injected: bool,
    /// This attempt holds its thread past the deadline (`block_once`, first attempt): the
    /// worker fails it at the deadline, though on a loaded machine the handler may still run
    /// to its end before the task is ended (its own timer had no thread to fire on).
    blocked: bool,
}

/// Every call of [`WatchingH`], in the order they started.
type WatchedCalls = Arc<Mutex<Vec<WatchedCall>>>;

/// Asserts that a step is called again only after a failed attempt: the one before it returned
/// its injected failure or was cut by the deadline (the handler ran past it, as one that waits
/// on a loaded database may), or held its thread past the deadline. A step delivered twice for
/// any other reason fails here. Returns the attempts the deadline failed.
fn assert_retries_follow_failures(calls: &[WatchedCall]) -> Vec<WatchedCall> {
    for c in calls.iter().filter(|c| c.attempt > 1) {
        let before = calls
            .iter()
            .find(|b| b.key == c.key && b.seq == c.seq && b.attempt == c.attempt - 1)
            .unwrap_or_else(|| panic!("{c:?} has no attempt before it"));
        assert!(
            !before.returned || before.injected || before.blocked,
            "{c:?} retried an attempt that returned without a failure: {before:?}"
        );
    }
    let cut: Vec<WatchedCall> = calls
        .iter()
        .filter(|c| !c.returned || c.blocked)
        .cloned()
        .collect();
    if !cut.is_empty() {
        eprintln!("attempts cut by the handler deadline: {cut:?}");
    }
    cut
}

struct WatchingH {
    calls: WatchedCalls,
    db: Arc<dyn KeyCount>,
}

#[outbox::async_trait]
impl Handler for WatchingH {
    type Event = WatchedStep;
    const NAME: &'static str = "watching";
    async fn handle(&self, e: WatchedStep, ctx: &Context) -> Result<(), HandlerError> {
        let injected = e.fail_once && ctx.attempt() == 1;
        // Recorded before anything awaits, so that a call the deadline cuts is seen too.
        let at = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(WatchedCall {
                key: e.key.clone(),
                seq: e.seq,
                attempt: ctx.attempt(),
                live: None,
                returned: false,
                injected,
                blocked: e.block_once && ctx.attempt() == 1,
            });
            calls.len() - 1
        };
        let live = self.db.live_of(&e.key).await;
        self.calls.lock().unwrap()[at].live = Some(live);
        if e.block_once && ctx.attempt() == 1 {
            // Never yields: only the worker's deadline ends this attempt.
            std::thread::sleep(Duration::from_millis(900));
        }
        tokio::time::sleep(Duration::from_millis(e.ms)).await;
        self.calls.lock().unwrap()[at].returned = true;
        if injected {
            return Err(HandlerError::retry(
                "injected failure of a step's first attempt",
            ));
        }
        Ok(())
    }
}

fn watching_worker(
    store: Store,
    calls: &WatchedCalls,
    db: Arc<dyn KeyCount>,
    shutdown: Duration,
) -> Worker {
    Worker::builder(store)
        .handler(WatchingH {
            calls: calls.clone(),
            db,
        })
        .config(
            config()
                .handler_timeout(Duration::from_millis(300))
                .shutdown_timeout(shutdown),
        )
        .build()
        .expect("the watching worker builds")
}

macro_rules! all_backends {
    ($(async fn $name:ident($store:ident, $pool:ident) $body:block)*) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = outbox_tests::pg().await;
                    let $store = Store::from(&db.pool);
                    let $pool = db.pool.clone();
                    $body
                    db.drop_db().await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = outbox_tests::sqlite().await;
                    let $store = Store::from(&db.pool);
                    let $pool = db.pool.clone();
                    $body
                    db.drop_db().await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    outbox_tests::skip_without_mysql!();
                    let db = outbox_tests::mysql().await;
                    let $store = Store::from(&db.pool);
                    let $pool = db.pool.clone();
                    $body
                    db.drop_db().await;
                }
            )*
        }
    };
}

all_backends! {
    async fn each_key_is_handled_in_enqueue_order_across_topics_handlers_and_retries(store, pool) {
        let keys: Vec<String> = (0..30).map(|k| format!("booking:{k}")).collect();
        const STEPS: i64 = 12;
        // Producers interleave the keys, one transaction per step of each key, as services do.
        for seq in 0..STEPS {
            let mut tx = pool.begin().await.unwrap();
            for key in &keys {
                let (on_a, fails) = plan(key, seq);
                if on_a {
                    enqueue(&mut *tx, &StepA { key: key.clone(), seq, fails }).await.unwrap();
                } else {
                    enqueue(&mut *tx, &StepB { key: key.clone(), seq, fails }).await.unwrap();
                }
            }
            tx.commit().await.unwrap();
        }
        let log = Arc::new(Log::default());
        // Two workers on one database, as two processes would be.
        let running = start(vec![worker(store.clone(), &log), worker(store.clone(), &log)]);
        wait_until(Duration::from_secs(60), "every keyed message done", async || live(&store).await == 0).await;
        stop(running).await;
        assert_in_order(&log, &keys, STEPS);
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.total.dead, stats.total.blocked), (0, 0));
    }

    async fn one_key_with_many_messages_drains_in_order(store, pool) {
        let key = "account:7".to_string();
        let steps: Vec<StepA> = (0..400).map(|seq| StepA { key: key.clone(), seq, fails: 0 }).collect();
        let mut tx = pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &steps).await.unwrap();
        tx.commit().await.unwrap();
        // Blocked: every message but the key's first.
        let before = store.stats().await.unwrap().total;
        assert_eq!((before.ready, before.blocked, before.blocked_by_dead), (1, 399, 0));
        assert!(before.oldest_blocked_age.is_some());
        let log = Arc::new(Log::default());
        let running = start(vec![worker(store.clone(), &log)]);
        wait_until(Duration::from_secs(60), "the key drained", async || live(&store).await == 0).await;
        stop(running).await;
        for h in ["audit-a", "mail-a"] {
            let seqs = &log.by_key()[&(h, key.clone())];
            assert_eq!(*seqs, (0..400).collect::<Vec<_>>(), "{h}");
        }
    }

    async fn a_key_passes_between_workers_of_different_topics(store, pool) {
        // One key whose steps alternate between a topic only one worker serves and a topic only
        // the other serves: a worker's done write must leave the next step to the worker that
        // has its handler (claiming it would hold it unstarted until its lease ran out).
        let key = "booking:1".to_string();
        const STEPS: i64 = 40;
        let mut tx = pool.begin().await.unwrap();
        for seq in 0..STEPS {
            if seq % 2 == 0 {
                enqueue(&mut *tx, &StepA { key: key.clone(), seq, fails: 0 }).await.unwrap();
            } else {
                enqueue(&mut *tx, &StepB { key: key.clone(), seq, fails: 0 }).await.unwrap();
            }
        }
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let only_a = Worker::builder(store.clone())
            .handler(AuditA(log.clone()))
            .config(config())
            .build()
            .unwrap();
        let only_b = Worker::builder(store.clone())
            .handler(IndexB(log.clone()))
            .config(config())
            .build()
            .unwrap();
        let running = start(vec![only_a, only_b]);
        // 40 hand-overs at the workers' 20 ms poll take about a second; one step held for its
        // 5 s lease would take the whole run past this.
        wait_until(Duration::from_secs(20), "the key drained across both workers", async || {
            live(&store).await == 0
        })
        .await;
        stop(running).await;
        let seqs: Vec<i64> = log.calls().iter().map(|c| c.2).collect();
        assert_eq!(seqs, (0..STEPS).collect::<Vec<_>>());
    }

    async fn a_keys_next_message_starts_only_once_the_one_before_is_written_done(store, pool) {
        // A handler that counts its key's live messages as it starts sees only its own step and
        // the later ones: the one before it was not merely handled but written done (deleted)
        // before this one started, through failures and a handler that holds its thread past
        // its deadline. Nothing behind a failed or timed out message is left claimed to wait
        // for its lease: every step's first call is its first attempt.
        const STEPS: i64 = 40;
        let keys = ["r:fail", "r:block", "r:clean"];
        let mut tx = pool.begin().await.unwrap();
        for seq in 0..STEPS {
            for key in keys {
                let step = WatchedStep {
                    key: key.into(),
                    seq,
                    fail_once: key == "r:fail" && (seq == 0 || seq == 20),
                    block_once: key == "r:block" && seq == 5,
                    ms: 0,
                };
                enqueue(&mut *tx, &step).await.unwrap();
            }
        }
        tx.commit().await.unwrap();
        let calls = WatchedCalls::default();
        let db: Arc<dyn KeyCount> = Arc::new(pool.clone());
        let running = start(vec![watching_worker(store.clone(), &calls, db, Duration::from_secs(5))]);
        wait_until(Duration::from_secs(60), "every key drained", async || live(&store).await == 0).await;
        stop(running).await;
        let calls = calls.lock().unwrap().clone();
        for key in keys {
            let mine: Vec<&WatchedCall> = calls.iter().filter(|c| c.key == key).collect();
            let seqs: Vec<i64> = mine.iter().map(|c| c.seq).collect();
            let mut firsts = seqs.clone();
            firsts.dedup();
            assert_eq!(firsts, (0..STEPS).collect::<Vec<_>>(), "{key}: in order, none skipped: {seqs:?}");
            for c in &mine {
                if let Some(live) = c.live {
                    assert_eq!(live, STEPS - c.seq, "{c:?} started before the step before it was written done");
                }
            }
            // A step's first call is its first attempt: nothing behind a failed or timed out one
            // was claimed and left to its lease.
            for seq in 0..STEPS {
                let first = mine.iter().find(|c| c.seq == seq).unwrap();
                assert_eq!(first.attempt, 1, "{key} step {seq}'s first call: {first:?}");
            }
        }
        let cut = assert_retries_follow_failures(&calls);
        let blocked = |c: &WatchedCall| c.key == "r:block" && c.seq == 5 && c.attempt == 1;
        assert!(cut.iter().any(blocked), "the blocking attempt is cut by its deadline: {calls:?}");
        // One retry per injected failure (two failures, one blocking attempt), and one for each
        // other attempt that ran past its deadline on a loaded machine.
        assert_eq!(calls.len(), 3 * STEPS as usize + 2 + cut.len(), "{cut:?}");
    }

    async fn a_stopping_worker_leaves_nothing_of_a_key_claimed(store, pool) {
        // A worker stopped while a key steps on: the done write of the last running step may
        // claim the next one as the worker stops; that claim goes back at once, so the stop
        // waits for nothing but the running step, and the next worker takes the key on from
        // there at first attempts.
        const STEPS: i64 = 60;
        let key = "r:stop".to_string();
        let steps: Vec<WatchedStep> = (0..STEPS)
            .map(|seq| WatchedStep { key: key.clone(), seq, fail_once: false, block_once: false, ms: 30 })
            .collect();
        let mut tx = pool.begin().await.unwrap();
        enqueue_many(&mut *tx, &steps).await.unwrap();
        tx.commit().await.unwrap();
        let calls = WatchedCalls::default();
        let db: Arc<dyn KeyCount> = Arc::new(pool.clone());
        let running = start(vec![watching_worker(store.clone(), &calls, db.clone(), Duration::from_secs(30))]);
        wait_until(Duration::from_secs(30), "a few steps handled", async || calls.lock().unwrap().len() >= 3).await;
        let stopping = std::time::Instant::now();
        stop(running).await;
        // The running step gets its 30 ms; nothing else is a reason to wait out the 30 s.
        assert!(stopping.elapsed() < Duration::from_secs(10), "stop took {:?}", stopping.elapsed());
        let t = store.stats().await.unwrap().total;
        assert_eq!(t.in_flight, 0, "nothing is left claimed: {t:?}");
        let handled = calls.lock().unwrap().iter().filter(|c| c.returned).count() as i64;
        assert_eq!(t.pending(), STEPS - handled, "{t:?}");
        // Another worker takes the rest from where the first stopped, each step's first attempt.
        let running = start(vec![watching_worker(store.clone(), &calls, db, Duration::from_secs(5))]);
        wait_until(Duration::from_secs(60), "the key drained", async || live(&store).await == 0).await;
        stop(running).await;
        let calls = calls.lock().unwrap().clone();
        // Each step once, at its first attempt; a repeat only after an attempt the deadline cut.
        let cut = assert_retries_follow_failures(&calls);
        let firsts: Vec<i64> = calls.iter().filter(|c| c.attempt == 1).map(|c| c.seq).collect();
        assert_eq!(firsts, (0..STEPS).collect::<Vec<_>>(), "{calls:?}");
        assert_eq!(calls.len(), STEPS as usize + cut.len(), "no attempt counted twice: {calls:?}");
    }

    async fn unkeyed_messages_are_never_held_back_by_keyed_ones(store, pool) {
        // A key stuck behind a message that keeps failing, and unordered messages after it.
        let mut tx = pool.begin().await.unwrap();
        enqueue(&mut *tx, &StepA { key: "k".into(), seq: 0, fails: -1 }).await.unwrap();
        enqueue(&mut *tx, &StepA { key: "k".into(), seq: 1, fails: 0 }).await.unwrap();
        enqueue_many(&mut *tx, &(0..50).map(|n| Plain { n }).collect::<Vec<_>>()).await.unwrap();
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let running = start(vec![worker(store.clone(), &log)]);
        wait_until(Duration::from_secs(30), "the unordered messages done", async || {
            log.calls().iter().filter(|c| c.0 == "plain").count() == 50
        }).await;
        wait_until(Duration::from_secs(30), "the failing message dead", async || {
            store.stats().await.unwrap().total.dead == 1
        }).await;
        stop(running).await;
        assert!(
            log.calls().iter().all(|c| !(c.1 == "k" && c.2 == 1)),
            "the step behind the failing one never ran"
        );
    }

    async fn a_dead_message_blocks_its_key_until_retried_or_discarded(store, pool) {
        let mut tx = pool.begin().await.unwrap();
        // k1: its first step dies; k2: its second step dies; k3: free.
        enqueue(&mut *tx, &StepA { key: "k1".into(), seq: 0, fails: -1 }).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "k1".into(), seq: 1, fails: 0 }).await.unwrap();
        enqueue(&mut *tx, &StepA { key: "k1".into(), seq: 2, fails: 0 }).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "k2".into(), seq: 0, fails: 0 }).await.unwrap();
        enqueue(&mut *tx, &StepA { key: "k2".into(), seq: 1, fails: -1 }).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "k2".into(), seq: 2, fails: 0 }).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "k3".into(), seq: 0, fails: 0 }).await.unwrap();
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let w = worker(store.clone(), &log);
        let health = w.health();
        let running = start(vec![w]);
        wait_until(Duration::from_secs(30), "two dead letters and their keys blocked", async || {
            let t = store.stats().await.unwrap().total;
            t.dead == 2 && t.blocked_by_dead == 3 && t.ready == 0 && t.in_flight == 0
        }).await;
        let stats = store.stats().await.unwrap();
        let a = stats.topics.iter().find(|t| t.topic == "ord.a").unwrap();
        let b = stats.topics.iter().find(|t| t.topic == "ord.b").unwrap();
        assert_eq!((a.blocked, a.blocked_by_dead), (1, 1), "{a:?}");
        assert_eq!((b.blocked, b.blocked_by_dead), (2, 2), "{b:?}");
        assert!(stats.total.oldest_blocked_age.is_some());
        // Nothing blocked is silent: the health check says so once the stats refresh shows it.
        wait_until(Duration::from_secs(10), "health names the blocked keys", async || {
            health.check().is_err_and(|e| matches!(e, outbox::Unhealthy::BlockedByDead { .. }) && e.to_string().contains("dead letter of their ordering key"))
        }).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let k1: Vec<i64> = log.calls().iter().filter(|c| c.1 == "k1").map(|c| c.2).collect();
        assert!(k1.iter().all(|s| *s == 0), "k1's later steps wait: {k1:?}");
        assert!(log.calls().iter().any(|c| c.1 == "k3"), "k3 is free");

        // The downstream recovers: retrying k1's dead step runs it first, then the rest of k1.
        log.1.store(true, std::sync::atomic::Ordering::SeqCst);
        let dead = store.dead_letters(&outbox::DeadLetterFilter::default()).await.unwrap();
        let k1_dead = dead.iter().find(|m| m.payload.contains("\"k1\"")).unwrap().id;
        let k2_dead = dead.iter().find(|m| m.payload.contains("\"k2\"")).unwrap().id;
        assert_eq!(store.retry_dead(&DeadSelection::One(k1_dead)).await.unwrap(), 1);
        // Discarding k2's dead step lets k2 go on without it.
        assert_eq!(store.discard_dead(&DeadSelection::One(k2_dead)).await.unwrap(), 1);
        wait_until(Duration::from_secs(30), "everything done", async || live(&store).await == 0).await;
        wait_until(Duration::from_secs(10), "health clears", async || health.check().is_ok()).await;
        stop(running).await;
        let k1: Vec<i64> = log.calls().iter().filter(|c| c.1 == "k1" && c.0 != "mail-a").map(|c| c.2).collect();
        assert_eq!(k1.iter().filter(|s| **s > 0).copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(*k1.last().unwrap(), 2);
        let k2: Vec<i64> = log.calls().iter().filter(|c| c.1 == "k2" && c.2 != 1).map(|c| c.2).collect();
        assert_eq!(k2, vec![0, 2]);
        assert_eq!(store.stats().await.unwrap().total.blocked, 0);
    }

    async fn a_dead_message_of_an_event_that_releases_its_key_lets_the_next_go(store, pool) {
        let mut tx = pool.begin().await.unwrap();
        enqueue(&mut *tx, &LooseStep { key: "k".into(), seq: 0, fails: -1 }).await.unwrap();
        enqueue(&mut *tx, &LooseStep { key: "k".into(), seq: 1, fails: 0 }).await.unwrap();
        // The option overrides the event's choice: this dead letter blocks its key.
        enqueue_with(&mut *tx, &LooseStep { key: "j".into(), seq: 0, fails: -1 },
            &EnqueueOptions::new().dead_releases_key(false)).await.unwrap();
        enqueue(&mut *tx, &LooseStep { key: "j".into(), seq: 1, fails: 0 }).await.unwrap();
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let running = start(vec![worker(store.clone(), &log)]);
        wait_until(Duration::from_secs(30), "k's second step done, j's blocked", async || {
            let t = store.stats().await.unwrap().total;
            t.dead == 2 && t.blocked_by_dead == 1 && t.pending() == 1
        }).await;
        stop(running).await;
        assert!(log.calls().iter().any(|c| c.1 == "k" && c.2 == 1));
        assert!(!log.calls().iter().any(|c| c.1 == "j" && c.2 == 1));
    }

    async fn a_delayed_message_holds_back_the_later_ones_of_its_key(store, pool) {
        // Long enough that a loaded machine handles the other key well within it.
        const DELAY: Duration = Duration::from_secs(3);
        let enqueued = std::time::Instant::now();
        let mut tx = pool.begin().await.unwrap();
        enqueue_with(&mut *tx, &StepA { key: "k".into(), seq: 0, fails: 0 },
            &EnqueueOptions::new().delay(DELAY)).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "k".into(), seq: 1, fails: 0 }).await.unwrap();
        // An explicit key on an unkeyed event type, and one on another key.
        enqueue_with(&mut *tx, &Plain { n: 1 }, &EnqueueOptions::new().ordering_key("k")).await.unwrap();
        enqueue(&mut *tx, &StepB { key: "other".into(), seq: 0, fails: 0 }).await.unwrap();
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let running = start(vec![worker(store.clone(), &log)]);
        wait_until(Duration::from_secs(10), "the other key done", async || {
            log.calls().iter().any(|c| c.1 == "other")
        }).await;
        let calls = log.calls();
        let t = store.stats().await.unwrap().total;
        let seen = enqueued.elapsed();
        assert!(seen < DELAY - Duration::from_millis(100), "the other key took {seen:?}: too long to tell waiting from running");
        assert!(calls.iter().all(|c| c.1 != "k" && c.0 != "plain"), "k waits for its delayed first step: {calls:?}");
        assert_eq!((t.scheduled, t.blocked), (1, 2), "{t:?}");
        wait_until(Duration::from_secs(20), "all done", async || live(&store).await == 0).await;
        stop(running).await;
        let k: Vec<(&str, i64)> = log.calls().iter().filter(|c| c.1 == "k" || c.0 == "plain")
            .map(|c| (c.0, c.2)).collect();
        assert_eq!(k.last(), Some(&("plain", 1)));
        assert_eq!(k.iter().filter(|c| c.0 == "index-b").map(|c| c.1).collect::<Vec<_>>(), vec![1]);
        let first_b = k.iter().position(|c| c.0 == "index-b").unwrap();
        assert!(k[..first_b].iter().filter(|c| c.1 == 0).count() == 2, "step 0 (both handlers) first: {k:?}");
    }

    async fn a_delayed_message_behind_a_running_one_of_its_key_waits_out_its_delay(store, pool) {
        // Step 1 becomes its key's head when step 0 is written done, long before it is due: the
        // write that releases the key must leave it for later.
        const DELAY: Duration = Duration::from_millis(1500);
        let enqueued = std::time::Instant::now();
        let mut tx = pool.begin().await.unwrap();
        enqueue(&mut *tx, &StepA { key: "k".into(), seq: 0, fails: 0 }).await.unwrap();
        enqueue_with(&mut *tx, &StepA { key: "k".into(), seq: 1, fails: 0 },
            &EnqueueOptions::new().delay(DELAY)).await.unwrap();
        tx.commit().await.unwrap();
        let log = Arc::new(Log::default());
        let running = start(vec![worker(store.clone(), &log)]);
        let step_1 = |log: &Log| log.calls().iter().filter(|c| c.2 == 1).count();
        while enqueued.elapsed() < DELAY - Duration::from_millis(100) {
            assert_eq!(step_1(&log), 0, "step 1 started {:?} after its enqueue, before its delay", enqueued.elapsed());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(log.calls().iter().filter(|c| c.2 == 0).count(), 2, "step 0 ran on both handlers meanwhile");
        wait_until(Duration::from_secs(10), "step 1 done", async || live(&store).await == 0).await;
        stop(running).await;
        assert_eq!(step_1(&log), 2);
    }
}

#[tokio::test]
async fn ordering_keys_are_checked_at_enqueue() {
    let db = outbox_tests::sqlite().await;
    let mut tx = db.pool.begin().await.unwrap();
    let empty = enqueue(
        &mut *tx,
        &StepA {
            key: String::new(),
            seq: 0,
            fails: 0,
        },
    )
    .await;
    assert!(
        matches!(empty, Err(outbox::Error::InvalidOrderingKey { .. })),
        "{empty:?}"
    );
    let long = enqueue_with(
        &mut *tx,
        &Plain { n: 1 },
        &EnqueueOptions::new().ordering_key("x".repeat(256)),
    )
    .await;
    assert!(
        matches!(long, Err(outbox::Error::InvalidOrderingKey { .. })),
        "{long:?}"
    );
    enqueue_with(
        &mut *tx,
        &Plain { n: 1 },
        &EnqueueOptions::new().ordering_key("x".repeat(255)),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    db.drop_db().await;
}
