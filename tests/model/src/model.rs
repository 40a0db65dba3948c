//! The worker side and the whole system as a [`stateright::Model`]: producers, workers (the
//! engine of `outbox-core/src/worker/`), time (leases running out, backoffs ending) and an
//! operator, over the [`Table`] of [`crate::db`].

use stateright::{Model, Property};

use crate::db::{Gen, Holder, Row, Status, Table};
use crate::{Bugs, Mutant};

/// The bounds and the system checked.
#[derive(Clone, Debug)]
pub struct Config {
    /// Worker slots; each runs one incarnation at a time.
    pub workers: usize,
    /// The messages, in the order the application writes them (a key's writes serialised):
    /// each one's ordering key and `releases_key`.
    pub messages: Vec<(Option<u32>, bool)>,
    /// Per message, the time its producer's clock gave its id (UUID v7); unless set, the
    /// order they are written in. Only [`Bugs::order_by_producer_clock`] reads it.
    pub clocks: Vec<u32>,
    /// `max_attempts`.
    pub attempt_limit: u32,
    /// Handler slots of a worker (`concurrency`).
    pub concurrency: usize,
    /// Claimed messages a worker holds at most (`batch_size`: it claims only with a slot free,
    /// a full batch).
    pub batch: usize,
    /// Worker crashes (a SIGKILL at any step), each followed by a restart.
    pub crashes: u32,
    /// Leases that run out under a live worker that still runs the message (renewals failing,
    /// a stalled process).
    pub stalls: u32,
    /// Graceful stops (`run_until`'s signal), each followed by a restart.
    pub stops: u32,
    /// Operator actions on dead letters (retry or discard).
    pub operator: u32,
    /// The done write claims the next message of each key it releases (PostgreSQL); without
    /// it the next claim finds it (SQLite).
    pub chained_claims: bool,
    /// Leases of messages that a done write claimed may run out while they wait for
    /// `start_claimed` (see the crate docs' findings); off, they are taken before that.
    pub chained_leases_lapse: bool,
    /// The protocol's known bugs switched on (a buggy variant), or none.
    pub bugs: Bugs,
}

impl Config {
    /// Ordered messages: 2 workers, 2 messages of one key, 2 attempts, 1 crash, 1 stall, 1
    /// stop, 1 operator action, PostgreSQL's chained claims.
    pub fn ordered() -> Self {
        Config {
            workers: 2,
            messages: vec![(Some(0), false), (Some(0), false)],
            clocks: Vec::new(),
            attempt_limit: 2,
            concurrency: 1,
            batch: 1,
            crashes: 1,
            stalls: 1,
            stops: 1,
            operator: 1,
            chained_claims: true,
            chained_leases_lapse: false,
            bugs: Bugs::default(),
        }
    }

    /// Unordered messages: [`ordered`](Self::ordered) with 2 messages without a key and no
    /// operator (dead letters of unordered messages hold nothing).
    pub fn unordered() -> Self {
        Config {
            messages: vec![(None, false), (None, false)],
            operator: 0,
            ..Config::ordered()
        }
    }

    /// [`ordered`](Self::ordered) with a first message that releases its key when dead
    /// (`dead_releases_key`): its successor runs while it is dead, and the operator's retry
    /// makes it the key's earliest live message again.
    pub fn released() -> Self {
        Config {
            messages: vec![(Some(0), true), (Some(0), false)],
            ..Config::ordered()
        }
    }

    /// The larger check (`OUTBOX_MODEL_LARGE=1`): 3 workers, 3 messages (two of one key, the
    /// first releasing it when dead, and one unkeyed), 2 crashes. Too large to finish on 2
    /// cores in half an hour; the test explores it depth first within a time budget.
    pub fn large() -> Self {
        Config {
            workers: 3,
            messages: vec![(Some(0), true), (Some(0), false), (None, false)],
            crashes: 2,
            ..Config::ordered()
        }
    }

    /// Batches of 2 (`batch_size` 2, one handler slot): a worker holds a message waiting for
    /// the slot while another runs, so a waiting message's lease may lapse and the same worker
    /// claim it again, or another worker claim it. 2 worker slots, 3 messages (two of one key,
    /// one unkeyed), 2 stalls (leases lapsing under a live worker) besides the leases a crash
    /// lets lapse, 1 crash (the restarted incarnation is another holder), no stop and no
    /// operator (either outgrows the test suite's budget here). Checked with symmetry
    /// reduction ([`crate::Search::Symmetric`]).
    pub fn batched() -> Self {
        Config {
            workers: 2,
            messages: vec![(Some(0), false), (Some(0), false), (None, false)],
            batch: 2,
            stalls: 2,
            stops: 0,
            operator: 0,
            ..Config::ordered()
        }
    }

    /// Two producers whose clocks disagree write one key, the second write after the first
    /// committed (the application serialises them), and the second producer's clock is
    /// behind: the later write's id is the smaller. With
    /// [`Bugs::order_by_producer_clock`] the database orders the key by id.
    pub fn clock_skew() -> Self {
        Config {
            clocks: vec![1, 0],
            crashes: 0,
            stops: 0,
            operator: 0,
            ..Config::ordered()
        }
    }

    /// The same with `stalls` lapsed leases under live workers.
    pub fn stalls(mut self, stalls: u32) -> Self {
        self.stalls = stalls;
        self
    }

    /// The same with `workers` workers.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// The same on SQLite: no claim in the done write; the next claim finds the key's next
    /// message.
    pub fn sqlite(mut self) -> Self {
        self.chained_claims = false;
        self
    }

    /// The same bounds with `mutant` applied to the model's transitions.
    pub fn with_mutant(mut self, mutant: Mutant) -> Self {
        self.bugs.mutant = Some(mutant);
        self
    }

    /// The same bounds with `bugs` switched on.
    pub fn with_bugs(mut self, bugs: Bugs) -> Self {
        self.bugs = bugs;
        self
    }
}

/// The life of a worker incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Claiming and running.
    Running,
    /// From the stop request to the deadline: nothing starts that has not, claimed messages
    /// not started are handed back, running handlers may finish.
    Stopping,
    /// From the deadline: what still ran was handed back; the last outcome writes run.
    Final,
    /// `run_until` returned.
    Stopped,
    /// Crashed (SIGKILL): nothing of it runs, its leases run out.
    Down,
}

/// A claimed message in a worker (`Flight`): waiting for a handler slot, or running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flight {
    /// The message.
    pub msg: u8,
    /// Its claim (the fence of its writes).
    pub gen: Gen,
    /// The attempt that claim counted, as the worker read it.
    pub attempt: u32,
    /// Its handler task began (`Watch::begin`).
    pub started: bool,
    /// The claim its running handler task was started under (the fence the task reports its
    /// outcome with), while it runs: the flight's own claim, unless a start took another
    /// claim's record.
    pub run: Option<Gen>,
    /// Its lease ran out under this live worker (a stall), even if a renewal took it back:
    /// from then on it is an attempt the order does not bind (see `KEY_ORDER`).
    pub lapsed: bool,
}

/// An outcome waiting for its write: a done one in the flusher, a failed one in its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Outcome {
    /// The message.
    pub msg: u8,
    /// The claim it ran under.
    pub gen: Gen,
    /// For a failed outcome: `Some(true)` retry, `Some(false)` dead; `None` for done.
    pub retry: Option<bool>,
}

/// One worker slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Worker {
    /// Its current incarnation (a restart makes a new one).
    pub incarnation: u8,
    /// Where it is.
    pub phase: Phase,
    /// The claim loop may still land a statement: until its first claim after the stop
    /// request (the statement in flight then), or the end of the stop phase.
    pub claim_loop: bool,
    /// `flights`, by message (a newer claim of a message replaces its record, as `register`
    /// does).
    pub flights: Vec<Flight>,
    /// Claimed messages waiting for a handler slot in `start_registered`, each with its
    /// batch's claim: (message, claim).
    pub queue: Vec<(u8, Gen)>,
    /// History: claims this worker handed back that its queue still holds (to see them
    /// never start).
    pub returned: Vec<(u8, Gen)>,
    /// Done outcomes in the flusher.
    pub dones: Vec<Outcome>,
    /// Failed outcomes being written (`write_failure` tasks).
    pub failures: Vec<Outcome>,
    /// Messages the flusher's done writes claimed, on their way to `start_claimed`.
    pub chained: Vec<Outcome>,
}

impl Worker {
    fn new(incarnation: u8) -> Self {
        Worker {
            incarnation,
            phase: Phase::Running,
            claim_loop: true,
            flights: Vec::new(),
            queue: Vec::new(),
            returned: Vec::new(),
            dones: Vec::new(),
            failures: Vec::new(),
            chained: Vec::new(),
        }
    }

    /// Enters a claim into the worker (`register`): its record, replacing an older claim's
    /// record of the message, and its entry in the start queue.
    fn register(&mut self, msg: u8, gen: Gen, attempt: u32) {
        self.flights.retain(|f| f.msg != msg);
        self.flights.push(Flight {
            msg,
            gen,
            attempt,
            started: false,
            run: None,
            lapsed: false,
        });
        self.flights.sort_by_key(|f| f.msg);
        self.queue.push((msg, gen));
        self.queue.sort_unstable();
    }

    /// Handler tasks running (each holds a handler slot).
    fn running(&self) -> usize {
        self.flights.iter().filter(|f| f.run.is_some()).count()
    }

    fn alive(&self) -> bool {
        matches!(self.phase, Phase::Running | Phase::Stopping | Phase::Final)
    }
}

/// What the model remembers of the past, for the properties (history variables).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per message: a handler run of it finished successfully.
    pub ran_ok: Vec<bool>,
    /// Per message: claims since the last operator retry, less the hand-backs.
    pub counted: Vec<u32>,
    /// Per message: claims since the last operator retry that ended without an outcome or a
    /// hand-back (their worker crashed, or their lease ran out and another claim took it).
    pub lost: Vec<u32>,
    /// A claim took a message whose lease had not run out.
    pub double_lease: bool,
    /// A fenced write changed a row that, before it, another claim (or none) held: read
    /// from the row before and after the write, not from what the write reported.
    pub stale_landed: bool,
    /// A failed outcome retried a message at or past the attempt limit, or dead-lettered it
    /// below the limit (read from the row before and after the write).
    pub dead_off_limit: bool,
    /// A handler task started under a claim its worker had handed back.
    pub started_handed_back: bool,
    /// A message started while an earlier message of its key was live, or dead and holding
    /// the key.
    pub out_of_order: bool,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The database.
    pub table: Table,
    /// The worker slots.
    pub workers: Vec<Worker>,
    /// Crashes still allowed.
    pub crashes: u32,
    /// Stalls still allowed.
    pub stalls: u32,
    /// Stops still allowed.
    pub stops: u32,
    /// Operator actions still allowed.
    pub operator: u32,
    /// History.
    pub ghost: Ghost,
}

/// One step of the system, named after the code that takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A producer's transaction commits message `.0` (a key's messages in id order).
    Commit(u8),
    /// Worker `.0`'s claim statement takes the messages of bitmask `.1`, one batch under one
    /// claim token (`claim_loop`, `outbox_claim_batch`).
    Claim(u8, u8),
    /// Worker `.0` starts the queue's entry for message `.1` of the batch with claim `.2`
    /// (`start_registered`): it finds the claim's record and begins its task
    /// (`Watch::begin`), or finds none (handed back, or claimed again since) and skips it.
    Start(u8, u8, Gen),
    /// Its handlers end, successfully or not, and the outcome is landed (`collect`) if the
    /// record is still the task's claim.
    Finish(u8, u8, bool),
    /// The flusher writes a done outcome (`outbox_mark_done`); with `true`, the same statement
    /// claims the key's next message (`outbox_mark_done_and_claim`).
    WriteDone(u8, u8, bool),
    /// A failed outcome is written (`write_failure`, `outbox_mark_failed`).
    WriteFailure(u8, u8),
    /// `start_claimed` starts what the done writes claimed.
    StartChained(u8),
    /// `start_claimed` hands back what the done writes claimed after the stop request.
    HandBackChained(u8),
    /// The chores renew a lease that ran out (`outbox_renew` matches the token only).
    Renew(u8, u8),
    /// Time passes: message `.0`'s lease runs out.
    Expire(u8),
    /// Worker `.0` is SIGKILLed.
    Crash(u8),
    /// A crashed worker slot starts a new incarnation (a stopped one stays stopped).
    Restart(u8),
    /// The stop request.
    Stop(u8),
    /// The stop phase hands back what is claimed and not started (`hand_back_unstarted`).
    HandBackUnstarted(u8),
    /// The stop phase ends (nothing left, or the deadline): what still runs is handed back.
    Deadline(u8),
    /// The final writes are through: `run_until` returns.
    Exit(u8),
    /// `outbox dead retry` of message `.0`.
    DeadRetry(u8),
    /// `outbox dead discard` of message `.0`.
    Discard(u8),
}

/// The lease holder that is incarnation `incarnation` of worker slot `w`.
fn holder_of(w: usize, incarnation: u8) -> Holder {
    (w as u32) << 8 | u32::from(incarnation)
}

/// The worker slot a lease holder belongs to.
fn slot_of(holder: Holder) -> usize {
    (holder >> 8) as usize
}

/// The state with its worker slots in one canonical order, for symmetry reduction
/// ([`crate::Search::Symmetric`]).
///
/// Worker slots are interchangeable: every slot runs the same code under the same bounds,
/// and no step or property names a slot but through the leases it holds. So a state whose
/// slots are permuted, with the lease holders renamed to match, behaves the same, and one of
/// them stands for all. The slots are sorted by what they hold (their incarnation, phase,
/// records, queues and outcomes, and the leases the table gives them), and each lease's
/// holder is renamed to its slot's new place. Two slots that tie hold the same, so either
/// order is the same state.
pub fn representative(s: &State) -> State {
    let n = s.workers.len();
    let leases: Vec<Vec<(usize, Gen, Holder, bool)>> = (0..n)
        .map(|w| {
            s.table
                .rows
                .iter()
                .enumerate()
                .filter_map(|(m, r)| {
                    let l = r.lease()?;
                    (slot_of(l.holder) == w).then_some((m, l.gen, l.holder & 0xff, l.expired))
                })
                .collect()
        })
        .collect();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| (&s.workers[a], &leases[a]).cmp(&(&s.workers[b], &leases[b])));
    permuted(s, &order)
}

/// The state with its worker slots permuted: slot `i` of the result is slot `order[i]` of
/// `s`, and every lease holder is renamed to its slot's new place. `order` must be a
/// permutation of the slots.
pub fn permuted(s: &State, order: &[usize]) -> State {
    let mut place = vec![0; order.len()];
    for (new, &old) in order.iter().enumerate() {
        place[old] = new;
    }
    let mut r = s.clone();
    r.workers = order.iter().map(|&old| s.workers[old].clone()).collect();
    for row in &mut r.table.rows {
        if let Status::Live { lease: Some(l), .. } = &mut row.status {
            l.holder = holder_of(place[slot_of(l.holder)], (l.holder & 0xff) as u8);
        }
    }
    r
}

/// The system under [`Config`].
#[derive(Clone, Debug)]
pub struct Protocol {
    /// Bounds and variant.
    pub config: Config,
}

impl Protocol {
    /// The system with these bounds.
    pub fn new(config: Config) -> Self {
        Protocol { config }
    }

    fn holder(w: usize, s: &State) -> Holder {
        holder_of(w, s.workers[w].incarnation)
    }

    fn mutant(&self, m: Mutant) -> bool {
        self.config.bugs.mutant == Some(m)
    }

    /// How the lease of `m` may run out: `Some(false)` at any time (its holder crashed,
    /// stopped, or no longer refers to it), `Some(true)` only within the stall budget (a live
    /// worker renews it, or its outcome waits for its write), `None` never (it waits for
    /// `start_claimed`, unless [`Config::chained_leases_lapse`]).
    fn lapse(&self, s: &State, m: usize) -> Option<bool> {
        let lease = s.table.rows[m].lease()?;
        if lease.expired {
            return None;
        }
        let this = |msg: u8, gen: Gen| msg as usize == m && gen == lease.gen;
        let holder = s
            .workers
            .iter()
            .enumerate()
            .find(|(w, wk)| Self::holder(*w, s) == lease.holder && wk.alive());
        let Some((_, wk)) = holder else {
            return Some(false);
        };
        if !self.config.chained_leases_lapse && wk.chained.iter().any(|o| this(o.msg, o.gen)) {
            return None;
        }
        Some(
            wk.flights.iter().any(|f| this(f.msg, f.gen))
                || wk
                    .dones
                    .iter()
                    .chain(&wk.failures)
                    .any(|o| this(o.msg, o.gen))
                || wk.chained.iter().any(|o| this(o.msg, o.gen)),
        )
    }

    fn claim(&self, s: &mut State, w: usize, m: usize) -> Gen {
        let bugs = self.config.bugs;
        let row = s.table.rows[m];
        if let Some(l) = row.lease() {
            s.ghost.double_lease |= !l.expired;
            s.ghost.lost[m] += 1;
        }
        let holder = Self::holder(w, s);
        let gen = s.table.claim(m, holder, bugs);
        s.ghost.counted[m] += 1;
        gen
    }

    /// Whether worker `w`'s claim `gen` of `m` holds its lease, not run out.
    fn holds_lease(s: &State, w: usize, m: usize, gen: Gen) -> bool {
        let own = s.workers[w]
            .flights
            .iter()
            .find(|f| f.msg as usize == m && f.gen == gen);
        own.is_some_and(|f| {
            !f.lapsed
                && s.table.rows[m]
                    .lease()
                    .is_some_and(|l| l.gen == f.gen && !l.expired)
        })
    }

    /// Whether another message of `m`'s key runs: its handler task runs in a live worker,
    /// and its lease did not run out under it (an attempt whose lease ran out is not
    /// promised to have stopped when the next one starts). Read from the workers, not from
    /// the rows: a write that deleted a row does not stop the task that runs it.
    fn key_runs(s: &State, m: usize) -> bool {
        let key = s.table.rows[m].key;
        key.is_some()
            && s.workers.iter().any(|wk| {
                wk.phase != Phase::Down
                    && wk.flights.iter().any(|f| {
                        f.run.is_some()
                            && !f.lapsed
                            && f.msg as usize != m
                            && s.table.rows[f.msg as usize].key == key
                    })
            })
    }

    fn attempt_of(s: &State, m: usize) -> u32 {
        s.table.rows[m].attempts().unwrap_or(0)
    }

    /// A fenced write of `m` under claim `gen`, judged from the row before and after it: a
    /// change to a row that another claim (or none) held is an unfenced change, whatever the
    /// statement reported.
    fn judged(s: &mut State, m: usize, gen: Gen, write: impl FnOnce(&mut Table)) -> bool {
        let before = s.table.rows[m];
        write(&mut s.table);
        let after = s.table.rows[m];
        let changed = before != after;
        if changed && before.lease().is_none_or(|l| l.gen != gen) {
            s.ghost.stale_landed = true;
        }
        changed
    }

    /// The hand-back of claim `gen` of `m` by worker `w`.
    fn hand_back(&self, s: &mut State, w: usize, m: usize, gen: Gen) {
        let bugs = self.config.bugs;
        let before = s.table.rows[m];
        let changed = Self::judged(s, m, gen, |t| {
            t.hand_back(m, gen, bugs);
        });
        if changed && before.lease().is_some_and(|l| l.gen == gen) {
            s.ghost.counted[m] = s.ghost.counted[m].saturating_sub(1);
        }
        if s.workers[w].queue.contains(&(m as u8, gen)) {
            s.workers[w].returned.push((m as u8, gen));
            s.workers[w].returned.sort_unstable();
            s.workers[w].returned.dedup();
        }
    }

    /// The next message of `m`'s key that a claim finds if `m` were gone: the early-successor
    /// bug, and the done write whose fence failed but still claims.
    fn successor_as_if_done(&self, s: &State, m: usize) -> Option<usize> {
        let mut t = s.table.clone();
        t.rows[m].status = Status::Done;
        let key = t.rows[m].key?;
        let next = t.rows.iter().position(|r| r.key == Some(key) && r.live())?;
        t.may_claim(next, self.config.bugs).then_some(next)
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let n = self.config.messages.len();
        vec![State {
            table: Table {
                rows: self
                    .config
                    .messages
                    .iter()
                    .enumerate()
                    .map(|(i, &(key, releases))| {
                        let clock = self.config.clocks.get(i).copied().unwrap_or(i as u32);
                        Row::new(key, releases, clock)
                    })
                    .collect(),
            },
            workers: (0..self.config.workers).map(|_| Worker::new(0)).collect(),
            crashes: self.config.crashes,
            stalls: self.config.stalls,
            stops: self.config.stops,
            operator: self.config.operator,
            ghost: Ghost {
                ran_ok: vec![false; n],
                counted: vec![0; n],
                lost: vec![0; n],
                ..Ghost::default()
            },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let bugs = self.config.bugs;
        let t = &s.table;
        for (m, row) in t.rows.iter().enumerate() {
            let mi = m as u8;
            match row.status {
                Status::Uncommitted
                    if t.predecessors(m).all(|p| p.status != Status::Uncommitted) =>
                {
                    actions.push(Action::Commit(mi));
                }
                Status::Live { .. } => match self.lapse(s, m) {
                    Some(false) => actions.push(Action::Expire(mi)),
                    Some(true) if s.stalls > 0 => actions.push(Action::Expire(mi)),
                    _ => {}
                },
                Status::Dead { .. } if s.operator > 0 => {
                    actions.push(Action::DeadRetry(mi));
                    actions.push(Action::Discard(mi));
                }
                _ => {}
            }
        }
        for (w, wk) in s.workers.iter().enumerate() {
            let wi = w as u8;
            if wk.alive() && s.crashes > 0 {
                actions.push(Action::Crash(wi));
            }
            match wk.phase {
                Phase::Down => {
                    actions.push(Action::Restart(wi));
                    continue;
                }
                Phase::Stopped => continue,
                Phase::Running if s.stops > 0 => actions.push(Action::Stop(wi)),
                _ => {}
            }
            let claiming = match wk.phase {
                Phase::Running => true,
                Phase::Stopping => wk.claim_loop,
                _ => false,
            };
            let live = matches!(wk.phase, Phase::Running | Phase::Stopping);
            if claiming && wk.flights.len() < self.config.batch {
                // Every batch of claimable messages that fits: the statement takes up to the
                // batch size, skipping rows locked by other claims.
                let room = self.config.batch - wk.flights.len();
                let claimable: u8 = (0..t.rows.len())
                    .filter(|&m| t.may_claim(m, bugs))
                    .fold(0, |acc, m| acc | 1 << m);
                let mut mask = claimable;
                while mask != 0 {
                    if (mask.count_ones() as usize) <= room {
                        actions.push(Action::Claim(wi, mask));
                    }
                    mask = (mask - 1) & claimable;
                }
            }
            if live && wk.running() < self.config.concurrency {
                for &(m, gen) in &wk.queue {
                    actions.push(Action::Start(wi, m, gen));
                }
            }
            for f in &wk.flights {
                if f.run.is_some() && live {
                    if f.attempt <= self.config.attempt_limit {
                        actions.push(Action::Finish(wi, f.msg, true));
                    }
                    actions.push(Action::Finish(wi, f.msg, false));
                }
                let row = t.rows[f.msg as usize];
                if live && row.lease().is_some_and(|l| l.gen == f.gen && l.expired) {
                    actions.push(Action::Renew(wi, f.msg));
                }
            }
            if wk.phase == Phase::Stopping {
                if wk.flights.iter().any(|f| !f.started) {
                    actions.push(Action::HandBackUnstarted(wi));
                }
                actions.push(Action::Deadline(wi));
            }
            for d in &wk.dones {
                let keyed = t.rows[d.msg as usize].key.is_some() && self.config.chained_claims;
                match wk.phase {
                    Phase::Running => actions.push(Action::WriteDone(wi, d.msg, keyed)),
                    // A write that began before the stop request may still claim.
                    _ => {
                        actions.push(Action::WriteDone(wi, d.msg, false));
                        if keyed {
                            actions.push(Action::WriteDone(wi, d.msg, true));
                        }
                    }
                }
            }
            for f in &wk.failures {
                actions.push(Action::WriteFailure(wi, f.msg));
            }
            if !wk.chained.is_empty() {
                if wk.phase == Phase::Running {
                    actions.push(Action::StartChained(wi));
                } else {
                    actions.push(Action::HandBackChained(wi));
                }
            }
            if wk.phase == Phase::Final
                && wk.dones.is_empty()
                && wk.failures.is_empty()
                && wk.chained.is_empty()
            {
                actions.push(Action::Exit(wi));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let bugs = self.config.bugs;
        let limit = self.config.attempt_limit;
        let mut s = last.clone();
        match action {
            Action::Commit(m) => s.table.commit(m as usize),
            Action::Claim(w, mask) => {
                let wu = w as usize;
                for m in (0..s.table.rows.len()).filter(|m| mask & 1 << m != 0) {
                    let gen = self.claim(&mut s, wu, m);
                    let attempt = Self::attempt_of(&s, m);
                    s.workers[wu].register(m as u8, gen, attempt);
                }
                if s.workers[wu].phase == Phase::Stopping {
                    // The statement in flight at the stop request was its last.
                    s.workers[wu].claim_loop = false;
                }
            }
            Action::Start(w, m, gen) => {
                let (wu, mu) = (w as usize, m as usize);
                let i = s.workers[wu].queue.iter().position(|&e| e == (m, gen))?;
                s.workers[wu].queue.remove(i);
                let record = s.workers[wu]
                    .flights
                    .iter()
                    .position(|f| f.msg == m && (f.gen == gen || bugs.start_by_id));
                if let Some(r) = record.filter(|&r| !s.workers[wu].flights[r].started) {
                    // A retried release without a lease waits for this one (claimed before it
                    // was retried): the claims skip it while a later message of its key is
                    // leased. A start under a claim whose lease ran out is an attempt the
                    // order does not bind against such a release (see `KEY_ORDER`).
                    let current = Self::holds_lease(&s, wu, mu, gen);
                    s.ghost.out_of_order |= s.table.predecessors(mu).any(|p| {
                        p.holds_key()
                            && !(p.retried_release
                                && (!current || p.lease().is_none_or(|l| l.expired)))
                    }) || (current && Self::key_runs(&s, mu));
                    s.ghost.started_handed_back |= s.workers[wu].returned.contains(&(m, gen));
                    let f = &mut s.workers[wu].flights[r];
                    f.started = true;
                    f.run = Some(gen);
                }
            }
            Action::Finish(w, m, ok) => {
                let wu = w as usize;
                let i = s.workers[wu]
                    .flights
                    .iter()
                    .position(|f| f.msg == m && f.run.is_some())?;
                let f = s.workers[wu].flights[i];
                let run = f.run?;
                if f.gen != run {
                    // `land`: the record is another claim's; the outcome is not written.
                    s.workers[wu].flights[i].run = None;
                    canonical_gens(&mut s);
                    return Some(s);
                }
                s.workers[wu].flights.remove(i);
                // process.rs: past the limit it is dead-lettered without running; a failure
                // retries below the limit and is dead at it.
                if ok && f.attempt <= limit {
                    s.ghost.ran_ok[m as usize] = true;
                    s.workers[wu].dones.push(Outcome {
                        msg: m,
                        gen: f.gen,
                        retry: None,
                    });
                    if bugs.early_successor {
                        if let Some(next) = self.successor_as_if_done(&s, m as usize) {
                            let gen = self.claim(&mut s, wu, next);
                            s.workers[wu].chained.push(Outcome {
                                msg: next as u8,
                                gen,
                                retry: None,
                            });
                        }
                    }
                } else {
                    let retry = if self.mutant(Mutant::DeadEarly) {
                        f.attempt + 1 < limit
                    } else if self.mutant(Mutant::DeadLate) {
                        f.attempt <= limit
                    } else {
                        f.attempt < limit
                    };
                    s.workers[wu].failures.push(Outcome {
                        msg: m,
                        gen: f.gen,
                        retry: Some(retry),
                    });
                }
            }
            Action::WriteDone(w, m, chain) => {
                let (wu, mu) = (w as usize, m as usize);
                let i = s.workers[wu].dones.iter().position(|d| d.msg == m)?;
                let d = s.workers[wu].dones.remove(i);
                let mut written = None;
                let changed = Self::judged(&mut s, mu, d.gen, |t| {
                    written = Some(t.mark_done(mu, d.gen, bugs));
                });
                let reported = written.is_some_and(|w| w.changed);
                debug_assert_eq!(changed, reported);
                let next = if chain && reported {
                    s.table.next_head(mu, bugs)
                } else if chain && self.mutant(Mutant::FailedFenceStillChains) {
                    self.successor_as_if_done(&s, mu)
                } else {
                    None
                };
                if let Some(next) = next {
                    let gen = self.claim(&mut s, wu, next);
                    s.workers[wu].chained.push(Outcome {
                        msg: next as u8,
                        gen,
                        retry: None,
                    });
                }
            }
            Action::WriteFailure(w, m) => {
                let (wu, mu) = (w as usize, m as usize);
                let i = s.workers[wu].failures.iter().position(|d| d.msg == m)?;
                let f = s.workers[wu].failures.remove(i);
                let retry = f.retry == Some(true);
                let changed = Self::judged(&mut s, mu, f.gen, |t| {
                    t.mark_failed(mu, f.gen, retry, bugs);
                });
                if changed {
                    s.ghost.dead_off_limit |= match s.table.rows[mu].status {
                        Status::Live { attempts, .. } => attempts >= limit,
                        Status::Dead { attempts } => attempts < limit,
                        _ => false,
                    };
                }
            }
            Action::StartChained(w) => {
                let wu = w as usize;
                let chained = std::mem::take(&mut s.workers[wu].chained);
                for c in chained {
                    let attempt = Self::attempt_of(&s, c.msg as usize);
                    s.workers[wu].register(c.msg, c.gen, attempt);
                }
            }
            Action::HandBackChained(w) => {
                let chained = std::mem::take(&mut s.workers[w as usize].chained);
                if !self.mutant(Mutant::StopDropsChained) {
                    for c in chained {
                        self.hand_back(&mut s, w as usize, c.msg as usize, c.gen);
                    }
                }
            }
            Action::Renew(w, m) => {
                let wu = w as usize;
                let f = *s.workers[wu].flights.iter().find(|f| f.msg == m)?;
                Self::judged(&mut s, m as usize, f.gen, |t| {
                    t.renew(m as usize, f.gen);
                });
            }
            Action::Expire(m) => {
                if self.lapse(&s, m as usize) == Some(true) {
                    s.stalls -= 1;
                    if let Some(l) = s.table.rows[m as usize].lease() {
                        for wk in &mut s.workers {
                            for f in wk.flights.iter_mut() {
                                if f.msg == m && f.gen == l.gen {
                                    f.lapsed = true;
                                }
                            }
                        }
                    }
                }
                s.table.expire(m as usize);
            }
            Action::Crash(w) => {
                s.crashes -= 1;
                let wk = &mut s.workers[w as usize];
                *wk = Worker {
                    phase: Phase::Down,
                    claim_loop: false,
                    ..Worker::new(wk.incarnation)
                };
            }
            Action::Restart(w) => {
                let wk = &mut s.workers[w as usize];
                *wk = Worker::new(wk.incarnation + 1);
            }
            Action::Stop(w) => {
                s.stops -= 1;
                s.workers[w as usize].phase = Phase::Stopping;
            }
            Action::HandBackUnstarted(w) => {
                let wu = w as usize;
                let unstarted: Vec<Flight> = s.workers[wu]
                    .flights
                    .iter()
                    .filter(|f| !f.started)
                    .copied()
                    .collect();
                for f in &unstarted {
                    self.hand_back(&mut s, wu, f.msg as usize, f.gen);
                }
                if !self.mutant(Mutant::HandedBackStillStart) {
                    // Withdrawn: their records go, and their queue entries find none.
                    let wk = &mut s.workers[wu];
                    wk.flights.retain(|f| f.started);
                    wk.queue
                        .retain(|&(m, g)| !unstarted.iter().any(|f| f.msg == m && f.gen == g));
                }
            }
            Action::Deadline(w) => {
                let wu = w as usize;
                let left = std::mem::take(&mut s.workers[wu].flights);
                s.workers[wu].queue.clear();
                s.workers[wu].phase = Phase::Final;
                s.workers[wu].claim_loop = false;
                for f in left {
                    if !(f.started && self.mutant(Mutant::DeadlineDropsRunning)) {
                        self.hand_back(&mut s, wu, f.msg as usize, f.gen);
                    }
                }
            }
            Action::Exit(w) => s.workers[w as usize].phase = Phase::Stopped,
            Action::DeadRetry(m) => {
                s.operator -= 1;
                s.table.dead_retry(m as usize);
                let mu = m as usize;
                s.ghost.counted[mu] = 0;
                s.ghost.lost[mu] = 0;
            }
            Action::Discard(m) => {
                s.operator -= 1;
                s.table.discard(m as usize);
            }
        }
        canonical_gens(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NOTHING_LOST, |_, s: &State| nothing_lost(s)),
            Property::always(ONE_LEASE, |_, s: &State| one_lease(s)),
            Property::always(STALE_OUTCOME, |_, s: &State| !s.ghost.stale_landed),
            Property::always(OWN_CLAIM, |_, s: &State| {
                s.workers
                    .iter()
                    .all(|w| w.flights.iter().all(|f| f.run.is_none_or(|r| r == f.gen)))
            }),
            Property::always(HANDED_BACK_NEVER_STARTS, |_, s: &State| {
                !s.ghost.started_handed_back
            }),
            Property::always(KEY_ORDER, |_, s: &State| !s.ghost.out_of_order),
            Property::always(ATTEMPTS, |p: &Protocol, s: &State| attempts_counted(p, s)),
            Property::always(DEAD_AT_LIMIT, |_, s: &State| !s.ghost.dead_off_limit),
            Property::always(SHUTDOWN, |_, s: &State| stopped_holds_nothing(s)),
            Property::eventually(SETTLED, |_, s: &State| settled(s)),
            Property::sometimes(REACH_DONE_BY_CHAIN, |_, s: &State| {
                s.workers.iter().any(|w| !w.chained.is_empty())
            }),
            Property::sometimes(REACH_STALE_REFUSED, |_, s: &State| {
                s.workers.iter().enumerate().any(|(w, wk)| {
                    wk.alive()
                        && wk.dones.iter().chain(&wk.failures).any(|o| {
                            let row = s.table.rows[o.msg as usize];
                            row.live()
                                && row.lease().is_some_and(|l| {
                                    l.gen != o.gen && Protocol::holder(w, s) != l.holder
                                })
                        })
                })
            }),
            Property::sometimes(REACH_DEAD_HOLDS_KEY, |_, s: &State| {
                (0..s.table.rows.len()).any(|m| {
                    s.table.rows[m].live()
                        && s.table
                            .predecessors(m)
                            .any(|p| matches!(p.status, Status::Dead { .. }))
                })
            }),
            Property::sometimes(REACH_HANDED_BACK_AT_STOP, |_, s: &State| {
                s.workers.iter().any(|w| w.phase == Phase::Stopped)
                    && s.table.rows.iter().any(|r| {
                        matches!(r.status, Status::Live { attempts: 0, .. }) && r.claims > 0
                    })
            }),
            Property::sometimes(REACH_RETRIED_RELEASE_WAITS, |_, s: &State| {
                (0..s.table.rows.len()).any(|m| {
                    let r = &s.table.rows[m];
                    r.retried_release
                        && r.live()
                        && r.lease().is_none()
                        && s.table
                            .successors(m)
                            .any(|n| n.lease().is_some_and(|l| !l.expired))
                })
            }),
            Property::sometimes(REACH_RECLAIMED_WHILE_WAITING, |_, s: &State| {
                s.workers.iter().any(|w| {
                    w.queue
                        .iter()
                        .any(|&(m, g)| w.flights.iter().any(|f| f.msg == m && f.gen != g))
                })
            }),
        ]
    }
}

/// "nothing lost": every committed message is live (pending, waiting for a retry, or leased),
/// dead (or discarded from the dead letters by an operator), or done after a handler run of
/// it succeeded.
pub const NOTHING_LOST: &str = "nothing lost";
/// "one lease": no claim takes a message whose lease has not run out, so a message is leased
/// to at most one live worker at a time.
pub const ONE_LEASE: &str = "one lease";
/// "no unfenced change": no outcome write, hand-back or renewal changes a row that, before
/// it, another claim (or none) held. Judged from the row before and after each write, not
/// from what the write reported.
pub const STALE_OUTCOME: &str = "no unfenced change";
/// "own claim": a handler task runs only under the claim whose record started it (the fence
/// its outcome is written with is the record's).
pub const OWN_CLAIM: &str = "a start only under its own claim";
/// "handed back": a claim the worker handed back at the stop request never starts.
pub const HANDED_BACK_NEVER_STARTS: &str = "a handed-back claim never starts";
/// "key order": a message with a key starts only when every message its key's writes put
/// before it is done (its done write committed) or discarded, or dead with `releases_key`: a
/// dead earlier message holds it until retried or discarded. A dead letter that released its
/// key and was retried waits for the later messages of its key claimed before (they may start
/// before it), and no message starts under its lease while a handler task of another message
/// of its key runs (read from the workers' tasks, not from the rows' leases). An attempt whose
/// lease ran out (a stalled worker) is not bound by the retried release.
pub const KEY_ORDER: &str = "key order";
/// "attempts": a message's attempts are its claims less its hand-backs (counted at claim),
/// and never exceed the attempt limit plus its claims lost to crashes and lapsed leases.
pub const ATTEMPTS: &str = "attempts counted at claim";
/// "dead at the limit": a failed attempt below the attempt limit is retried, one at or past
/// it dead-lettered (judged from the row the failure write leaves).
pub const DEAD_AT_LIMIT: &str = "dead exactly at the attempt limit";
/// "shutdown": a stopped worker holds no lease, and no message waits in it.
pub const SHUTDOWN: &str = "stopped worker holds nothing";
/// "settled" (liveness): once the crashes, stalls, stops and operator actions allowed are
/// spent, every message ends done or dead, or waits behind a dead letter of its key.
pub const SETTLED: &str = "every message settles";
/// Coverage: a done write claimed the next message of its key.
pub const REACH_DONE_BY_CHAIN: &str = "reached: a done write claims the key's next message";
/// Coverage: an outcome waits for its write while another claim owns the message.
pub const REACH_STALE_REFUSED: &str = "reached: a stale outcome meets a newer claim";
/// Coverage: a dead letter holds a live message of its key.
pub const REACH_DEAD_HOLDS_KEY: &str = "reached: a dead letter holds its key";
/// Coverage: a retried dead letter that had released its key waits while a later message of
/// its key holds a lease.
pub const REACH_RETRIED_RELEASE_WAITS: &str =
    "reached: a retried release waits for its key's claimed message";
/// Coverage: a stopped worker handed a claimed message back.
pub const REACH_HANDED_BACK_AT_STOP: &str = "reached: a stopped worker's message handed back";
/// Coverage: a worker claimed again a message whose older claim still waits in its queue.
pub const REACH_RECLAIMED_WHILE_WAITING: &str =
    "reached: a waiting message claimed again by its own worker";

/// Renumbers each message's claims 1, 2, ... in their order, over the claims still referred
/// to (by the table or a worker), and its claim count to the last (at least 1 once claimed):
/// only their equality and the freshness of the next one matter, so states that differ in
/// claims long gone are one.
fn canonical_gens(s: &mut State) {
    for wk in &mut s.workers {
        let queue = &wk.queue;
        wk.returned.retain(|e| queue.contains(e));
    }
    for m in 0..s.table.rows.len() {
        let mut gens: Vec<Gen> = Vec::new();
        if let Some(l) = s.table.rows[m].lease() {
            gens.push(l.gen);
        }
        let mine = |msg: u8| msg as usize == m;
        for wk in &s.workers {
            for f in wk.flights.iter().filter(|f| mine(f.msg)) {
                gens.push(f.gen);
                gens.extend(f.run);
            }
            gens.extend(
                wk.queue
                    .iter()
                    .chain(&wk.returned)
                    .filter(|e| mine(e.0))
                    .map(|e| e.1),
            );
            gens.extend(
                wk.dones
                    .iter()
                    .chain(&wk.failures)
                    .chain(&wk.chained)
                    .filter(|o| mine(o.msg))
                    .map(|o| o.gen),
            );
        }
        gens.sort_unstable();
        gens.dedup();
        let new = |g: Gen| {
            gens.iter()
                .position(|&x| x == g)
                .map_or(g, |i| i as Gen + 1)
        };
        if let Status::Live { lease: Some(l), .. } = &mut s.table.rows[m].status {
            l.gen = new(l.gen);
        }
        for wk in &mut s.workers {
            for f in wk.flights.iter_mut().filter(|f| mine(f.msg)) {
                f.gen = new(f.gen);
                f.run = f.run.map(new);
            }
            for e in wk
                .queue
                .iter_mut()
                .chain(wk.returned.iter_mut())
                .filter(|e| mine(e.0))
            {
                e.1 = new(e.1);
            }
            for o in wk
                .dones
                .iter_mut()
                .chain(wk.failures.iter_mut())
                .chain(wk.chained.iter_mut())
                .filter(|o| mine(o.msg))
            {
                o.gen = new(o.gen);
            }
            wk.queue.sort_unstable();
            wk.returned.sort_unstable();
        }
        // Whether it was ever claimed stays known.
        let ever = Gen::from(s.table.rows[m].claims > 0);
        s.table.rows[m].claims = (gens.len() as Gen).max(ever);
    }
}
fn nothing_lost(s: &State) -> bool {
    s.table
        .rows
        .iter()
        .zip(&s.ghost.ran_ok)
        .all(|(r, ran)| r.status != Status::Done || *ran)
}

fn one_lease(s: &State) -> bool {
    !s.ghost.double_lease
}

fn attempts_counted(p: &Protocol, s: &State) -> bool {
    s.table
        .rows
        .iter()
        .enumerate()
        .all(|(m, r)| match r.status {
            Status::Live { attempts, .. } | Status::Dead { attempts } => {
                attempts == s.ghost.counted[m]
                    && attempts <= p.config.attempt_limit + s.ghost.lost[m]
            }
            _ => true,
        })
}

fn stopped_holds_nothing(s: &State) -> bool {
    s.workers.iter().enumerate().all(|(w, wk)| {
        wk.phase != Phase::Stopped
            || (wk.flights.is_empty()
                && !s.table.rows.iter().any(|r| {
                    r.lease()
                        .is_some_and(|l| l.holder == Protocol::holder(w, s))
                }))
    })
}

fn settled(s: &State) -> bool {
    (0..s.table.rows.len()).all(|m| {
        let r = &s.table.rows[m];
        match r.status {
            Status::Done | Status::Dead { .. } | Status::Discarded => true,
            Status::Live { .. } => s
                .table
                .predecessors(m)
                .any(|p| matches!(p.status, Status::Dead { .. }) && !p.releases_key),
            Status::Uncommitted => false,
        }
    })
}
