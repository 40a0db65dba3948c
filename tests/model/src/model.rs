//! The worker side and the whole system as a [`stateright::Model`]: producers, workers (the
//! engine of `outbox-core/src/worker/`), time (leases running out, backoffs ending) and an
//! operator, over the [`Table`] of [`crate::db`].

use stateright::{Model, Property};

use crate::db::{Gen, Holder, Row, Status, Table};
use crate::Bugs;

/// The bounds and the system checked.
#[derive(Clone, Debug)]
pub struct Config {
    /// Worker slots; each runs one incarnation at a time.
    pub workers: usize,
    /// The messages, in id order: each one's ordering key and `releases_key`.
    pub messages: Vec<(Option<u32>, bool)>,
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

    /// The same bounds with `bugs` switched on.
    pub fn with_bugs(mut self, bugs: Bugs) -> Self {
        self.bugs = bugs;
        self
    }
}

/// The life of a worker incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flight {
    /// The message.
    pub msg: u8,
    /// Its claim (the fence of its writes).
    pub gen: Gen,
    /// The attempt that claim counted, as the worker read it.
    pub attempt: u32,
    /// Its handler task began (`Watch::begin`).
    pub started: bool,
    /// Its lease ran out under this live worker (a stall), even if a renewal took it back:
    /// from then on it is an attempt the order does not bind (see `KEY_ORDER`).
    pub lapsed: bool,
}

/// An outcome waiting for its write: a done one in the flusher, a failed one in its task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Outcome {
    /// The message.
    pub msg: u8,
    /// The claim it ran under.
    pub gen: Gen,
    /// For a failed outcome: `Some(true)` retry, `Some(false)` dead; `None` for done.
    pub retry: Option<bool>,
}

/// One worker slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Worker {
    /// Its current incarnation (a restart makes a new one).
    pub incarnation: u8,
    /// Where it is.
    pub phase: Phase,
    /// The claim loop may still land a statement: until its first claim after the stop
    /// request (the statement in flight then), or the end of the stop phase.
    pub claim_loop: bool,
    /// `flights`, by message.
    pub flights: Vec<Flight>,
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
            dones: Vec::new(),
            failures: Vec::new(),
            chained: Vec::new(),
        }
    }

    fn flight(&self, m: u8) -> Option<&Flight> {
        self.flights.iter().find(|f| f.msg == m)
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
    /// An outcome write changed a message another claim (or none) held.
    pub stale_landed: bool,
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
    /// Worker `.0`'s claim statement takes message `.1` (`claim_loop`, `outbox_claim_batch`).
    Claim(u8, u8),
    /// A claimed message's handler task begins (`start_all`, `Watch::begin`).
    Start(u8, u8),
    /// Its handlers end, successfully or not, and the outcome is landed (`collect`).
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
        (w as u32) << 8 | u32::from(s.workers[w].incarnation)
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

    /// Whether worker `w`'s claim of `m` is the one that holds its lease, not run out.
    fn holds_lease(s: &State, w: usize, m: usize) -> bool {
        let own = s.workers[w].flights.iter().find(|f| f.msg as usize == m);
        own.is_some_and(|f| {
            !f.lapsed
                && s.table.rows[m]
                    .lease()
                    .is_some_and(|l| l.gen == f.gen && !l.expired)
        })
    }

    /// Whether another message of `m`'s key runs: started in a live worker under the claim
    /// that holds its lease, which has not run out. (An attempt whose lease ran out is not
    /// promised to have stopped when the next one starts.)
    fn key_runs(s: &State, m: usize) -> bool {
        let key = s.table.rows[m].key;
        key.is_some()
            && s.workers.iter().any(|wk| {
                wk.phase != Phase::Down
                    && wk.flights.iter().any(|f| {
                        let r = &s.table.rows[f.msg as usize];
                        f.started
                            && !f.lapsed
                            && f.msg as usize != m
                            && r.key == key
                            && r.lease().is_some_and(|l| l.gen == f.gen && !l.expired)
                    })
            })
    }

    fn attempt_of(s: &State, m: usize) -> u32 {
        s.table.rows[m].attempts().unwrap_or(0)
    }

    fn hand_back(&self, s: &mut State, m: usize, gen: Gen) {
        let written = s.table.hand_back(m, gen, self.config.bugs);
        if written.changed && !written.stale {
            s.ghost.counted[m] = s.ghost.counted[m].saturating_sub(1);
        }
        s.ghost.stale_landed |= written.stale;
    }

    /// The next message of `m`'s key a worker claims as soon as `m`'s handlers succeed, before
    /// `m`'s done write (the early-successor bug): the key's head as if `m` were gone.
    fn early_successor(&self, s: &State, m: usize) -> Option<usize> {
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
                    .map(|&(key, releases)| Row::new(key, releases))
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
            let running = wk.flights.iter().filter(|f| f.started).count();
            if claiming && wk.flights.len() < self.config.batch {
                for m in 0..t.rows.len() {
                    if t.may_claim(m, bugs) {
                        actions.push(Action::Claim(wi, m as u8));
                    }
                }
            }
            for f in &wk.flights {
                if !f.started
                    && running < self.config.concurrency
                    && matches!(wk.phase, Phase::Running | Phase::Stopping)
                {
                    actions.push(Action::Start(wi, f.msg));
                }
                if f.started && matches!(wk.phase, Phase::Running | Phase::Stopping) {
                    if f.attempt <= self.config.attempt_limit {
                        actions.push(Action::Finish(wi, f.msg, true));
                    }
                    actions.push(Action::Finish(wi, f.msg, false));
                }
                let row = t.rows[f.msg as usize];
                if matches!(wk.phase, Phase::Running | Phase::Stopping)
                    && row.lease().is_some_and(|l| l.gen == f.gen && l.expired)
                {
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
        let mut s = last.clone();
        match action {
            Action::Commit(m) => {
                s.table.rows[m as usize].status = Status::Live {
                    attempts: 0,
                    lease: None,
                };
            }
            Action::Claim(w, m) => {
                let (wu, mu) = (w as usize, m as usize);
                let gen = self.claim(&mut s, wu, mu);
                let attempt = Self::attempt_of(&s, mu);
                let wk = &mut s.workers[wu];
                wk.flights.retain(|f| f.msg != m);
                wk.flights.push(Flight {
                    msg: m,
                    gen,
                    attempt,
                    started: false,
                    lapsed: false,
                });
                wk.flights.sort_by_key(|f| f.msg);
                if wk.phase == Phase::Stopping {
                    // The statement in flight at the stop request was its last.
                    wk.claim_loop = false;
                }
            }
            Action::Start(w, m) => {
                let mu = m as usize;
                // A retried release without a lease waits for this one (claimed before it was
                // retried): the claims skip it while a later message of its key is leased. A
                // start under a claim whose lease ran out is an attempt the order does not
                // bind against such a release (see `KEY_ORDER`).
                let current = Self::holds_lease(&s, w as usize, mu);
                s.ghost.out_of_order |= s.table.predecessors(mu).any(|p| {
                    p.holds_key()
                        && !(p.retried_release && (!current || p.lease().is_none_or(|l| l.expired)))
                }) || (current && Self::key_runs(&s, mu));
                let wk = &mut s.workers[w as usize];
                if let Some(f) = wk.flights.iter_mut().find(|f| f.msg == m) {
                    f.started = true;
                }
            }
            Action::Finish(w, m, ok) => {
                let wu = w as usize;
                let f = *s.workers[wu].flight(m)?;
                s.workers[wu].flights.retain(|x| x.msg != m);
                let limit = self.config.attempt_limit;
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
                        if let Some(next) = self.early_successor(&s, m as usize) {
                            let gen = self.claim(&mut s, wu, next);
                            s.workers[wu].chained.push(Outcome {
                                msg: next as u8,
                                gen,
                                retry: None,
                            });
                        }
                    }
                } else {
                    s.workers[wu].failures.push(Outcome {
                        msg: m,
                        gen: f.gen,
                        retry: Some(f.attempt < limit),
                    });
                }
            }
            Action::WriteDone(w, m, chain) => {
                let (wu, mu) = (w as usize, m as usize);
                let i = s.workers[wu].dones.iter().position(|d| d.msg == m)?;
                let d = s.workers[wu].dones.remove(i);
                let written = s.table.mark_done(mu, d.gen, bugs);
                s.ghost.stale_landed |= written.stale;
                if chain && written.changed {
                    if let Some(next) = s.table.next_head(mu, bugs) {
                        let gen = self.claim(&mut s, wu, next);
                        s.workers[wu].chained.push(Outcome {
                            msg: next as u8,
                            gen,
                            retry: None,
                        });
                    }
                }
            }
            Action::WriteFailure(w, m) => {
                let (wu, mu) = (w as usize, m as usize);
                let i = s.workers[wu].failures.iter().position(|d| d.msg == m)?;
                let f = s.workers[wu].failures.remove(i);
                let written = s.table.mark_failed(mu, f.gen, f.retry == Some(true), bugs);
                s.ghost.stale_landed |= written.stale;
            }
            Action::StartChained(w) => {
                let wu = w as usize;
                let chained = std::mem::take(&mut s.workers[wu].chained);
                for c in chained {
                    let attempt = Self::attempt_of(&s, c.msg as usize);
                    let wk = &mut s.workers[wu];
                    wk.flights.retain(|f| f.msg != c.msg);
                    wk.flights.push(Flight {
                        msg: c.msg,
                        gen: c.gen,
                        attempt,
                        started: false,
                        lapsed: false,
                    });
                    wk.flights.sort_by_key(|f| f.msg);
                }
            }
            Action::HandBackChained(w) => {
                let chained = std::mem::take(&mut s.workers[w as usize].chained);
                for c in chained {
                    self.hand_back(&mut s, c.msg as usize, c.gen);
                }
            }
            Action::Renew(w, m) => {
                let f = *s.workers[w as usize].flight(m)?;
                s.table.renew(m as usize, f.gen);
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
                let (unstarted, kept): (Vec<Flight>, Vec<Flight>) =
                    s.workers[wu].flights.iter().partition(|f| !f.started);
                s.workers[wu].flights = kept;
                for f in unstarted {
                    self.hand_back(&mut s, f.msg as usize, f.gen);
                }
            }
            Action::Deadline(w) => {
                let wu = w as usize;
                let left = std::mem::take(&mut s.workers[wu].flights);
                s.workers[wu].phase = Phase::Final;
                s.workers[wu].claim_loop = false;
                for f in left {
                    self.hand_back(&mut s, f.msg as usize, f.gen);
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
            Property::always(KEY_ORDER, |_, s: &State| !s.ghost.out_of_order),
            Property::always(ATTEMPTS, |p: &Protocol, s: &State| attempts_counted(p, s)),
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
/// "stale outcome": an outcome written under a superseded claim (its token no longer the
/// message's) never changes the message.
pub const STALE_OUTCOME: &str = "stale outcome refused";
/// "key order": a message with a key starts only when every earlier message of its key is
/// done (its done write committed) or discarded, or dead with `releases_key`: a dead earlier
/// message holds it until retried or discarded. A dead letter that released its key and was
/// retried waits for the later messages of its key claimed before (they may start before
/// it), and no message starts under its lease while another of its key runs under a lease.
/// An attempt whose lease ran out (a stalled worker) is not bound by the retried release.
pub const KEY_ORDER: &str = "key order";
/// "attempts": a message's attempts are its claims less its hand-backs (counted at claim),
/// and never exceed the attempt limit plus its claims lost to crashes and lapsed leases.
pub const ATTEMPTS: &str = "attempts counted at claim";
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

/// Renumbers each message's claims 1, 2, ... in their order, over the claims still referred
/// to (by the table or a worker), and its claim count to the last (at least 1 once claimed):
/// only their equality and the freshness of the next one matter, so states that differ in
/// claims long gone are one.
fn canonical_gens(s: &mut State) {
    for m in 0..s.table.rows.len() {
        let mut gens: Vec<Gen> = Vec::new();
        if let Some(l) = s.table.rows[m].lease() {
            gens.push(l.gen);
        }
        for wk in &s.workers {
            gens.extend(
                wk.flights
                    .iter()
                    .filter(|f| f.msg as usize == m)
                    .map(|f| f.gen),
            );
            gens.extend(
                wk.dones
                    .iter()
                    .chain(&wk.failures)
                    .chain(&wk.chained)
                    .filter(|o| o.msg as usize == m)
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
            for f in wk.flights.iter_mut().filter(|f| f.msg as usize == m) {
                f.gen = new(f.gen);
            }
            for o in wk
                .dones
                .iter_mut()
                .chain(wk.failures.iter_mut())
                .chain(wk.chained.iter_mut())
                .filter(|o| o.msg as usize == m)
            {
                o.gen = new(o.gen);
            }
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
