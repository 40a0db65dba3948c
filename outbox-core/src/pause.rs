//! Pausing and resuming a handler or a topic, for every worker, as methods on [`Store`](crate::Store).
//!
//! A pause is a row of `outbox_pauses`, which every running worker reads twice a second, so a
//! pause or a resume reaches every worker within a second:
//! - A paused topic, or a topic all of whose handlers (in that worker) are paused, is left out
//!   of the worker's claims: nothing of it is claimed and no attempt is counted.
//! - A topic with some handlers paused is still claimed: its other handlers run, and the
//!   message is then *parked* for the paused handler (`parked_by`), pending, with this attempt
//!   not counted. Claims skip parked messages; a parked message with an ordering key still
//!   holds its key. Resuming the handler makes its parked messages claimable again, and only
//!   the handlers that have not succeeded run.
//! - A pause with an end (`until`) ends by itself then: workers treat it as gone, and the
//!   first worker to see it expired deletes it and makes its parked messages claimable.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// What a pause applies to: one handler (by its [`Handler::NAME`](crate::Handler::NAME), on
/// every topic it handles) or one topic (all of its handlers).
///
/// ```
/// use outbox::PauseTarget;
///
/// let t = PauseTarget::handler("send-confirmation");
/// assert_eq!(t.to_string(), "handler send-confirmation");
/// assert_eq!(t.scope(), "handler");
/// assert_eq!(PauseTarget::topic("booking.created").name(), "booking.created");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum PauseTarget {
    /// A handler, by name, on every topic it handles.
    Handler(String),
    /// A topic: none of its messages is claimed.
    Topic(String),
}

impl PauseTarget {
    /// A pause of the handler named `name`.
    pub fn handler(name: impl Into<String>) -> Self {
        PauseTarget::Handler(name.into())
    }

    /// A pause of the topic `name`.
    pub fn topic(name: impl Into<String>) -> Self {
        PauseTarget::Topic(name.into())
    }

    /// `"handler"` or `"topic"`, as the `scope` column stores it.
    pub fn scope(&self) -> &'static str {
        match self {
            PauseTarget::Handler(_) => "handler",
            PauseTarget::Topic(_) => "topic",
        }
    }

    /// The handler's or the topic's name.
    pub fn name(&self) -> &str {
        match self {
            PauseTarget::Handler(n) | PauseTarget::Topic(n) => n,
        }
    }

    /// The target of a stored row; `None` for a scope this build does not know.
    pub(crate) fn from_row(scope: &str, name: String) -> Option<Self> {
        match scope {
            "handler" => Some(PauseTarget::Handler(name)),
            "topic" => Some(PauseTarget::Topic(name)),
            _ => None,
        }
    }
}

impl fmt::Display for PauseTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.scope(), self.name())
    }
}

/// One pause, as [`Store::pauses`](crate::Store::pauses) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PauseInfo {
    /// What is paused.
    pub target: PauseTarget,
    /// When the pause began (a pause set again while it runs keeps its start).
    pub paused_at: DateTime<Utc>,
    /// When it ends by itself; `None`: when resumed.
    pub until: Option<DateTime<Utc>>,
    /// Who paused it: the user and host of the process that did, or what the caller said.
    pub paused_by: String,
    /// Why, if the operator said.
    pub reason: Option<String>,
    /// Whether it is in force now: false once `until` has passed (workers then treat it as
    /// gone; the first worker to notice deletes it).
    pub active: bool,
    /// Messages that wait on it: for a handler, the messages parked for it; for a topic, its
    /// messages not running. Counted by [`Store::pauses`](crate::Store::pauses) and [`Store::stats`](crate::Store::stats); 0 where a
    /// listing does not count them.
    pub waiting: i64,
}

/// What [`Store::pause`](crate::Store::pause) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Paused {
    /// The pause as stored now.
    pub pause: PauseInfo,
    /// For a topic: whether any worker has ever run a handler of it. A topic nobody serves is
    /// paused all the same (a worker that starts later honours it), and this says so.
    pub served: bool,
}

/// What [`Store::resume`](crate::Store::resume) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resumed {
    /// Whether there was a pause to lift (an expired one counts).
    pub was_paused: bool,
    /// Messages parked for the handler that are claimable again (0 for a topic).
    pub unparked: u64,
}

/// Why a pause or a resume was refused; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PauseError {
    /// The name is empty or only blanks.
    #[error("the {scope} to pause or resume has an empty name; name it (`outbox pauses` lists the paused ones)")]
    EmptyName {
        /// `"handler"` or `"topic"`.
        scope: &'static str,
    },
    /// No worker has ever run a handler of that name: most likely a typo.
    #[error("no worker has run a handler named `{name}`, so there is nothing to pause; known handlers: {}", known_list(.known))]
    UnknownHandler {
        /// The name asked for.
        name: String,
        /// The handler names workers have run, sorted.
        known: Vec<String>,
    },
    /// The pause's duration is zero or too long to store.
    #[error("a pause must last more than zero and at most {max_days} days; {given:?} was given (leave the duration out to pause until resumed)", max_days = MAX_PAUSE.as_secs() / 86_400)]
    DurationOutOfRange {
        /// The duration given.
        given: Duration,
    },
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        "none yet (a worker records its handlers when it starts)".into()
    } else {
        known.join(", ")
    }
}

/// The longest pause with an end: a year. Longer ones are pauses until resumed.
pub const MAX_PAUSE: Duration = Duration::from_secs(366 * 86_400);

/// The longest a name may be: the MariaDB column's width.
pub(crate) const MAX_NAME: usize = 255;

/// What a backend writes for a pause.
#[derive(Debug)]
pub(crate) struct PauseWrite<'a> {
    pub(crate) target: &'a PauseTarget,
    pub(crate) until: Option<Duration>,
    pub(crate) paused_by: &'a str,
    pub(crate) reason: Option<&'a str>,
}
