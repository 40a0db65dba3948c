//! What a worker knows of the pauses in force (`outbox pause`) and of the open breakers
//! ([`crate::breaker`]): read from the database every [`PAUSE_POLL`] (by default), so a pause,
//! a resume or a breaker that opened reaches every worker within a second.
//!
//! - A topic that is paused, or all of whose handlers in this worker are paused, is left out of
//!   this worker's claims (and of the claims its done writes make for the next messages of
//!   their keys).
//! - A paused handler, or one whose breaker is open, is skipped when its topic's messages run
//!   (a topic is not left out of claims for a breaker: the probe needs parked messages); the
//!   message is then parked for it ([`Outcome::Parked`](super::process::Outcome::Parked)).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::backend::Backend;
use crate::breaker::BreakerRow;
use crate::handler::ErasedHandler;
use crate::pause::{PauseInfo, PauseTarget};

/// How often a running worker reads the pauses.
pub(crate) const PAUSE_POLL: Duration = Duration::from_millis(500);

/// The pauses in force and the breakers open, as one worker last read them.
#[derive(Debug, Default)]
pub(crate) struct PauseSet {
    /// The open breakers, by handler.
    pub(crate) open: BTreeMap<String, BreakerRow>,
    /// Handlers whose breaker counts failures (closed): a success of theirs resets it.
    pub(crate) counting: BTreeSet<String>,
    /// Every pause in force, with when it began.
    pub(crate) active: BTreeMap<PauseTarget, DateTime<Utc>>,
    /// The paused handlers' names.
    handlers: BTreeSet<String>,
    /// This worker's topics that it does not claim: paused, or all of their handlers paused.
    excluded: BTreeSet<&'static str>,
}

impl PauseSet {
    /// The set of `pauses` in force, for a worker of `topics`.
    fn new(
        pauses: &[PauseInfo],
        breakers: Vec<BreakerRow>,
        topics: &BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>>,
    ) -> Self {
        let counting = breakers
            .iter()
            .filter(|b| !b.open && (b.failures > 0 || b.repeats > 0))
            .map(|b| b.handler.clone())
            .collect();
        let open = breakers
            .into_iter()
            .filter(|b| b.open)
            .map(|b| (b.handler.clone(), b))
            .collect();
        let active: BTreeMap<PauseTarget, DateTime<Utc>> = pauses
            .iter()
            .filter(|p| p.active)
            .map(|p| (p.target.clone(), p.paused_at))
            .collect();
        let mut handlers = BTreeSet::new();
        let mut paused_topics = BTreeSet::new();
        for t in active.keys() {
            match t {
                PauseTarget::Handler(h) => {
                    handlers.insert(h.clone());
                }
                PauseTarget::Topic(t) => {
                    paused_topics.insert(t.as_str());
                }
            }
        }
        let excluded = topics
            .iter()
            .filter(|(topic, hs)| {
                paused_topics.contains(**topic) || hs.iter().all(|h| handlers.contains(h.name()))
            })
            .map(|(topic, _)| *topic)
            .collect();
        PauseSet {
            open,
            counting,
            active,
            handlers,
            excluded,
        }
    }

    /// Whether this worker claims messages of `topic`.
    pub(crate) fn claims(&self, topic: &str) -> bool {
        !self.excluded.contains(topic)
    }

    /// Whether the handler `name` is paused.
    pub(crate) fn handler_paused(&self, name: &str) -> bool {
        self.handlers.contains(name)
    }

    /// Whether the handler `name` must not run now: paused, or its breaker open (unless this
    /// delivery is the breaker's probe, `probe`).
    pub(crate) fn handler_held(&self, name: &str, probe: Option<&str>) -> bool {
        self.handler_paused(name) || (self.open.contains_key(name) && probe != Some(name))
    }
}

/// The pause set a worker works with, replaced whole at each read.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    current: Mutex<Arc<PauseSet>>,
}

/// What one read of the pauses changed.
pub(crate) struct PauseChange {
    /// Pauses that began (or that this worker sees for the first time), with their row.
    pub(crate) began: Vec<PauseInfo>,
    /// Pauses that ended (resumed, or past their end), with when they began.
    pub(crate) ended: Vec<(PauseTarget, DateTime<Utc>)>,
    /// Breakers that this worker sees open for the first time.
    pub(crate) opened: Vec<BreakerRow>,
    /// Breakers that closed since the last read, with when they opened.
    pub(crate) closed: Vec<(String, DateTime<Utc>)>,
}

impl Pauses {
    /// The set in force now.
    pub(crate) fn current(&self) -> Arc<PauseSet> {
        super::lock(&self.current).clone()
    }

    /// Reads the pauses from `backend` and makes them the set in force; pauses past their end
    /// are deleted (and their handlers' messages unparked) on the way. On a database error the
    /// set in force stays as it was.
    pub(crate) async fn refresh(
        &self,
        backend: &dyn Backend,
        topics: &BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>>,
    ) -> crate::error::Result<PauseChange> {
        let rows = backend.pause_list(false).await?;
        if rows.iter().any(|p| !p.active) {
            match backend.pause_expire().await {
                Ok(n) if n > 0 => tracing::debug!(deleted = n, "deleted pauses past their end"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not delete pauses past their end; retrying at the next read")
                }
            }
        }
        let breakers = backend.breaker_list(false).await?;
        let next = Arc::new(PauseSet::new(&rows, breakers, topics));
        let before = std::mem::replace(&mut *super::lock(&self.current), next.clone());
        let began = rows
            .into_iter()
            .filter(|p| p.active && !before.active.contains_key(&p.target))
            .collect();
        let ended = before
            .active
            .iter()
            .filter(|(t, _)| !next.active.contains_key(*t))
            .map(|(t, at)| (t.clone(), *at))
            .collect();
        let opened = next
            .open
            .values()
            .filter(|b| !before.open.contains_key(&b.handler))
            .cloned()
            .collect();
        let closed = before
            .open
            .values()
            .filter(|b| !next.open.contains_key(&b.handler))
            .map(|b| (b.handler.clone(), b.opened_at.unwrap_or(b.window_start)))
            .collect();
        Ok(PauseChange {
            began,
            ended,
            opened,
            closed,
        })
    }
}

impl PauseChange {
    /// Logs each change on one line; true when a pause ended (claims should look again now).
    pub(crate) fn log(&self, worker: &str) -> bool {
        for p in &self.began {
            let until = p.until.map(|u| u.to_rfc3339());
            tracing::info!(
                worker,
                scope = p.target.scope(),
                name = p.target.name(),
                paused_by = %p.paused_by,
                reason = p.reason.as_deref().unwrap_or(""),
                until = until.as_deref().unwrap_or("resumed"),
                "pause began: {}; its messages wait, no attempt counted",
                p.target
            );
        }
        for (t, since) in &self.ended {
            let secs = (Utc::now() - *since).num_seconds().max(0);
            tracing::info!(
                worker,
                scope = t.scope(),
                name = t.name(),
                paused_secs = secs,
                "pause ended: {t}; its messages run again"
            );
        }
        for b in &self.opened {
            let next = b.probe_at.map(|t| t.to_rfc3339());
            tracing::warn!(
                worker,
                handler = %b.handler,
                next_probe = next.as_deref().unwrap_or(""),
                error = b.last_error.as_deref().unwrap_or(""),
                "breaker open: handler `{}` is failing; its messages wait, no attempt counted, until a probe succeeds",
                b.handler
            );
        }
        for (h, since) in &self.closed {
            let secs = (Utc::now() - *since).num_seconds().max(0);
            tracing::info!(
                worker,
                handler = %h,
                open_secs = secs,
                "breaker closed: handler `{h}` runs again"
            );
        }
        for p in &self.began {
            metrics::gauge!(crate::metrics::PAUSED, "scope" => p.target.scope(), "name" => p.target.name().to_string()).set(1.0);
        }
        for (t, _) in &self.ended {
            metrics::gauge!(crate::metrics::PAUSED, "scope" => t.scope(), "name" => t.name().to_string()).set(0.0);
        }
        for b in &self.opened {
            metrics::gauge!(crate::metrics::BREAKER_OPEN, "handler" => b.handler.clone()).set(1.0);
        }
        for (h, _) in &self.closed {
            metrics::gauge!(crate::metrics::BREAKER_OPEN, "handler" => h.clone()).set(0.0);
        }
        !self.ended.is_empty() || !self.closed.is_empty()
    }
}
