//! Parameter and row types of the backend seam.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// What a claim asks for.
#[derive(Debug)]
pub(crate) struct ClaimParams<'a> {
    pub(crate) topics: &'a [&'a str],
    /// Per topic of `topics`, at the same index, the highest version this worker decodes:
    /// messages of a newer version are left for a worker that knows it.
    pub(crate) versions: &'a [i32],
    pub(crate) limit: i64,
    pub(crate) lease: Duration,
    pub(crate) claim_token: Uuid,
    /// The claiming worker's id (its row in the workers table).
    pub(crate) worker: Uuid,
    /// Ordering keys whose messages this worker's done writes deleted since its last claim:
    /// the next messages of these keys are looked for first, without walking every key.
    pub(crate) released: &'a [Arc<str>],
}

/// A claimed message, running under `claim_token` until its lease runs out.
#[derive(Debug, Clone)]
pub(crate) struct ClaimedMessage {
    /// The message's id (UUID v7), the one handlers see.
    pub(crate) id: Uuid,
    pub(crate) topic: String,
    pub(crate) payload: String,
    /// The version of the event type the payload was written with.
    pub(crate) version: u32,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) claim_token: Uuid,
    /// The error an earlier attempt recorded, if any: kept when the message is dead-lettered
    /// for attempts that never finished.
    pub(crate) last_error: Option<String>,
    /// Its ordering key, if it has one: when it is done, the next message of its key may start.
    pub(crate) key: Option<Arc<str>>,
    /// Its place in its key's order (`seq`, the commit order of the key's writes), when it has
    /// a key: recorded in the protocol trace, which orders a key by it.
    pub(crate) seq: Option<i64>,
    /// Its key's `dead_releases_key`: a dead letter of it does not hold its key's later
    /// messages (false for a message without a key). Recorded in the protocol trace.
    pub(crate) releases_key: bool,
    /// The trace context stored at enqueue, if any.
    pub(crate) trace: Option<crate::trace::TraceContext>,
}

/// A message id and the claim token that fences writes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fence {
    pub(crate) id: Uuid,
    pub(crate) claim_token: Uuid,
}

/// One failed attempt to write.
#[derive(Debug)]
pub(crate) struct Failure<'a> {
    pub(crate) fence: Fence,
    /// `None`: dead-letter now. `Some(d)`: back to pending, available after `d`.
    pub(crate) retry_in: Option<Duration>,
    pub(crate) error: &'a str,
    /// Handlers of this message that succeeded in this attempt.
    pub(crate) succeeded: &'a [&'a str],
}

/// A message whose handlers all succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Done {
    pub(crate) fence: Fence,
    /// An earlier attempt may have recorded per-handler progress, to delete with the message.
    pub(crate) had_attempts: bool,
    /// Its ordering key, if it has one: writing it done lets the next message of its key
    /// start.
    pub(crate) key: Option<Arc<str>>,
}

/// What a worker says of itself in its heartbeat.
#[derive(Debug)]
pub(crate) struct Beat<'a> {
    pub(crate) id: Uuid,
    pub(crate) name: &'a str,
    pub(crate) topics: &'a [&'a str],
    /// Per topic of `topics`, the highest version the worker decodes.
    pub(crate) versions: &'a [i32],
    /// The host the worker runs on.
    pub(crate) host: &'a str,
    /// Its process id.
    pub(crate) pid: u32,
    /// Per topic of `topics`, the names of the handlers it runs for that topic, as a JSON
    /// array of arrays (see [`Beat::handlers_json`]).
    pub(crate) handlers: &'a [Vec<&'a str>],
    /// Sleeping until a producer wakes it: only then do producers of its topics notify.
    pub(crate) waiting: bool,
    /// Wake one other waiting worker of these topics: this one was woken and claimed a full
    /// batch, so a burst is waiting that one worker alone would drain slowly.
    pub(crate) wake_peer: bool,
}

impl Beat<'_> {
    /// [`handlers`](Self::handlers) as the workers table stores it on every backend: a JSON
    /// array of arrays of names, in the order of `topics`.
    pub(crate) fn handlers_json(&self) -> String {
        serde_json::to_string(self.handlers).unwrap_or_else(|_| "[]".into())
    }
}

/// One message as `enqueue` hands it to a backend to insert. Public in a private module: the
/// sealed [`Connection`](crate::Connection) trait's hidden insert takes it, so users can
/// neither name nor build one.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)]
pub struct NewMessage {
    pub(crate) id: uuid::Uuid,
    pub(crate) topic: &'static str,
    /// The version of the event type, [`Event::VERSION`](crate::Event::VERSION).
    pub(crate) version: i32,
    pub(crate) payload: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) delay: std::time::Duration,
    pub(crate) ordering_key: Option<String>,
    pub(crate) releases_key: bool,
    pub(crate) trace: Option<crate::trace::TraceContext>,
}

/// What one step of a replay's runner writes.
#[derive(Debug, Clone)]
pub(crate) struct ReplayStep {
    /// The last event handled, if the step handled any.
    pub(crate) cursor: Option<Uuid>,
    /// The `seq` of that event.
    pub(crate) cursor_seq: Option<i64>,
    /// Events handled (failures included).
    pub(crate) delivered: i64,
    /// Events failed for good: (event id, attempts, error).
    pub(crate) failures: Vec<(Uuid, i32, String)>,
    /// The window has no more events: the replay is done.
    pub(crate) finished: bool,
    /// The lease renewed for this long.
    pub(crate) lease: std::time::Duration,
    /// The runner gives the replay up (the worker stops).
    pub(crate) release: bool,
}

impl ReplayStep {
    /// A step that only renews the lease for `lease`: what a step starts from.
    pub(crate) fn renewal(lease: std::time::Duration) -> Self {
        ReplayStep {
            cursor: None,
            cursor_seq: None,
            delivered: 0,
            failures: Vec::new(),
            finished: false,
            lease,
            release: false,
        }
    }
}
