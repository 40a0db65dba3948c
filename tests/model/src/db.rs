//! The database's side of the protocol: one row per message and the statements of
//! `outbox-core/src/backend/` on it, each one atomic, as PostgreSQL and SQLite run them.
//!
//! A claim token is a fresh UUID per claim statement; only its equality with the token a row
//! holds matters, so a message's claims are numbered here ([`Gen`]: the n-th claim of this
//! message) and a fence is (message, claim number).

use crate::{Bugs, Mutant};

/// The n-th claim of a message (1, 2, ...): stands for the claim token that claim wrote.
pub type Gen = u32;

/// Who holds a lease: a worker incarnation (a process, or one `run_until`).
pub type Holder = u32;

/// `locked_until` and `claim_token` of a claimed row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The claim that wrote the token.
    pub gen: Gen,
    /// The worker that claimed it.
    pub holder: Holder,
    /// `locked_until < now()`: a claim may take the row again.
    pub expired: bool,
}

/// Where a message is: `outbox_messages` (live), deleted as done, `outbox_dead`, or gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// Not committed yet (its producer's transaction is still open).
    Uncommitted,
    /// A row of `outbox_messages`: pending, waiting for a retry, or claimed. A retry's backoff
    /// is not a state: a retried message may be claimed at any time after its failure write,
    /// which covers every backoff.
    Live {
        /// `attempts`.
        attempts: u32,
        /// Set by a claim, cleared by a failed outcome or a hand-back.
        lease: Option<Lease>,
    },
    /// Deleted by a done write.
    Done,
    /// Moved to `outbox_dead`.
    Dead {
        /// The attempts it had.
        attempts: u32,
    },
    /// Deleted from `outbox_dead` by an operator's discard.
    Discarded,
}

/// One message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// Its place in the table.
    pub status: Status,
    /// Its ordering key, if it has one.
    pub key: Option<u32>,
    /// `releases_key`: when dead, it does not hold its key's later messages.
    pub releases_key: bool,
    /// `retried_release`: a dead letter that had released its key, retried by an operator; a
    /// claim takes it only when no later message of its key holds a lease.
    pub retried_release: bool,
    /// How many claims took it so far: the next claim's [`Gen`] is one more.
    pub claims: Gen,
    /// `seq`: its place in its key, assigned by the database when the insert runs (0 before
    /// its commit). A key's writes serialised by the application commit one after another,
    /// so their `seq` is their commit order.
    pub seq: u32,
    /// Its id's time: the producer's clock when it made the id (UUID v7). Only the buggy
    /// variant that orders a key by the id ([`Bugs::order_by_producer_clock`]) reads it.
    pub clock: u32,
}

impl Row {
    /// A message not yet committed.
    pub fn new(key: Option<u32>, releases_key: bool, clock: u32) -> Self {
        Row {
            status: Status::Uncommitted,
            key,
            releases_key,
            retried_release: false,
            claims: 0,
            seq: 0,
            clock,
        }
    }

    /// Its lease, if it is live and claimed.
    pub fn lease(&self) -> Option<Lease> {
        match self.status {
            Status::Live { lease, .. } => lease,
            _ => None,
        }
    }

    /// Its attempts, live or dead.
    pub fn attempts(&self) -> Option<u32> {
        match self.status {
            Status::Live { attempts, .. } | Status::Dead { attempts } => Some(attempts),
            _ => None,
        }
    }

    /// Whether a statement fenced by `gen` matches it (`WHERE claim_token = $token`).
    pub fn fenced(&self, gen: Gen, bugs: Bugs) -> bool {
        if bugs.mutant == Some(Mutant::FenceOnlyClaimed) {
            return self.lease().is_some();
        }
        self.lease().is_some_and(|l| l.gen == gen)
    }

    /// Whether it is in `outbox_messages`.
    pub fn live(&self) -> bool {
        matches!(self.status, Status::Live { .. })
    }

    /// Whether it holds the later messages of its key: live, or dead without `releases_key`.
    pub fn holds_key(&self) -> bool {
        match self.status {
            Status::Live { .. } => true,
            Status::Dead { .. } => !self.releases_key,
            _ => false,
        }
    }
}

/// What a write did to a row, for the model's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    /// The statement changed the row.
    pub changed: bool,
    /// It changed the row although another claim (or none) held it: the fence failed.
    pub stale: bool,
}

/// The table: messages in the order the application wrote them (a key's writes serialised:
/// a key's earlier message has a smaller index). The database orders a key by `seq`
/// ([`Row::seq`]), which it assigns at insert time: the same order, whatever the producers'
/// clocks say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Table {
    /// The rows, by message index.
    pub rows: Vec<Row>,
}

impl Table {
    /// The messages of `m`'s key that the application wrote before `m` (the order the
    /// properties hold the system to).
    pub fn predecessors(&self, m: usize) -> impl Iterator<Item = &Row> + '_ {
        let key = self.rows[m].key;
        self.rows[..m]
            .iter()
            .filter(move |r| key.is_some() && r.key == key)
    }

    /// The messages of `m`'s key that the application wrote after `m`.
    pub fn successors(&self, m: usize) -> impl Iterator<Item = &Row> + '_ {
        let key = self.rows[m].key;
        self.rows[m + 1..]
            .iter()
            .filter(move |r| key.is_some() && r.key == key)
    }

    /// Whether the database orders committed row `a` before committed row `b` of the same key:
    /// by `seq`, or, in the buggy variant, by the producers' clocks.
    fn db_before(&self, a: usize, b: usize, bugs: Bugs) -> bool {
        let (ra, rb) = (&self.rows[a], &self.rows[b]);
        if bugs.order_by_producer_clock {
            (ra.clock, a) < (rb.clock, b)
        } else {
            ra.seq < rb.seq
        }
    }

    /// The committed messages of `m`'s key the database orders before `m` (`before`), or
    /// after it.
    fn db_key_rows(&self, m: usize, bugs: Bugs, before: bool) -> impl Iterator<Item = &Row> + '_ {
        let key = self.rows[m].key;
        (0..self.rows.len())
            .filter(move |&i| {
                let r = &self.rows[i];
                let (a, b) = if before { (i, m) } else { (m, i) };
                i != m
                    && key.is_some()
                    && r.key == key
                    && r.status != Status::Uncommitted
                    && self.db_before(a, b, bugs)
            })
            .map(|i| &self.rows[i])
    }

    /// The insert commits: the row becomes pending, and takes the next `seq` of its key.
    pub fn commit(&mut self, m: usize) {
        let key = self.rows[m].key;
        let seq = self
            .rows
            .iter()
            .filter(|r| key.is_some() && r.key == key)
            .map(|r| r.seq)
            .max()
            .unwrap_or(0)
            + 1;
        let row = &mut self.rows[m];
        row.seq = if key.is_some() { seq } else { 1 };
        row.status = Status::Live {
            attempts: 0,
            lease: None,
        };
    }

    /// `head_may_start` and the claim's own terms: live, its lease free or run out, and
    /// for an ordered message the head of its key (no earlier live message of the key), not
    /// behind a dead letter that holds the key, and, for a retried dead letter that had
    /// released its key, no later message of the key under a lease.
    pub fn may_claim(&self, m: usize, bugs: Bugs) -> bool {
        let Status::Live { lease, .. } = self.rows[m].status else {
            return false;
        };
        let free = match lease {
            None => true,
            Some(l) => {
                (l.expired && !bugs.claim_skips_expired)
                    || bugs.claim_ignores_lease
                    || bugs.mutant == Some(Mutant::ClaimTakesRunningLease)
            }
        };
        let successors_leased = self
            .db_key_rows(m, bugs, false)
            .any(|r| r.lease().is_some_and(|l| !l.expired));
        free && self.db_key_rows(m, bugs, true).all(|p| match p.status {
            // The head is the first row not locked: a predecessor under a running lease is
            // skipped as if it were gone.
            Status::Live { lease: Some(l), .. }
                if bugs.mutant == Some(Mutant::HeadIgnoresRunningLease) =>
            {
                !l.expired
            }
            Status::Live { .. } => false,
            Status::Dead { .. } => {
                p.releases_key
                    || bugs.dead_does_not_hold
                    || bugs.mutant == Some(Mutant::DeadNeverHolds)
            }
            _ => true,
        }) && !(self.rows[m].retried_release
            && successors_leased
            && !bugs.retried_release_ignores_claims)
    }

    /// A claim of `m` by `holder` (`outbox_claim_batch`, or the claim half of
    /// `outbox_mark_done_and_claim`): counts the attempt and takes a fresh lease. Returns the
    /// claim's number. The caller checked [`may_claim`](Self::may_claim).
    pub fn claim(&mut self, m: usize, holder: Holder, bugs: Bugs) -> Gen {
        let row = &mut self.rows[m];
        row.claims += 1;
        let gen = row.claims;
        if let Status::Live { attempts, lease } = row.status {
            let reclaim = lease.is_some() && bugs.mutant == Some(Mutant::ReclaimNotCounted);
            let attempts = if bugs.count_at_completion || reclaim {
                attempts
            } else {
                attempts + 1
            };
            row.status = if bugs.delete_at_claim {
                Status::Done
            } else {
                Status::Live {
                    attempts,
                    lease: Some(Lease {
                        gen,
                        holder,
                        expired: false,
                    }),
                }
            };
        }
        gen
    }

    /// Applies a fenced write: `f` when the fence holds (or, with the fence-less bug, when
    /// the message is live at all).
    fn fenced_write(
        &mut self,
        m: usize,
        gen: Gen,
        bugs: Bugs,
        f: impl FnOnce(&mut Row),
    ) -> Written {
        self.fenced_write_or(m, gen, bugs, false, f)
    }

    /// [`fenced_write`](Self::fenced_write), with `unfenced` a mutant that skips the fence.
    fn fenced_write_or(
        &mut self,
        m: usize,
        gen: Gen,
        bugs: Bugs,
        unfenced: bool,
        f: impl FnOnce(&mut Row),
    ) -> Written {
        let row = &mut self.rows[m];
        let fenced = row.fenced(gen, bugs);
        if fenced || ((bugs.no_fence || unfenced) && row.live()) {
            f(row);
            Written {
                changed: true,
                stale: !fenced,
            }
        } else {
            Written {
                changed: false,
                stale: false,
            }
        }
    }

    /// `outbox_mark_done` for one message: deletes it under its claim token.
    pub fn mark_done(&mut self, m: usize, gen: Gen, bugs: Bugs) -> Written {
        let unfenced = matches!(
            bugs.mutant,
            Some(Mutant::DoneIgnoresTokenReported | Mutant::DoneIgnoresToken)
        );
        let mut written =
            self.fenced_write_or(m, gen, bugs, unfenced, |row| row.status = Status::Done);
        // As SQL does: the count of rows it deleted, nothing about whose they were.
        if bugs.mutant == Some(Mutant::DoneIgnoresToken) {
            written.stale = false;
        }
        written
    }

    /// `outbox_mark_failed`: back to pending after a backoff (`retry`), or to `outbox_dead`.
    pub fn mark_failed(&mut self, m: usize, gen: Gen, retry: bool, bugs: Bugs) -> Written {
        self.fenced_write(m, gen, bugs, |row| {
            if let Status::Live { attempts, .. } = row.status {
                let attempts = if bugs.count_at_completion {
                    attempts + 1
                } else {
                    attempts
                };
                row.status = if retry {
                    Status::Live {
                        attempts: if bugs.mutant == Some(Mutant::RetryUncounts) {
                            attempts.saturating_sub(1)
                        } else {
                            attempts
                        },
                        lease: None,
                    }
                } else {
                    Status::Dead { attempts }
                };
            }
        })
    }

    /// `outbox_hand_back`: ready again at once, the attempt not counted, the lease cleared.
    pub fn hand_back(&mut self, m: usize, gen: Gen, bugs: Bugs) -> Written {
        self.fenced_write(m, gen, bugs, |row| {
            if let Status::Live {
                attempts, lease, ..
            } = row.status
            {
                row.status = Status::Live {
                    attempts: if bugs.mutant == Some(Mutant::HandBackKeepsAttempt) {
                        attempts
                    } else {
                        attempts.saturating_sub(1)
                    },
                    lease: if bugs.hand_back_keeps_lease
                        || bugs.mutant == Some(Mutant::HandBackKeepsLease)
                    {
                        lease
                    } else {
                        None
                    },
                };
            }
        })
    }

    /// `outbox_renew`: extends the lease of a row still under this claim's token, run out or
    /// not (the statement matches the token only). Returns whether it matched.
    pub fn renew(&mut self, m: usize, gen: Gen) -> bool {
        let row = &mut self.rows[m];
        if let Status::Live {
            lease: Some(lease), ..
        } = &mut row.status
        {
            if lease.gen == gen {
                lease.expired = false;
                return true;
            }
        }
        false
    }

    /// Time passes: the lease of `m` runs out.
    pub fn expire(&mut self, m: usize) {
        if let Status::Live {
            lease: Some(lease), ..
        } = &mut self.rows[m].status
        {
            lease.expired = true;
        }
    }

    /// `outbox_dead_retry`: back to `outbox_messages`, its `seq` (and so its place in its
    /// key) kept, attempts reset, marked `retried_release` if it had released its key.
    pub fn dead_retry(&mut self, m: usize) {
        if let Status::Dead { .. } = self.rows[m].status {
            let row = &mut self.rows[m];
            row.status = Status::Live {
                attempts: 0,
                lease: None,
            };
            row.retried_release = row.key.is_some() && row.releases_key;
        }
    }

    /// `outbox_dead_discard`.
    pub fn discard(&mut self, m: usize) {
        if let Status::Dead { .. } = self.rows[m].status {
            self.rows[m].status = Status::Discarded;
        }
    }

    /// The message that `m`'s done write makes the head of its key, if that write may claim
    /// it (`outbox_mark_done_and_claim` after the delete): the key's first live message. The
    /// statement's claim reads the table as it was before its delete, where `m` still holds
    /// its lease: a retried release before `m` is left to the next claim.
    pub fn next_head(&self, m: usize, bugs: Bugs) -> Option<usize> {
        let key = self.rows[m].key?;
        let next = (0..self.rows.len())
            .filter(|&i| i != m && self.rows[i].key == Some(key) && self.rows[i].live())
            .min_by(|&a, &b| {
                if self.db_before(a, b, bugs) {
                    std::cmp::Ordering::Less
                } else {
                    std::cmp::Ordering::Greater
                }
            })?;
        let behind_done = self.db_before(next, m, bugs) && self.rows[next].retried_release;
        (self.may_claim(next, bugs) && (!behind_done || bugs.retried_release_ignores_claims))
            .then_some(next)
    }
}
