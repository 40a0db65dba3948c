//! A model-checked specification of the outbox worker protocol, and the check of recorded runs
//! against it.
//!
//! The README's guarantees (nothing lost, a stale worker's outcome never lands, a key's
//! messages in order, a SIGKILLed worker's messages back within a lease) rest on the worker
//! protocol. This crate states that protocol as a [Stateright](https://docs.rs/stateright)
//! model, explores every interleaving of a bounded system under `cargo test`, and prints a
//! counterexample trace (the steps from the start) when a property fails.
//!
//! # What is modelled
//!
//! Named as the code names it ([`model::Action`] lists every step):
//!
//! - **The database** ([`db`]): one row per message and the statements of
//!   `outbox-core/src/backend/` on it, each atomic: the claim (`outbox_claim_batch`: one batch
//!   of messages under one claim statement; counts each one's attempt, takes a fresh claim
//!   token and a lease; skips locked rows and rows whose lease has not run out; an ordered
//!   message only as the head of its key and not behind a dead letter that holds the key), the done write (`outbox_mark_done`, and on PostgreSQL
//!   `outbox_mark_done_and_claim`, which claims the key's next message in the same statement),
//!   the failed outcome (`outbox_mark_failed`: back to pending, or to `outbox_dead`), the
//!   hand-back (`outbox_hand_back`: attempt not counted, lease cleared), the renewal
//!   (`outbox_renew`), and the operator's `outbox dead retry` and `outbox dead discard`. Every
//!   write is fenced by the claim token; a claim token is modelled as the claim's number per
//!   message ([`db::Gen`]), as only its equality matters (a batch's one token is, per message,
//!   that message's claim).
//! - **Producers** commit messages, with and without an ordering key; a key's writes are
//!   serialised by the application, each committing after the one before. The database gives
//!   each insert its key's next `seq` ([`db::Row::seq`]) and orders a key by it: the commit
//!   order of serialised writes, whatever the producers' clocks (the buggy variant
//!   [`Bugs::order_by_producer_clock`] orders by the ids producers make from their clocks).
//! - **Workers** (`outbox-core/src/worker/`): the claim loop claims a batch when a handler
//!   slot is free (`engine.rs`); each claimed message's record enters the worker's flights
//!   (`register`, by message id: a newer claim of the message replaces it) and its batch entry,
//!   which carries the batch's claim, waits for a slot in `start_registered`, where it starts
//!   the record of its own claim, or skips (handed back, or claimed again since); a finished
//!   handler's outcome is landed only if its claim is still the record's (`land`), done outcomes go to the flusher (`flush.rs`),
//!   failed ones are written by their own task (`write_failure`), past the attempt limit a
//!   message is dead-lettered without running (`process.rs`); the chores renew leases
//!   (`chores.rs`); messages a done write claimed go through `start_claimed`.
//! - **Shutdown**: at the stop request, claimed messages not started are handed back
//!   (`hand_back_unstarted`) and the claim loop may still land the statement it has in flight;
//!   running handlers may finish; at the deadline (or when nothing is left) what still runs is
//!   handed back, the last outcome writes run, and `run_until` returns. What the done writes
//!   claim after the stop request is handed back by `start_claimed`.
//! - **Faults and time**: a worker crashes (SIGKILL) at any step and restarts as a new
//!   incarnation; a lease runs out at any time once no live worker keeps it (its worker
//!   crashed or stopped), and within a stall budget while one does (renewals failing, an
//!   outcome write slower than the lease), after which a renewal may take it back if no
//!   other claim did; a retried message may be claimed any time after its failure write,
//!   which covers every backoff.
//!
//! Not modelled: the database failing a statement (the code retries, or leaves the message to
//! its lease, which a crash already covers), a server crash losing a claim committed without
//! a WAL flush (a lost claim is a crash of its worker, as far as the row goes), batched
//! outcome writes (a done batch is its messages' fenced deletes run together; the model runs
//! them one by one, in any order), the wake-up and idle protocol (it decides only when a
//! claim runs), per-handler progress of topics with several handlers, and handler timeouts
//! (the engine's failure of a handler past its deadline is a failed outcome like any other).
//! A claim statement still in flight at the shutdown deadline is dropped by the code and its
//! claims left to their lease; the model does not let a claim land after the deadline.
//!
//! # Properties
//!
//! Each is a [`stateright::Property`] named by a constant of [`model`], and each is read from
//! the state (the rows, the workers' records and tasks, and history the model keeps), never
//! from what a statement reported about itself:
//!
//! - [`NOTHING_LOST`](model::NOTHING_LOST), *nothing lost*: every committed message is pending,
//!   waiting for a retry or leased, dead (or discarded by an operator), or done after a handler
//!   run of it succeeded.
//! - [`ONE_LEASE`](model::ONE_LEASE), *one lease*: no claim takes a message whose lease has not
//!   run out (read from the row before the claim), so a message is leased to at most one live
//!   worker at a time.
//! - [`STALE_OUTCOME`](model::STALE_OUTCOME), *no unfenced change*: no outcome write,
//!   hand-back or renewal changes a row that, before it, another claim (or none) held, judged
//!   from the row before and after every write. The fence is the claim token, not the clock: an
//!   outcome written after its lease ran out still lands when no other claim took the message
//!   meanwhile, as a renewal would have taken the lease back.
//! - [`OWN_CLAIM`](model::OWN_CLAIM), *a start only under its own claim*: a running handler
//!   task's claim (the fence it reports its outcome with) is its record's.
//! - [`HANDED_BACK_NEVER_STARTS`](model::HANDED_BACK_NEVER_STARTS): a claim the worker handed
//!   back at the stop request never starts.
//! - [`KEY_ORDER`](model::KEY_ORDER), *key order*: a message with a key starts only when every
//!   message its key's writes put before it is done (its done write committed), discarded, or
//!   dead with `releases_key`; a dead earlier message holds it until retried or discarded. No
//!   message starts under its lease while a handler task of another message of its key runs,
//!   read from the workers' tasks (a write that deleted a row does not stop the task running
//!   it), unless that task's lease ran out under it. A dead letter that released its key and
//!   is retried runs after the later messages of its key claimed before its retry.
//! - [`ATTEMPTS`](model::ATTEMPTS), *attempts counted at claim*: a message's attempts are its
//!   claims less its hand-backs, and never exceed the attempt limit plus its claims lost to
//!   crashes and lapsed leases.
//! - [`DEAD_AT_LIMIT`](model::DEAD_AT_LIMIT), *dead exactly at the attempt limit*: the row a
//!   failure write leaves is pending again only below the attempt limit, dead only at or past
//!   it.
//! - [`SHUTDOWN`](model::SHUTDOWN), *stopped worker holds nothing*: once `run_until` returned,
//!   no message is leased to that worker, or waits in it.
//! - [`SETTLED`](model::SETTLED), *every message settles* (liveness): once the crashes, stalls,
//!   stops and operator actions allowed are spent, every message ends done or dead, or waits
//!   behind a dead letter of its key for an operator. Stateright checks an `eventually`
//!   property on the terminal states of acyclic paths only, and explores a state reached by
//!   two paths once: a path that would break it only after such a join is not seen. The model
//!   is acyclic (each claim makes a new claim number, every fault is budgeted), so every
//!   path ends in a terminal state where the property is checked; fairness (a crashed worker's
//!   lease runs out, a live worker claims what is due) follows from a terminal state having
//!   no step left.
//!
//! The `reached:` properties are examples the check must find (a done write claiming the
//! key's next message, a stale outcome meeting a newer claim, a dead letter holding its key,
//! a stopped worker's message handed back, a waiting message claimed again by its own worker):
//! a model that never gets there checks little.
//!
//! # Bounds and time
//!
//! `cargo test -p outbox-model` (and so `cargo test --workspace`) checks six systems, each
//! with 2 attempts; each check stops at its first counterexample and within a budget
//! ([`Budget::DEFAULT`]: 90 s and 20 M states generated), and a check its budget cuts short
//! fails. Five are explored breadth first; the batched one depth first with symmetry
//! reduction ([`Search::Symmetric`]: a state whose worker slots are a permutation of one seen
//! is not explored again), which it needs to fit its two workers in the budget:
//!
//! | system | workers | messages | keys | batch | crashes | stalls | stops | operator | distinct states |
//! | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
//! | [`Config::ordered`] (PostgreSQL) | 2 | 2 | 1 | 1 | 1 | 1 | 1 | 1 | 0.27 M |
//! | [`Config::ordered`] with 3 workers | 3 | 2 | 1 | 1 | 1 | 1 | 1 | 1 | 1.40 M |
//! | [`Config::ordered`], [`sqlite`](Config::sqlite) | 2 | 2 | 1 | 1 | 1 | 1 | 1 | 1 | 0.27 M |
//! | [`Config::released`] (the first releases its key) | 2 | 2 | 1 | 1 | 1 | 1 | 1 | 1 | 0.80 M |
//! | [`Config::unordered`] | 2 | 2 | 0 | 1 | 1 | 1 | 1 | 0 | 1.08 M |
//! | [`Config::batched`] (symmetry reduced) | 2 | 3 | 1 | 2 | 1 | 2 | 0 | 0 | 4.10 M |
//!
//! A lapsed lease comes from a crash (every lease of the crashed worker may lapse) or a stall
//! (a lease lapsing under a live worker): each system has at least two per run. The batched
//! system has two workers, three messages, batches of two and two stalls, so that a message
//! waits in its worker for the handler slot while its lease lapses and its own worker, or the
//! other, claims it again. Its symmetry reduction is what fits it: 17.0 M states generated of
//! the 20 M allowed; without it the same check is cut short at 20 M (4.96 M distinct states
//! seen), and `tests/symmetry.rs` holds the representative to be the same under every
//! permutation of the workers of a 3-worker system. A stop or an operator action there, or two
//! stalls in the others, outgrow the budget of the test suite (the ordered system with two
//! stalls: 1.75 M distinct states, 36 s; the released and unordered ones: past 20 M states
//! generated).
//!
//! The six take 52 s together on 2 cores, the batched one 57-59 s of it (run alongside the
//! others or alone); the model is compiled with optimisations even in debug builds (see the
//! workspace's `Cargo.toml`). The whole model test, with the variants, the mutants and the
//! trace check's own tests, takes under 60 s once built. `OUTBOX_MODEL_LARGE=1 cargo test -p
//! outbox-model --test protocol -- --nocapture` also explores [`Config::large`] (3 workers, 3
//! messages: two of one key, the first releasing it when dead, one unkeyed; 2 crashes) depth
//! first, for `OUTBOX_MODEL_LARGE_MINUTES` minutes (10 unless set, 0 for no limit). It is too
//! large to finish: breadth first ran out of 24 GB, and depth first had not finished after 18
//! minutes with one crash fewer. A budgeted run covers part of it, and fails on any
//! counterexample it meets.
//!
//! # The checker bites
//!
//! `tests/variants.rs` switches on known bugs ([`Bugs`]) one at a time and expects a
//! counterexample to the property each breaks: an unfenced outcome write (no unfenced change),
//! a successor claimed before its predecessor's done write committed (key order), attempts
//! counted at completion (attempts), a hand-back that leaves the lease (shutdown), a claim
//! that ignores leases (one lease), a dead letter that does not hold its key (key order), a
//! claim that deletes (nothing lost), a claim that skips lapsed leases (settled), a retried
//! dead letter that had released its key claimed while a later message of its key is leased
//! (key order), a key ordered by the producers' clocks (key order: [`Config::clock_skew`],
//! two producers, the second's clock behind, writing one key one after the other; ordered by
//! `seq` the same system holds), and a start that finds its record by message id (own claim,
//! on [`Config::batched`] with one worker).
//!
//! # The mutation gate
//!
//! `tests/mutants.rs` applies each [`Mutant`] of the model's own transitions on its own and
//! fails unless the check finds a counterexample within its budget. Each is caught (breadth
//! first: the shortest counterexample; figures on 2 cores):
//!
//! | mutant | system | caught by | seconds |
//! | --- | --- | --- | --- |
//! | the done write ignores the claim token, reporting the mismatch ([`Mutant::DoneIgnoresTokenReported`]) | unordered | no unfenced change | 0.04 |
//! | the done write ignores the claim token, reporting only the rows it changed ([`Mutant::DoneIgnoresToken`]) | unordered | no unfenced change | 0.03 |
//! | the fence asks only "is the row claimed" ([`Mutant::FenceOnlyClaimed`]) | unordered | no unfenced change | 0.01 |
//! | a claim takes a row whose lease still runs ([`Mutant::ClaimTakesRunningLease`]) | unordered | one lease | 0.01 |
//! | the hand-back keeps the lease ([`Mutant::HandBackKeepsLease`]) | unordered | stopped worker holds nothing | 0.01 |
//! | the hand-back keeps the attempt counted ([`Mutant::HandBackKeepsAttempt`]) | unordered | attempts counted at claim | 0.02 |
//! | at the deadline running messages are dropped ([`Mutant::DeadlineDropsRunning`]) | unordered | stopped worker holds nothing | 0.01 |
//! | unstarted messages handed back at stop can still start ([`Mutant::HandedBackStillStart`]) | unordered | a handed-back claim never starts | 0.01 |
//! | what done writes claim after the stop request is dropped ([`Mutant::StopDropsChained`]) | ordered | stopped worker holds nothing | 0.04 |
//! | a predecessor under a running lease does not hold its key ([`Mutant::HeadIgnoresRunningLease`]) | ordered | key order | 0.01 |
//! | a done write whose fence failed still claims the key's next message ([`Mutant::FailedFenceStillChains`]) | ordered | key order | 0.02 |
//! | a retry un-counts the failed attempt ([`Mutant::RetryUncounts`]) | unordered | attempts counted at claim | 0.03 |
//! | a re-claim of a lapsed lease does not count the attempt ([`Mutant::ReclaimNotCounted`]) | unordered | attempts counted at claim | 0.01 |
//! | dead-lettered one attempt early ([`Mutant::DeadEarly`]) | unordered | dead exactly at the attempt limit | 0.03 |
//! | dead-lettered one attempt late ([`Mutant::DeadLate`]) | unordered | dead exactly at the attempt limit | 0.06 |
//! | a dead letter never holds its key ([`Mutant::DeadNeverHolds`]) | ordered | key order | 0.07 |
//!
//! # Findings
//!
//! Three, all fixed.
//!
//! **A lapsed chained claim.** Messages that a done write claims (PostgreSQL) went through a channel to
//! `start_claimed`, which started one batch at a time and entered a batch into the worker's
//! flights only when it began to start it; a batch waiting behind another was not renewed,
//! against the promise that a message waiting for a handler slot keeps its lease. If it waited
//! longer than the lease (handlers slower than the lease holding every slot), another claim
//! took its messages, counting an attempt, and the stale claim still ran when its turn came,
//! after the newer claim may have finished it. The worker registers each such batch in its
//! flights the moment it arrives (`register`), and starts the batches in order from a second
//! task.
//!
//! - `tests/variants.rs`, `finding_a_lapsed_chained_claim_replaces_a_newer_claim` (with
//!   [`Config::chained_leases_lapse`]): the model's counterexample to the old behaviour, down
//!   to the stopped worker still holding the newer claim. The default checks assume, as the
//!   code now guarantees, that such a lease does not run out while it waits.
//! - `tests/chained_lease.rs` in `outbox-tests`: on PostgreSQL, a key's next message claimed by
//!   a done write waits behind another batch while handlers slower than the lease hold both
//!   slots; it must run once.
//!
//! **A retried release beside its successor.** A dead letter that released its key
//! (`dead_releases_key`) lets the later messages of its key run. Retried by an operator, it was
//! the key's earliest live message again, so a claim took it at once, while a later message
//! of its key, claimed before the retry, was running or waiting for a handler slot: two
//! messages of one key ran at once, or the later one started while the earlier one was
//! pending. A retried release is now marked (`retried_release`), and the claims take it only
//! once no later message of its key holds a lease: it runs after the messages claimed before
//! its retry and before those still pending.
//!
//! - `tests/variants.rs`,
//!   `a_retried_release_claimed_beside_its_running_successor_runs_out_of_order` (with
//!   [`Config::released`]): the counterexample to the old claim.
//! - `tests/released_key_retry.rs` in `outbox-tests`: on PostgreSQL and SQLite, the retried
//!   letter starts only after its running successor ended, and before the key's pending one.
//!
//! **A start that took a newer claim's record.** `start_registered` (`dispatch.rs`) found a
//! waiting message's record in the worker's flights by message id only. If the lease of a
//! message waiting for a handler slot lapsed and the same worker claimed it again, the old
//! batch's start took the newer claim's record and ran it under the old claim: that outcome
//! was refused by `land`, the newer claim never started (its record already begun), and the
//! worker renewed its lease until it stopped, holding the message and its key. The start now
//! takes only the record of its own claim.
//!
//! - `tests/variants.rs`, `a_start_that_finds_its_record_by_id_runs_another_claim` (with
//!   [`Bugs::start_by_id`] on [`Config::batched`] with one worker): the counterexample, a
//!   re-claim by the same worker and the old batch's start.
//! - `outbox-core`, `worker::engine::tests` (`reclaimed_while_waiting_*`): on PostgreSQL, SQLite
//!   and MariaDB, the engine's own register and start, a claim waiting for the only slot past
//!   its lease, the same worker's second claim, and the old batch's start first: the message
//!   must run once, under the newer claim, and reach the flusher.
//!
//! # Trace validation
//!
//! The model is kept in step with the code by the soak (`tests/soak.rs`): its worker processes
//! record their protocol steps (`tracing` events at the target `outbox::protocol`) as JSON
//! lines, and the soak replays them through the model's statements ([`trace`], which says what
//! a trace can and cannot tell), failing on a step the model does not allow. Half of the
//! soak's laggards stage a stale done write (a claim past its lease that succeeds while a newer
//! claim runs the message); `.ci/fence-check` takes the claim token term out of the done
//! statement of every backend on a scratch copy and runs a short soak on PostgreSQL and on
//! MariaDB, which must fail naming the stale write (without the fence the message still ends
//! done: only the trace tells).

pub mod db;
pub mod model;
pub mod trace;

use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

pub use model::{Config, Protocol};

/// What one model check found.
#[derive(Debug)]
pub struct Checked {
    /// States generated and distinct states.
    pub states: usize,
    /// Distinct states.
    pub unique: usize,
    /// The longest path explored.
    pub depth: usize,
    /// How long the check took.
    pub elapsed: Duration,
    /// Whether it stopped at its time budget before it had seen every state.
    pub cut_short: bool,
    /// The properties that failed, each with its counterexample (the steps from the start).
    pub failures: Vec<(&'static str, String)>,
    /// The `reached:` properties the check found an example of.
    pub reached: Vec<&'static str>,
}

/// How much a check may take before it is cut short: a system (or a mutant) whose state space
/// outgrows it fails the check instead of running on or exhausting memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Wall time.
    pub time: Duration,
    /// States generated (distinct ones are fewer): a bound on the memory a breadth-first
    /// search holds.
    pub states: usize,
}

impl Budget {
    /// The budget of every check under `cargo test`: 90 s and 20 M states (a few GB at most).
    pub const DEFAULT: Budget = Budget {
        time: Duration::from_secs(90),
        states: 20_000_000,
    };
}

/// Explores every state of `config`'s system (breadth first, on 2 threads) within
/// [`Budget::DEFAULT`], stopping at the first counterexample; with `until`, it stops only at a
/// counterexample to that property (or an example of it).
pub fn check(config: Config, until: Option<&'static str>) -> Checked {
    check_with(
        config,
        until,
        Search::BreadthFirst,
        Some(Budget::DEFAULT.time),
    )
}

/// How [`check_with`] walks the states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Search {
    /// Level by level: the shortest counterexamples, but every state of a level is held in
    /// memory at once.
    BreadthFirst,
    /// Path by path: holds only the current path and the fingerprints of the states seen, so
    /// a system too large for breadth first (the larger check) fits in memory.
    DepthFirst,
    /// Depth first, with symmetry reduction: a state whose worker slots are a permutation of
    /// one already seen (lease holders renamed to match, [`model::representative`]) is not
    /// explored again. Within [`Budget::DEFAULT`]'s states as well as its time.
    Symmetric,
}

/// [`check`] with the search order chosen and, with `time`, a time limit in place of the
/// default one (`None`: no time limit, the state budget only). A check cut short by either
/// budget has looked at part of the states only ([`Checked::cut_short`]).
pub fn check_with(
    config: Config,
    until: Option<&'static str>,
    search: Search,
    time: Option<Duration>,
) -> Checked {
    let start = Instant::now();
    let states = match search {
        Search::BreadthFirst => Budget::DEFAULT.states,
        // Depth first holds fingerprints only: no state budget beyond the time.
        Search::DepthFirst => usize::MAX,
        Search::Symmetric => Budget::DEFAULT.states,
    };
    let mut builder = Protocol::new(config)
        .checker()
        .threads(2)
        .target_state_count(states);
    builder = match until {
        Some(name) => builder.finish_when(HasDiscoveries::AnyOf([name].into())),
        None => builder.finish_when(HasDiscoveries::AnyFailures),
    };
    if let Some(time) = time {
        builder = builder.timeout(time);
    }
    let mut found = match search {
        Search::BreadthFirst => checked(&builder.spawn_bfs().join(), start),
        Search::DepthFirst => checked(&builder.spawn_dfs().join(), start),
        Search::Symmetric => checked(
            &builder
                .symmetry_fn(model::representative)
                .spawn_dfs()
                .join(),
            start,
        ),
    };
    found.cut_short = found.failures.is_empty()
        && (time.is_some_and(|b| found.elapsed >= b) || found.states >= states);
    found
}

/// What `checker`, done, found.
fn checked(checker: &impl Checker<Protocol>, start: Instant) -> Checked {
    let model = checker.model();
    let mut failures = Vec::new();
    let mut reached = Vec::new();
    for property in model.properties() {
        let Some(path) = checker.discovery(property.name) else {
            continue;
        };
        if property.expectation.discovery_is_failure() {
            let steps: Vec<String> = path
                .into_actions()
                .iter()
                .map(|a| format!("{a:?}"))
                .collect();
            failures.push((
                property.name,
                format!("{} steps: {}", steps.len(), steps.join(" -> ")),
            ));
        } else {
            reached.push(property.name);
        }
    }
    Checked {
        states: checker.state_count(),
        unique: checker.unique_state_count(),
        depth: checker.max_depth(),
        elapsed: start.elapsed(),
        cut_short: false,
        failures,
        reached,
    }
}

/// Known bugs of the protocol, each one switch: a buggy variant of the model turns one on, and
/// its check must find a counterexample, or the model checks nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// Outcome writes are not fenced by the claim token: any live message is changed.
    pub no_fence: bool,
    /// The next message of a key is claimed as soon as its predecessor's handlers succeed,
    /// before the predecessor's done write committed.
    pub early_successor: bool,
    /// Attempts are counted when an outcome is written instead of at claim.
    pub count_at_completion: bool,
    /// The hand-back gives the message back but leaves its lease (token and `locked_until`).
    pub hand_back_keeps_lease: bool,
    /// A claim takes messages whose lease has not run out (no `locked_until` test).
    pub claim_ignores_lease: bool,
    /// A dead letter does not hold the later messages of its key.
    pub dead_does_not_hold: bool,
    /// The claim deletes the message (acknowledged before it is handled).
    pub delete_at_claim: bool,
    /// A claim takes only messages never leased or given back (`locked_until IS NULL`), not
    /// those whose lease ran out: a crashed worker's messages never run again.
    pub claim_skips_expired: bool,
    /// A retried dead letter that had released its key is claimed while later messages of
    /// its key hold a lease (running, or waiting for a handler slot).
    pub retried_release_ignores_claims: bool,
    /// A key's messages are ordered by their ids, made from the producers' clocks, instead of
    /// by the `seq` the database assigns at insert time: two producers whose clocks disagree
    /// write one key, each write after the other committed, and the later write's id is the
    /// smaller.
    pub order_by_producer_clock: bool,
    /// The claimed message's start finds its record in the worker by message id only, not
    /// by its claim: after a lapsed lease and a re-claim by the same worker, the old batch's
    /// start takes the newer claim's record (the bug fixed in `dispatch.rs`).
    pub start_by_id: bool,
    /// A mutant of the model's own transitions (the mutation gate, [`Mutant`]).
    pub mutant: Option<Mutant>,
}

/// Mutants of the model's transitions, each one deliberate error in the model's own code:
/// `tests/mutants.rs` checks each on its own and expects a counterexample within its budget.
/// They are what an error in the model, not in the protocol, could look like: a check that
/// passes one of them would pass such an error unnoticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// The done write ignores the claim token (any live row is deleted) and reports the
    /// mismatch.
    DoneIgnoresTokenReported,
    /// The done write ignores the claim token and reports only the rows it changed, as SQL
    /// does.
    DoneIgnoresToken,
    /// Every fence asks only "is the row claimed", not "by this claim".
    FenceOnlyClaimed,
    /// A claim takes a row whose lease still runs.
    ClaimTakesRunningLease,
    /// The hand-back keeps the lease.
    HandBackKeepsLease,
    /// The hand-back keeps the attempt counted.
    HandBackKeepsAttempt,
    /// At the deadline, running messages are dropped instead of handed back.
    DeadlineDropsRunning,
    /// Unstarted messages handed back at the stop request can still start.
    HandedBackStillStart,
    /// What done writes claim after the stop request is dropped, not handed back.
    StopDropsChained,
    /// A predecessor under a running lease does not hold its key: the head is the first
    /// unlocked row.
    HeadIgnoresRunningLease,
    /// A done write whose fence failed still claims the key's next message.
    FailedFenceStillChains,
    /// A retry un-counts the failed attempt.
    RetryUncounts,
    /// A re-claim of a lapsed lease does not count the attempt.
    ReclaimNotCounted,
    /// A message is dead-lettered one attempt early.
    DeadEarly,
    /// A message is dead-lettered one attempt late.
    DeadLate,
    /// A dead letter never holds its key.
    DeadNeverHolds,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 16] = [
        Mutant::DoneIgnoresTokenReported,
        Mutant::DoneIgnoresToken,
        Mutant::FenceOnlyClaimed,
        Mutant::ClaimTakesRunningLease,
        Mutant::HandBackKeepsLease,
        Mutant::HandBackKeepsAttempt,
        Mutant::DeadlineDropsRunning,
        Mutant::HandedBackStillStart,
        Mutant::StopDropsChained,
        Mutant::HeadIgnoresRunningLease,
        Mutant::FailedFenceStillChains,
        Mutant::RetryUncounts,
        Mutant::ReclaimNotCounted,
        Mutant::DeadEarly,
        Mutant::DeadLate,
        Mutant::DeadNeverHolds,
    ];
}
