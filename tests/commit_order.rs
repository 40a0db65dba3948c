//! A key's order is its commit order, whatever the producers' clocks say, on every backend.
//!
//! Two `order-producer` processes (tests/bin/order_producer.rs) write the same 20 aggregates,
//! each write under the aggregate's row lock (read and bump its version, enqueue the event of
//! that version with the aggregate as ordering key, commit), so an aggregate's versions are the
//! order in which its writes committed. One of the producers runs under libfaketime with its
//! wall clock shifted back by 0, 10 ms, 100 ms or 1 s; the shift is measured, not assumed. A
//! worker handles the events meanwhile, and every aggregate's versions must reach its handler
//! in increasing order, each once.
//!
//! Message ids (UUID v7) come from each producer's clock; when the order of a key was the order
//! of the ids, the shifted producer's events overtook the other's, and ids minted in the same
//! millisecond by two processes were ordered by chance. The database's insert order (`seq`)
//! does not depend on either.
//!
//! libfaketime is Debian's `faketime` package: without it these tests are skipped, saying so,
//! outside CI (`CI` or `OUTBOX_REQUIRE_FAKETIME=1` make that a failure; CI installs it).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::{outbox_event, Context, Handler, HandlerError, Store, Worker};
use outbox_tests::{start, stop, wait_until};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Aggregates both producers write, round-robin.
const AGGREGATES: i64 = 20;
/// Writes of each producer.
const WRITES: i64 = 750;

/// A new version of an aggregate, as the producers write it.
#[outbox_event(topic = "order.changed", ordering_key = "key")]
#[derive(Debug, Serialize, Deserialize)]
struct Changed {
    key: String,
    agg: i64,
    n: i64,
}

/// Records every call's (aggregate, version), in the order the calls started.
struct Record(Arc<Mutex<Vec<(i64, i64)>>>);

#[outbox::async_trait]
impl Handler for Record {
    type Event = Changed;
    const NAME: &'static str = "record";
    async fn handle(&self, e: Changed, _ctx: &Context) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push((e.agg, e.n));
        Ok(())
    }
}

/// Whether libfaketime's `faketime` is on this machine; a skip (said) or a failure (in CI)
/// when it is not.
fn faketime_here(test: &str) -> bool {
    let found = std::process::Command::new("faketime")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if found {
        return true;
    }
    let required = std::env::var("OUTBOX_REQUIRE_FAKETIME").is_ok_and(|v| v == "1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false");
    assert!(
        !required,
        "{test}: libfaketime's `faketime` is missing (Debian package `faketime`)"
    );
    eprintln!(
        "SKIPPED {test}: libfaketime's `faketime` is missing; `apt-get install faketime` to run it"
    );
    false
}

/// This process's wall clock less the machine's monotonic clock, in nanoseconds.
fn wall_less_monotonic() -> i128 {
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
    let mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    real - (i128::from(mono.tv_sec) * 1_000_000_000 + i128::from(mono.tv_nsec))
}

/// Starts a producer, its wall clock `behind` this process's (through libfaketime when not
/// zero), and returns it with the shift it measured, in nanoseconds (negative: behind).
async fn producer(
    url: &str,
    behind: Duration,
) -> (Child, BufReader<tokio::process::ChildStdout>, i128) {
    let bin = env!("CARGO_BIN_EXE_order-producer");
    let mut cmd = if behind.is_zero() {
        Command::new(bin)
    } else {
        let mut c = Command::new("faketime");
        c.args(["-m", "-f", &format!("-{:.3}", behind.as_secs_f64()), bin]);
        // Timers and the measurement below keep the machine's monotonic clock.
        c.env("DONT_FAKE_MONOTONIC", "1");
        c
    };
    let mut child = cmd
        .args([url, &WRITES.to_string(), &AGGREGATES.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn order-producer");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line)
        .await
        .expect("read the producer's clock");
    let mut parts = line.split_whitespace().skip(1).map(|n| n.parse::<i128>());
    let (Some(Ok(real)), Some(Ok(mono))) = (parts.next(), parts.next()) else {
        panic!("the producer printed no clock: {line:?}");
    };
    let shift = (real - mono) - wall_less_monotonic();
    (child, out, shift)
}

/// Runs both producers, one `behind`, beside a worker; returns, per aggregate, the versions in
/// the order the handler saw them.
async fn run(url: &str, store: Store, behind: Duration) -> BTreeMap<i64, Vec<i64>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::builder(store)
        .handler(Record(seen.clone()))
        .build()
        .expect("worker builds");
    let running = start(vec![worker]);
    let (mut shifted, mut shifted_out, shift) = producer(url, behind).await;
    let (mut plain, mut plain_out, _) = producer(url, Duration::ZERO).await;
    let expected = -i128::try_from(behind.as_nanos()).unwrap();
    assert!(
        (shift - expected).abs() < 2_000_000,
        "the shifted producer's clock is {:.3} ms off ours, where {:.3} ms were asked for: is \
         libfaketime working?",
        shift as f64 / 1e6,
        expected as f64 / 1e6
    );
    for (child, out) in [
        (&mut shifted, &mut shifted_out),
        (&mut plain, &mut plain_out),
    ] {
        let status = child.wait().await.expect("wait for the producer");
        let mut rest = String::new();
        tokio::io::AsyncReadExt::read_to_string(out, &mut rest)
            .await
            .expect("read the producer's output");
        assert!(status.success(), "a producer failed: {status}; {rest}");
        assert!(rest.contains(&format!("wrote {WRITES}")), "{rest}");
    }
    let total = usize::try_from(2 * WRITES).unwrap();
    wait_until(
        Duration::from_secs(120),
        "every event handled",
        async || seen.lock().unwrap().len() >= total,
    )
    .await;
    stop(running).await;
    let mut by_agg: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (agg, n) in seen.lock().unwrap().iter() {
        by_agg.entry(*agg).or_default().push(*n);
    }
    by_agg
}

/// The events handled after a later version of their aggregate.
fn out_of_order(by_agg: &BTreeMap<i64, Vec<i64>>) -> usize {
    by_agg
        .values()
        .map(|ns| {
            let mut highest = 0;
            ns.iter()
                .filter(|&&n| {
                    let late = n < highest;
                    highest = highest.max(n);
                    late
                })
                .count()
        })
        .sum()
}

/// The aggregates table both producers write, every aggregate at version 0.
fn setup_sql() -> String {
    let rows: Vec<String> = (0..AGGREGATES).map(|a| format!("({a}, 0)")).collect();
    format!(
        "CREATE TABLE aggregates (id BIGINT PRIMARY KEY, n BIGINT NOT NULL); \
         INSERT INTO aggregates (id, n) VALUES {}",
        rows.join(", ")
    )
}

/// The run with one producer `behind`: no event out of commit order, each version once.
async fn check(test: &str, url: &str, store: Store, behind: Duration) {
    let by_agg = run(url, store, behind).await;
    let late = out_of_order(&by_agg);
    eprintln!(
        "{test}: one producer {} ms behind: {late} of {} events handled out of commit order",
        behind.as_millis(),
        2 * WRITES
    );
    assert_eq!(late, 0, "events handled out of commit order: {by_agg:?}");
    let mut handled = 0;
    for (agg, ns) in &by_agg {
        handled += ns.len();
        assert_eq!(
            *ns,
            (1..=i64::try_from(ns.len()).unwrap()).collect::<Vec<_>>(),
            "aggregate {agg}: each version once, in order"
        );
    }
    assert_eq!(
        handled,
        usize::try_from(2 * WRITES).unwrap(),
        "every event, once"
    );
}

macro_rules! shifts {
    ($($name:ident: $ms:expr),*) => {
        outbox_tests::all_backends! {
            $(
                async fn $name(db, store, pool) {
                    if faketime_here(module_path!()) {
                        sqlx::raw_sql(sqlx::AssertSqlSafe(setup_sql()))
                            .execute(&pool)
                            .await
                            .expect("create the aggregates");
                        check(
                            concat!(module_path!(), "::", stringify!($name)),
                            &db.url,
                            store,
                            Duration::from_millis($ms),
                        )
                        .await;
                    }
                }
            )*
        }
    };
}

shifts! {
    producers_on_the_same_clock: 0,
    one_producer_10_ms_behind: 10,
    one_producer_100_ms_behind: 100,
    one_producer_1_s_behind: 1000
}

/// The statements of the previous release (its schema has no `seq`), per backend: its
/// producer's insert of a keyed message (`id`, payload, key) and its worker's dead letter of
/// one.
struct PreviousRelease {
    insert: &'static str,
    dead: &'static str,
}

const PG_PREVIOUS: PreviousRelease = PreviousRelease {
    insert: "INSERT INTO outbox_messages (id, topic, payload, ordering_key) \
             VALUES ($1, 'order.changed', $2::json, $3)",
    dead: "INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, \
                                   ordering_key) \
           VALUES ($1, 'order.changed', $2::json, 8, 'failed for good', now(), $3)",
};

const SQLITE_PREVIOUS: PreviousRelease = PreviousRelease {
    insert:
        "INSERT INTO outbox_messages (id, topic, payload, available_at, created_at, ordering_key) \
             VALUES (?1, 'order.changed', ?2, 0, 0, ?3)",
    dead:
        "INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at, \
                                   ordering_key) \
           VALUES (?1, 'order.changed', ?2, 8, 'failed for good', 0, 0, ?3)",
};

const MYSQL_PREVIOUS: PreviousRelease = PreviousRelease {
    insert:
        "INSERT INTO outbox_messages (id, topic, payload, available_at, created_at, ordering_key) \
             VALUES (?, 'order.changed', ?, 0, 0, ?)",
    dead:
        "INSERT INTO outbox_dead (id, topic, payload, attempts, last_error, created_at, dead_at, \
                                   ordering_key) \
           VALUES (?, 'order.changed', ?, 8, 'failed for good', 0, 0, ?)",
};

/// Runs one of [`PreviousRelease`]'s statements for message `id`, version `n` of aggregate
/// `agg`, on any backend's pool.
macro_rules! previous {
    ($pool:expr, $sql:expr, $id:expr, $agg:expr, $n:expr) => {{
        let agg: i64 = $agg;
        let payload = serde_json::json!({ "key": format!("agg:{agg}"), "agg": agg, "n": $n });
        let id: uuid::Uuid = $id;
        let q = sqlx::query($sql);
        // SQLite stores ids as text; the others as UUIDs (BINARY(16) on MySQL).
        let q = if $sql.contains("?1") {
            q.bind(id.to_string())
        } else {
            q.bind(id)
        };
        q.bind(payload.to_string())
            .bind(format!("agg:{agg}"))
            .execute(&$pool)
            .await
            .expect("the previous release's statement runs");
    }};
}

/// An upgrade from the previous release (migrations up to 11), on a database with live keyed
/// messages and a dead letter, while producers and workers of the previous release go on:
///
/// - aggregate 1: versions 1 to 3 inserted by the previous release out of id order (3, 1, 2);
///   it ordered them by id, and the migration keeps that order. Version 4 is then inserted by a
///   producer of the previous release (no `seq` named) after the upgrade: the database still
///   numbers it, after the others.
/// - aggregate 2: a dead letter of the previous release (version 1) holding version 2.
/// - aggregate 3: version 2 enqueued after the upgrade, behind a dead letter (version 1) that a
///   worker of the previous release wrote after the upgrade (no `seq`: 0), which holds it.
macro_rules! upgrade_test {
    ($name:ident, $empty:path, $previous:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            if stringify!($name).contains("mysql") {
                outbox_tests::skip_without_mysql!();
            }
            let db = $empty().await;
            let store = Store::from(&db.pool);
            let previous: PreviousRelease = $previous;
            outbox::__private::migrate_up_to(store.clone(), 11)
                .await
                .expect("the previous release's schema");
            let ids: Vec<uuid::Uuid> = (0..6).map(|_| uuid::Uuid::now_v7()).collect();
            for (i, n) in [(2, 3), (0, 1), (1, 2)] {
                previous!(db.pool, previous.insert, ids[i], 1, n);
            }
            previous!(db.pool, previous.dead, ids[3], 2, 1);
            previous!(db.pool, previous.insert, ids[4], 2, 2);

            outbox::migrate(store.clone())
                .await
                .expect("the upgrade applies");

            previous!(db.pool, previous.insert, uuid::Uuid::now_v7(), 1, 4);
            previous!(db.pool, previous.dead, ids[5], 3, 1);
            let mut tx = db.pool.begin().await.expect("begin");
            outbox::enqueue(
                &mut *tx,
                &Changed {
                    key: "agg:3".into(),
                    agg: 3,
                    n: 2,
                },
            )
            .await
            .expect("enqueue");
            tx.commit().await.expect("commit");

            let seen = Arc::new(Mutex::new(Vec::new()));
            let worker = Worker::builder(store.clone())
                .handler(Record(seen.clone()))
                .build()
                .expect("worker builds");
            let running = start(vec![worker]);
            wait_until(Duration::from_secs(30), "aggregate 1 handled", async || {
                seen.lock().unwrap().len() >= 4
            })
            .await;
            // Long enough for a held message to have been claimed, were it free.
            tokio::time::sleep(Duration::from_millis(500)).await;
            stop(running).await;
            assert_eq!(
                *seen.lock().unwrap(),
                vec![(1, 1), (1, 2), (1, 3), (1, 4)],
                "aggregate 1 in its order; aggregates 2 and 3 held by their dead letters"
            );
            let stats = store.stats().await.expect("stats");
            let topic = stats
                .topics
                .iter()
                .find(|t| t.topic == "order.changed")
                .expect("the topic's statistics");
            assert_eq!(topic.blocked_by_dead, 2, "{topic:?}");
            db.drop_db().await;
        }
    };
}

upgrade_test!(
    upgrade_keeps_order_on_postgres,
    outbox_tests::pg_empty,
    PG_PREVIOUS
);
upgrade_test!(
    upgrade_keeps_order_on_sqlite,
    outbox_tests::sqlite_empty,
    SQLITE_PREVIOUS
);
upgrade_test!(
    upgrade_keeps_order_on_mysql,
    outbox_tests::mysql_empty,
    MYSQL_PREVIOUS
);
