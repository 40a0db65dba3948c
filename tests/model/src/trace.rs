//! Trace validation: a recorded run of real workers replayed through the model's statements.
//!
//! The workers record their protocol steps as `tracing` events at the target
//! `outbox::protocol` (see `outbox-core/src/worker/protocol.rs`), one JSON object a line:
//! `t` (microseconds since the Unix epoch), `action`, `worker`, and the action's fields. Every
//! event is fed, in time order, to the [`db::Table`](crate::db::Table) statements of the model,
//! which say what each statement must have done; a step the model does not allow is a
//! [`Violation`].
//!
//! What a trace can tell, and so what is checked:
//! - a claim takes only a message that is still live (never one whose done or dead write
//!   committed), and counts its attempt: the attempt it reads is one more than the model's
//!   count, or more when claims were unseen (see below), never less;
//! - a message with an ordering key is claimed and started only when no earlier message of
//!   its key (by `seq`, the key's commit order, among the messages the trace saw; by id in a
//!   trace that records no `seq`) is live, or dead and holding the key (a dead letter whose
//!   claim recorded `releases_key` does not hold it);
//! - a handler starts only under a claim its worker made;
//! - outcome writes, hand-backs and renewals are fenced: a statement never changes more
//!   messages than the model holds under its tokens (a done, failed or hand-back write, or a
//!   renewal, of a superseded claim never lands);
//! - a worker that stopped with its final writes complete holds no message;
//! - at the end, each message's state in the model agrees with the database's.
//!
//! What it cannot tell, and so is not checked:
//! - time: when a lease runs out (the soak lapses leases on purpose), so a claim of a message
//!   leased to another claim is taken as coming after that lease ran out;
//! - steps that left no event: a SIGKILLed worker's last statements (committed, the process
//!   killed before it wrote the line), and statements whose connection failed after they
//!   committed (an `error` event says they may have). Their effects are inferred: attempts
//!   higher than counted are unseen claims; a fenced write that changed fewer messages than
//!   the model expected lost its fence to a claim whose event comes later, or to an unseen
//!   step; such messages are left open until a later event or the final state settles them;
//! - the exact order of statements of different workers that ran at the same time: the events
//!   are ordered by the time each was written, after its statement returned, which is why a
//!   write that changed fewer messages than expected is not a violation by itself. A refused
//!   step is tried again after a later event of the same message (within 2 s) only when that
//!   event stands on its own there: one that would then have lost its fence cannot explain
//!   the refused step (a stale done write that landed, followed by the newer claim's own done
//!   write finding nothing). A renewal may have changed messages the model already ended under
//!   the renewal's own claim (it ran just before that claim's outcome write, which was recorded
//!   first): those count as renewed before their end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use serde::Deserialize;

use crate::db::{Gen, Lease, Row, Status, Table};
use crate::Bugs;

/// One recorded protocol step.
#[derive(Clone, Debug, Deserialize)]
pub struct Event {
    /// Microseconds since the Unix epoch when it was recorded.
    pub t: u64,
    /// `claim`, `start`, `renew`, `done`, `failed`, `hand_back`, `error`, `stop`, `stopped`.
    pub action: String,
    /// The worker's id.
    pub worker: String,
    /// One message's id.
    #[serde(default)]
    pub message: Option<String>,
    /// Its claim token.
    #[serde(default)]
    pub token: Option<String>,
    /// Several messages' ids, comma-separated.
    #[serde(default)]
    pub messages: Option<String>,
    /// Their claim tokens, in the same order.
    #[serde(default)]
    pub tokens: Option<String>,
    /// A claimed message's ordering key.
    #[serde(default)]
    pub key: Option<String>,
    /// A claimed keyed message's place in its key's order (`seq`: the commit order of the
    /// key's writes).
    #[serde(default)]
    pub seq: Option<i64>,
    /// A claimed keyed message's `releases_key`: dead, it does not hold its key.
    #[serde(default)]
    pub releases_key: Option<bool>,
    /// A claimed message's attempt.
    #[serde(default)]
    pub attempt: Option<u32>,
    /// A failed outcome: retry (true) or dead.
    #[serde(default)]
    pub retry: Option<bool>,
    /// What the statement changed: a count (batches) or a bool (one failed outcome).
    #[serde(default)]
    pub written: Option<serde_json::Value>,
    /// `stopped`: the final writes finished in time.
    #[serde(default)]
    pub complete: Option<bool>,
}

impl Event {
    fn fences(&self) -> Vec<(String, String)> {
        match (&self.message, &self.token, &self.messages, &self.tokens) {
            (Some(m), Some(t), _, _) => vec![(m.clone(), t.clone())],
            (_, _, Some(ms), Some(ts)) if !ms.is_empty() => ms
                .split(',')
                .zip(ts.split(','))
                .map(|(m, t)| (m.to_string(), t.to_string()))
                .collect(),
            _ => Vec::new(),
        }
    }

    fn written_count(&self) -> Option<u64> {
        match &self.written {
            Some(serde_json::Value::Number(n)) => n.as_u64(),
            Some(serde_json::Value::Bool(b)) => Some(u64::from(*b)),
            _ => None,
        }
    }
}

/// A step of the trace the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The event's time (microseconds since the Unix epoch).
    pub t: u64,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at t={}us: {}", self.t, self.what)
    }
}

/// A message's final state in the database, for [`Validator::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Final {
    /// Deleted as done.
    Done,
    /// In `outbox_dead`.
    Dead,
    /// Still in `outbox_messages`.
    Live,
}

/// What the validation saw and inferred.
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// Steps the model allowed only after events of the same message recorded just after them
    /// (their statements ran in the other order).
    pub reordered: usize,
    /// Events replayed.
    pub events: usize,
    /// Messages seen.
    pub messages: usize,
    /// Claims replayed.
    pub claims: usize,
    /// Claims that took a message still leased to another claim: that lease ran out first.
    pub lapsed_leases: usize,
    /// Attempts counted by claims that left no event.
    pub unseen_claims: u64,
    /// Writes that changed fewer messages than the model expected (a claim recorded later, or
    /// an unseen step, took them first).
    pub fences_lost: usize,
    /// Workers whose trace ends without a complete `stopped` (SIGKILLed, or their final writes cut
    /// short).
    pub killed_workers: usize,
}

/// The state of some messages before a step, to undo it.
struct Saved {
    rows: Vec<(usize, Row, Message)>,
    summary: Summary,
    violations: usize,
    all_violations: Vec<Violation>,
}

/// One message as the validator knows it.
#[derive(Debug, Clone)]
struct Message {
    id: String,
    key: Option<String>,
    /// Its place in its key's order, when the trace recorded it.
    seq: Option<i64>,
    /// Its claims: token -> (claim number, worker).
    claims: HashMap<String, (Gen, String)>,
    /// A write under this claim may have changed it without the model knowing (an `error`
    /// event, or a write that changed fewer messages than expected).
    open: bool,
    /// When its last event but handler starts was a claim: that claim, and the message before
    /// it, so that a statement that ran before the claim but was recorded after it can go
    /// first.
    before_claim: Option<Box<(Event, Row, Message)>>,
}

/// How far apart (microseconds) two events of one message may be recorded in the opposite
/// order of their statements: a step the model refuses is tried again after the events of the
/// same message recorded up to this much later.
const REORDER_WINDOW_US: u64 = 2_000_000;

/// Replays events through the model's statements.
#[derive(Debug, Default, Clone)]
pub struct Validator {
    table: Table,
    messages: Vec<Message>,
    index: HashMap<String, usize>,
    /// Each key's messages in the key's order: by `seq`, then id.
    keys: HashMap<String, BTreeMap<(Option<i64>, String), usize>>,
    holders: HashMap<String, u32>,
    stopped: HashSet<String>,
    workers: HashSet<String>,
    summary: Summary,
    violations: Vec<Violation>,
}

impl Validator {
    /// An empty validator.
    pub fn new() -> Self {
        Validator::default()
    }

    /// Parses JSON lines; a last line cut short (a SIGKILLed writer) is left out.
    pub fn parse(text: &str) -> Result<Vec<Event>, String> {
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut out = Vec::with_capacity(lines.len());
        for (i, line) in lines.iter().enumerate() {
            match serde_json::from_str::<Event>(line) {
                Ok(e) => out.push(e),
                Err(_) if i + 1 == lines.len() => {}
                Err(e) => return Err(format!("line {}: {e}: {line}", i + 1)),
            }
        }
        Ok(out)
    }

    /// Replays `events` (from any number of workers) in time order, ties in the given order.
    pub fn replay(&mut self, mut events: Vec<Event>) {
        events.sort_by_key(|e| e.t);
        for e in &events {
            self.workers.insert(e.worker.clone());
            // A worker whose final writes did not finish in time may have left steps unseen,
            // as a killed one.
            if e.action == "stopped" && e.complete == Some(true) {
                self.stopped.insert(e.worker.clone());
            }
        }
        let mut done = vec![false; events.len()];
        for i in 0..events.len() {
            if done[i] {
                continue;
            }
            done[i] = true;
            self.summary.events += 1;
            let mine = Self::touched(&events[i]);
            let before = self.save(&mine);
            self.step(&events[i]);
            if self.violations.len() == before.violations {
                continue;
            }
            // Refused: the statements may have run in the other order than their events were
            // recorded. Try each later event of the same message first.
            let refused = self.save(&mine);
            let window = events[i].t.saturating_add(REORDER_WINDOW_US);
            let mut accepted = false;
            for j in i + 1..events.len() {
                if events[j].t > window {
                    break;
                }
                let theirs = Self::touched(&events[j]);
                if done[j] || !theirs.iter().any(|m| mine.contains(m)) {
                    continue;
                }
                let both: Vec<String> = mine.iter().chain(&theirs).cloned().collect();
                self.restore(&before);
                let tried = self.save(&both);
                let lost = self.summary.fences_lost;
                self.step(&events[j]);
                // Moved first, the later event must stand on its own: had its statement run
                // first, it would have found its claim in place. One that then lost its fence
                // (and so left the message open) would only excuse the refused step: a stale
                // write followed by the newer claim's own write.
                let stands = self.summary.fences_lost == lost;
                self.step(&events[i]);
                if stands && self.violations.len() == before.violations {
                    self.summary.events += 1;
                    self.summary.reordered += 1;
                    done[j] = true;
                    accepted = true;
                    break;
                }
                self.restore(&tried);
            }
            if !accepted {
                self.restore(&refused);
                accepted = self.before_last_claims(&events[i], &mine, &before);
            }
            if !accepted {
                self.restore(&refused);
            }
        }
    }

    /// Tries `e` before the claims recorded last (within the reorder window) for its
    /// messages: the claim statement may have come after `e`'s statement. Accepts that order
    /// when the model allows it.
    fn before_last_claims(&mut self, e: &Event, ids: &[String], before: &Saved) -> bool {
        self.restore(before);
        let mut claims = Vec::new();
        for id in ids {
            let m = self.message(id, None, None);
            if let Some(undo) = &self.messages[m].before_claim {
                if undo.0.t.saturating_add(REORDER_WINDOW_US) >= e.t {
                    claims.push((m, (**undo).clone()));
                }
            }
        }
        if claims.is_empty() {
            return false;
        }
        for (m, (_, row, message)) in &claims {
            self.table.rows[*m] = *row;
            self.messages[*m] = message.clone();
            self.summary.claims -= 1;
        }
        self.step(e);
        for (_, (claim, _, _)) in &claims {
            self.step(claim);
        }
        let accepted = self.violations.len() == before.violations;
        if accepted {
            self.summary.reordered += 1;
        }
        accepted
    }

    /// The ids of the messages an event is about.
    fn touched(e: &Event) -> Vec<String> {
        e.fences().into_iter().map(|(m, _)| m).collect()
    }

    /// What a step on these messages may change.
    fn save(&mut self, ids: &[String]) -> Saved {
        let rows = ids
            .iter()
            .map(|id| {
                let m = self.message(id, None, None);
                (m, self.table.rows[m], self.messages[m].clone())
            })
            .collect();
        Saved {
            rows,
            summary: self.summary.clone(),
            violations: self.violations.len(),
            all_violations: self.violations.clone(),
        }
    }

    fn restore(&mut self, saved: &Saved) {
        for (m, row, message) in saved.rows.iter().rev() {
            self.table.rows[*m] = *row;
            self.messages[*m] = message.clone();
        }
        self.summary = saved.summary.clone();
        self.violations = saved.all_violations.clone();
    }

    fn violation(&mut self, t: u64, what: String) {
        if self.violations.len() < 50 {
            self.violations.push(Violation { t, what });
        }
    }

    fn message(&mut self, id: &str, key: Option<&str>, seq: Option<i64>) -> usize {
        if let Some(&i) = self.index.get(id) {
            if key.is_some() && self.messages[i].key.is_none() {
                self.messages[i].key = key.map(str::to_string);
                self.messages[i].seq = seq;
                self.keys
                    .entry(key.unwrap_or_default().to_string())
                    .or_default()
                    .insert((seq, id.to_string()), i);
            }
            return i;
        }
        let i = self.messages.len();
        let mut row = Row::new(None, false, 0);
        row.status = Status::Live {
            attempts: 0,
            lease: None,
        };
        self.table.rows.push(row);
        self.messages.push(Message {
            id: id.to_string(),
            key: key.map(str::to_string),
            seq,
            claims: HashMap::new(),
            open: false,
            before_claim: None,
        });
        self.index.insert(id.to_string(), i);
        if let Some(k) = key {
            self.keys
                .entry(k.to_string())
                .or_default()
                .insert((seq, id.to_string()), i);
        }
        i
    }

    fn holder(&mut self, worker: &str) -> u32 {
        let n = self.holders.len() as u32;
        *self.holders.entry(worker.to_string()).or_insert(n)
    }

    fn killed(&self, worker: &str) -> bool {
        !self.stopped.contains(worker)
    }

    /// An earlier message of `m`'s key that holds it (live, or dead), if one does and no
    /// unseen step may have ended it.
    fn held_by(&self, m: usize) -> Option<String> {
        let key = self.messages[m].key.as_ref()?;
        let place = (self.messages[m].seq, self.messages[m].id.clone());
        self.keys[key]
            .range(..place)
            .map(|(_, &p)| p)
            .find(|&p| {
                let row = self.table.rows[p];
                let unseen_end = self.messages[p].open
                    || row.lease().is_some_and(|l| {
                        self.holders
                            .iter()
                            .any(|(w, &h)| h == l.holder && self.killed(w))
                    });
                row.holds_key() && !unseen_end
            })
            .map(|p| self.messages[p].id.clone())
    }

    fn gen_of(&self, m: usize, token: &str) -> Option<Gen> {
        self.messages[m].claims.get(token).map(|c| c.0)
    }

    fn step(&mut self, e: &Event) {
        let claimed = (e.action == "claim")
            .then(|| {
                e.message
                    .as_deref()
                    .map(|id| self.message(id, e.key.as_deref(), e.seq))
            })
            .flatten()
            .map(|m| (m, self.table.rows[m], self.messages[m].clone()));
        // A handler's start changes no row: the claim before it may still be undone.
        if e.action != "start" {
            for id in Self::touched(e) {
                let m = self.message(&id, None, None);
                self.messages[m].before_claim = None;
            }
        }
        self.apply(e);
        if let Some((m, row, mut before)) = claimed {
            before.before_claim = None;
            self.messages[m].before_claim = Some(Box::new((e.clone(), row, before)));
        }
    }

    fn apply(&mut self, e: &Event) {
        match e.action.as_str() {
            "claim" => self.claim(e),
            "start" => self.start(e),
            "renew" | "done" | "hand_back" => self.batch(e),
            "failed" => self.failed(e),
            "error" => {
                for (id, _) in e.fences() {
                    let m = self.message(&id, None, None);
                    self.messages[m].open = true;
                }
            }
            "stopped" => self.stopped_worker(e),
            _ => {}
        }
    }

    fn claim(&mut self, e: &Event) {
        let (Some(id), Some(token), Some(attempt)) = (&e.message, &e.token, e.attempt) else {
            return self.violation(
                e.t,
                format!("claim without message, token or attempt: {e:?}"),
            );
        };
        self.summary.claims += 1;
        let m = self.message(id, e.key.as_deref(), e.seq);
        if let Some(releases) = e.releases_key {
            self.table.rows[m].releases_key = releases;
        }
        let row = self.table.rows[m];
        let Status::Live { attempts, lease } = row.status else {
            if self.messages[m].open {
                // An unseen or uncertain write ended it; this claim says it did not.
                self.table.rows[m].status = Status::Live {
                    attempts: attempt.saturating_sub(1),
                    lease: None,
                };
                return self.claim(e);
            }
            return self.violation(
                e.t,
                format!("{id} claimed by {} after its {:?}", e.worker, row.status),
            );
        };
        if let Some(p) = self.held_by(m) {
            self.violation(
                e.t,
                format!("{id} claimed by {} while {p} of its key holds it", e.worker),
            );
        }
        if lease.is_some() {
            self.summary.lapsed_leases += 1;
        }
        // An open message may have been handed back unseen (its attempt then not counted).
        if attempt < attempts + 1 && !self.messages[m].open {
            self.violation(
                e.t,
                format!(
                    "{id} claimed at attempt {attempt}, but {} attempts were already counted",
                    attempts + 1
                ),
            );
        } else {
            self.summary.unseen_claims += u64::from(attempt.saturating_sub(attempts + 1));
        }
        let holder = self.holder(&e.worker);
        let row = &mut self.table.rows[m];
        row.claims += 1;
        let gen = row.claims;
        row.status = Status::Live {
            attempts: attempt,
            lease: Some(Lease {
                gen,
                holder,
                expired: false,
            }),
        };
        self.messages[m].open = false;
        self.messages[m]
            .claims
            .insert(token.clone(), (gen, e.worker.clone()));
    }

    fn start(&mut self, e: &Event) {
        let (Some(id), Some(token)) = (&e.message, &e.token) else {
            return;
        };
        let m = self.message(id, None, None);
        match self.messages[m].claims.get(token) {
            Some((_, w)) if *w == e.worker => {}
            _ => self.violation(
                e.t,
                format!("{id} started by {} under a claim it did not make", e.worker),
            ),
        }
        let current = self
            .gen_of(m, token)
            .is_some_and(|g| self.table.rows[m].fenced(g, Bugs::default()));
        if current {
            if let Some(p) = self.held_by(m) {
                self.violation(
                    e.t,
                    format!("{id} started by {} while {p} of its key holds it", e.worker),
                );
            }
        }
    }

    /// A fenced statement on several messages (`done`, `hand_back`, `renew`) and the count of
    /// rows it changed.
    fn batch(&mut self, e: &Event) {
        let Some(n) = e.written_count() else { return };
        let fences: Vec<(usize, Option<Gen>)> = e
            .fences()
            .iter()
            .map(|(id, token)| {
                let m = self.message(id, None, None);
                (m, self.gen_of(m, token))
            })
            .collect();
        let current: Vec<(usize, Gen)> = fences
            .iter()
            .filter_map(|&(m, g)| {
                g.filter(|&g| self.table.rows[m].fenced(g, Bugs::default()))
                    .map(|g| (m, g))
            })
            .collect();
        // A renewal that ran just before the write that ended a message, recorded after it.
        let ended = if e.action == "renew" {
            // Under the last claim of the message: the one its end came under.
            fences
                .iter()
                .filter(|&&(m, g)| {
                    let row = &self.table.rows[m];
                    !row.live() && g == Some(row.claims)
                })
                .count()
        } else {
            0
        };
        if n > (current.len() + ended) as u64 {
            let open = fences.iter().any(|&(m, _)| self.messages[m].open);
            if !open {
                let ids: Vec<&str> = fences
                    .iter()
                    .map(|&(m, _)| self.messages[m].id.as_str())
                    .collect();
                // The fences that no longer hold, each with the claim that holds the message.
                let stale: Vec<String> = e
                    .fences()
                    .iter()
                    .zip(&fences)
                    .filter(|(_, (m, g))| !current.iter().any(|c| c == &(*m, g.unwrap_or(0))))
                    .map(|((id, token), &(m, _))| {
                        let holder = self.table.rows[m].lease().and_then(|l| {
                            self.messages[m]
                                .claims
                                .iter()
                                .find(|(_, c)| c.0 == l.gen)
                                .map(|(t, c)| format!("claim {t} of {}", c.1))
                        });
                        format!(
                            "{id} under claim {token}, which {}",
                            holder.map_or_else(
                                || format!("no longer holds it ({:?})", self.table.rows[m].status),
                                |h| format!("{h} superseded")
                            )
                        )
                    })
                    .collect();
                self.violation(
                    e.t,
                    format!(
                        "stale write: {} by {} changed {n} messages, but only {} of [{}] are still under its claims; not under its claim: {}",
                        e.action,
                        e.worker,
                        current.len(),
                        ids.join(","),
                        stale.join("; ")
                    ),
                );
            }
            return;
        }
        if n > current.len() as u64 {
            // Renewed before their end: the renewal's own messages go on.
            for (m, g) in current {
                self.table.renew(m, g);
            }
            return;
        }
        if n < current.len() as u64 {
            self.summary.fences_lost += 1;
            if e.action != "renew" {
                for &(m, _) in &current {
                    self.messages[m].open = true;
                }
            }
            return;
        }
        let none = Bugs::default();
        for (m, g) in current {
            match e.action.as_str() {
                "done" => {
                    self.table.mark_done(m, g, none);
                }
                "hand_back" => {
                    self.table.hand_back(m, g, none);
                }
                _ => {
                    self.table.renew(m, g);
                }
            }
        }
    }

    fn failed(&mut self, e: &Event) {
        let (Some(id), Some(token), Some(written), Some(retry)) =
            (&e.message, &e.token, e.written_count(), e.retry)
        else {
            return;
        };
        let m = self.message(id, None, None);
        let gen = self.gen_of(m, token);
        let current = gen.is_some_and(|g| self.table.rows[m].fenced(g, Bugs::default()));
        match (written > 0, current) {
            (true, true) => {
                if let Some(g) = gen {
                    self.table.mark_failed(m, g, retry, Bugs::default());
                }
            }
            (true, false) if !self.messages[m].open => self.violation(
                e.t,
                format!(
                    "failed outcome of {id} by {} landed, but its claim was superseded ({:?})",
                    e.worker, self.table.rows[m].status
                ),
            ),
            (false, true) => {
                self.summary.fences_lost += 1;
                self.messages[m].open = true;
            }
            _ => {}
        }
    }

    fn stopped_worker(&mut self, e: &Event) {
        if e.complete != Some(true) {
            return;
        }
        let holder = self.holder(&e.worker);
        for m in 0..self.messages.len() {
            let held = self.table.rows[m]
                .lease()
                .is_some_and(|l| l.holder == holder);
            if held && !self.messages[m].open {
                let id = self.messages[m].id.clone();
                self.violation(e.t, format!("{} stopped still holding {id}", e.worker));
            }
        }
    }

    /// Compares the model's final state of every message seen with the database's, and
    /// returns what was seen, or the violations.
    pub fn finish(mut self, db: &HashMap<String, Final>) -> Result<Summary, Vec<Violation>> {
        self.summary.messages = self.messages.len();
        self.summary.killed_workers = self.workers.iter().filter(|w| self.killed(w)).count();
        for m in 0..self.messages.len() {
            let id = self.messages[m].id.clone();
            let row = self.table.rows[m];
            let Some(&actual) = db.get(&id) else {
                self.violation(
                    u64::MAX,
                    format!("{id} is in the trace, not in the database"),
                );
                continue;
            };
            let model = match row.status {
                Status::Done => Final::Done,
                Status::Dead { .. } => Final::Dead,
                _ => Final::Live,
            };
            // A message whose last claim's worker was killed, or with a write whose result is
            // unknown, may have ended by a step that left no event.
            let unseen = self.messages[m].open
                || row.lease().is_some_and(|l| {
                    self.holders
                        .iter()
                        .any(|(w, &h)| h == l.holder && self.killed(w))
                });
            if model != actual && !(unseen && model == Final::Live) {
                self.violation(
                    u64::MAX,
                    format!(
                        "{id} ends {actual:?} in the database, {:?} in the model",
                        row.status
                    ),
                );
            }
        }
        if self.violations.is_empty() {
            Ok(self.summary)
        } else {
            Err(self.violations)
        }
    }
}
