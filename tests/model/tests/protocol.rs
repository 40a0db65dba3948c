//! The protocol's properties hold in every state of the bounded systems (see the crate docs
//! for the bounds); `OUTBOX_MODEL_LARGE=1` checks the larger one as well.

use outbox_model::model::{
    REACH_DEAD_HOLDS_KEY, REACH_DONE_BY_CHAIN, REACH_HANDED_BACK_AT_STOP,
    REACH_RECLAIMED_WHILE_WAITING, REACH_RETRIED_RELEASE_WAITS, REACH_STALE_REFUSED,
};
use std::time::Duration;

use outbox_model::{check_with, Budget, Checked, Config, Search};

/// Checks `config` to the end within [`Budget::DEFAULT`] and fails on any counterexample (the
/// check stops at the first), when the budget ran out first, or when the check did not reach
/// the states named in `reached` (a model that never gets there checks little).
fn holds(what: &str, config: Config, reached: &[&str]) -> Checked {
    holds_by(what, config, reached, Search::BreadthFirst)
}

/// [`holds`], walking the states by `search`.
fn holds_by(what: &str, config: Config, reached: &[&str], search: Search) -> Checked {
    let checked = holds_with(what, config, reached, search, Some(Budget::DEFAULT.time));
    assert!(
        !checked.cut_short,
        "{what}: the check outgrew its budget ({:?}) before it saw every state",
        Budget::DEFAULT
    );
    checked
}

fn holds_with(
    what: &str,
    config: Config,
    reached: &[&str],
    search: Search,
    budget: Option<Duration>,
) -> Checked {
    let checked = check_with(config, None, search, budget);
    println!(
        "{what}: {} states ({} distinct), depth {}, {:.1?}{}",
        checked.states,
        checked.unique,
        checked.depth,
        checked.elapsed,
        if checked.cut_short {
            ", cut short by its budget: part of the states only"
        } else {
            ", every state"
        }
    );
    for (property, trace) in &checked.failures {
        println!("counterexample to \"{property}\": {trace}");
    }
    assert!(
        checked.failures.is_empty(),
        "{what}: {} propert(ies) fail, traces above",
        checked.failures.len()
    );
    for name in reached {
        assert!(
            checked.reached.contains(name),
            "{what}: the check never {name}"
        );
    }
    checked
}

#[test]
fn ordered_messages_on_postgres() {
    holds(
        "ordered, 2 workers",
        Config::ordered(),
        &[
            REACH_DONE_BY_CHAIN,
            REACH_STALE_REFUSED,
            REACH_DEAD_HOLDS_KEY,
            REACH_HANDED_BACK_AT_STOP,
        ],
    );
}

#[test]
fn ordered_messages_with_three_workers() {
    holds(
        "ordered, 3 workers",
        Config::ordered().workers(3),
        &[REACH_DONE_BY_CHAIN, REACH_STALE_REFUSED],
    );
}

#[test]
fn ordered_messages_on_sqlite() {
    holds(
        "ordered, SQLite",
        Config::ordered().sqlite(),
        &[REACH_STALE_REFUSED, REACH_DEAD_HOLDS_KEY],
    );
}

#[test]
fn a_key_released_by_its_dead_letter() {
    holds(
        "released key, 2 workers",
        Config::released(),
        &[REACH_DONE_BY_CHAIN, REACH_RETRIED_RELEASE_WAITS],
    );
}

#[test]
fn batches_of_two_with_lapsed_leases() {
    holds_by(
        "batches of 2, 2 workers, 3 messages, 2 stalls, 1 crash",
        Config::batched(),
        &[REACH_RECLAIMED_WHILE_WAITING, REACH_DONE_BY_CHAIN],
        Search::Symmetric,
    );
}

#[test]
fn unordered_messages() {
    holds(
        "unordered, 2 workers",
        Config::unordered(),
        &[REACH_STALE_REFUSED, REACH_HANDED_BACK_AT_STOP],
    );
}

/// By hand: `OUTBOX_MODEL_LARGE=1 cargo test -p outbox-model --test protocol -- --nocapture`,
/// depth first for `OUTBOX_MODEL_LARGE_MINUTES` minutes (10 unless set; 0 for no limit). The
/// larger system does not finish within half an hour on 2 cores, so a budgeted run looks at
/// part of its states: any counterexample it meets still fails the test.
#[test]
fn large_system_when_asked() {
    if std::env::var("OUTBOX_MODEL_LARGE").is_ok_and(|v| v == "1") {
        let minutes: u64 = std::env::var("OUTBOX_MODEL_LARGE_MINUTES")
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(10);
        let budget = (minutes > 0).then(|| Duration::from_secs(60 * minutes));
        holds_with(
            "large",
            Config::large(),
            &[REACH_DONE_BY_CHAIN],
            Search::DepthFirst,
            budget,
        );
    }
}
