//! Pause and resume of a handler or a topic, the same on every backend (PostgreSQL, SQLite and
//! MariaDB/MySQL): a paused topic is not claimed, a paused handler's messages park with no
//! attempt counted while the topic's other handlers go on, a pause with an end ends by itself,
//! a parked keyed message holds its key, and a running worker sees a pause and a resume within
//! a second.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{
    enqueue, outbox_event, Context, Error, Handler, HandlerError, PauseError, PauseTarget, Store,
    Worker, WorkerConfig,
};
use serde::{Deserialize, Serialize};

#[outbox_event(topic = "pause.ping")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ping {
    n: i64,
}

#[outbox_event(topic = "pause.keyed", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    key: String,
    n: i64,
}

/// What the handlers saw: per handler name, the `n` of each call, in call order.
#[derive(Default)]
struct Seen {
    calls: Mutex<Vec<(&'static str, i64)>>,
    total: AtomicUsize,
}

impl Seen {
    fn of(&self, handler: &str) -> Vec<i64> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(h, _)| *h == handler)
            .map(|(_, n)| *n)
            .collect()
    }

    fn note(&self, handler: &'static str, n: i64) {
        self.calls.lock().unwrap().push((handler, n));
        self.total.fetch_add(1, Ordering::SeqCst);
    }
}

/// Two handlers of `pause.ping`, and two of `pause.keyed`.
macro_rules! counting {
    ($ty:ident, $event:ident, $name:literal) => {
        struct $ty(Arc<Seen>);

        #[outbox::async_trait]
        impl Handler for $ty {
            type Event = $event;
            const NAME: &'static str = $name;
            async fn handle(&self, e: $event, _: &Context) -> Result<(), HandlerError> {
                self.0.note($name, e.n);
                Ok(())
            }
        }
    };
}

counting!(Mailer, Ping, "mailer");
counting!(Indexer, Ping, "indexer");
counting!(KeyedFirst, Keyed, "keyed-first");
counting!(KeyedSecond, Keyed, "keyed-second");

fn config() -> WorkerConfig {
    WorkerConfig::default()
        .handler_timeout(Duration::from_secs(5))
        .lease(Duration::from_secs(5))
        .poll_interval(Duration::from_millis(50))
}

/// A worker of both topics, with its handlers' record; a first `run_once` on an empty queue
/// records its handlers, as a worker's start does (pausing a handler needs a worker that ran
/// it).
async fn worker(store: impl Into<Store>) -> (Worker, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let w = Worker::builder(store)
        .handler(Mailer(seen.clone()))
        .handler(Indexer(seen.clone()))
        .handler(KeyedFirst(seen.clone()))
        .handler(KeyedSecond(seen.clone()))
        .config(config())
        .build()
        .expect("the test worker builds");
    assert_eq!(w.run_once().await.unwrap().claimed, 0);
    (w, seen)
}

/// Writes each test once and runs it on every backend: `$db` is a fresh, migrated database.
macro_rules! on_every_backend {
    ($(async fn $name:ident($db:ident) $body:block)*) => {
        mod postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $db = outbox_tests::pg().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
        mod sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let $db = outbox_tests::sqlite().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
        mod mysql {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    outbox_tests::skip_without_mysql!();
                    let $db = outbox_tests::mysql().await;
                    $body
                    $db.drop_db().await;
                }
            )*
        }
    };
}

on_every_backend! {
    async fn a_paused_topic_is_not_claimed_and_drains_on_resume(db) {
        let store = Store::from(&db.pool);
        let (w, seen) = worker(&db.pool).await;
        let paused = store.pause(&PauseTarget::topic("pause.ping"), None).await.unwrap();
        assert!(paused.served, "a worker ran handlers of the topic");
        let mut ids = Vec::new();
        for n in 0..5 {
            let mut tx = db.pool.begin().await.unwrap();
            ids.push(enqueue(&mut *tx, &Ping { n }).await.unwrap());
            tx.commit().await.unwrap();
        }
        for _ in 0..3 {
            assert_eq!(w.run_once().await.unwrap().claimed, 0, "nothing of a paused topic is claimed");
        }
        for id in &ids {
            assert_eq!(db.status(*id).await, ("pending".to_string(), 0, None), "no attempt counted");
        }
        assert_eq!(seen.total.load(Ordering::SeqCst), 0);
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.pauses.len(), 1, "stats show the pause");
        assert_eq!(stats.pauses[0].target, PauseTarget::topic("pause.ping"));
        assert_eq!(stats.pauses[0].waiting, 5, "and the messages that wait on it");
        assert!(stats.pauses[0].until.is_none());

        let resumed = store.resume(&PauseTarget::topic("pause.ping")).await.unwrap();
        assert!(resumed.was_paused);
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done), (5, 5), "{report:?}");
        assert_eq!(seen.of("mailer").len(), 5);
        assert_eq!(seen.of("indexer").len(), 5);
        assert_eq!(db.count().await, 0);
        assert!(store.pauses().await.unwrap().is_empty());
        assert!(!store.resume(&PauseTarget::topic("pause.ping")).await.unwrap().was_paused);
    }

    async fn a_paused_handler_parks_its_messages_while_the_other_goes_on(db) {
        let store = Store::from(&db.pool);
        let (w, seen) = worker(&db.pool).await;
        store
            .pause_because(&PauseTarget::handler("indexer"), None, Some("search cluster migration"))
            .await
            .unwrap();
        let mut ids = Vec::new();
        for n in 0..3 {
            let mut tx = db.pool.begin().await.unwrap();
            ids.push(enqueue(&mut *tx, &Ping { n }).await.unwrap());
            tx.commit().await.unwrap();
        }
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.parked, report.done), (3, 3, 0), "{report:?}");
        assert_eq!(seen.of("mailer"), vec![0, 1, 2], "the handler that is not paused goes on");
        assert!(seen.of("indexer").is_empty());
        for id in &ids {
            let (status, attempts, _) = db.status(*id).await;
            assert_eq!((status.as_str(), attempts), ("pending", 0), "parked, its attempt not counted");
            assert_eq!(db.deliveries(*id).await, vec!["mailer".to_string()]);
        }
        // Parked messages are not claimed again while the handler is paused.
        assert_eq!(w.run_once().await.unwrap().claimed, 0);
        let pauses = store.pauses().await.unwrap();
        assert_eq!(pauses.len(), 1);
        assert_eq!(pauses[0].waiting, 3, "the parked messages wait on the pause");
        assert_eq!(pauses[0].reason.as_deref(), Some("search cluster migration"));

        let resumed = store.resume(&PauseTarget::handler("indexer")).await.unwrap();
        assert_eq!((resumed.was_paused, resumed.unparked), (true, 3));
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done), (3, 3), "{report:?}");
        assert_eq!(seen.of("mailer"), vec![0, 1, 2], "the handler that succeeded does not run again");
        let mut indexed = seen.of("indexer");
        indexed.sort_unstable();
        assert_eq!(indexed, vec![0, 1, 2], "the resumed handler runs each message once");
        assert_eq!(db.count().await, 0);
    }

    async fn a_pause_with_an_end_ends_by_itself(db) {
        let store = Store::from(&db.pool);
        let (w, seen) = worker(&db.pool).await;
        let end = Duration::from_millis(1500);
        let topic = store.pause(&PauseTarget::topic("pause.keyed"), Some(end)).await.unwrap();
        assert!(topic.pause.until.is_some());
        store.pause(&PauseTarget::handler("indexer"), Some(end)).await.unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        let ping = enqueue(&mut *tx, &Ping { n: 1 }).await.unwrap();
        let keyed = enqueue(&mut *tx, &Keyed { key: "k".into(), n: 1 }).await.unwrap();
        tx.commit().await.unwrap();
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.parked), (1, 1), "the ping parks, the keyed topic waits: {report:?}");
        assert_eq!(db.status(keyed).await, ("pending".to_string(), 0, None));
        tokio::time::sleep(end + Duration::from_millis(300)).await;
        // The worker reads both pauses as over, deletes them and unparks the ping.
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done), (2, 2), "{report:?}");
        assert_eq!(seen.of("indexer"), vec![1]);
        assert_eq!(seen.of("mailer"), vec![1], "the mailer ran once, before the pause ended");
        assert_eq!(seen.of("keyed-first"), vec![1]);
        assert!(store.pauses().await.unwrap().is_empty(), "expired pauses are deleted");
        assert_eq!(db.count().await, 0, "{ping}");
    }

    async fn a_parked_keyed_message_holds_its_key(db) {
        let store = Store::from(&db.pool);
        let (w, seen) = worker(&db.pool).await;
        store.pause(&PauseTarget::handler("keyed-second"), None).await.unwrap();
        let mut tx = db.pool.begin().await.unwrap();
        let first = enqueue(&mut *tx, &Keyed { key: "booking:1".into(), n: 1 }).await.unwrap();
        let second = enqueue(&mut *tx, &Keyed { key: "booking:1".into(), n: 2 }).await.unwrap();
        tx.commit().await.unwrap();
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.parked), (1, 1), "only the key's head: {report:?}");
        for _ in 0..2 {
            assert_eq!(w.run_once().await.unwrap().claimed, 0, "the parked head holds its key");
        }
        assert_eq!(db.status(second).await, ("pending".to_string(), 0, None));
        assert_eq!(seen.of("keyed-first"), vec![1]);

        assert_eq!(store.resume(&PauseTarget::handler("keyed-second")).await.unwrap().unparked, 1);
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done), (1, 1), "the head first: {report:?}");
        assert_eq!(db.state(first).await, None, "done");
        let report = w.run_once().await.unwrap();
        assert_eq!((report.claimed, report.done), (1, 1), "then the next of its key: {report:?}");
        assert_eq!(seen.of("keyed-first"), vec![1, 2], "in key order, each once");
        assert_eq!(seen.of("keyed-second"), vec![1, 2]);
    }

    async fn bad_pauses_are_refused_and_change_nothing(db) {
        let store = Store::from(&db.pool);
        let (_w, _seen) = worker(&db.pool).await;
        let err = store.pause(&PauseTarget::handler("indexr"), None).await.unwrap_err();
        match &err {
            Error::Pause(PauseError::UnknownHandler { name, known }) => {
                assert_eq!(name, "indexr");
                assert!(known.contains(&"indexer".to_string()), "{known:?}");
            }
            other => panic!("{other}"),
        }
        assert!(err.to_string().contains("known handlers: indexer"), "{err}");
        let err = store.pause(&PauseTarget::topic(" "), None).await.unwrap_err();
        assert!(matches!(err, Error::Pause(PauseError::EmptyName { scope: "topic" })), "{err}");
        let err = store.pause(&PauseTarget::topic("pause.ping"), Some(Duration::ZERO)).await.unwrap_err();
        assert!(matches!(err, Error::Pause(PauseError::DurationOutOfRange { .. })), "{err}");
        assert!(store.pauses().await.unwrap().is_empty(), "nothing was paused");
        // A topic nobody serves is paused all the same, and said so.
        let paused = store.pause(&PauseTarget::topic("nobody.serves"), None).await.unwrap();
        assert!(!paused.served);
        assert_eq!(store.pauses().await.unwrap().len(), 1);
    }

    async fn a_running_worker_sees_a_pause_and_a_resume_within_a_second(db) {
        let store = Store::from(&db.pool);
        let (w, seen) = worker(&db.pool).await;
        let running = outbox_tests::start(vec![w]);
        store.pause(&PauseTarget::topic("pause.ping"), None).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut ids = Vec::new();
        for n in 0..3 {
            let mut tx = db.pool.begin().await.unwrap();
            ids.push(enqueue(&mut *tx, &Ping { n }).await.unwrap());
            tx.commit().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(seen.total.load(Ordering::SeqCst), 0, "the running worker holds the paused topic");
        for id in &ids {
            assert_eq!(db.status(*id).await, ("pending".to_string(), 0, None));
        }
        let resumed_at = std::time::Instant::now();
        store.resume(&PauseTarget::topic("pause.ping")).await.unwrap();
        outbox_tests::wait_until(Duration::from_secs(5), "the resumed topic drains", async || {
            seen.total.load(Ordering::SeqCst) == 6
        })
        .await;
        assert!(resumed_at.elapsed() < Duration::from_millis(1500), "drained {:?} after the resume", resumed_at.elapsed());
        outbox_tests::stop(running).await;
    }
}

/// `outbox pause --topic T` on a migrated database, `outbox stats` then shows it, `outbox
/// resume --topic T` lifts it (PostgreSQL; the command line is the same on every backend).
#[tokio::test]
async fn the_command_line_pauses_lists_and_resumes() {
    let db = outbox_tests::pg().await;
    let ops = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .expect("run the outbox command line");
        (
            o.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, out, err) = ops(&[
        "pause",
        "--topic",
        "pause.ping",
        "--for",
        "30m",
        "--reason",
        "provider down",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("paused topic pause.ping until "), "{out}");
    assert!(
        out.contains("no worker has served topic pause.ping yet"),
        "{out}"
    );
    let (code, out, _) = ops(&["stats"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("paused (") && out.contains("topic pause.ping  since"),
        "{out}"
    );
    assert!(out.contains("reason: provider down"), "{out}");
    let (_, out, _) = ops(&["stats", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(doc["pauses"][0]["name"], "pause.ping");
    assert_eq!(doc["pauses"][0]["scope"], "topic");
    let (_, out, _) = ops(&["pauses", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(doc[0]["reason"], "provider down");
    let (code, out, err) = ops(&["pause", "--handler", "nobody"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("no worker has run a handler named `nobody`"),
        "{err}"
    );
    let (code, out, _) = ops(&["resume", "--topic", "pause.ping"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            "resumed topic pause.ping; its messages are claimed again"
        )
    );
    let (code, out, _) = ops(&["pauses"]);
    assert_eq!((code, out.trim()), (0, "nothing is paused"));
    let (code, _, err) = ops(&["pause", "--topic", "t", "--handler", "h"]);
    assert_eq!(code, 2, "one target at a time: {err}");
    db.drop_db().await;
}
