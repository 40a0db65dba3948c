//! Replays of the event log, on every backend (PostgreSQL, SQLite, MariaDB): a window of a retained topic's events goes to
//! one handler only, in order per key, with the original ids and idempotency keys (or fresh
//! ones); bad requests are refused saying why; a replay pauses, resumes, is cancelled and is
//! taken over by another worker from its cursor; and a handler deployed later with
//! `Start::Beginning` gets one backfill however many workers start at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    enqueue, outbox_event, Context, Error, Handler, HandlerError, ReplayRequest, ReplayState,
    RetryPolicy, Start, Store, Worker, WorkerConfig,
};
use outbox_tests::{start, stop, wait_until};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[outbox_event(topic = "rp.booking", ordering_key = "key", retain = "30d")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Booking {
    key: String,
    n: i64,
}

#[outbox_event(topic = "rp.plain")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plain {
    n: i64,
}

/// One call: (handler, message id, idempotency key, key, n).
type Calls = Arc<Mutex<Vec<(&'static str, Uuid, String, String, i64)>>>;

/// A handler named `$name` of `Booking` that records its calls and waits `$pause` ms in each.
macro_rules! recorder {
    ($ty:ident, $name:literal, $start:expr) => {
        struct $ty(Calls, u64);

        #[outbox::async_trait]
        impl Handler for $ty {
            type Event = Booking;
            const NAME: &'static str = $name;
            const START: Start = $start;
            async fn handle(&self, e: Booking, ctx: &Context) -> Result<(), HandlerError> {
                if self.1 > 0 {
                    tokio::time::sleep(Duration::from_millis(self.1)).await;
                }
                self.0.lock().unwrap().push((
                    $name,
                    ctx.message_id(),
                    ctx.idempotency_key().to_string(),
                    e.key,
                    e.n,
                ));
                Ok(())
            }
        }
    };
}

recorder!(Index, "index", Start::Present);
recorder!(Mail, "mail", Start::Present);
recorder!(Late, "late", Start::Beginning);

struct PlainHandler;

#[outbox::async_trait]
impl Handler for PlainHandler {
    type Event = Plain;
    const NAME: &'static str = "plain";
    async fn handle(&self, _: Plain, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(RetryPolicy::default().max_attempts(2).jitter(false))
        .concurrency(16)
        .batch_size(64)
        .poll_interval(Duration::from_millis(20))
}

/// A worker of `Index` and `Mail` (each pausing `pause` ms a call) and `PlainHandler`.
fn worker(store: &Store, calls: &Calls, pause: u64) -> Worker {
    Worker::builder(store.clone())
        .handler(Index(calls.clone(), pause))
        .handler(Mail(calls.clone(), 0))
        .handler(PlainHandler)
        .config(config())
        .build()
        .expect("the worker builds")
}

/// Enqueues `$count` bookings over five keys, one transaction.
macro_rules! produce {
    ($pool:expr, $count:expr) => {{
        let mut tx = $pool.begin().await.unwrap();
        let count: i64 = $count;
        for n in 0..count {
            let key = format!("k{}", n % 5);
            enqueue(&mut *tx, &Booking { key, n }).await.unwrap();
        }
        enqueue(&mut *tx, &Plain { n: 0 }).await.unwrap();
        tx.commit().await.unwrap();
    }};
}

async fn drained(store: &Store) {
    wait_until(
        Duration::from_secs(30),
        "every message delivered",
        async || store.stats().await.unwrap().total.pending() == 0,
    )
    .await;
}

async fn replay_ends(store: &Store, id: Uuid) -> outbox::ReplayInfo {
    let mut last = None;
    wait_until(Duration::from_secs(60), "the replay ends", async || {
        let r = store.replay(id).await.unwrap().expect("the replay exists");
        let ended = r.state != ReplayState::Running;
        last = Some(r);
        ended
    })
    .await;
    last.expect("read")
}

/// The calls of `handler`, taken out of `calls`.
fn take(calls: &Calls, handler: &str) -> Vec<(&'static str, Uuid, String, String, i64)> {
    let mut all = calls.lock().unwrap();
    let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|c| c.0 == handler);
    *all = rest;
    mine
}

/// Each key's `n`s in call order.
fn per_key(calls: &[(&'static str, Uuid, String, String, i64)]) -> BTreeMap<String, Vec<i64>> {
    let mut keys: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for c in calls {
        keys.entry(c.3.clone()).or_default().push(c.4);
    }
    keys
}

outbox_tests::all_backends! {
    async fn a_replay_goes_to_one_handler_in_order_with_the_original_ids(db, store, pool) {
        let calls: Calls = Arc::default();
        let running = start(vec![worker(&store, &calls, 0)]);
        produce!(pool, 100);
        drained(&store).await;
        let live = take(&calls, "index");
        assert_eq!(live.len(), 100);
        take(&calls, "mail");

        let plan = store.plan_replay(&ReplayRequest::new("rp.booking", "index")).await.unwrap();
        assert_eq!(plan.events, 100, "{plan:?}");
        let replay = store.start_replay(&ReplayRequest::new("rp.booking", "index")).await.unwrap();
        assert_eq!((replay.total, replay.state), (100, ReplayState::Running));
        let ended = replay_ends(&store, replay.id).await;
        assert_eq!((ended.state, ended.delivered, ended.failed), (ReplayState::Done, 100, 0), "{ended:?}");
        assert!(ended.progress_line().contains("100%"), "{}", ended.progress_line());

        let again = take(&calls, "index");
        assert!(take(&calls, "mail").is_empty(), "the topic's other handler sees nothing");
        let ids = |c: &[(&'static str, Uuid, String, String, i64)]| -> BTreeMap<Uuid, String> {
            c.iter().map(|c| (c.1, c.2.clone())).collect()
        };
        assert_eq!(ids(&again), ids(&live), "the same message ids and idempotency keys");
        assert_eq!(again.len(), 100, "each event once");
        for (key, ns) in per_key(&again) {
            assert!(ns.windows(2).all(|w| w[0] < w[1]), "key {key} in order: {ns:?}");
        }
        assert_eq!(store.retained_topics().await.unwrap()[0].events, 100, "a replay logs nothing again");

        // A fresh re-run: new message ids and keys, the same events.
        let fresh = store
            .start_replay(&ReplayRequest::new("rp.booking", "index").key("k3").fresh())
            .await
            .unwrap();
        assert_eq!(fresh.total, 20);
        assert_eq!(replay_ends(&store, fresh.id).await.state, ReplayState::Done);
        let rerun = take(&calls, "index");
        assert_eq!(rerun.len(), 20);
        assert!(rerun.iter().all(|c| !ids(&live).contains_key(&c.1) && c.3 == "k3"));
        stop(running).await;
    }

    async fn an_event_that_no_longer_decodes_is_recorded_and_the_replay_goes_on(db, store, pool) {
        let calls: Calls = Arc::default();
        let running = start(vec![worker(&store, &calls, 0)]);
        produce!(pool, 10);
        drained(&store).await;
        take(&calls, "index");
        let broken = store.events(&outbox::EventFilter::topic("rp.booking").limit(4)).await.unwrap()[3].id;
        // An event stored by a build whose type has since changed without a new version.
        assert_eq!(db.set_event_payload(broken, r#"{"key": 7}"#).await, 1);
        let replay = store.start_replay(&ReplayRequest::new("rp.booking", "index")).await.unwrap();
        let ended = replay_ends(&store, replay.id).await;
        assert_eq!((ended.state, ended.delivered, ended.failed), (ReplayState::Done, 10, 1), "{ended:?}");
        let failures = store.replay_failures(replay.id).await.unwrap();
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].event_id, broken);
        assert!(failures[0].error.contains("does not decode"), "{:?}", failures[0]);
        assert_eq!(take(&calls, "index").len(), 9, "the others were delivered");
        stop(running).await;
    }

    async fn bad_replays_are_refused_saying_why(db, store, pool) {
        let calls: Calls = Arc::default();
        let running = start(vec![worker(&store, &calls, 0)]);
        produce!(pool, 10);
        drained(&store).await;
        stop(running).await;
        let refused = async |r: ReplayRequest| match store.start_replay(&r).await {
            Err(Error::ReplayRefused(why)) => why,
            other => panic!("refused, not {other:?}"),
        };
        let why = refused(ReplayRequest::new("rp.plain", "plain")).await;
        assert!(why.contains("retains no events"), "{why}");
        let why = refused(ReplayRequest::new("rp.booking", "indx")).await;
        assert!(why.contains("no worker has run a handler named `indx`"), "{why}");
        let why = refused(ReplayRequest::new("rp.booking", "plain")).await;
        assert!(why.contains("for topic `rp.booking`"), "a handler of another topic: {why}");
        let why = refused(ReplayRequest::new("rp.booking", "index").key("nobody")).await;
        assert!(why.contains("no retained events in that window for key `nobody`"), "{why}");
        let e = store.start_replay(&ReplayRequest::new("rp.booking", "index").rate(0)).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert!(store.replays().await.unwrap().is_empty(), "nothing was made");
    }

    async fn a_replay_pauses_resumes_is_taken_over_and_cancelled(db, store, pool) {
        let calls: Calls = Arc::default();
        let first = start(vec![worker(&store, &calls, 0)]);
        produce!(pool, 300);
        drained(&store).await;
        take(&calls, "index");
        let replay = store
            .start_replay(&ReplayRequest::new("rp.booking", "index").rate(20))
            .await
            .unwrap();
        let progressed = async |at_least: i64| {
            wait_until(Duration::from_secs(20), "the replay progresses", async || {
                store.replay(replay.id).await.unwrap().unwrap().delivered >= at_least
            })
            .await;
        };
        progressed(40).await;
        store.pause_replay(replay.id).await.unwrap();
        let e = store.pause_replay(replay.id).await.unwrap_err();
        assert!(e.to_string().contains("only a running one can"), "{e}");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let paused = store.replay(replay.id).await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let still = store.replay(replay.id).await.unwrap().unwrap();
        assert_eq!((still.state, still.delivered), (ReplayState::Paused, paused.delivered));

        // The worker stops; another one resumes the replay from its cursor.
        stop(first).await;
        store.resume_replay(replay.id).await.unwrap();
        let second = start(vec![worker(&store, &calls, 0)]);
        progressed(paused.delivered + 40).await;
        store.cancel_replay(replay.id).await.unwrap();
        let cancelled = replay_ends(&store, replay.id).await;
        assert_eq!(cancelled.state, ReplayState::Cancelled);
        assert!(cancelled.delivered < 300, "{cancelled:?}");
        stop(second).await;
        let seen = take(&calls, "index");
        let distinct: BTreeSet<i64> = seen.iter().map(|c| c.4).collect();
        assert_eq!(distinct.len(), seen.len(), "no event twice across the take-over");
        assert!(seen.len() as i64 >= cancelled.delivered, "{} seen, {} recorded", seen.len(), cancelled.delivered);
        let e = store.resume_replay(replay.id).await.unwrap_err();
        assert!(e.to_string().contains("is cancelled"), "{e}");
    }

    async fn a_handler_deployed_later_gets_one_backfill(db, store, pool) {
        let calls: Calls = Arc::default();
        let first = start(vec![worker(&store, &calls, 0)]);
        produce!(pool, 60);
        drained(&store).await;
        stop(first).await;
        take(&calls, "index");

        // The next release adds `late`, starting at the beginning; four workers start at once.
        let workers: Vec<Worker> = (0..4)
            .map(|_| {
                Worker::builder(store.clone())
                    .handler(Index(calls.clone(), 0))
                    .handler(Mail(calls.clone(), 0))
                    .handler(Late(calls.clone(), 0))
                    .handler(PlainHandler)
                    .config(config())
                    .build()
                    .unwrap()
            })
            .collect();
        let running = start(workers);
        wait_until(Duration::from_secs(30), "the backfill is made and done", async || {
            let all = store.replays().await.unwrap();
            !all.is_empty() && all.iter().all(|r| r.state == ReplayState::Done)
        })
        .await;
        produce!(pool, 5);
        drained(&store).await;
        stop(running).await;
        let replays = store.replays().await.unwrap();
        assert_eq!(replays.len(), 1, "one backfill for the deployment: {replays:?}");
        assert!(replays[0].backfill && replays[0].request.handler == "late");
        let late = take(&calls, "late");
        let ns: BTreeSet<i64> = late.iter().map(|c| c.4).collect();
        assert_eq!(late.len(), 65, "the 60 before it and the 5 after, each once");
        assert_eq!(ns.len(), 60, "n 0..5 twice: the old and the new bookings");
        assert_eq!(take(&calls, "index").len(), 5, "the other handlers only see the new ones");
    }
}
