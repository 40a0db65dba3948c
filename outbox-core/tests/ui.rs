//! Compile-time tests of `#[outbox_event]`: what it accepts, and how it explains each mistake.
//!
//! Each file under `ui/outbox_event/fail` makes one mistake; the `.stderr` beside it is the
//! diagnostic a user sees. Regenerate them with `TRYBUILD=overwrite` and read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/outbox_event/fail/*.rs");
    t.pass("tests/ui/outbox_event/pass/*.rs");
}
