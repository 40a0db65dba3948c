//! Messages that a done write claims for the next step of their keys (PostgreSQL) wait in the
//! worker for a handler slot like any claimed message, and keep their lease meanwhile: the
//! worker enters each such batch into its running set the moment the done write hands it
//! over, not when the batches before it have started. The protocol's model (`tests/model`, its
//! "Findings") showed the race this guards: a batch waiting behind another outside the running
//! set is not renewed, another worker claims it past its lease, and the stale claim still runs
//! when its turn comes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{enqueue, outbox_event, Context, Handler, HandlerError, Wakeup, Worker, WorkerConfig};
use outbox_tests::wait_until;
use serde::{Deserialize, Serialize};

/// One step of a key, whose handler sleeps `sleep_ms`.
#[outbox_event(topic = "lapse.step", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Step {
    key: String,
    seq: i64,
    sleep_ms: u64,
}

/// Every handler call: (worker, key, seq, attempt), in the order they started.
type Calls = Arc<Mutex<Vec<(&'static str, String, i64, u32)>>>;

struct Run {
    worker: &'static str,
    calls: Calls,
}

#[outbox::async_trait]
impl Handler for Run {
    type Event = Step;
    const NAME: &'static str = "run";

    async fn handle(&self, e: Step, ctx: &Context) -> Result<(), HandlerError> {
        self.calls
            .lock()
            .unwrap()
            .push((self.worker, e.key.clone(), e.seq, ctx.attempt()));
        tokio::time::sleep(Duration::from_millis(e.sleep_ms)).await;
        Ok(())
    }
}

fn worker(store: &outbox::Store, name: &'static str, calls: &Calls) -> Worker {
    Worker::builder(store.clone())
        .handler(Run {
            worker: name,
            calls: calls.clone(),
        })
        .config(
            WorkerConfig::default()
                .lease(Duration::from_secs(1))
                .concurrency(2)
                .batch_size(2)
                .poll_interval(Duration::from_millis(50))
                .wakeup(Wakeup::Poll)
                .handler_timeout(Duration::from_secs(10)),
        )
        .build()
        .expect("the worker builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_claim_waiting_for_a_slot_keeps_its_lease() {
    let db = outbox_tests::pg().await;
    let store = outbox::Store::from(&db.pool);
    let step = |key: &str, seq, sleep_ms| Step {
        key: key.into(),
        seq,
        sleep_ms,
    };
    // a1 and b1 run first; their done writes claim a2 and b2 while x and y (slower than the
    // lease) hold both handler slots: a2 waits in start_all, b2 behind it.
    let mut tx = db.pool.begin().await.unwrap();
    for s in [
        step("a", 1, 0),
        step("a", 2, 0),
        step("b", 1, 100),
        step("b", 2, 0),
        step("x", 1, 3000),
        step("y", 1, 3000),
    ] {
        enqueue(&mut *tx, &s).await.unwrap();
    }
    tx.commit().await.unwrap();

    let calls = Calls::default();
    let mut running = Vec::new();
    for (name, after) in [("w1", 0), ("w2", 500)] {
        let w = worker(&store, name, &calls);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        running.push((
            tx,
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after)).await;
                w.run_until(async {
                    let _ = rx.await;
                })
                .await
                .expect("the worker runs");
            }),
        ));
    }
    wait_until(Duration::from_secs(20), "every step done", async || {
        store.stats().await.unwrap().total.pending() == 0 && calls.lock().unwrap().len() >= 6
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (tx, task) in running {
        let _ = tx.send(());
        task.await.unwrap();
    }
    let calls = calls.lock().unwrap().clone();
    println!("handler calls (worker, key, seq, attempt): {calls:?}");
    let b2: Vec<_> = calls.iter().filter(|c| c.1 == "b" && c.2 == 2).collect();
    assert_eq!(
        b2.len(),
        1,
        "b2 waited for a handler slot with its lease renewed and ran once; it ran {b2:?}"
    );
    db.drop_db().await;
}
