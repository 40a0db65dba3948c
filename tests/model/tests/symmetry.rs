//! Symmetry reduction is sound only if the representative is the same for every permutation
//! of a state's worker slots, and is itself one of them.

use outbox_model::model::{permuted, representative, State};
use outbox_model::{Config, Protocol};
use stateright::Model;

/// Every permutation of `0..n`.
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut all = Vec::new();
    for p in permutations(n - 1) {
        for at in 0..=p.len() {
            let mut q = p.clone();
            q.insert(at, n - 1);
            all.push(q);
        }
    }
    all
}

/// States met on random walks through `config`'s system (a fixed seed, so a failure repeats).
fn walk(config: Config, walks: usize) -> Vec<State> {
    let model = Protocol::new(config);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut seen = Vec::new();
    for _ in 0..walks {
        let mut state = model.init_states().remove(0);
        loop {
            seen.push(state.clone());
            let mut actions = Vec::new();
            model.actions(&state, &mut actions);
            let steps: Vec<State> = actions
                .into_iter()
                .filter_map(|a| model.next_state(&state, a))
                .collect();
            if steps.is_empty() {
                break;
            }
            state = steps[next() as usize % steps.len()].clone();
        }
    }
    seen
}

#[test]
fn the_representative_is_the_same_under_every_permutation_of_the_workers() {
    let config = Config::batched().workers(3);
    let orders = permutations(config.workers);
    let states = walk(config, 200);
    let mut asymmetric = 0;
    for s in &states {
        let r = representative(s);
        assert!(
            orders.iter().any(|o| permuted(s, o) == r),
            "the representative is not a permutation of its state: {s:?}"
        );
        for o in &orders {
            let p = permuted(s, o);
            if p != *s {
                asymmetric += 1;
            }
            assert_eq!(
                representative(&p),
                r,
                "permutation {o:?} changes the representative of {s:?}"
            );
        }
    }
    // The walks must meet states whose slots differ, or the test shows nothing.
    assert!(
        asymmetric > states.len(),
        "only {asymmetric} permuted states differ from their own, of {} states",
        states.len()
    );
}
