//! Compile-time tests: what `#[outbox_event]` accepts and how it explains each mistake, and
//! how the compiler answers a first-time user's mistakes with `enqueue`.
//!
//! Each file under `ui/*/fail` makes one mistake; the `.stderr` beside it is the
//! diagnostic a user sees. Regenerate them with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    // Past the test harness's capture: the first run builds the crate and its dependencies for
    // the cases, which takes minutes on a small machine, and should not look hung.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "ui: compiling each #[outbox_event] case with trybuild (the first run builds outbox and its \
         dependencies for them, a few minutes on 2 cores)"
    );
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/outbox_event/fail/*.rs");
    t.pass("tests/ui/outbox_event/pass/*.rs");
}

/// `enqueue(&pool, ..)`, `enqueue(&mut pool, ..)` and `enqueue(&mut tx, ..)`: each answered
/// with what to pass instead (`&mut *tx`). The cases use PostgreSQL's pool, and the compiler
/// lists the connections that are accepted, so the expected output is that of a build with
/// both backends (as `cargo test --workspace` builds).
#[cfg(all(feature = "postgres", feature = "sqlite"))]
#[test]
fn ui_enqueue() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/enqueue/fail/*.rs");
}
