//! Errors say what happened: real database failures (PostgreSQL, SQLite and MariaDB) are told apart as
//! connectivity, missing schema, constraint, data and bad argument, each with its own advice and
//! its own exit code, and the `outbox` command line refuses absurd arguments before any SQL.

use std::process::Output;
use std::time::Duration;

use outbox::cli::exit;
use outbox::{DatabaseErrorKind, Error};
use outbox_tests::{pg_empty, TestDb};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};

/// What the outbox makes of a real database error: its kind, exit code and one-line message.
fn seen(e: sqlx::Error) -> (Option<DatabaseErrorKind>, u8, String) {
    let e = Error::from(e);
    (
        e.database_kind(),
        exit::for_error(&e),
        outbox::cli::error_line(&e),
    )
}

fn assert_kind(
    what: &str,
    got: (Option<DatabaseErrorKind>, u8, String),
    kind: DatabaseErrorKind,
    code: u8,
    says: &str,
) {
    let (k, c, line) = got;
    assert_eq!(k, Some(kind), "{what}: {line}");
    assert_eq!(c, code, "{what}: exit code; {line}");
    assert!(line.contains(says), "{what}: `{line}` should say `{says}`");
}

#[tokio::test]
async fn postgres_errors_are_classified_by_what_happened() {
    let db = pg_empty().await;
    let pool = &db.pool;

    let e = sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(pool)
        .await
        .unwrap_err();
    // What a `main` returning `Box<dyn Error>` prints is the same line, with the server's
    // message and without its source position.
    let again = sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(pool)
        .await
        .unwrap_err();
    let debug = format!("{:?}", Error::from(again));
    assert!(
        debug.contains("run `outbox migrate`")
            && debug.contains("relation \"outbox_messages\" does not exist")
            && !debug.contains(" at line ")
            && !debug.contains("PgDatabaseError"),
        "{debug}"
    );
    assert_kind(
        "42P01 undefined table",
        seen(e),
        DatabaseErrorKind::MissingSchema,
        exit::SCHEMA,
        "run `outbox migrate`",
    );

    pool.execute("CREATE TABLE t (id BIGINT PRIMARY KEY, at TIMESTAMPTZ)")
        .await
        .unwrap();
    let e = sqlx::query("SELECT no_such_column FROM t")
        .execute(pool)
        .await
        .unwrap_err();
    assert_kind(
        "42703 undefined column",
        seen(e),
        DatabaseErrorKind::MissingSchema,
        exit::SCHEMA,
        "outbox tables are missing",
    );

    pool.execute("INSERT INTO t VALUES (1, now())")
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t VALUES (1, now())")
        .execute(pool)
        .await
        .unwrap_err();
    assert_kind(
        "23505 unique violation",
        seen(e),
        DatabaseErrorKind::Constraint,
        exit::CONSTRAINT,
        "breaks a constraint",
    );

    // What `outbox purge --older-than 1000000000y` would send if durations were not bounded.
    let e = sqlx::query("SELECT now() - make_interval(secs => $1)")
        .bind(1_000_000_000.0 * 365.25 * 86_400.0)
        .execute(pool)
        .await
        .unwrap_err();
    let got = seen(e);
    assert_kind(
        "22008 timestamp out of range",
        got.clone(),
        DatabaseErrorKind::Data,
        exit::DATA,
        "invalid or out of range",
    );
    assert!(
        got.2.contains("out of range"),
        "the database's words follow: {}",
        got.2
    );

    // An administrator ends the session (57P01), then the server is unreachable.
    let mut conn = pool.acquire().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await
        .unwrap();
    let e = sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .unwrap_err();
    assert_kind(
        "terminated session",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );
    drop(conn);

    let e = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert_kind(
        "connection refused",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );

    let closed = sqlx::PgPool::connect(&db.url).await.unwrap();
    closed.close().await;
    let e = sqlx::query("SELECT 1").execute(&closed).await.unwrap_err();
    assert_kind(
        "closed pool",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );

    assert_bad_url("postgres://postgres@:99999999/x").await;
    db.drop_db().await;
}

#[tokio::test]
async fn sqlite_errors_are_classified_by_what_happened() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("e.sqlite").display());
    let pool = outbox::sqlite_pool(&url).await.unwrap();

    let e = sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_kind(
        "no such table",
        seen(e),
        DatabaseErrorKind::MissingSchema,
        exit::SCHEMA,
        "run `outbox migrate`",
    );

    pool.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .await
        .unwrap();
    let e = sqlx::query("INSERT INTO t (id, name) VALUES (1, NULL)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_kind(
        "not null",
        seen(e),
        DatabaseErrorKind::Constraint,
        exit::CONSTRAINT,
        "breaks a constraint",
    );

    // Another connection holds the write lock; this one does not wait.
    let mut holder = pool.acquire().await.unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let opts: SqliteConnectOptions = url.parse().unwrap();
    let mut impatient = opts.busy_timeout(Duration::ZERO).connect().await.unwrap();
    let e = sqlx::query("INSERT INTO t (id, name) VALUES (2, 'x')")
        .execute(&mut impatient)
        .await
        .unwrap_err();
    assert_kind(
        "database is locked",
        seen(e),
        DatabaseErrorKind::Busy,
        exit::DATABASE,
        "sqlite_begin_immediate",
    );
    holder.execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn mysql_errors_are_classified_by_what_happened() {
    outbox_tests::skip_without_mysql!();
    let db = outbox_tests::mysql_empty().await;
    let pool = &db.pool;

    let e = sqlx::query("SELECT count(*) FROM outbox_messages")
        .execute(pool)
        .await
        .unwrap_err();
    assert_kind(
        "1146 no such table",
        seen(e),
        DatabaseErrorKind::MissingSchema,
        exit::SCHEMA,
        "run `outbox migrate`",
    );

    pool.execute(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, name VARCHAR(8) NOT NULL, n TINYINT) \
         ENGINE = InnoDB",
    )
    .await
    .unwrap();
    let e = sqlx::query("SELECT no_such_column FROM t")
        .execute(pool)
        .await
        .unwrap_err();
    assert_kind(
        "1054 unknown column",
        seen(e),
        DatabaseErrorKind::MissingSchema,
        exit::SCHEMA,
        "outbox tables are missing",
    );

    pool.execute("INSERT INTO t VALUES (1, 'a', 0)")
        .await
        .unwrap();
    for (what, sql) in [
        ("1062 duplicate key", "INSERT INTO t VALUES (1, 'b', 0)"),
        ("1048 not null", "INSERT INTO t VALUES (2, NULL, 0)"),
    ] {
        let e = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_kind(
            what,
            seen(e),
            DatabaseErrorKind::Constraint,
            exit::CONSTRAINT,
            "breaks a constraint",
        );
    }
    for (what, sql) in [
        (
            "1406 data too long",
            "INSERT INTO t VALUES (3, 'too long a name', 0)",
        ),
        ("1264 out of range", "INSERT INTO t VALUES (4, 'x', 1000)"),
    ] {
        let e = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_kind(
            what,
            seen(e),
            DatabaseErrorKind::Data,
            exit::DATA,
            "invalid or out of range",
        );
    }

    // Another transaction holds the row; this one waits a second for it, then gives up.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("UPDATE t SET n = 1 WHERE id = 1")
        .execute(&mut *holder)
        .await
        .unwrap();
    let mut impatient = pool.acquire().await.unwrap();
    impatient
        .execute("SET SESSION innodb_lock_wait_timeout = 1")
        .await
        .unwrap();
    let e = sqlx::query("UPDATE t SET n = 2 WHERE id = 1")
        .execute(&mut *impatient)
        .await
        .unwrap_err();
    // Its exit code is not checked: `exit::for_error` gives a conflict no code of its own
    // (it falls to FAILURE, as an unclassified error).
    let (kind, _, line) = seen(e);
    assert_eq!(
        kind,
        Some(DatabaseErrorKind::Conflict),
        "1205 lock wait timeout: {line}"
    );
    assert!(
        line.contains("run the whole transaction again"),
        "1205 lock wait timeout: {line}"
    );
    holder.rollback().await.unwrap();
    drop(impatient);

    // An administrator ends the session, then the server is unreachable.
    let mut conn = pool.acquire().await.unwrap();
    let id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(pool)
        .await
        .unwrap();
    let e = sqlx::query("SELECT 1")
        .execute(&mut *conn)
        .await
        .unwrap_err();
    assert_kind(
        "killed session",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );
    conn.detach();

    let e = sqlx::MySqlConnection::connect("mysql://root@127.0.0.1:1/none")
        .await
        .unwrap_err();
    assert_kind(
        "connection refused",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );

    let missing = format!("{}_missing", db.name);
    let mut opts: sqlx::mysql::MySqlConnectOptions = db.url.parse().unwrap();
    opts = opts.database(&missing);
    let e = opts.connect().await.unwrap_err();
    assert_kind(
        "1049 unknown database",
        seen(e),
        DatabaseErrorKind::Connection,
        exit::DATABASE,
        "cannot reach the database",
    );

    assert_bad_url("mysql://root@:99999999/x").await;
    db.drop_db().await;
}

/// A URL `outbox::cli::connect` cannot use is an invalid argument, exit code USAGE.
async fn assert_bad_url(url: &str) {
    let e = outbox::cli::connect(url).await.unwrap_err();
    assert_eq!(
        e.database_kind(),
        Some(DatabaseErrorKind::InvalidArgument),
        "{e}"
    );
    assert_eq!(
        exit::for_error(&e),
        exit::USAGE,
        "a bad URL is a bad argument"
    );
}

fn ops(url: &str, args: &[&str]) -> (i32, String) {
    let o: Output = std::process::Command::new(env!("CARGO_BIN_EXE_ops"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("run the outbox command line");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_command_line_exit_code_and_message_say_what_went_wrong() {
    let db: TestDb = pg_empty().await;

    // Not migrated: say so, and how to fix it.
    let (code, err) = ops(&db.url, &["stats"]);
    assert_eq!(code, 5, "missing schema: {err}");
    assert!(err.contains("run `outbox migrate`"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let (code, err) = ops(&db.url, &["migrate"]);
    assert_eq!(code, 0, "{err}");

    // Absurd durations and batches are bad arguments, refused before any SQL.
    for args in [
        &["purge", "--older-than", "1000000000y"][..],
        &["purge", "--older-than", "101y"],
        &["dead", "list", "--older-than", "1000000000y"],
        &["purge", "--older-than", "1h", "--batch", "0"],
        &[
            "purge",
            "--older-than",
            "1h",
            "--batch",
            "99999999999999999999",
        ],
    ] {
        let (code, err) = ops(&db.url, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.starts_with("error:"), "{args:?}: {err}");
        assert!(
            err.contains("too long") || err.contains("batch size"),
            "{args:?} names the problem: {err}"
        );
        assert!(!err.contains("out of range"), "no SQL ran: {err}");
    }
    // The longest accepted retention still works on the real database.
    let (code, err) = ops(&db.url, &["purge", "--older-than", "100y"]);
    assert_eq!(code, 0, "100y is allowed: {err}");

    let (code, err) = ops("postgres://postgres@127.0.0.1:1/none", &["stats"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("cannot reach the database"), "{err}");

    let (code, err) = ops("postgres://postgres@:99999999/x", &["stats"]);
    assert_eq!(code, 2, "a malformed URL is a bad argument: {err}");
    db.drop_db().await;
}

/// A worker on a database `migrate` never ran on refuses to start, naming the fix, instead of
/// retrying for ever: in the library ...
async fn run_until_refuses_an_unmigrated_database(store: outbox::Store) {
    let (worker, _) = outbox_tests::jobs::worker(store);
    let ran = tokio::time::timeout(
        Duration::from_secs(10),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("run_until returns instead of retrying for ever");
    let e = ran.expect_err("no outbox tables: an error");
    assert_eq!(
        e.database_kind(),
        Some(DatabaseErrorKind::MissingSchema),
        "{e}"
    );
    assert!(e.to_string().contains("outbox migrate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_unmigrated_postgres_database() {
    let db = pg_empty().await;
    run_until_refuses_an_unmigrated_database(outbox::Store::from(&db.pool)).await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_unmigrated_sqlite_database() {
    let db = outbox_tests::sqlite_empty().await;
    run_until_refuses_an_unmigrated_database(outbox::Store::from(&db.pool)).await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_unmigrated_mysql_database() {
    outbox_tests::skip_without_mysql!();
    let db = outbox_tests::mysql_empty().await;
    run_until_refuses_an_unmigrated_database(outbox::Store::from(&db.pool)).await;
    db.drop_db().await;
}

/// ... and a worker binary exits with the schema's exit code and says what to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_binary_refuses_an_unmigrated_database_with_the_schema_exit_code() {
    let db = pg_empty().await;
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .args(["--database-url", &db.url, "--no-migrate"])
            .env("RUST_LOG", "off")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the worker exits instead of retrying for ever")
    .expect("run test-worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(i32::from(exit::SCHEMA)), "{stderr}");
    assert!(stderr.contains("outbox migrate"), "{stderr}");
    db.drop_db().await;
}
