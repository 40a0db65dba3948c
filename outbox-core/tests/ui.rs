//! Compile-time tests of `#[outbox_event]`: what it accepts, and how it explains each mistake.
//!
//! Each file under `ui/outbox_event/fail` makes one mistake; the `.stderr` beside it is the
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
