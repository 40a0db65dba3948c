//! A dead letter that releases its key (`dead_releases_key`) lets the next messages of its key
//! run. Retried by an operator while one of them runs, it is again the earliest live message
//! of its key: it must wait for the messages of its key claimed before the retry (the worker
//! holds them, running or waiting for a handler slot), and run before those still pending, so
//! that a key never runs two messages at once. Found by the protocol's model: the retried
//! letter was claimed at once and ran beside its running successor. On every backend.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::{
    enqueue_with, outbox_event, Context, DeadSelection, EnqueueOptions, Handler, HandlerError,
    Store, Worker, WorkerConfig,
};
use outbox_tests::wait_until;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Step `seq` of key `k`: step 0 fails until healed, step 1 runs for two seconds.
#[outbox_event(topic = "retry.step")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    seq: i64,
}

/// One handler call: the step, its attempt, and when it started and ended.
#[derive(Debug, Clone)]
struct Call {
    seq: i64,
    attempt: u32,
    started: Instant,
    ended: Option<Instant>,
}

type Calls = Arc<Mutex<Vec<Call>>>;

struct RunStep {
    calls: Calls,
    healed: Arc<AtomicBool>,
}

#[outbox::async_trait]
impl Handler for RunStep {
    type Event = Step;
    const NAME: &'static str = "step";

    async fn handle(&self, e: Step, ctx: &Context) -> Result<(), HandlerError> {
        let index = {
            let mut calls = self.calls.lock().unwrap();
            calls.push(Call {
                seq: e.seq,
                attempt: ctx.attempt(),
                started: Instant::now(),
                ended: None,
            });
            calls.len() - 1
        };
        let result = if e.seq == 0 && !self.healed.load(Ordering::SeqCst) {
            Err(HandlerError::permanent("the first step fails until healed"))
        } else {
            if e.seq == 1 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(())
        };
        self.calls.lock().unwrap()[index].ended = Some(Instant::now());
        result
    }
}

async fn enqueue_steps<C>(mut conn: C) -> Uuid
where
    C: std::ops::DerefMut + Send,
    C::Target: outbox::Connection,
{
    let releasing = EnqueueOptions::new()
        .ordering_key("k")
        .dead_releases_key(true);
    let mut ids = Vec::new();
    for seq in 0..3 {
        ids.push(
            enqueue_with(&mut *conn, &Step { seq }, &releasing)
                .await
                .unwrap(),
        );
    }
    ids[0]
}

async fn the_retried_release_waits_for_the_running_successor(store: Store, first: Uuid) {
    let calls = Calls::default();
    let healed = Arc::new(AtomicBool::new(false));
    let worker = |calls: &Calls, concurrency| {
        Worker::builder(store.clone())
            .handler(RunStep {
                calls: calls.clone(),
                healed: healed.clone(),
            })
            .config(
                WorkerConfig::default()
                    .concurrency(concurrency)
                    .batch_size(3)
                    .poll_interval(Duration::from_millis(50)),
            )
            .build()
            .unwrap()
    };

    // Step 0 fails for good and is dead, releasing its key.
    let report = worker(&calls, 1).run_once().await.unwrap();
    assert_eq!((report.claimed, report.dead), (1, 1), "{report:?}");
    healed.store(true, Ordering::SeqCst);

    // Two handler slots: step 1 (the key's head now) runs; step 2 waits behind it.
    let running_worker = worker(&calls, 2);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        running_worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    wait_until(Duration::from_secs(10), "step 1 runs", async || {
        calls.lock().unwrap().iter().any(|c| c.seq == 1)
    })
    .await;
    // The operator retries step 0 while step 1 runs: it is the key's earliest live message
    // again, with a free handler slot.
    assert_eq!(
        store.retry_dead(&DeadSelection::One(first)).await.unwrap(),
        1
    );
    wait_until(Duration::from_secs(20), "every message done", async || {
        store.stats().await.unwrap().total.pending() == 0 && calls.lock().unwrap().len() >= 4
    })
    .await;
    let _ = stop.send(());
    running.await.unwrap();

    let calls = calls.lock().unwrap().clone();
    println!("handler calls: {calls:?}");
    let order: Vec<(i64, u32)> = calls.iter().map(|c| (c.seq, c.attempt)).collect();
    assert_eq!(
        order,
        [(0, 1), (1, 1), (0, 1), (2, 1)],
        "after the retry, step 0 runs once step 1 is done, and before step 2"
    );
    let step1_ended = calls[1].ended.expect("step 1 ended");
    assert!(
        calls[2].started >= step1_ended,
        "the retried step 0 started {:?} before its running successor ended",
        step1_ended - calls[2].started
    );
}

outbox_tests::all_backends! {
    async fn a_retried_released_letter_waits_for_its_running_successor(db, store, pool) {
        let mut tx = pool.begin().await.unwrap();
        let first = enqueue_steps(&mut *tx).await;
        tx.commit().await.unwrap();
        the_retried_release_waits_for_the_running_successor(store, first).await;
        let _ = &db;
    }
}
