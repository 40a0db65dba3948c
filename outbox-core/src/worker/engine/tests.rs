//! The engine's start of a claimed message, against a real database: a message that waits for
//! a handler slot while its lease lapses, and that the same worker claims again, runs once
//! under the newer claim, whose outcome lands.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::{dispatch, Shared};
use crate::backend::Fence;
use crate::event::Event;
use crate::handler::{Context, Handler, HandlerError};
use crate::store::Store;
use crate::worker::{Worker, WorkerConfig};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ping;

impl Event for Ping {
    const TOPIC: &'static str = "engine.reclaim";
}

/// Counts its runs.
struct Count(Arc<AtomicU64>);

#[async_trait::async_trait]
impl Handler for Count {
    type Event = Ping;
    const NAME: &'static str = "count";

    async fn handle(&self, _: Ping, _: &Context) -> Result<(), HandlerError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One message, claimed while the only handler slot is taken; its lease lapses while it waits
/// and the same worker claims it again. The first claim's start then comes first: it must not
/// take the newer claim's record (the newer claim would never start, its outcome never be
/// written, and the worker would renew its lease until it stops), and the newer claim must run
/// and reach the flusher under its own token.
async fn a_lapsed_waiting_claim_reclaimed_by_its_worker_runs_under_the_new_claim(store: Store) {
    let runs = Arc::new(AtomicU64::new(0));
    let worker = Worker::builder(store.clone())
        .handler(Count(runs.clone()))
        .config(
            WorkerConfig::default()
                .lease(Duration::from_secs(1))
                .concurrency(1)
                .batch_size(1),
        )
        .build()
        .expect("the worker builds");
    let backend = store
        .backend()
        .detached(3)
        .await
        .expect("the engine's pool opens");
    let (finished_tx, finished_rx) = mpsc::unbounded_channel();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        worker: worker.clone(),
        backend: backend.clone(),
        handlers_rt: tokio::runtime::Handle::current(),
        flights: Mutex::new(HashMap::new()),
        stop: CancellationToken::new(),
        finished_tx,
        done_tx,
        permits: Arc::new(Semaphore::new(1)),
        waiting: AtomicBool::new(false),
        peers: AtomicI64::new(1),
        running_tasks: Arc::new(AtomicU64::new(0)),
        epoch: Instant::now(),
        host: crate::host::host(),
        wake: Arc::new(super::super::wake::Wakeups::default()),
        probing: Mutex::new(Default::default()),
        reset_sent: Mutex::new(Default::default()),
        last_success: Default::default(),
    });
    let collector = tokio::spawn(dispatch::collect(shared.clone(), finished_rx));

    // The only slot is busy: the first claim waits for it, not renewed here, past its lease.
    let slot = shared.permits.clone().acquire_owned().await.unwrap();
    let first = worker
        .claim(&*backend, 1, &[])
        .await
        .expect("the first claim");
    assert_eq!(first.len(), 1, "the first claim takes the message");
    let old = first[0].claim_token;
    shared.register(&first);
    let waiting = {
        let shared = shared.clone();
        tokio::spawn(async move { shared.start_registered(first).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = worker
        .claim(&*backend, 1, &[])
        .await
        .expect("the second claim");
    assert_eq!(
        second.len(),
        1,
        "the same worker claims the message again once its lease lapsed"
    );
    let new = second[0].claim_token;
    assert_ne!(old, new);
    shared.register(&second);
    // The slot frees: the first claim's start, waiting longest, comes first.
    drop(slot);
    waiting.await.unwrap();
    shared.start_registered(second).await;

    let done = tokio::time::timeout(Duration::from_secs(10), done_rx.recv()).await;
    let ran = runs.load(Ordering::SeqCst);
    let held: Vec<Fence> = super::lock(&shared.flights)
        .values()
        .map(|f| f.fence)
        .collect();
    match done {
        Ok(Some(d)) => assert_eq!(
            d.fence.claim_token, new,
            "the done outcome is the newer claim's (the old one's is {old})"
        ),
        _ => panic!(
            "no done outcome within 10 s for the newer claim {new}: the handler ran {ran} time(s), \
             and the worker still holds {held:?} (the first claim {old} started in its place, so \
             the newer claim never runs and its lease is renewed until the worker stops)"
        ),
    }
    assert_eq!(ran, 1, "the message ran once, under the newer claim");
    collector.abort();
    backend.close().await;
}

/// Migrates `pool`'s database, enqueues one `Ping`, runs the scenario on it and closes the
/// pool.
async fn on_pool<DB: sqlx::Database>(pool: sqlx::Pool<DB>)
where
    Store: From<sqlx::Pool<DB>>,
    DB::Connection: crate::backend::Connection,
{
    crate::migrate(Store::from(pool.clone()))
        .await
        .expect("migrations apply");
    let mut conn = pool.acquire().await.expect("a connection");
    crate::enqueue(&mut *conn, &Ping).await.expect("enqueued");
    drop(conn);
    a_lapsed_waiting_claim_reclaimed_by_its_worker_runs_under_the_new_claim(Store::from(
        pool.clone(),
    ))
    .await;
    pool.close().await;
}

#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_while_waiting_sqlite() {
    let dir = std::env::temp_dir().join(format!("outbox-engine-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("outbox.sqlite").display());
    let pool = crate::backend::sqlite::sqlite_pool(&url)
        .await
        .expect("SQLite opens");
    on_pool(pool).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_while_waiting_postgres() {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let admin = sqlx::PgPool::connect(&url).await.expect("PostgreSQL is up");
    let name = format!("outbox_engine_{}", uuid::Uuid::now_v7().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
    let pool = sqlx::PgPool::connect(&format!("{base}/{name}"))
        .await
        .unwrap();
    on_pool(pool).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaimed_while_waiting_mysql() {
    let url = std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into());
    let admin = match sqlx::MySqlPool::connect(&url).await {
        Ok(p) => p,
        Err(e) if std::env::var("OUTBOX_REQUIRE_MYSQL").is_ok_and(|v| v == "1") => {
            panic!("MariaDB at {url} is required (OUTBOX_REQUIRE_MYSQL=1): {e}")
        }
        Err(e) => {
            eprintln!("skipped: no MariaDB at {url} ({e})");
            return;
        }
    };
    let name = format!("outbox_engine_{}", uuid::Uuid::now_v7().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    let pool = sqlx::MySqlPool::connect(&format!("{}/{name}", url.trim_end_matches('/')))
        .await
        .unwrap();
    on_pool(pool).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
}
