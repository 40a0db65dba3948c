//! A topic whose ready messages no live worker serves is loud wherever an operator looks, on
//! every backend: `outbox stats` lists it apart, every worker's `/metrics` has its
//! `outbox_unserved_ready_messages` gauge and its `/health` turns 503 naming it once the oldest
//! of them has waited over 60 s; the workers that do run record the topics they serve.

use std::time::Duration;

use outbox::observe::PrometheusHandle;
use outbox::{
    enqueue_with, outbox_event, Context, EnqueueOptions, Handler, HandlerError, Store, Worker,
    WorkerConfig,
};
use outbox_tests::http_get;
use serde::{Deserialize, Serialize};

/// The topic the running worker serves.
#[outbox_event(topic = "unserved.served")]
#[derive(Debug, Serialize, Deserialize)]
struct Served {
    n: i64,
}

struct ServedHandler;

#[outbox::async_trait]
impl Handler for ServedHandler {
    type Event = Served;
    const NAME: &'static str = "served";

    async fn handle(&self, _: Served, _: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// `outbox stats` of the operations binary, which links no handler: its output.
fn ops_stats(url: &str, json: bool) -> String {
    let mut args = vec!["stats"];
    if json {
        args.push("--json");
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(&args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run the outbox command line");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The part of `outbox stats` after its unserved heading, if it has one.
fn unserved_section(out: &str) -> Option<&str> {
    out.split_once("ready messages that no live worker serves")
        .map(|(_, rest)| rest)
}

/// The check on one database, whose `forgotten` topic holds three ready messages two minutes
/// old (raw rows: the event's type lives in a crate no binary here links).
async fn unserved_is_loud(
    mut conn: StoreConn,
    url: &str,
    forgotten: &str,
    prometheus: &PrometheusHandle,
) {
    let store = conn.store();
    // No worker at all: the topic is listed apart, with no live worker.
    let out = ops_stats(url, false);
    let section = unserved_section(&out).unwrap_or_else(|| panic!("no unserved section:\n{out}"));
    assert!(section.contains(forgotten), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ops_stats(url, true)).unwrap();
    let listed: Vec<&str> = json["unserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["topic"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [forgotten], "{json}");
    assert!(
        json["unserved"][0]["oldest_ready_age_secs"]
            .as_f64()
            .unwrap()
            >= 110.0,
        "{json}"
    );

    let w = Worker::builder(store.clone())
        .handler(ServedHandler)
        .config(
            WorkerConfig::default()
                .name(format!("serves-{forgotten}"))
                .stats_interval(Duration::from_millis(100)),
        )
        .build()
        .unwrap();
    let server = outbox::observe::serve(
        "127.0.0.1:0".parse().unwrap(),
        prometheus.clone(),
        w.health(),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        w.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });

    let gauge = format!("outbox_unserved_ready_messages{{topic=\"{forgotten}\"}} 3");
    outbox_tests::wait_until(
        Duration::from_secs(15),
        "the unserved topic to fail health",
        async || {
            let (code, reason) = http_get(addr, "/health").await;
            code == 503 && reason.contains(forgotten)
        },
    )
    .await;
    let (_, reason) = http_get(addr, "/health").await;
    assert!(reason.contains("no live worker serves"), "{reason}");
    let metrics = http_get(addr, "/metrics").await.1;
    assert!(
        metrics.lines().any(|l| l == gauge),
        "{gauge} not in\n{metrics}"
    );

    // The running worker recorded its topic: a message of it waiting for its due time counts
    // the worker, and that topic is not reported.
    conn.enqueue_delayed().await;
    let stats = store.stats().await.unwrap();
    let served = stats
        .topics
        .iter()
        .find(|t| t.topic == "unserved.served")
        .unwrap();
    assert_eq!(
        (served.scheduled, served.live_workers, served.unserved()),
        (1, 1, false)
    );
    let out = ops_stats(url, false);
    let section = unserved_section(&out).unwrap();
    assert!(
        section.contains(forgotten) && !section.contains("unserved.served"),
        "{out}"
    );

    let _ = stop_tx.send(());
    running.await.unwrap().unwrap();
    server.shutdown();
}

/// A pool on any backend.
enum StoreConn {
    Pg(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
    MySql(sqlx::MySqlPool),
}

impl StoreConn {
    fn store(&self) -> Store {
        match self {
            StoreConn::Pg(p) => Store::from(p),
            StoreConn::Sqlite(p) => Store::from(p),
            StoreConn::MySql(p) => Store::from(p),
        }
    }

    /// Enqueues one `Served`, due in an hour.
    async fn enqueue_delayed(&mut self) {
        let later = EnqueueOptions::default().delay(Duration::from_secs(3600));
        match self {
            StoreConn::Pg(p) => {
                let mut tx = p.begin().await.unwrap();
                enqueue_with(&mut *tx, &Served { n: 1 }, &later)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            StoreConn::Sqlite(p) => {
                let mut tx = p.begin().await.unwrap();
                enqueue_with(&mut *tx, &Served { n: 1 }, &later)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
            StoreConn::MySql(p) => {
                let mut tx = p.begin().await.unwrap();
                enqueue_with(&mut *tx, &Served { n: 1 }, &later)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }
    }
}

// One test: the metrics recorder is the process's, installed once.
#[tokio::test]
async fn a_topic_no_live_worker_serves_shows_in_stats_metrics_and_health() {
    let prometheus = outbox::observe::install_prometheus().unwrap();

    let pg = outbox_tests::pg().await;
    pg.insert_raw("forgotten.pg", "{}", 3).await;
    sqlx::query("UPDATE outbox_messages SET available_at = now() - interval '2 minutes', created_at = now() - interval '2 minutes'")
        .execute(&pg.pool)
        .await
        .unwrap();
    unserved_is_loud(
        StoreConn::Pg(pg.pool.clone()),
        &pg.url,
        "forgotten.pg",
        &prometheus,
    )
    .await;
    pg.drop_db().await;

    let lite = outbox_tests::sqlite().await;
    lite.insert_raw("forgotten.sqlite", "{}", 3).await;
    sqlx::query("UPDATE outbox_messages SET available_at = available_at - 120000, created_at = created_at - 120000")
        .execute(&lite.pool)
        .await
        .unwrap();
    unserved_is_loud(
        StoreConn::Sqlite(lite.pool.clone()),
        &lite.url,
        "forgotten.sqlite",
        &prometheus,
    )
    .await;
    lite.drop_db().await;

    outbox_tests::skip_without_mysql!();
    let my = outbox_tests::mysql().await;
    my.insert_raw("forgotten.mysql", "{}", 3).await;
    sqlx::query("UPDATE outbox_messages SET available_at = available_at - 120000, created_at = created_at - 120000")
        .execute(&my.pool)
        .await
        .unwrap();
    unserved_is_loud(
        StoreConn::MySql(my.pool.clone()),
        &my.url,
        "forgotten.mysql",
        &prometheus,
    )
    .await;
    my.drop_db().await;
}
