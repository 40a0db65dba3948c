//! What is particular to MariaDB/MySQL, beside the shared suites that run on it too: the claim's
//! plans, InnoDB's conflicts in the caller's transaction, the packet limit, 4-byte UTF-8, and
//! connections killed in the middle of a drain.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox::{
    enqueue, enqueue_many, enqueue_with, outbox_event, Context, DatabaseErrorKind, EnqueueOptions,
    Error, Handler, HandlerError, Store, Worker, WorkerConfig,
};
use outbox_tests::{mysql, wait_until};
use serde::{Deserialize, Serialize};
use sqlx::{Connection, Row};

#[outbox_event(topic = "mysql.note")]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Note {
    n: i64,
    text: String,
}

fn note(n: i64) -> Note {
    Note {
        n,
        text: format!("note {n}"),
    }
}

/// Records every note it is handed.
struct Notes(Arc<Mutex<Vec<Note>>>, Arc<AtomicUsize>);

#[outbox::async_trait]
impl Handler for Notes {
    type Event = Note;
    const NAME: &'static str = "notes";

    async fn handle(&self, e: Note, _: &Context) -> Result<(), HandlerError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.lock().unwrap().push(e);
        Ok(())
    }
}

/// The rows of `EXPLAIN` for `sql` with `binds` (strings and integers), as (table, key, Extra).
async fn explain(
    pool: &sqlx::MySqlPool,
    sql: &str,
    binds: &[serde_json::Value],
) -> Vec<(Option<String>, Option<String>, String)> {
    let text = format!("EXPLAIN {sql}");
    let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
    for b in binds {
        q = match b {
            serde_json::Value::String(s) => q.bind(s.clone()),
            v => q.bind(v.as_i64().expect("an integer")),
        };
    }
    q.fetch_all(pool)
        .await
        .expect("EXPLAIN runs")
        .iter()
        .map(|r| {
            (
                r.try_get::<Option<String>, _>("table").unwrap(),
                r.try_get::<Option<String>, _>("key").unwrap(),
                r.try_get::<Option<String>, _>("Extra")
                    .unwrap()
                    .unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_claim_reads_its_index_in_due_order_and_never_sorts() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    // A table that looks like production: three topics, keyed and unkeyed rows, some running.
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Note> = (0..3_000).map(note).collect();
    enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    for (topic, n) in [("other.a", 2_000), ("other.b", 2_000)] {
        db.insert_raw(topic, "{}", n).await;
    }
    sqlx::query("UPDATE outbox_messages SET ordering_key = CONCAT('k', MOD(attempts + LENGTH(id), 50)) WHERE topic = 'other.b'")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE TABLE outbox_messages")
        .execute(&db.pool)
        .await
        .unwrap();

    let plan = explain(
        &db.pool,
        outbox::__private::MYSQL_CLAIM_UNKEYED,
        &["mysql.note".into(), 1.into(), 100.into()],
    )
    .await;
    assert_eq!(plan.len(), 1, "one table read: {plan:?}");
    let (table, key, extra) = &plan[0];
    assert_eq!(table.as_deref(), Some("outbox_messages"));
    assert_eq!(
        key.as_deref(),
        Some("outbox_messages_ready_idx"),
        "the claim reads the ready index: {plan:?}"
    );
    assert!(
        !extra.contains("filesort") && !extra.contains("temporary"),
        "the claim never sorts its candidates: {plan:?}"
    );

    // A page of the walk over the keys: a one-row probe, then a loose index scan.
    let plan = explain(
        &db.pool,
        outbox::__private::MYSQL_WALK_KEYS,
        &["".into(), "".into(), 100.into()],
    )
    .await;
    let reads: Vec<_> = plan.iter().filter(|(t, ..)| t.is_some()).collect();
    assert_eq!(reads.len(), 2, "{plan:?}");
    assert!(
        reads
            .iter()
            .all(|(_, key, _)| key.as_deref() == Some("outbox_messages_key_idx")),
        "{plan:?}"
    );
    assert!(
        reads[1].2.contains("Using index for group-by"),
        "the walk over many keys is a loose index scan, one probe per key: {plan:?}"
    );
    assert!(
        !reads.iter().any(|(.., e)| e.contains("filesort")),
        "{plan:?}"
    );
    db.drop_db().await;
}

#[outbox_event(topic = "mysql.keyed", ordering_key = "key")]
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Keyed {
    key: String,
    n: i64,
}

/// `Handler_read_*` of this session after running `sql` with `binds` (strings, integers or
/// NULL), with the rows it returned as (key, head).
async fn index_reads(
    conn: &mut sqlx::MySqlConnection,
    sql: &str,
    binds: &[serde_json::Value],
) -> (i64, Vec<(String, Option<i64>)>) {
    sqlx::raw_sql("FLUSH STATUS")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql));
    for b in binds {
        q = match b {
            serde_json::Value::String(s) => q.bind(s.clone()),
            serde_json::Value::Null => q.bind(None::<String>),
            v => q.bind(v.as_i64().expect("an integer")),
        };
    }
    let rows = q.fetch_all(&mut *conn).await.expect("the statement runs");
    (handler_reads(conn).await, rows)
}

/// The sum of this session's `Handler_read_*` since its last `FLUSH STATUS`.
async fn handler_reads(conn: &mut sqlx::MySqlConnection) -> i64 {
    let reads: Vec<(String, String)> = sqlx::query_as(
        "SHOW SESSION STATUS WHERE Variable_name IN \
         ('Handler_read_key', 'Handler_read_next', 'Handler_read_prev', 'Handler_read_first', \
          'Handler_read_last', 'Handler_read_rnd_next')",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    reads.iter().map(|(_, v)| v.parse::<i64>().unwrap()).sum()
}

/// What [`walk_all`] met.
struct Walked {
    /// Every key once, in the order first met, with the head the walk gave it.
    heads: Vec<(String, i64)>,
    pages: usize,
    /// Pages MariaDB cut short at the walk's `ROWS EXAMINED` cap.
    cut: usize,
}

impl Walked {
    /// Every key of `expected` met once, in order, each with its true head.
    async fn check(&self, conn: &mut sqlx::MySqlConnection, expected: &[String]) {
        let keys: Vec<&str> = self.heads.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys, expected,
            "the walk meets every key once, in key order"
        );
        for (key, head) in &self.heads {
            let first: i64 = sqlx::query_scalar(
                "SELECT seq FROM outbox_messages WHERE ordering_key = ? ORDER BY seq LIMIT 1",
            )
            .bind(key)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
            assert_eq!(*head, first, "{key}'s head");
        }
    }
}

/// Walks every key a page of `page` keys at a time, through the claim's own statement, each
/// page after the greatest key of the one before, until a page comes back empty; checks that
/// no page reads more than the cap allows.
async fn walk_all(conn: &mut sqlx::MySqlConnection, page: i64) -> Walked {
    let mut after = String::new();
    let mut walked = Walked {
        heads: Vec::new(),
        pages: 0,
        cut: 0,
    };
    loop {
        assert!(walked.pages < 2_000, "the walk ends");
        sqlx::raw_sql("FLUSH STATUS")
            .execute(&mut *conn)
            .await
            .unwrap();
        let rows: Vec<(i64, String, i64)> = sqlx::query_as(outbox::__private::MYSQL_WALK_KEYS)
            .bind(&after)
            .bind(&after)
            .bind(page)
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let warnings: Vec<(String, u32, String)> = sqlx::query_as("SHOW WARNINGS")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
        let reads = handler_reads(conn).await;
        assert!(
            reads <= 2_100,
            "a page of the walk reads a bounded number of index entries: {reads}"
        );
        walked.pages += 1;
        if warnings.iter().any(|(_, code, _)| *code == 1931) {
            walked.cut += 1;
        }
        let Some(last) = rows.iter().map(|(_, k, _)| k.clone()).max() else {
            return walked;
        };
        for (_, k, h) in rows {
            if !walked.heads.iter().any(|(s, _)| *s == k) {
                walked.heads.push((k, h));
            }
        }
        after = last;
    }
}

/// An outbox table's statistics are usually those of a nearly empty table. Then a burst goes
/// into one key: finding the head of the key a worker just released must still read one index
/// entry, and a page of the walk over every key a bounded number, not every message of the key
/// (on such statistics the optimizer picked a plain range scan for `GROUP BY ordering_key` with
/// `MIN(id)` then, and one key of 20,000 messages drained ever slower).
#[tokio::test]
async fn heads_are_found_in_bounded_reads_whatever_the_statistics() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    // The statistics of the empty table, kept: no recalculation in the background.
    sqlx::raw_sql(
        "ANALYZE TABLE outbox_messages; ALTER TABLE outbox_messages STATS_AUTO_RECALC = 0",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut events: Vec<Keyed> = (0..5_000)
        .map(|n| Keyed {
            key: "hot".into(),
            n,
        })
        .collect();
    events.extend((0..100).map(|n| Keyed {
        key: format!("k{:02}", n % 50),
        n,
    }));
    let mut tx = db.pool.begin().await.unwrap();
    enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    let first_hot: i64 = sqlx::query_scalar(
        "SELECT seq FROM outbox_messages WHERE ordering_key = 'hot' ORDER BY seq LIMIT 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut conn = db.pool.acquire().await.unwrap();

    let (reads, heads) = index_reads(
        &mut conn,
        outbox::__private::MYSQL_KEY_HEAD,
        &["hot".into()],
    )
    .await;
    assert_eq!(heads, vec![("hot".to_string(), Some(first_hot))]);
    assert!(
        reads <= 4,
        "one key's head is one probe: {reads} index reads"
    );

    // The walk over every key, page by page as the claim walks it: each page reads a bounded
    // number of index entries whatever its plan (on these statistics a plain GROUP BY read all
    // 5,000 messages of the hot key), and every key comes with its true head.
    let walked = walk_all(&mut conn, 100).await;
    let mut expected: Vec<String> = (0..50).map(|n| format!("k{n:02}")).collect();
    expected.insert(0, "hot".into());
    walked.check(&mut conn, &expected).await;
    assert_eq!(walked.heads[0].1, first_hot);

    // Pages of 5,000 keys over 2,551: a page's loose index scan reads more than the cap of
    // 2,000 entries, so MariaDB cuts it short (warning 1931); the walk still meets every key,
    // and the group it cut still has its true head.
    let more: Vec<Keyed> = (0..2_500)
        .map(|n| Keyed {
            key: format!("m{n:04}"),
            n,
        })
        .collect();
    let mut tx = db.pool.begin().await.unwrap();
    enqueue_many(&mut *tx, &more).await.unwrap();
    tx.commit().await.unwrap();
    let walked = walk_all(&mut conn, 5_000).await;
    expected.extend((0..2_500).map(|n| format!("m{n:04}")));
    walked.check(&mut conn, &expected).await;
    assert!(
        walked.cut > 0,
        "a page over the cap is cut short: {} pages",
        walked.pages
    );

    drop(conn);
    db.drop_db().await;
}

#[tokio::test]
async fn a_payload_over_max_allowed_packet_is_refused_before_it_is_sent() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let limit: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let limit = usize::try_from(limit).unwrap();
    let big = Note {
        n: 1,
        text: "x".repeat(limit + 1024),
    };
    let options = EnqueueOptions::new().max_payload_bytes(limit * 2);
    let mut tx = db.pool.begin().await.unwrap();
    let kept = enqueue(&mut *tx, &note(0)).await.unwrap();
    let err = enqueue_with(&mut *tx, &big, &options)
        .await
        .expect_err("an insert over the packet limit is refused");
    assert!(
        matches!(err, Error::PacketTooLarge { limit: l, .. } if l == limit),
        "{err:?}"
    );
    assert!(err.is_payload_too_large());
    let message = err.to_string();
    assert!(
        message.contains(&limit.to_string()) && message.contains("max_allowed_packet"),
        "the error names the limit: {message}"
    );
    // Nothing reached the server: the transaction goes on and commits what it had.
    let after = enqueue(&mut *tx, &note(2)).await.unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM outbox_messages ORDER BY id")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(ids, vec![kept, after]);
    db.drop_db().await;
}

#[tokio::test]
async fn four_byte_utf8_round_trips_through_the_worker() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let text = "Harbour Loft 🏨 for 2 🧳, ☕ included, 𝄞 and 漢字";
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(
        &mut *tx,
        &Note {
            n: 7,
            text: text.into(),
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Worker::builder(&db.pool)
        .handler(Notes(seen.clone(), calls.clone()))
        .config(outbox_tests::jobs::config())
        .build()
        .unwrap();
    let running = outbox_tests::start(vec![worker]);
    wait_until(Duration::from_secs(20), "the note is handled", async || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    outbox_tests::stop(running).await;
    assert_eq!(seen.lock().unwrap()[0].text, text);
    db.drop_db().await;
}

/// Another connection in a transaction that holds a gap lock over the whole (empty) outbox
/// table at REPEATABLE READ, so that an insert waits for it (end it with `ROLLBACK`), and a
/// caller's connection whose lock waits time out after a second.
async fn gap_locked(db: &outbox_tests::MySqlDb) -> (sqlx::MySqlConnection, sqlx::MySqlConnection) {
    let mut holder = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    for sql in [
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "BEGIN",
        "SELECT id FROM outbox_messages WHERE id >= 0x00 FOR UPDATE",
    ] {
        sqlx::query(sql).execute(&mut holder).await.unwrap();
    }
    let mut caller = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut caller)
        .await
        .unwrap();
    (holder, caller)
}

#[tokio::test]
async fn a_lock_wait_in_the_callers_transaction_comes_back_classified_and_is_not_retried() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let (mut held, mut caller) = gap_locked(&db).await;
    let mut tx = caller.begin().await.unwrap();
    let started = Instant::now();
    let err = enqueue(&mut *tx, &note(1))
        .await
        .expect_err("the insert waits for the gap lock, then times out");
    let waited = started.elapsed();
    assert_eq!(
        err.database_kind(),
        Some(DatabaseErrorKind::Conflict),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("run the whole transaction again"),
        "the error says what to do: {err}"
    );
    assert!(
        waited < Duration::from_millis(2_500),
        "one wait of the session's 1 s timeout, not retried behind the caller's back: {waited:?}"
    );
    tx.rollback().await.unwrap();
    sqlx::query("ROLLBACK").execute(&mut held).await.unwrap();
    assert_eq!(db.count().await, 0);
    db.drop_db().await;
}

/// The user's trap: with the server's default `innodb_rollback_on_timeout = OFF`, a lock wait
/// timeout ends only the insert, and a caller who ignores the error and commits would store its
/// booking without the event. `enqueue` rolls the transaction back, so the commit stores
/// nothing, a later write in it fails rather than committing on its own, and the message says
/// what happened to the transaction.
#[tokio::test]
async fn a_caller_who_commits_after_a_lock_wait_timeout_stores_nothing() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let on_timeout: i64 = sqlx::query_scalar("SELECT CAST(@@innodb_rollback_on_timeout AS SIGNED)")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        on_timeout, 0,
        "the server's default, which ends only the statement"
    );
    sqlx::query("CREATE TABLE bookings (id BIGINT PRIMARY KEY) ENGINE = InnoDB")
        .execute(&db.pool)
        .await
        .unwrap();
    let (mut held, mut caller) = gap_locked(&db).await;
    let mut tx = caller.begin().await.unwrap();
    sqlx::query("INSERT INTO bookings (id) VALUES (1)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let err = enqueue(&mut *tx, &note(1))
        .await
        .expect_err("the insert waits for the gap lock, then times out");
    assert_eq!(err.database_kind(), Some(DatabaseErrorKind::Conflict));
    let line = err.line();
    for says in [
        "(1205)",
        "only that statement",
        "innodb_rollback_on_timeout",
        "run the whole transaction again",
        "enqueue has already rolled it back",
    ] {
        assert!(line.contains(says), "the error says {says:?}: {line}");
    }
    // The caller ignores the error: a later write fails instead of committing on its own...
    let write = sqlx::query("INSERT INTO bookings (id) VALUES (2)")
        .execute(&mut *tx)
        .await
        .expect_err("no write after the conflict");
    assert!(write.to_string().contains("READ ONLY"), "{write}");
    // ... and the commit stores nothing: not the booking without its event.
    tx.commit().await.unwrap();
    sqlx::query("ROLLBACK").execute(&mut held).await.unwrap();
    let bookings: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (bookings, db.count().await),
        (0, 0),
        "neither the booking nor its event"
    );
    // The connection goes on as usual.
    let mut tx = caller.begin().await.unwrap();
    sqlx::query("INSERT INTO bookings (id) VALUES (3)")
        .execute(&mut *tx)
        .await
        .unwrap();
    enqueue(&mut *tx, &note(3)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count().await, 1);
    db.drop_db().await;
}

#[tokio::test]
async fn a_deadlock_is_classified_as_a_conflict() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    sqlx::raw_sql(
        "CREATE TABLE rooms (id BIGINT PRIMARY KEY, booked INT NOT NULL DEFAULT 0) ENGINE = InnoDB;
         INSERT INTO rooms (id) VALUES (1), (2);",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let mut a = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    let mut b = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    let mut ta = a.begin().await.unwrap();
    let mut tb = b.begin().await.unwrap();
    enqueue(&mut *ta, &note(1)).await.unwrap();
    enqueue(&mut *tb, &note(2)).await.unwrap();
    sqlx::query("UPDATE rooms SET booked = 1 WHERE id = 1")
        .execute(&mut *ta)
        .await
        .unwrap();
    sqlx::query("UPDATE rooms SET booked = 1 WHERE id = 2")
        .execute(&mut *tb)
        .await
        .unwrap();
    // Each now wants the other's row: InnoDB picks a victim.
    let (ra, rb) = tokio::join!(
        sqlx::query("UPDATE rooms SET booked = 2 WHERE id = 2").execute(&mut *ta),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            sqlx::query("UPDATE rooms SET booked = 2 WHERE id = 1")
                .execute(&mut *tb)
                .await
        }
    );
    let victim = match (ra, rb) {
        (Err(e), Ok(_)) | (Ok(_), Err(e)) => e,
        other => panic!("exactly one deadlock victim, got {other:?}"),
    };
    let err = Error::from(victim);
    assert_eq!(err.database_kind(), Some(DatabaseErrorKind::Conflict));
    drop((ta, tb));
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_mid_drain_lose_nothing() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let n = 3_000;
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Note> = (0..n).map(note).collect();
    enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();

    // The worker on a pool of its own, whose connections are killed with the engine's.
    let door = Door::open(0, true).await;
    let (seen, calls, running) = notes_worker(&db, &door);
    let mut admin = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
    let mut kills = 0;
    for round in 0..3 {
        wait_until(Duration::from_secs(60), "the drain moves on", async || {
            calls.load(Ordering::SeqCst) >= (round + 1) * 600
        })
        .await;
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE() AND id <> CONNECTION_ID()",
        )
        .fetch_all(&mut admin)
        .await
        .unwrap();
        for id in ids {
            // A connection may end on its own meanwhile.
            if sqlx::query("KILL CONNECTION ?")
                .bind(id)
                .execute(&mut admin)
                .await
                .is_ok()
            {
                kills += 1;
            }
        }
    }
    assert!(kills >= 3, "connections were killed: {kills}");
    wait_until(
        Duration::from_secs(120),
        "every message is done",
        async || db.count().await == 0,
    )
    .await;
    outbox_tests::stop(running).await;
    all_handled(&seen, n);
    assert_eq!(db.count_status("dead").await, 0, "none dead-lettered");
    db.drop_db().await;
}

/// A stand-in for the server's port that can go down and come back: while down it refuses
/// new connections (closes them at once) and has closed every open one, as a restarting
/// server does.
struct Door {
    port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::AbortHandle,
}

impl Door {
    /// Listens on `port` (0: any free one), forwarding to the server while up.
    async fn open(port: u16, up: bool) -> Door {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(up));
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (is_up, held) = (up.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !is_up.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect("127.0.0.1:3306").await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap().push(task.abort_handle());
            }
        })
        .abort_handle();
        Door {
            port,
            up,
            conns,
            accept,
        }
    }

    /// Closes every connection and refuses new ones.
    fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    fn up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.accept.abort();
        self.down();
    }
}

/// A worker of [`Notes`] on a lazy pool through `door`, started in the background.
fn notes_worker(
    db: &outbox_tests::MySqlDb,
    door: &Door,
) -> (
    Arc<Mutex<Vec<Note>>>,
    Arc<AtomicUsize>,
    outbox_tests::Running,
) {
    let url = db
        .url
        .replace("127.0.0.1:3306", &format!("127.0.0.1:{}", door.port));
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy(&url)
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let calls = Arc::new(AtomicUsize::new(0));
    let worker = Worker::builder(Store::from(&pool))
        .handler(Notes(seen.clone(), calls.clone()))
        .config(
            WorkerConfig::default()
                .lease(Duration::from_secs(5))
                .batch_size(50)
                .concurrency(8),
        )
        .build()
        .unwrap();
    (seen, calls, outbox_tests::start(vec![worker]))
}

/// Every note of `0..n` handled at least once.
fn all_handled(seen: &Mutex<Vec<Note>>, n: i64) {
    let mut handled: Vec<i64> = seen.lock().unwrap().iter().map(|e| e.n).collect();
    handled.sort_unstable();
    handled.dedup();
    assert_eq!(
        handled,
        (0..n).collect::<Vec<_>>(),
        "every message was handled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_at_start_and_restarted_mid_drain_loses_nothing() {
    outbox_tests::skip_without_mysql!();
    let db = mysql().await;
    let n = 2_000;
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Note> = (0..n).map(note).collect();
    enqueue_many(&mut *tx, &events).await.unwrap();
    tx.commit().await.unwrap();

    // Down at start: the worker retries its connect.
    let door = Door::open(0, false).await;
    let (seen, calls, running) = notes_worker(&db, &door);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "nothing runs while the server is down"
    );
    door.up();
    // Twice down for a second in the middle of the drain, every connection closed.
    for round in 1..=2 {
        wait_until(Duration::from_secs(60), "the drain moves on", async || {
            calls.load(Ordering::SeqCst) >= round * 500
        })
        .await;
        door.down();
        tokio::time::sleep(Duration::from_secs(1)).await;
        door.up();
    }
    wait_until(
        Duration::from_secs(120),
        "every message is done",
        async || db.count().await == 0,
    )
    .await;
    outbox_tests::stop(running).await;
    all_handled(&seen, n);
    assert_eq!(db.count_status("dead").await, 0, "none dead-lettered");
    db.drop_db().await;
}
