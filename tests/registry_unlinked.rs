//! A handler crate that is not linked registers nothing, and the registry says so by name.
//!
//! On SQLite only, as a database at hand: the registry and its checks are the same on every
//! backend, so there is no PostgreSQL or MariaDB variant.

use fixture_events::FixtureShipped;
use outbox::{
    outbox_event, register_handler, Context, FromResources, Handler, HandlerError, Registry,
    ResourceError, Resources,
};
use serde::{Deserialize, Serialize};

#[outbox_event]
#[derive(Serialize, Deserialize)]
struct RoomCleaned {
    room: String,
}

macro_rules! handler_named {
    ($ty:ident, $name:literal) => {
        struct $ty;
        #[outbox::async_trait]
        impl Handler for $ty {
            type Event = RoomCleaned;
            const NAME: &'static str = $name;
            async fn handle(&self, _: RoomCleaned, _: &Context) -> Result<(), HandlerError> {
                Ok(())
            }
        }
        impl FromResources for $ty {
            fn from_resources(_: &Resources) -> Result<Self, ResourceError> {
                Ok($ty)
            }
        }
        register_handler!($ty);
    };
}

handler_named!(NotifyHousekeeping, "notify");
handler_named!(NotifyFrontDesk, "notify");

#[test]
fn unlinked_handler_is_named_as_missing() {
    // The event type is linked (it is used here); its handler's crate is not.
    let _ = std::mem::size_of::<FixtureShipped>();
    let registry = Registry::linked();
    assert!(!registry.topics().contains_key("fixture.shipped"));

    let err = registry.check().unwrap_err();
    let text = err.to_string();
    assert!(text.contains("fixture_events::FixtureShipped"), "{text}");
    assert!(
        text.contains("`fixture.shipped` has no handler")
            || text.contains("(topic `fixture.shipped`) has no handler"),
        "{text}"
    );
    assert!(
        text.contains("registry_unlinked::NotifyFrontDesk")
            && text.contains("registry_unlinked::NotifyHousekeeping"),
        "{text}"
    );
    assert!(text.contains("share the name `notify`"), "{text}");
    assert_eq!(err.problems().len(), 2, "{text}");

    // Allowing the topic removes that problem, and only that one.
    let err = Registry::linked()
        .allow_unhandled("fixture.shipped")
        .check()
        .unwrap_err();
    assert_eq!(err.problems().len(), 1);

    let panic = std::panic::catch_unwind(outbox::assert_all_events_handled).unwrap_err();
    let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("fixture_events::FixtureShipped"), "{msg}");
}

#[test]
fn an_empty_registry_fails_its_check() {
    let err = Registry::empty().check().unwrap_err();
    assert!(
        err.to_string().contains("no handlers are registered"),
        "{err}"
    );
}

#[tokio::test]
async fn a_worker_refuses_to_start_when_a_declared_event_has_no_handler() {
    let _ = std::mem::size_of::<FixtureShipped>();
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    // One of the two `notify` handlers, so the only problem left is the unlinked crate.
    let registry = || Registry::linked().filter(|h| h.type_name().ends_with("NotifyHousekeeping"));
    let err = outbox::Worker::builder(&pool)
        .registry(registry())
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fixture_events::FixtureShipped")
            && err.contains("use my_handlers as _;")
            && err.contains("--served-elsewhere fixture.shipped"),
        "{err}"
    );
    // Declared as served elsewhere, or not strict: it builds.
    outbox::Worker::builder(&pool)
        .registry(registry().allow_unhandled("fixture.shipped"))
        .build()
        .unwrap();
    outbox::Worker::builder(&pool)
        .registry(registry())
        .strict(false)
        .build()
        .unwrap();
}

/// What a run of `unlinked-worker` (tests/bin/unlinked_worker.rs) gave: its exit code, stdout
/// and stderr.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `unlinked-worker` against the SQLite file at `url`, with `args` and the environment
/// variables `env` set.
fn run_unlinked_worker_on(url: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_unlinked-worker"))
        .args(["--database-url", url])
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("OUTBOX_SERVED_ELSEWHERE")
        .env_remove("UNLINKED_WORKER_WITHOUT_CONFIG")
        .envs(env.iter().copied())
        .output()
        .expect("run unlinked-worker");
    Run {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `unlinked-worker` against a fresh SQLite file, `--once`: its exit code and what it printed.
fn run_unlinked_worker(extra: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("outbox.sqlite").display());
    let run = run_unlinked_worker_on(&url, &[&["--once"], extra].concat(), &[]);
    (run.code, run.stderr)
}

#[test]
fn a_worker_binary_that_forgot_a_handler_crate_exits_with_a_configuration_error() {
    let (code, stderr) = run_unlinked_worker(&[]);
    assert_eq!(code, Some(i32::from(outbox::cli::exit::CONFIG)), "{stderr}");
    assert!(
        stderr.contains("fixture_events::FixtureShipped")
            && stderr.contains("use my_handlers as _;")
            && stderr.contains("--served-elsewhere fixture.shipped"),
        "{stderr}"
    );
    // The operator says another service's workers serve it: the worker runs.
    let (code, stderr) = run_unlinked_worker(&["--served-elsewhere", "fixture.shipped"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// The `missing:` lines of an `unlinked-worker --list-topics` that found something missing,
/// after checking what comes with them: the configuration error's exit code, the linked topic
/// listed first, and the pending message nobody here handles.
fn missing_of(run: &Run) -> Vec<&str> {
    let all = format!("{}{}", run.stdout, run.stderr);
    assert_eq!(
        run.code,
        Some(i32::from(outbox::cli::exit::CONFIG)),
        "{all}"
    );
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"unlinked.own: own"), "{all}");
    assert!(
        lines.contains(
            &"warning: 1 pending message(s) of topic fixture.shipped have no handler here"
        ),
        "{all}"
    );
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("missing: "))
        .collect()
}

#[tokio::test]
async fn list_topics_lists_what_is_linked_then_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("outbox.sqlite").display());
    // A message of the topic whose handler crate is not linked waits in the database.
    let pool = outbox::sqlite_pool(&url).await.unwrap();
    outbox::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    outbox::enqueue(&mut *tx, &FixtureShipped { id: 7 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    pool.close().await;
    // The event's handler crate is missing.
    let run = run_unlinked_worker_on(&url, &["--list-topics"], &[]);
    let missing = missing_of(&run);
    assert_eq!(missing.len(), 1, "{}", run.stdout);
    assert!(
        missing[0].contains("fixture_events::FixtureShipped")
            && missing[0].contains("--served-elsewhere fixture.shipped"),
        "{}",
        run.stdout
    );

    // And the handler that is linked cannot be built: both are named, the listing still comes.
    let run = run_unlinked_worker_on(
        &url,
        &["--list-topics"],
        &[("UNLINKED_WORKER_WITHOUT_CONFIG", "1")],
    );
    let missing = missing_of(&run);
    assert_eq!(missing.len(), 2, "{}", run.stdout);
    assert!(
        missing
            .iter()
            .any(|m| m.contains("cannot be built") && m.contains("unlinked_worker::OwnConfig")),
        "{}",
        run.stdout
    );
    assert!(
        missing
            .iter()
            .any(|m| m.contains("fixture_events::FixtureShipped")),
        "{}",
        run.stdout
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);

    // Served elsewhere and buildable: nothing is missing, and the worker would start.
    let run = run_unlinked_worker_on(
        &url,
        &["--list-topics", "--served-elsewhere", "fixture.shipped"],
        &[],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(!run.stdout.contains("missing:"), "{}", run.stdout);
    assert!(
        run.stdout.lines().any(
            |l| l == "served elsewhere: fixture.shipped (event fixture_events::FixtureShipped)"
        ),
        "{}",
        run.stdout
    );

    // The statistics need no handler at all.
    let run = run_unlinked_worker_on(
        &url,
        &["--stats"],
        &[("UNLINKED_WORKER_WITHOUT_CONFIG", "1")],
    );
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .lines()
            .any(|l| l.starts_with("fixture.shipped ")),
        "{}",
        run.stdout
    );
}
