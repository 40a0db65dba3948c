//! Events that change shape, on every backend (PostgreSQL, SQLite, MariaDB): a version stored with each message, upcasts
//! from older versions to the type a handler takes, and messages of a version a worker does not
//! know left pending for a worker that does (a rolling deploy).
//!
//! Two builds of one service are two modules here: `old` has version 1 of `ver.booking`, `new`
//! adds version 2 with `previous = old::BookingCreated`. Both are linked into this binary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    enqueue, outbox_event, Context, Handler, HandlerError, MessageStatus, Registry, RetryPolicy,
    Store, Worker, WorkerConfig,
};
use outbox_tests::{console_page, start, stop, wait_until};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The build that knows version 1 of `ver.booking` only.
mod old {
    use super::*;

    #[outbox_event(topic = "ver.booking", ordering_key = "key")]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct BookingCreated {
        pub(crate) key: String,
        pub(crate) seq: i64,
        pub(crate) guest: String,
    }
}

/// The next build: version 2 renamed `guest` and added `nights`.
mod new {
    use super::*;

    #[outbox_event(
        topic = "ver.booking",
        ordering_key = "key",
        version = 2,
        previous = super::old::BookingCreated
    )]
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub(crate) struct BookingCreated {
        pub(crate) key: String,
        pub(crate) seq: i64,
        pub(crate) guest_name: String,
        pub(crate) nights: u32,
    }

    impl From<old::BookingCreated> for BookingCreated {
        fn from(v1: old::BookingCreated) -> Self {
            Self {
                key: v1.key,
                seq: v1.seq,
                guest_name: v1.guest,
                nights: 1,
            }
        }
    }
}

/// Every call: (build, key, seq, guest), in the order they started.
type Calls = Arc<Mutex<Vec<(&'static str, String, i64, String)>>>;

struct OldConfirm(Calls);

#[outbox::async_trait]
impl Handler for OldConfirm {
    type Event = old::BookingCreated;
    const NAME: &'static str = "confirm";
    async fn handle(&self, e: old::BookingCreated, _: &Context) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push(("old", e.key, e.seq, e.guest));
        Ok(())
    }
}

struct NewConfirm(Calls);

#[outbox::async_trait]
impl Handler for NewConfirm {
    type Event = new::BookingCreated;
    const NAME: &'static str = "confirm";
    async fn handle(&self, e: new::BookingCreated, _: &Context) -> Result<(), HandlerError> {
        self.0
            .lock()
            .unwrap()
            .push(("new", e.key, e.seq, e.guest_name));
        Ok(())
    }
}

/// Version 1 of `ver.guest`: one name.
#[outbox_event(topic = "ver.guest")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GuestV1 {
    n: i64,
    name: String,
}

/// Version 2: the name split in two.
#[outbox_event(topic = "ver.guest", version = 2, previous = GuestV1)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GuestV2 {
    n: i64,
    first_name: String,
    last_name: String,
}

/// Version 3: a flag added, false for guests of older versions.
#[outbox_event(topic = "ver.guest", version = 3, previous = GuestV2)]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Guest {
    n: i64,
    first_name: String,
    last_name: String,
    vip: bool,
}

impl From<GuestV1> for GuestV2 {
    fn from(v1: GuestV1) -> Self {
        // A conversion that panics on some input: the attempt fails as a handler's panic does.
        assert!(v1.name != "panic", "cannot split the name {:?}", v1.name);
        let (first, last) = v1.name.split_once(' ').unwrap_or((&v1.name, ""));
        Self {
            n: v1.n,
            first_name: first.into(),
            last_name: last.into(),
        }
    }
}

impl From<GuestV2> for Guest {
    fn from(v2: GuestV2) -> Self {
        Self {
            n: v2.n,
            first_name: v2.first_name,
            last_name: v2.last_name,
            vip: false,
        }
    }
}

struct Welcome(Arc<Mutex<Vec<Guest>>>);

#[outbox::async_trait]
impl Handler for Welcome {
    type Event = Guest;
    const NAME: &'static str = "welcome";
    async fn handle(&self, g: Guest, _: &Context) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push(g);
        Ok(())
    }
}

/// A worker of [`Welcome`], and the guests it will have seen.
fn welcome_worker(store: &Store) -> (Worker, Arc<Mutex<Vec<Guest>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::builder(store.clone())
        .handler(Welcome(seen.clone()))
        .config(config())
        .build()
        .expect("the welcome worker builds");
    (worker, seen)
}

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .retry(
            RetryPolicy::default()
                .jitter(false)
                .base(Duration::from_millis(20))
                .max_delay(Duration::from_millis(50))
                .max_attempts(2),
        )
        .concurrency(16)
        .batch_size(64)
        .poll_interval(Duration::from_millis(20))
        .stats_interval(Duration::from_millis(100))
}

async fn pending(store: &Store) -> i64 {
    store.stats().await.unwrap().total.pending()
}

/// The status and attempts of message `id`.
async fn state(store: &Store, id: Uuid) -> (MessageStatus, i32) {
    let m = store
        .message(id)
        .await
        .unwrap()
        .expect("the message exists");
    (m.status, m.attempts)
}

/// The stats of `topic`.
async fn topic_stats(store: &Store, topic: &str) -> outbox::TopicStats {
    let stats = store.stats().await.unwrap();
    stats
        .topics
        .into_iter()
        .find(|t| t.topic == topic)
        .expect("the topic has stats")
}

outbox_tests::all_backends! {
    async fn a_rolling_deploy_leaves_the_new_version_waiting_until_a_worker_knows_it(db, store, pool) {
        let calls: Calls = Arc::default();
        let old_worker = Worker::builder(store.clone())
            .handler(OldConfirm(calls.clone()))
            .config(config())
            .build()
            .expect("the old worker builds");
        assert_eq!(old_worker.versions()["ver.booking"], 1);
        let old_health = old_worker.health();
        let old_running = start(vec![old_worker]);
        // Old and new producers side by side: keys `a:*` get a version 2 message between two
        // of version 1, keys `b:*` only version 1, key `c:0` only version 2.
        let mut waiting = Vec::new();
        for seq in 0..3 {
            let mut tx = pool.begin().await.unwrap();
            for k in 0..5 {
                let (key, guest) = (format!("a:{k}"), format!("guest {k}"));
                if seq == 1 {
                    let v2 = new::BookingCreated { key, seq, guest_name: guest, nights: 3 };
                    waiting.push(enqueue(&mut *tx, &v2).await.unwrap());
                } else {
                    let id = enqueue(&mut *tx, &old::BookingCreated { key, seq, guest }).await.unwrap();
                    if seq == 2 {
                        waiting.push(id);
                    }
                }
                let b = old::BookingCreated { key: format!("b:{k}"), seq, guest: format!("guest {k}") };
                enqueue(&mut *tx, &b).await.unwrap();
            }
            tx.commit().await.unwrap();
        }
        let c = new::BookingCreated { key: "c:0".into(), seq: 0, guest_name: "c".into(), nights: 1 };
        let mut conn = pool.acquire().await.unwrap();
        waiting.push(enqueue(&mut *conn, &c).await.unwrap());
        drop(conn);

        // The old worker handles every version 1 message that is not behind a version 2 one.
        wait_until(Duration::from_secs(30), "the old worker handled what it knows", async || {
            calls.lock().unwrap().len() == 20 && pending(&store).await == 11
        })
        .await;
        // Several claims later, the waiting messages are still untouched: not claimed, not
        // counted as attempts, not dead-lettered.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(pending(&store).await, 11);
        for id in &waiting {
            assert_eq!(state(&store, *id).await, (MessageStatus::Pending, 0), "{id}");
        }
        let booking = topic_stats(&store, "ver.booking").await;
        assert_eq!((booking.dead, booking.unknown_version), (0, Some(2)));
        // The version 2 heads (five keys `a:*` and `c:0`) await a worker that knows them:
        // counted apart, not ready, and out of the oldest ready age that alerts watch; the
        // version 1 messages behind them are blocked.
        assert_eq!(
            (booking.ready, booking.awaiting_version, booking.blocked),
            (0, 6, 5),
            "{booking:?}"
        );
        assert_eq!(booking.oldest_ready_age, None, "{booking:?}");
        assert!(booking.oldest_awaiting_version_age.is_some(), "{booking:?}");
        // Health has its own reason for them, with its own limit (15 minutes unless set): a
        // rollout in progress is not a late queue.
        assert_eq!(old_health.check(), Ok(()));
        wait_until(Duration::from_secs(10), "the old worker's health names the version", async || {
            old_health.unknown_versions().iter().any(|(t, v, _)| t == "ver.booking" && *v == 2)
        })
        .await;
        assert_eq!(
            booking.unknown_version_note().as_deref(),
            Some("version 2 of topic ver.booking: no live worker knows it; deploy workers built with that version")
        );
        let page = console_page(store.clone()).await;
        let overview = page("/").await;
        assert!(
            overview.contains("id=\"unknown-versions\"")
                && overview.contains("version 2 of <strong>ver.booking</strong> (6 waiting, the oldest "),
            "the console's overview names the waiting version and counts its messages: {overview}"
        );
        assert!(
            overview.contains("<td class=\"n awaiting-version warn\">6</td>"),
            "the topics table counts the awaiting messages in their own column: {overview}"
        );

        // The new build's worker starts beside the old one; everything drains in key order.
        let new_worker = Worker::builder(store.clone())
            .handler(NewConfirm(calls.clone()))
            .config(config())
            .build()
            .expect("the new worker builds");
        assert_eq!(new_worker.versions()["ver.booking"], 2);
        let new_running = start(vec![new_worker]);
        wait_until(Duration::from_secs(30), "everything drained", async || pending(&store).await == 0).await;
        let booking = topic_stats(&store, "ver.booking").await;
        assert_eq!((booking.dead, booking.unknown_version), (0, None));
        stop(old_running).await;
        stop(new_running).await;

        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 31);
        for k in 0..5 {
            let key = format!("a:{k}");
            let seqs: Vec<(i64, &str)> =
                calls.iter().filter(|c| c.1 == key).map(|c| (c.2, c.0)).collect();
            assert_eq!(seqs.iter().map(|s| s.0).collect::<Vec<_>>(), [0, 1, 2], "{key}");
            assert_eq!(seqs[1].1, "new", "{key}: the version 2 message went to the new worker");
            assert!(calls.iter().all(|c| c.1 != key || c.3 == format!("guest {k}")));
        }
        assert!(calls.iter().any(|c| c.0 == "new" && c.1 == "c:0"));
    }

    async fn a_worker_upcasts_a_mixed_backlog_to_the_current_type(db, store, pool) {
        let mut tx = pool.begin().await.unwrap();
        for n in 0..30 {
            match n % 3 {
                0 => enqueue(&mut *tx, &GuestV1 { n, name: format!("Ada{n} Lovelace") }).await,
                1 => {
                    let v2 = GuestV2 { n, first_name: format!("Ada{n}"), last_name: "Lovelace".into() };
                    enqueue(&mut *tx, &v2).await
                }
                _ => {
                    let v3 = Guest { n, first_name: format!("Ada{n}"), last_name: "Lovelace".into(), vip: true };
                    enqueue(&mut *tx, &v3).await
                }
            }
            .unwrap();
        }
        tx.commit().await.unwrap();
        let (worker, seen) = welcome_worker(&store);
        assert_eq!(worker.versions()["ver.guest"], 3);
        // One batch holds the whole backlog: versions 1, 2 and 3 in one claim.
        let report = worker.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done, report.dead), (30, 30, 0));
        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|g| g.n);
        assert_eq!(seen.len(), 30);
        for g in &seen {
            assert_eq!((g.first_name.as_str(), g.last_name.as_str()), (format!("Ada{}", g.n).as_str(), "Lovelace"));
            assert_eq!(g.vip, g.n % 3 == 2, "guest {}: only version 3 payloads carry the flag", g.n);
        }
        assert_eq!(pending(&store).await, 0);
        let _ = db;
    }

    async fn a_message_written_before_versions_existed_reads_as_version_1(db, store, pool) {
        // The schema as it was before versions: the columns and the record of their migration
        // gone, and a message written then.
        sqlx::raw_sql(
            "ALTER TABLE outbox_messages DROP COLUMN version; \
             ALTER TABLE outbox_dead DROP COLUMN version; \
             ALTER TABLE outbox_workers DROP COLUMN versions; \
             DELETE FROM outbox_migrations WHERE version = 9;",
        )
        .execute(&pool)
        .await
        .unwrap();
        db.insert_raw("ver.guest", r#"{"n": 1, "name": "Grace Hopper"}"#, 1).await;
        outbox::migrate(&pool).await.expect("the versions migration applies");
        let (worker, seen) = welcome_worker(&store);
        assert_eq!(worker.run_once().await.unwrap().done, 1);
        let seen = seen.lock().unwrap().clone();
        assert_eq!((seen[0].first_name.as_str(), seen[0].last_name.as_str()), ("Grace", "Hopper"));
    }

    async fn bad_payloads_and_panicking_upcasts_fail_like_handlers(db, store, pool) {
        // Version 2 by its column, but not the shape of version 2.
        let bad = db.insert_version("ver.guest", r#"{"n": 1, "first_name": 7}"#, 2).await;
        // A row whose insert names no version: version 1.
        db.insert_raw("ver.guest", r#"{"n": 2, "name": "Grace Hopper"}"#, 1).await;
        // A version 1 payload whose conversion panics.
        let mut conn = pool.acquire().await.unwrap();
        let panics = enqueue(&mut *conn, &GuestV1 { n: 3, name: "panic".into() }).await.unwrap();
        drop(conn);
        // A version this build has never heard of.
        let future = db.insert_version("ver.guest", r#"{"n": 4}"#, 9).await;
        let (worker, seen) = welcome_worker(&store);
        let running = start(vec![worker]);
        wait_until(Duration::from_secs(30), "both failures dead-lettered", async || {
            store.stats().await.unwrap().total.dead == 2
        })
        .await;
        // The worker kept running: a message enqueued after the panic is handled.
        let mut conn = pool.acquire().await.unwrap();
        let turing = Guest { n: 5, first_name: "Alan".into(), last_name: "Turing".into(), vip: true };
        enqueue(&mut *conn, &turing).await.unwrap();
        drop(conn);
        wait_until(Duration::from_secs(30), "the later message handled", async || seen.lock().unwrap().len() == 2).await;
        let booking = topic_stats(&store, "ver.guest").await;
        assert_eq!(booking.unknown_version, Some(9));
        stop(running).await;

        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|g| (g.n, g.first_name.as_str(), g.last_name.as_str())).collect::<Vec<_>>(),
            [(2, "Grace", "Hopper"), (5, "Alan", "Turing")]
        );
        let bad = store.message(bad).await.unwrap().unwrap();
        assert_eq!(bad.status, MessageStatus::Dead);
        let error = bad.last_error.unwrap();
        assert!(error.contains("payload of version 2 does not deserialize into `versions::GuestV2`"), "{error}");
        assert!(error.contains("invalid type: integer `7`, expected a string"), "{error}");
        let panicked = store.message(panics).await.unwrap().unwrap();
        assert_eq!((panicked.status, panicked.attempts), (MessageStatus::Dead, 2));
        let error = panicked.last_error.unwrap();
        assert!(error.contains("handler panicked: cannot split the name \"panic\""), "{error}");
        assert_eq!(state(&store, future).await, (MessageStatus::Pending, 0));
    }
}

#[tokio::test]
async fn both_versions_of_a_topic_are_declared_in_one_binary() {
    let declared: Vec<(u32, &str)> = Registry::linked()
        .events()
        .filter(|e| e.topic() == "ver.booking")
        .map(|e| (e.version(), e.type_name()))
        .collect();
    for event in [
        (1, "versions::old::BookingCreated"),
        (2, "versions::new::BookingCreated"),
    ] {
        assert!(declared.contains(&event), "{declared:?}");
    }
}

/// Another type claiming version 1 of `ver.booking`.
#[outbox_event(topic = "ver.booking")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OtherBooking {
    key: String,
}

struct OtherConfirm;

#[outbox::async_trait]
impl Handler for OtherConfirm {
    type Event = OtherBooking;
    const NAME: &'static str = "other";
    async fn handle(&self, _: OtherBooking, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A second handler of version 1 of `ver.booking`.
struct OldAudit;

#[outbox::async_trait]
impl Handler for OldAudit {
    type Event = old::BookingCreated;
    const NAME: &'static str = "audit";
    async fn handle(&self, _: old::BookingCreated, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_worker_refuses_handlers_that_disagree_on_a_topics_versions() {
    let db = outbox_tests::sqlite().await;
    let calls: Calls = Arc::default();
    let mixed = Worker::builder(Store::from(&db.pool))
        .handler(OldAudit)
        .handler(NewConfirm(calls.clone()))
        .build()
        .map(|_| ())
        .expect_err("versions 1 and 2 in one worker");
    let message = mixed.to_string();
    assert!(
        message.contains("handlers of topic `ver.booking` decode different versions")
            && message.contains("`versions::old::BookingCreated` (version 1)")
            && message.contains("`versions::new::BookingCreated` (version 2)"),
        "{message}"
    );
    let twice = Worker::builder(Store::from(&db.pool))
        .handler(OldAudit)
        .handler(OtherConfirm)
        .build()
        .map(|_| ())
        .expect_err("two types of version 1");
    let message = twice.to_string();
    assert!(
        message.contains(
            "types `versions::old::BookingCreated` and `versions::OtherBooking` both claim \
             version 1 of topic `ver.booking`"
        ) || message.contains(
            "types `versions::OtherBooking` and `versions::old::BookingCreated` both claim \
             version 1 of topic `ver.booking`"
        ),
        "{message}"
    );
    db.drop_db().await;
}
