//! The checker bites: each known bug, switched on in the model, yields a counterexample to
//! the property it breaks. A model that checked nothing would fail here.

use outbox_model::model::{
    ATTEMPTS, KEY_ORDER, NOTHING_LOST, ONE_LEASE, OWN_CLAIM, SETTLED, SHUTDOWN, STALE_OUTCOME,
};
use outbox_model::{check, Bugs, Config};

/// Checks `config` with the bug that `switch` turns on until `property` fails, and fails if
/// it never does.
fn breaks(config: Config, switch: impl FnOnce(&mut Bugs), property: &'static str) {
    let mut bugs = Bugs::default();
    switch(&mut bugs);
    let checked = check(config.with_bugs(bugs), Some(property));
    let trace = checked
        .failures
        .iter()
        .find(|(name, _)| *name == property)
        .map(|(_, trace)| trace.clone());
    match trace {
        Some(trace) => println!(
            "counterexample to \"{property}\" ({:.1?}): {trace}",
            checked.elapsed
        ),
        None => panic!(
            "no counterexample to \"{property}\" in {} states: the check does not see this bug",
            checked.unique
        ),
    }
}

#[test]
fn an_unfenced_outcome_write_lands_stale() {
    breaks(Config::unordered(), |b| b.no_fence = true, STALE_OUTCOME);
}

#[test]
fn a_successor_claimed_before_the_done_write_commits_runs_out_of_order() {
    breaks(Config::ordered(), |b| b.early_successor = true, KEY_ORDER);
}

#[test]
fn attempts_counted_at_completion_are_not_counted_at_claim() {
    breaks(
        Config::unordered(),
        |b| b.count_at_completion = true,
        ATTEMPTS,
    );
}

#[test]
fn a_hand_back_that_forgets_the_lease_leaves_it_with_the_stopped_worker() {
    breaks(
        Config::unordered(),
        |b| b.hand_back_keeps_lease = true,
        SHUTDOWN,
    );
}

#[test]
fn a_claim_that_ignores_leases_leases_twice() {
    breaks(
        Config::unordered(),
        |b| b.claim_ignores_lease = true,
        ONE_LEASE,
    );
}

#[test]
fn a_dead_letter_that_does_not_hold_its_key_lets_successors_run() {
    breaks(
        Config::ordered(),
        |b| b.dead_does_not_hold = true,
        KEY_ORDER,
    );
}

#[test]
fn a_claim_that_deletes_loses_messages() {
    breaks(
        Config::unordered(),
        |b| b.delete_at_claim = true,
        NOTHING_LOST,
    );
}

#[test]
fn a_claim_that_skips_lapsed_leases_never_settles_a_crashed_workers_messages() {
    breaks(
        Config::unordered(),
        |b| b.claim_skips_expired = true,
        SETTLED,
    );
}

#[test]
fn a_retried_release_claimed_beside_its_running_successor_runs_out_of_order() {
    breaks(
        Config::released(),
        |b| b.retried_release_ignores_claims = true,
        KEY_ORDER,
    );
}

/// Issue 43: a key ordered by its ids, which producers make from their own clocks, is not its
/// commit order. Two producers write one key, the second after the first committed, and the
/// second's clock is behind: the database ordering by id makes the later write the key's head.
/// Ordered by the `seq` the database assigns at insert time (the default), the same system
/// holds (`tests/protocol.rs` checks the others; this one is checked here too).
#[test]
fn a_key_ordered_by_producer_clocks_runs_out_of_commit_order() {
    breaks(
        Config::clock_skew(),
        |b| b.order_by_producer_clock = true,
        KEY_ORDER,
    );
    let checked = check(Config::clock_skew(), None);
    assert!(
        checked.failures.is_empty() && !checked.cut_short,
        "ordered by seq, the clock-skewed system holds: {:?}",
        checked.failures
    );
}

/// The start bug of `dispatch.rs`: a claimed message's start that finds its record by message
/// id only. With batches of 2 a waiting message's lease lapses, the same worker claims it
/// again, and the old batch's start runs the newer claim's record under the old claim.
#[test]
fn a_start_that_finds_its_record_by_id_runs_another_claim() {
    // One worker is enough to re-claim its own waiting message, and finds it sooner.
    breaks(
        Config::batched().workers(1),
        |b| b.start_by_id = true,
        OWN_CLAIM,
    );
}

/// The model's first finding (see the crate docs), kept as the counterexample it produces: with
/// messages a done write claimed waiting for `start_claimed` unrenewed, a lapsed lease lets a
/// newer claim take the message, and starting the stale claim puts it in the worker's flights
/// in place of the newer one, which is then neither renewed nor handed back: at shutdown it
/// stays with the stopped worker. The worker registers such batches at once, so the default
/// checks assume such a lease does not run out.
#[test]
fn finding_a_lapsed_chained_claim_replaces_a_newer_claim() {
    let config = Config {
        chained_leases_lapse: true,
        ..Config::ordered()
    };
    breaks(config, |_| {}, SHUTDOWN);
}
