//! The mutation gate: each mutant of the model's own transitions ([`Mutant`]), applied on its
//! own, must meet a counterexample within the check's budget. A mutant that passes would be an
//! error in the model that the properties cannot see; one that outgrows the budget fails too.
//! The crate docs' table lists which property catches each, and how fast.

use outbox_model::{check, Config, Mutant};

/// Checks `config` with `mutant` applied, stopping at the first counterexample, and fails if
/// there is none.
fn caught(mutant: Mutant, config: Config) {
    let checked = check(config.with_mutant(mutant), None);
    match checked.failures.first() {
        Some((property, trace)) => println!(
            "{mutant:?}: caught by \"{property}\" in {:.2} s ({} states): {trace}",
            checked.elapsed.as_secs_f64(),
            checked.unique
        ),
        None => panic!(
            "{mutant:?}: no counterexample in {} states ({:.1?}{}): the properties do not see this mutant",
            checked.unique,
            checked.elapsed,
            if checked.cut_short {
                ", cut short by the budget"
            } else {
                ""
            }
        ),
    }
}

macro_rules! mutants {
    ($($name:ident: $mutant:ident on $config:expr;)*) => {
        $(
            #[test]
            fn $name() {
                caught(Mutant::$mutant, $config);
            }
        )*

        /// Every mutant has its test above.
        #[test]
        fn every_mutant_is_checked() {
            let checked = [$(Mutant::$mutant),*];
            for m in Mutant::ALL {
                assert!(checked.contains(&m), "{m:?} has no test in tests/mutants.rs");
            }
        }
    };
}

mutants! {
    done_ignores_token_reported: DoneIgnoresTokenReported on Config::unordered();
    done_ignores_token: DoneIgnoresToken on Config::unordered();
    fence_only_claimed: FenceOnlyClaimed on Config::unordered();
    claim_takes_running_lease: ClaimTakesRunningLease on Config::unordered();
    hand_back_keeps_lease: HandBackKeepsLease on Config::unordered();
    hand_back_keeps_attempt: HandBackKeepsAttempt on Config::unordered();
    deadline_drops_running: DeadlineDropsRunning on Config::unordered();
    handed_back_still_start: HandedBackStillStart on Config::unordered();
    stop_drops_chained: StopDropsChained on Config::ordered();
    head_ignores_running_lease: HeadIgnoresRunningLease on Config::ordered();
    failed_fence_still_chains: FailedFenceStillChains on Config::ordered();
    retry_uncounts: RetryUncounts on Config::unordered();
    reclaim_not_counted: ReclaimNotCounted on Config::unordered();
    dead_early: DeadEarly on Config::unordered();
    dead_late: DeadLate on Config::unordered();
    dead_never_holds: DeadNeverHolds on Config::ordered();
}
