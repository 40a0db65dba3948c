//! The trace check on small hand-written traces: what it accepts and what it refuses.

use std::collections::HashMap;

use outbox_model::trace::{Final, Validator};

const A: &str = "0190a000-0000-7000-8000-00000000000a";
const B: &str = "0190a000-0000-7000-8000-00000000000b";

fn claim(t: u64, worker: &str, m: &str, token: &str, attempt: u32, key: Option<&str>) -> String {
    let key = key.map_or(String::new(), |k| format!(r#","key":"{k}""#));
    format!(
        r#"{{"t":{t},"action":"claim","worker":"{worker}","via":"claim","message":"{m}","token":"{token}","attempt":{attempt}{key}}}"#
    )
}

/// A claim of a keyed message that records its place in its key's order, as the workers do.
fn claim_at(t: u64, worker: &str, m: &str, token: &str, key: &str, seq: i64) -> String {
    let plain = claim(t, worker, m, token, 1, Some(key));
    format!(r#"{},"seq":{seq}}}"#, plain.trim_end_matches('}'))
}

/// [`claim_at`], recording the key's `releases_key` as well.
fn claim_releasing(t: u64, worker: &str, m: &str, token: &str, seq: i64, releases: bool) -> String {
    let plain = claim_at(t, worker, m, token, "k", seq);
    format!(
        r#"{},"releases_key":{releases}}}"#,
        plain.trim_end_matches('}')
    )
}

fn batch(t: u64, action: &str, worker: &str, m: &str, token: &str, written: u64) -> String {
    format!(
        r#"{{"t":{t},"action":"{action}","worker":"{worker}","messages":"{m}","tokens":"{token}","written":{written}}}"#
    )
}

fn failed(t: u64, worker: &str, m: &str, token: &str, retry: bool, written: bool) -> String {
    format!(
        r#"{{"t":{t},"action":"failed","worker":"{worker}","message":"{m}","token":"{token}","retry":{retry},"written":{written}}}"#
    )
}

fn stopped(t: u64, worker: &str) -> String {
    format!(r#"{{"t":{t},"action":"stopped","worker":"{worker}","complete":true}}"#)
}

fn validate(lines: &[String], finals: &[(&str, Final)]) -> Result<(), Vec<String>> {
    let events = Validator::parse(&lines.join("\n")).expect("the lines parse");
    let mut v = Validator::new();
    v.replay(events);
    let finals: HashMap<String, Final> = finals.iter().map(|(m, f)| (m.to_string(), *f)).collect();
    v.finish(&finals)
        .map(drop)
        .map_err(|vs| vs.iter().map(ToString::to_string).collect())
}

#[test]
fn a_retry_then_a_done_is_accepted() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        failed(2, "w1", A, "t1", true, true),
        claim(3, "w2", A, "t2", 2, None),
        batch(4, "done", "w2", A, "t2", 1),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    assert_eq!(validate(&trace, &[(A, Final::Done)]), Ok(()));
}

#[test]
fn a_stale_outcome_refused_by_the_fence_is_accepted() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", A, "t2", 2, None),
        failed(3, "w1", A, "t1", false, false),
        batch(4, "done", "w2", A, "t2", 1),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    assert_eq!(validate(&trace, &[(A, Final::Done)]), Ok(()));
}

#[test]
fn a_stale_outcome_that_lands_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", A, "t2", 2, None),
        failed(3, "w1", A, "t1", false, true),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    let errors = validate(&trace, &[(A, Final::Dead)]).unwrap_err();
    assert!(errors[0].contains("superseded"), "{errors:?}");
}

#[test]
fn a_claim_after_the_done_write_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        batch(2, "done", "w1", A, "t1", 1),
        claim(3, "w2", A, "t2", 2, None),
    ];
    let errors = validate(&trace, &[(A, Final::Done)]).unwrap_err();
    assert!(errors[0].contains("after its Done"), "{errors:?}");
}

#[test]
fn an_attempt_not_counted_at_claim_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        failed(2, "w1", A, "t1", true, true),
        claim(3, "w1", A, "t2", 1, None),
    ];
    let errors = validate(&trace, &[(A, Final::Live)]).unwrap_err();
    assert!(
        errors[0].contains("attempts were already counted"),
        "{errors:?}"
    );
}

#[test]
fn a_key_claimed_out_of_order_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, Some("k")),
        claim(2, "w2", B, "t2", 1, Some("k")),
        stopped(3, "w1"),
        stopped(4, "w2"),
    ];
    let errors = validate(&trace, &[(A, Final::Live), (B, Final::Live)]).unwrap_err();
    assert!(errors[0].contains("of its key holds it"), "{errors:?}");
}

/// B committed first (its `seq` is the smaller) though its id is the larger: the key's order
/// is B, then A, and a claim of A while B is claimed breaks it. Ordered by id, A would come
/// first and the claim would pass.
#[test]
fn a_key_is_ordered_by_seq_not_by_id() {
    let trace = [
        claim_at(1, "w1", B, "t1", "k", 1),
        claim_at(2, "w2", A, "t2", "k", 2),
        stopped(3, "w1"),
        stopped(4, "w2"),
    ];
    let errors = validate(&trace, &[(A, Final::Live), (B, Final::Live)]).unwrap_err();
    assert!(errors[0].contains("of its key holds it"), "{errors:?}");
    let trace = [
        claim_at(1, "w1", B, "t1", "k", 1),
        batch(2, "done", "w1", B, "t1", 1),
        claim_at(3, "w2", A, "t2", "k", 2),
        batch(4, "done", "w2", A, "t2", 1),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    assert_eq!(
        validate(&trace, &[(A, Final::Done), (B, Final::Done)]),
        Ok(())
    );
}

/// A dead letter holds its key unless its claim recorded `releases_key`.
#[test]
fn a_dead_letter_holds_its_key_unless_it_releases_it() {
    let trace = |releases: bool| {
        [
            claim_releasing(1, "w1", A, "t1", 1, releases),
            failed(2, "w1", A, "t1", false, true),
            claim_releasing(3, "w2", B, "t2", 2, releases),
            batch(4, "done", "w2", B, "t2", 1),
            stopped(5, "w1"),
            stopped(6, "w2"),
        ]
    };
    let finals = [(A, Final::Dead), (B, Final::Done)];
    assert_eq!(validate(&trace(true), &finals), Ok(()));
    let errors = validate(&trace(false), &finals).unwrap_err();
    assert!(errors[0].contains("of its key holds it"), "{errors:?}");
}

#[test]
fn a_key_stepping_on_after_the_done_write_is_accepted() {
    let trace = [
        claim(1, "w1", A, "t1", 1, Some("k")),
        batch(2, "done", "w1", A, "t1", 1),
        claim(2, "w1", B, "t2", 1, Some("k")),
        batch(3, "done", "w1", B, "t2", 1),
        stopped(4, "w1"),
    ];
    assert_eq!(
        validate(&trace, &[(A, Final::Done), (B, Final::Done)]),
        Ok(())
    );
}

#[test]
fn a_stopped_worker_still_holding_a_message_is_refused() {
    let trace = [claim(1, "w1", A, "t1", 1, None), stopped(2, "w1")];
    let errors = validate(&trace, &[(A, Final::Live)]).unwrap_err();
    assert!(errors[0].contains("stopped still holding"), "{errors:?}");
}

#[test]
fn a_killed_workers_unseen_steps_are_inferred() {
    // w1 is killed after its claim (no `stopped`): its done write may have committed unseen.
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", B, "t2", 1, None),
        batch(3, "done", "w2", B, "t2", 1),
        stopped(4, "w2"),
    ];
    assert_eq!(
        validate(&trace, &[(A, Final::Done), (B, Final::Done)]),
        Ok(())
    );
}

#[test]
fn events_recorded_in_the_other_order_than_their_statements_are_accepted() {
    // w1's failed outcome commits first, then w2 claims the retry; w1 records its write later.
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(3, "w2", A, "t2", 2, None),
        format!(r#"{{"t":3,"action":"start","worker":"w2","message":"{A}","token":"t2"}}"#),
        failed(4, "w1", A, "t1", true, true),
        batch(5, "done", "w2", A, "t2", 1),
        stopped(6, "w1"),
        stopped(7, "w2"),
    ];
    assert_eq!(validate(&trace, &[(A, Final::Done)]), Ok(()));
}

/// A stale done write that lands (the fence removed from the done statement), followed within
/// the reordering window by the newer claim's own done write, which then finds nothing: the
/// newer write, moved first, would have lost its fence, so it cannot explain the stale one.
#[test]
fn a_stale_done_followed_by_the_newer_claims_write_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", A, "t2", 2, None),
        batch(3, "done", "w1", A, "t1", 1),
        batch(4, "done", "w2", A, "t2", 0),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    let errors = validate(&trace, &[(A, Final::Done)]).unwrap_err();
    assert!(
        errors[0].contains("stale write: done by w1") && errors[0].contains("claim t2 of w2"),
        "{errors:?}"
    );
}

/// The same with the fence in place: the stale done changes nothing and the newer claim's
/// write lands.
#[test]
fn a_stale_done_refused_by_the_fence_is_accepted() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", A, "t2", 2, None),
        batch(3, "done", "w1", A, "t1", 0),
        batch(4, "done", "w2", A, "t2", 1),
        stopped(5, "w1"),
        stopped(6, "w2"),
    ];
    assert_eq!(validate(&trace, &[(A, Final::Done)]), Ok(()));
}

/// A renewal that ran just before its worker's done write of the same messages, recorded just
/// after it, is accepted.
#[test]
fn a_renewal_recorded_after_its_workers_done_write_is_accepted() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        batch(2, "done", "w1", A, "t1", 1),
        batch(3, "renew", "w1", A, "t1", 1),
        claim(4, "w2", B, "t2", 1, None),
        batch(5, "done", "w2", B, "t2", 1),
        stopped(6, "w1"),
        stopped(7, "w2"),
    ];
    assert_eq!(
        validate(&trace, &[(A, Final::Done), (B, Final::Done)]),
        Ok(())
    );
}

/// A renewal that changed a message another claim holds is refused.
#[test]
fn a_renewal_under_a_superseded_claim_that_lands_is_refused() {
    let trace = [
        claim(1, "w1", A, "t1", 1, None),
        claim(2, "w2", A, "t2", 2, None),
        // Past the reordering window: the renewal cannot have run before the claim.
        batch(3_000_000, "renew", "w1", A, "t1", 1),
        batch(3_000_001, "done", "w2", A, "t2", 1),
        stopped(3_000_002, "w1"),
        stopped(3_000_003, "w2"),
    ];
    let errors = validate(&trace, &[(A, Final::Done)]).unwrap_err();
    assert!(errors[0].contains("stale write: renew by w1"), "{errors:?}");
}
