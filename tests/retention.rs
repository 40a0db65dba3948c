//! The event log, on every backend (PostgreSQL, SQLite, MariaDB): delivered events of a retained topic are kept (and those of
//! other topics, and dead letters, are not), the longest declared window wins unless an
//! operator set one, windows end by whole days (PostgreSQL partitions) or batched deletes
//! (SQLite), and workers starting together declare a topic once.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::Utc;
use outbox::{
    enqueue, outbox_event, Context, Error, EventFilter, Handler, HandlerError, RetryPolicy, Store,
    Worker, WorkerConfig,
};
use outbox_tests::{start, stop, wait_until};
use serde::{Deserialize, Serialize};

const DAY: Duration = Duration::from_secs(86_400);

#[outbox_event(
    topic = "ret.kept",
    ordering_key = "key",
    dead_releases_key,
    retain = "30d"
)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Kept {
    key: String,
    n: i64,
}

#[outbox_event(topic = "ret.gone")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gone {
    n: i64,
}

/// Delivers every `Kept` but n = 13, which is dead at once.
struct KeepHandler;

#[outbox::async_trait]
impl Handler for KeepHandler {
    type Event = Kept;
    const NAME: &'static str = "keep";
    async fn handle(&self, e: Kept, _: &Context) -> Result<(), HandlerError> {
        if e.n == 13 {
            return Err(HandlerError::permanent("13 is refused"));
        }
        Ok(())
    }
}

struct GoneHandler;

#[outbox::async_trait]
impl Handler for GoneHandler {
    type Event = Gone;
    const NAME: &'static str = "gone";
    async fn handle(&self, _: Gone, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(RetryPolicy::default().max_attempts(1))
        .concurrency(16)
        .batch_size(64)
        .poll_interval(Duration::from_millis(20))
}

fn worker(store: &Store) -> Worker {
    Worker::builder(store.clone())
        .handler(KeepHandler)
        .handler(GoneHandler)
        .config(config())
        .build()
        .expect("the worker builds")
}

async fn pending(store: &Store) -> i64 {
    store.stats().await.unwrap().total.pending()
}

/// Enqueues `$kept` events of `ret.kept` over five keys and `$gone` of `ret.gone`, in one
/// transaction on `$pool`.
macro_rules! produce {
    ($pool:expr, $kept:expr, $gone:expr) => {{
        let mut tx = $pool.begin().await.unwrap();
        let kept: i64 = $kept;
        for n in 0..kept {
            let key = format!("k{}", n % 5);
            enqueue(&mut *tx, &Kept { key, n }).await.unwrap();
        }
        let gone: i64 = $gone;
        for n in 0..gone {
            enqueue(&mut *tx, &Gone { n }).await.unwrap();
        }
        tx.commit().await.unwrap();
    }};
}

/// Every event of `topic`'s log, page by page.
async fn all_events(store: &Store, topic: &str) -> Vec<outbox::RetainedEvent> {
    let mut out: Vec<outbox::RetainedEvent> = Vec::new();
    loop {
        let mut filter = EventFilter::topic(topic).limit(7);
        if let Some(last) = out.last() {
            filter = filter.after(last.id);
        }
        let page = store.events(&filter).await.unwrap();
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

async fn window(store: &Store, topic: &str) -> Option<Duration> {
    store
        .retained_topics()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.topic == topic)
        .map(|t| t.retain)
}

outbox_tests::all_backends! {
    async fn delivered_events_of_a_retained_topic_are_kept_and_no_others(db, store, pool) {
        let running = start(vec![worker(&store)]);
        produce!(pool, 60, 20);
        wait_until(Duration::from_secs(30), "every message delivered or dead", async || {
            pending(&store).await == 0
        })
        .await;
        stop(running).await;

        let kept = all_events(&store, "ret.kept").await;
        let ns: Vec<i64> = kept
            .iter()
            .map(|e| serde_json::from_str::<Kept>(&e.payload).unwrap().n)
            .collect();
        let expected: Vec<i64> = (0..60).filter(|n| *n != 13).collect();
        assert_eq!(ns, expected, "every delivered event, in enqueue order; the dead one not");
        assert!(kept.windows(2).all(|w| w[0].id < w[1].id), "in id order");
        for e in &kept {
            assert_eq!(e.topic, "ret.kept");
            assert_eq!(e.version, 1);
            let n = serde_json::from_str::<Kept>(&e.payload).unwrap().n;
            assert_eq!(e.ordering_key.as_deref(), Some(format!("k{}", n % 5).as_str()));
            assert!(e.delivered_at >= e.created_at);
        }
        let k2 = store
            .events(&EventFilter::topic("ret.kept").key("k2"))
            .await
            .unwrap();
        assert_eq!(k2.len(), 12, "one key's events: {k2:?}");
        assert!(
            store.events(&EventFilter::topic("ret.gone")).await.unwrap().is_empty(),
            "a topic without retention keeps nothing"
        );
        let topics = store.retained_topics().await.unwrap();
        assert_eq!(topics.len(), 1, "{topics:?}");
        assert_eq!(topics[0].topic, "ret.kept");
        assert_eq!(topics[0].retain, 30 * DAY);
        assert_eq!(topics[0].events, 59);
        assert_eq!(topics[0].oldest, Some(kept[0].created_at));
        if store.kind() == "postgres" {
            let until = topics[0].partitions_until.expect("days ahead");
            assert!(until > Utc::now() + chrono::Duration::days(7), "{until}");
            assert!(topics[0].runway_note(Utc::now()).is_none());
        }
    }

    async fn the_longest_declared_window_wins_unless_an_operator_set_one(db, store, pool) {
        let _ = &pool;
        store.declare_retention(&[("ret.w", DAY)]).await.unwrap();
        store.declare_retention(&[("ret.w", 10 * DAY)]).await.unwrap();
        assert_eq!(window(&store, "ret.w").await, Some(10 * DAY));
        // A worker of an older build declares less: the window stays.
        store.declare_retention(&[("ret.w", 2 * DAY)]).await.unwrap();
        assert_eq!(window(&store, "ret.w").await, Some(10 * DAY));
        // An operator shortens it, and declarations leave it so.
        assert!(store.set_retention("ret.w", Some(3 * DAY)).await.unwrap());
        store.declare_retention(&[("ret.w", 10 * DAY)]).await.unwrap();
        assert_eq!(window(&store, "ret.w").await, Some(3 * DAY));
        assert!(store.set_retention("ret.w", None).await.unwrap());
        assert_eq!(window(&store, "ret.w").await, None);
        assert!(!store.set_retention("ret.w", None).await.unwrap(), "nothing left to stop");
        // Bad input is refused before any SQL, saying what is allowed.
        let e = store.set_retention("ret.w", Some(Duration::from_secs(10))).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("one minute to 100 years"), "{e}");
        let e = store.declare_retention(&[("", DAY)]).await.unwrap_err();
        assert!(e.to_string().contains("1 to 64 characters"), "{e}");
    }

    async fn a_window_ends_by_whole_days_and_keeps_everything_within_it(db, store, pool) {
        let running = start(vec![worker(&store)]);
        produce!(pool, 40, 0);
        wait_until(Duration::from_secs(30), "every message delivered", async || {
            pending(&store).await == 0
        })
        .await;
        stop(running).await;
        store.set_retention("ret.kept", Some(DAY)).await.unwrap();
        assert_eq!(all_events(&store, "ret.kept").await.len(), 39);

        // Half a day later, everything delivered today is within the window.
        let now = Utc::now();
        let upkeep = store.__log_upkeep_at(now + chrono::Duration::hours(12), 7).await.unwrap();
        let upkeep = upkeep.expect("no other process keeps the log");
        assert_eq!((upkeep.dropped, upkeep.deleted), (0, 0), "{upkeep:?}");
        assert_eq!(all_events(&store, "ret.kept").await.len(), 39, "nothing within the window is lost");

        // Three days later, today is past the window.
        let upkeep = store.__log_upkeep_at(now + chrono::Duration::days(3), 7).await.unwrap();
        let upkeep = upkeep.expect("no other process keeps the log");
        if store.kind() == "postgres" {
            assert!(upkeep.dropped >= 2, "today's and tomorrow's partitions dropped: {upkeep:?}");
            assert_eq!(upkeep.deleted, 0, "no DELETE: {upkeep:?}");
        } else {
            assert_eq!(upkeep.deleted, 39, "{upkeep:?}");
        }
        assert!(all_events(&store, "ret.kept").await.is_empty());
        let topics = store.retained_topics().await.unwrap();
        assert_eq!(topics[0].events, 0, "{topics:?}");
    }

    async fn workers_starting_together_declare_a_topic_once(db, store, pool) {
        let workers: Vec<Worker> = (0..4).map(|_| worker(&store)).collect();
        let running = start(workers);
        produce!(pool, 200, 0);
        wait_until(Duration::from_secs(30), "every message delivered", async || {
            pending(&store).await == 0
        })
        .await;
        stop(running).await;
        let topics = store.retained_topics().await.unwrap();
        assert_eq!(topics.len(), 1, "{topics:?}");
        let kept = all_events(&store, "ret.kept").await;
        let ids: BTreeSet<_> = kept.iter().map(|e| e.id).collect();
        assert_eq!((kept.len(), ids.len()), (199, 199), "each delivered event once");
    }
}

/// PostgreSQL: when the days ahead run short (here: dropped by hand, and the upkeep held off by
/// another process holding the log's lock), the workers' health check and `Store` say so; an
/// upkeep then creates them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_runway_is_reported_until_the_upkeep_creates_the_days_again() {
    let db = outbox_tests::pg().await;
    let store = Store::from(&db.pool);
    store.declare_retention(&[("ret.kept", DAY)]).await.unwrap();
    assert_eq!(db.drop_future_log_days().await, 7, "seven days ahead");
    let note = store.retained_topics().await.unwrap()[0]
        .runway_note(Utc::now())
        .expect("a short runway is noted");
    assert!(note.contains("ret.kept"), "{note}");

    // Another process holds the log's lock: this worker's upkeep leaves the days to it.
    let mut holder = db.pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(122550255120231)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let w = Worker::builder(store.clone())
        .handler(GoneHandler)
        .config(config())
        .build()
        .unwrap();
    let health = w.health();
    let running = start(vec![w]);
    wait_until(
        Duration::from_secs(10),
        "health notices the short runway",
        async || {
            matches!(
                health.check(),
                Err(outbox::Unhealthy::EventLogRunway { .. })
            )
        },
    )
    .await;
    let message = health.check().unwrap_err().to_string();
    assert!(message.contains("`ret.kept`"), "{message}");
    stop(running).await;
    sqlx::query("SELECT pg_advisory_unlock(122550255120231)")
        .execute(&mut *holder)
        .await
        .unwrap();
    drop(holder);

    let upkeep = store.log_upkeep().await.unwrap().expect("the lock is free");
    assert_eq!(upkeep.created, 7, "{upkeep:?}");
    assert!(store.retained_topics().await.unwrap()[0]
        .runway_note(Utc::now())
        .is_none());
    db.drop_db().await;
}
