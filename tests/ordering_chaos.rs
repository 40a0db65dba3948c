//! Per-key ordering under faults, on every backend: four `ordering-worker`
//! processes (tests/bin/ordering_worker.rs) drain keys of 20 messages each, spread over two
//! topics (one with two handlers), beside unordered messages, while a random worker is
//! SIGKILLed and restarted every 1 to 2 seconds and about 5 % of handler calls fail
//! transiently. A few keys have a poison message in the middle, which dies and must block the
//! rest of its key until it is retried.
//!
//! Checked, from the log of every handler call in the order the calls started:
//! - every handler saw each key's messages in increasing enqueue order, each at least once,
//!   none skipped (a repeat, after a failure or a kill, only repeats the message just seen);
//! - across the handlers of a key, no message started before the previous one was done;
//! - while a poison message was dead, no later message of its key started, the statistics
//!   reported the key's messages as blocked by a dead letter, and every unordered message was
//!   done; after `retry_dead` the keys drained in order.
//!
//! The CI variants run 200 keys (4,000 ordered messages) per backend. The full size,
//! 2,000 keys x 20 messages (40,000), is `#[ignore]`d:
//!
//! ```sh
//! cargo test -p outbox-tests --test ordering_chaos -- --ignored --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use outbox::{enqueue_many, outbox_event, DeadSelection, Store};
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

const STEPS: i64 = 20;
const WORKERS: usize = 4;
/// One key in this many has a poison message at step [`POISON_STEP`].
const POISON_EVERY: usize = 50;
const POISON_STEP: i64 = 10;
/// The least time between the producer's steps once the workers run.
const PACE: Duration = Duration::from_millis(500);

const WORKER_FLAGS: &[&str] = &[
    "--lease",
    "2.5",
    "--handler-timeout",
    "2",
    "--max-attempts",
    "8",
    "--retry-base",
    "0.05",
    "--retry-max",
    "0.5",
    "--no-jitter",
    "--concurrency",
    "16",
    "--batch-size",
    "16",
    "--poll-interval",
    "0.2",
    "--shutdown-timeout",
    "5",
];

#[outbox_event(topic = "chaos.a", ordering_key = "key", retain = "1d")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepA {
    key: String,
    seq: i64,
    #[serde(default)]
    poison: bool,
}

#[outbox_event(topic = "chaos.b", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepB {
    key: String,
    seq: i64,
    #[serde(default)]
    poison: bool,
}

#[outbox_event(topic = "chaos.plain")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlainWork {
    n: i64,
}

fn key_name(k: usize) -> String {
    format!("booking:{k}")
}

/// Whether step `seq` of key `k` goes to `chaos.a` (else `chaos.b`).
fn on_a(k: usize, seq: i64) -> bool {
    (seq + k as i64) % 3 != 0
}

fn poisoned(k: usize) -> bool {
    k % POISON_EVERY == 7
}

/// The database under test, PostgreSQL, SQLite or MariaDB.
enum Db {
    Pg(outbox_tests::TestDb),
    Sqlite(outbox_tests::SqliteDb),
    MySql(outbox_tests::MySqlDb),
}

impl Db {
    fn url(&self) -> &str {
        match self {
            Db::Pg(d) => &d.url,
            Db::Sqlite(d) => &d.url,
            Db::MySql(d) => &d.url,
        }
    }

    fn store(&self) -> Store {
        match self {
            Db::Pg(d) => Store::from(&d.pool),
            Db::Sqlite(d) => Store::from(&d.pool),
            Db::MySql(d) => Store::from(&d.pool),
        }
    }

    async fn exec(&self, sql: &'static str) {
        match self {
            Db::Pg(d) => sqlx::raw_sql(sql).execute(&d.pool).await.map(drop),
            Db::Sqlite(d) => sqlx::raw_sql(sql).execute(&d.pool).await.map(drop),
            Db::MySql(d) => sqlx::raw_sql(sql).execute(&d.pool).await.map(drop),
        }
        .expect("harness statement");
    }

    /// The harness's tables: the handlers' call log and the cure switch. (The key's column is
    /// `ord_key`: `key` is a reserved word on MySQL.)
    async fn create_log(&self) {
        match self {
            Db::Pg(_) => {
                self.exec(
                    "CREATE TABLE chaos_log (id BIGSERIAL PRIMARY KEY, handler TEXT NOT NULL, ord_key TEXT NOT NULL, \
                     seq BIGINT NOT NULL, attempt BIGINT NOT NULL, pid BIGINT NOT NULL); \
                     CREATE TABLE chaos_cured (x INTEGER)",
                )
                .await
            }
            Db::Sqlite(_) => {
                self.exec(
                    "CREATE TABLE chaos_log (id INTEGER PRIMARY KEY AUTOINCREMENT, handler TEXT NOT NULL, \
                     ord_key TEXT NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL, pid INTEGER NOT NULL); \
                     CREATE TABLE chaos_cured (x INTEGER)",
                )
                .await
            }
            Db::MySql(_) => {
                self.exec(
                    "CREATE TABLE chaos_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, handler TEXT NOT NULL, \
                     ord_key TEXT NOT NULL, seq BIGINT NOT NULL, attempt BIGINT NOT NULL, pid BIGINT NOT NULL); \
                     CREATE TABLE chaos_cured (x INTEGER)",
                )
                .await
            }
        }
    }

    /// Every handler call, in the order their log rows landed: (handler, key, seq, attempt).
    async fn log(&self) -> Vec<(String, String, i64, i64)> {
        let sql = "SELECT handler, ord_key, seq, attempt FROM chaos_log ORDER BY id";
        match self {
            Db::Pg(d) => sqlx::query_as(sql).fetch_all(&d.pool).await,
            Db::Sqlite(d) => sqlx::query_as(sql).fetch_all(&d.pool).await,
            Db::MySql(d) => sqlx::query_as(sql).fetch_all(&d.pool).await,
        }
        .expect("read the log")
    }

    /// The calls of one key in detail, for a failure message: (id, handler, seq, attempt, pid).
    async fn key_log(&self, key: &str) -> Vec<(i64, String, i64, i64, i64)> {
        // `?` on SQLite and MySQL, `$1` on PostgreSQL.
        let sql =
            "SELECT id, handler, seq, attempt, pid FROM chaos_log WHERE ord_key = ? ORDER BY id";
        match self {
            Db::Pg(d) => {
                sqlx::query_as(
                    "SELECT id, handler, seq, attempt, pid FROM chaos_log WHERE ord_key = $1 ORDER BY id",
                )
                .bind(key)
                .fetch_all(&d.pool)
                .await
            }
            Db::Sqlite(d) => sqlx::query_as(sql).bind(key).fetch_all(&d.pool).await,
            Db::MySql(d) => sqlx::query_as(sql).bind(key).fetch_all(&d.pool).await,
        }
        .expect("read the log")
    }

    /// Enqueues step `seq` of keys `keys`, one transaction.
    async fn enqueue_steps(&self, keys: std::ops::Range<usize>, seq: i64) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for k in keys {
            let (key, poison) = (key_name(k), poisoned(k) && seq == POISON_STEP);
            if on_a(k, seq) {
                a.push(StepA { key, seq, poison });
            } else {
                b.push(StepB { key, seq, poison });
            }
        }
        match self {
            Db::Pg(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &a).await.unwrap();
                enqueue_many(&mut *tx, &b).await.unwrap();
                tx.commit().await.unwrap();
            }
            Db::Sqlite(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &a).await.unwrap();
                enqueue_many(&mut *tx, &b).await.unwrap();
                tx.commit().await.unwrap();
            }
            Db::MySql(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &a).await.unwrap();
                enqueue_many(&mut *tx, &b).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
    }

    async fn enqueue_plain(&self, range: std::ops::Range<i64>) {
        let plain: Vec<PlainWork> = range.map(|n| PlainWork { n }).collect();
        match self {
            Db::Pg(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &plain).await.unwrap();
                tx.commit().await.unwrap();
            }
            Db::Sqlite(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &plain).await.unwrap();
                tx.commit().await.unwrap();
            }
            Db::MySql(d) => {
                let mut tx = d.pool.begin().await.unwrap();
                enqueue_many(&mut *tx, &plain).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
    }

    async fn drop_db(self) {
        match self {
            Db::Pg(d) => d.drop_db().await,
            Db::Sqlite(d) => d.drop_db().await,
            Db::MySql(d) => d.drop_db().await,
        }
    }
}

struct Fleet {
    url: String,
    logs: std::path::PathBuf,
    children: Vec<Child>,
}

impl Fleet {
    fn spawn(url: &str, logs: &Path, slot: usize) -> Child {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(logs.join(format!("worker-{slot}.log")))
            .expect("open the worker log");
        Command::new(env!("CARGO_BIN_EXE_ordering-worker"))
            .arg("--database-url")
            .arg(url)
            .args(WORKER_FLAGS)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("clone the log file")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn ordering-worker")
    }

    fn start(url: &str, logs: &Path) -> Self {
        Fleet {
            url: url.to_string(),
            logs: logs.to_path_buf(),
            children: (0..WORKERS).map(|i| Self::spawn(url, logs, i)).collect(),
        }
    }

    /// SIGKILLs worker `i`, waits for it and starts a new one in its place.
    async fn sigkill(&mut self, i: usize) {
        let _ = self.children[i].start_kill();
        let _ = self.children[i].wait().await;
        self.children[i] = Self::spawn(&self.url, &self.logs, i);
    }

    async fn stop(&mut self) {
        for c in &mut self.children {
            if let Some(pid) = c.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
        }
        for c in &mut self.children {
            if tokio::time::timeout(Duration::from_secs(30), c.wait())
                .await
                .is_err()
            {
                let _ = c.start_kill();
            }
        }
    }
}

/// xorshift64*: the kill schedule.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

async fn chaos(db: Db, keys: usize, drain_limit: Duration) {
    let backend = match &db {
        Db::Pg(_) => "postgres",
        Db::Sqlite(_) => "sqlite",
        Db::MySql(_) => "mysql",
    };
    db.create_log().await;
    let plain = (keys as i64) * 2;
    let poisoned_keys: Vec<usize> = (0..keys).filter(|k| poisoned(*k)).collect();
    let started = Instant::now();
    // The first half of every key's history before the workers start, the rest while they run.
    for seq in 0..STEPS / 2 {
        for chunk in (0..keys).step_by(500) {
            db.enqueue_steps(chunk..(chunk + 500).min(keys), seq).await;
        }
    }
    let logs = tempfile::tempdir().expect("log dir");
    let mut fleet = Fleet::start(db.url(), logs.path());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ keys as u64);
    let mut kills = 0;
    let mut next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1001));
    let mut kill_due = async |fleet: &mut Fleet, kills: &mut usize| {
        if Instant::now() >= next_kill {
            fleet.sigkill(rng.below(WORKERS as u64) as usize).await;
            *kills += 1;
            next_kill = Instant::now() + Duration::from_millis(1000 + rng.below(1001));
        }
    };
    // The second half comes in paced over at least 5 seconds, so that however fast a backend
    // drains, the kills (one every 1 to 2 seconds) land while work is in flight: at least two.
    for seq in STEPS / 2..STEPS {
        let paced = Instant::now() + PACE;
        for chunk in (0..keys).step_by(500) {
            db.enqueue_steps(chunk..(chunk + 500).min(keys), seq).await;
        }
        if seq == STEPS / 2 {
            db.enqueue_plain(0..plain).await;
        }
        kill_due(&mut fleet, &mut kills).await;
        while Instant::now() < paced {
            tokio::time::sleep(Duration::from_millis(50)).await;
            kill_due(&mut fleet, &mut kills).await;
        }
    }

    // Drain with kills until only the keys behind dead letters are left.
    let store = db.store();
    let blocked_expected = (STEPS - POISON_STEP - 1) * poisoned_keys.len() as i64;
    let deadline = Instant::now() + drain_limit;
    let stats = loop {
        let s = store.stats().await.expect("stats");
        let t = &s.total;
        if t.ready == 0
            && t.in_flight == 0
            && t.scheduled == 0
            && t.stalled == 0
            && t.dead >= poisoned_keys.len() as i64
            && t.blocked == t.blocked_by_dead
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: not drained within {drain_limit:?}: {t:?}"
        );
        kill_due(&mut fleet, &mut kills).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let drained_in = started.elapsed();
    let t = &stats.total;
    // Kills can exhaust a healthy message's attempts too; it then blocks its key like poison.
    assert!(
        t.blocked_by_dead >= blocked_expected,
        "{backend}: the keys behind dead letters are reported blocked: {t:?}"
    );
    let plain_left = stats
        .topics
        .iter()
        .find(|s| s.topic == "chaos.plain")
        .map(|s| s.pending())
        .unwrap_or(0);
    assert_eq!(
        plain_left, 0,
        "{backend}: unordered messages are never held back"
    );
    let log = db.log().await;
    for k in &poisoned_keys {
        let key = key_name(*k);
        let later: Vec<i64> = log
            .iter()
            .filter(|(_, lk, s, _)| *lk == key && *s > POISON_STEP)
            .map(|e| e.2)
            .collect();
        assert!(
            later.is_empty(),
            "{backend}: {key} ran past its dead message: {later:?}"
        );
    }
    let dead_at_block = t.dead;
    // A retried dead letter counts its attempts from 1 again.
    let retried_at = log.len();

    // The downstream recovers; an operator retries the dead letters; the keys drain in order.
    db.exec("INSERT INTO chaos_cured (x) VALUES (1)").await;
    assert_eq!(
        store.retry_dead(&DeadSelection::All).await.expect("retry"),
        dead_at_block as u64
    );
    let deadline = Instant::now() + drain_limit;
    loop {
        let t = store.stats().await.expect("stats").total;
        if t.pending() == 0 && t.dead == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: the retried keys did not drain: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fleet.stop().await;

    // The log, call by call. A row that lands after a newer attempt of the same message has
    // started comes from a superseded attempt: one whose lease lapsed or that timed out while
    // its INSERT waited (on SQLite, for the write lock), and which the fence has already
    // overruled. Its effect is late, not out of order; the order is checked without it.
    let log = db.log().await;
    let mut newest_attempt: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut superseded = 0usize;
    let mut per_handler: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (i, (h, k, s, attempt)) in log.iter().enumerate() {
        if i == retried_at {
            newest_attempt.clear();
        }
        let newest = newest_attempt.entry((k.clone(), *s)).or_insert(*attempt);
        if *attempt < *newest {
            superseded += 1;
            continue;
        }
        *newest = *attempt;
        per_handler
            .entry((h.clone(), k.clone()))
            .or_default()
            .push(*s);
        per_key.entry(k.clone()).or_default().push(*s);
    }
    let mut repeats = 0usize;
    for k in 0..keys {
        let key = key_name(k);
        for (handler, topic_a) in [("audit", true), ("mail", true), ("index", false)] {
            let want: BTreeSet<i64> = (0..STEPS).filter(|s| on_a(k, *s) == topic_a).collect();
            let seen = per_handler
                .get(&(handler.to_string(), key.clone()))
                .cloned()
                .unwrap_or_default();
            if seen.windows(2).any(|w| w[0] > w[1]) {
                panic!(
                    "{backend}: {handler} saw {key} out of order: {seen:?}\n{:?}",
                    db.key_log(&key).await
                );
            }
            let distinct: BTreeSet<i64> = seen.iter().copied().collect();
            assert_eq!(
                distinct, want,
                "{backend}: {handler} saw every step of {key} once at least"
            );
            repeats += seen.len() - distinct.len();
        }
        let all = &per_key[&key];
        for w in all.windows(2) {
            assert!(
                w[0] <= w[1],
                "{backend}: a step of {key} started before the previous one was done: {all:?}"
            );
        }
    }
    let plain_seen: BTreeSet<i64> = log.iter().filter(|e| e.0 == "plain").map(|e| e.2).collect();
    assert_eq!(
        plain_seen.len() as i64,
        plain,
        "{backend}: every unordered message ran"
    );
    println!(
        "ordering chaos {backend}: {keys} keys x {STEPS} = {} ordered + {plain} unordered messages, \
         {WORKERS} workers, {kills} SIGKILLs, {} calls ({repeats} repeats of a step, \
         {superseded} late rows of superseded attempts), \
         {dead_at_block} dead letters blocked {} messages until retried; drained to the block in {:.1} s, \
         {:.1} s in all",
        keys as i64 * STEPS,
        log.len(),
        t.blocked_by_dead,
        drained_in.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        kills >= 2,
        "{backend}: the run saw {kills} SIGKILLs; it needs at least 2"
    );
    db.drop_db().await;
}

/// A replay of `chaos.a`'s retained events to its handler `audit` while a worker of three is
/// SIGKILLed every 1 to 2 seconds and about 5 % of calls fail: it ends done, `audit` sees every
/// event at least once and each key's events first in their order, `mail` (the topic's other
/// handler) and `chaos.b`'s handler see nothing.
async fn replay_chaos(db: Db) {
    const KEYS: usize = 100;
    const REPLAY_STEPS: i64 = 10;
    db.create_log().await;
    for seq in 0..REPLAY_STEPS {
        db.enqueue_steps(0..KEYS, seq).await;
    }
    let logs = tempfile::tempdir().expect("log dir");
    let mut fleet = Fleet::start(db.url(), logs.path());
    let store = db.store();
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.stats().await.expect("stats").total.pending() > 0 {
        assert!(Instant::now() < deadline, "the live messages did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected: BTreeSet<(String, i64)> = (0..KEYS)
        .flat_map(|k| {
            (0..REPLAY_STEPS)
                .filter(move |s| on_a(k, *s))
                .map(move |s| (key_name(k), s))
        })
        .collect();
    db.exec("DELETE FROM chaos_log").await;

    let replay = store
        .start_replay(&outbox::ReplayRequest::new("chaos.a", "audit").rate(100))
        .await
        .expect("the replay starts");
    assert_eq!(replay.total, expected.len() as i64);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let ended = loop {
        tokio::time::sleep(Duration::from_millis(1000 + rng.below(1001))).await;
        let now = store
            .replay(replay.id)
            .await
            .expect("read")
            .expect("exists");
        if now.state != outbox::ReplayState::Running {
            break now;
        }
        assert!(Instant::now() < deadline, "the replay did not end: {now:?}");
        fleet.sigkill(rng.below(WORKERS as u64) as usize).await;
        kills += 1;
    };
    fleet.stop().await;
    assert_eq!(ended.state, outbox::ReplayState::Done, "{ended:?}");
    assert_eq!(
        (ended.delivered, ended.failed),
        (ended.total, 0),
        "{ended:?}"
    );
    assert!(
        kills >= 2,
        "the replay saw {kills} SIGKILLs; it needs at least 2"
    );

    let log = db.log().await;
    let others: Vec<_> = log.iter().filter(|(h, ..)| h != "audit").collect();
    assert!(
        others.is_empty(),
        "only the replay's handler is called: {others:?}"
    );
    let mut first_seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i64)> = BTreeSet::new();
    for (_, key, seq, _) in &log {
        if seen.insert((key.clone(), *seq)) {
            first_seen.entry(key.clone()).or_default().push(*seq);
        }
    }
    assert_eq!(seen, expected, "every event of the window, at least once");
    for (key, seqs) in &first_seen {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{key}'s events first arrived out of order: {seqs:?}"
        );
    }
    println!(
        "replay chaos: {} events, {} calls, {kills} kills",
        expected.len(),
        log.len()
    );
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_replay_goes_on_through_kills_and_failures() {
    replay_chaos(Db::Pg(outbox_tests::pg().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_replay_goes_on_through_kills_and_failures() {
    replay_chaos(Db::Sqlite(outbox_tests::sqlite().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_replay_goes_on_through_kills_and_failures() {
    outbox_tests::skip_without_mysql!();
    replay_chaos(Db::MySql(outbox_tests::mysql().await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keys_stay_in_order_through_kills_failures_and_dead_letters() {
    chaos(
        Db::Pg(outbox_tests::pg().await),
        200,
        Duration::from_secs(120),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keys_stay_in_order_through_kills_failures_and_dead_letters() {
    chaos(
        Db::Sqlite(outbox_tests::sqlite().await),
        200,
        Duration::from_secs(120),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keys_stay_in_order_through_kills_failures_and_dead_letters() {
    outbox_tests::skip_without_mysql!();
    chaos(
        Db::MySql(outbox_tests::mysql().await),
        200,
        Duration::from_secs(120),
    )
    .await;
}

/// The full size: 2,000 keys x 20 messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes on a small machine; run by hand with --ignored"]
async fn postgres_full_size() {
    chaos(
        Db::Pg(outbox_tests::pg().await),
        2000,
        Duration::from_secs(600),
    )
    .await;
}

/// The full size on SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes on a small machine; run by hand with --ignored"]
async fn sqlite_full_size() {
    chaos(
        Db::Sqlite(outbox_tests::sqlite().await),
        2000,
        Duration::from_secs(600),
    )
    .await;
}

/// The full size on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes on a small machine; run by hand with --ignored"]
async fn mysql_full_size() {
    outbox_tests::skip_without_mysql!();
    chaos(
        Db::MySql(outbox_tests::mysql().await),
        2000,
        Duration::from_secs(600),
    )
    .await;
}
