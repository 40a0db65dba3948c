//! The worker's protocol steps as `tracing` events at the target [`TARGET`], DEBUG level: each
//! claim, renewal, handler start, outcome write and hand-back, with the worker, the messages
//! and their claim tokens, so that a recorded run can be checked against the protocol's model
//! (`tests/model`). Nothing is formatted unless a subscriber enables the target.
//!
//! Fields: `action` (`claim`, `start`, `renew`, `done`, `failed`, `hand_back`, `error`, `stop`,
//! `stopped`), `worker`, and as the action needs: `message` and `token` (one message), or
//! `messages` and `tokens` (comma-separated, in the same order); `key`, `seq` (a keyed
//! message's place in its key's order), `releases_key` (a keyed message's dead letter does not
//! hold its key), `attempt`, `via`
//! (`claim` or `done`: which statement claimed), `retry` (a failed outcome: retry or dead),
//! `written` (rows the statement changed: for a batch, how many of its messages), `statement`
//! (of an `error`: the statement that failed, which may or may not have committed), `complete`
//! (of `stopped`: the final writes finished in time).

use uuid::Uuid;

use crate::backend::{ClaimedMessage, Fence};

/// The target of the protocol events.
pub(crate) const TARGET: &str = "outbox::protocol";

fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

fn ids(fences: impl IntoIterator<Item = Fence>) -> (String, String) {
    let (messages, tokens): (Vec<String>, Vec<String>) = fences
        .into_iter()
        .map(|f| (f.id.to_string(), f.claim_token.to_string()))
        .unzip();
    (messages.join(","), tokens.join(","))
}

/// Messages a claim statement (`via` "claim") or a done write (`via` "done") claimed.
pub(crate) fn claimed(worker: Uuid, via: &'static str, claimed: &[ClaimedMessage]) {
    if !enabled() {
        return;
    }
    for m in claimed {
        tracing::debug!(target: TARGET, action = "claim", %worker, via, message = %m.id,
            token = %m.claim_token, key = m.key.as_deref(), seq = m.seq,
            releases_key = m.key.is_some().then_some(m.releases_key), attempt = m.attempts);
    }
}

/// A statement on a set of claimed messages (`done`, `hand_back`, `renew`) changed `written`
/// of them.
pub(crate) fn written(
    worker: Uuid,
    action: &'static str,
    fences: impl IntoIterator<Item = Fence>,
    written: u64,
) {
    if !enabled() {
        return;
    }
    let (messages, tokens) = ids(fences);
    tracing::debug!(target: TARGET, action, %worker, messages, tokens, written);
}

/// A statement on these messages failed: it may or may not have committed.
pub(crate) fn error(
    worker: Uuid,
    statement: &'static str,
    fences: impl IntoIterator<Item = Fence>,
) {
    if !enabled() {
        return;
    }
    let (messages, tokens) = ids(fences);
    tracing::debug!(target: TARGET, action = "error", %worker, statement, messages, tokens);
}

/// A failed outcome's write (`retry`: back to pending, else dead) changed the message or not.
pub(crate) fn failed(worker: Uuid, fence: Fence, retry: bool, written: bool) {
    tracing::debug!(target: TARGET, action = "failed", %worker, message = %fence.id,
        token = %fence.claim_token, retry, written);
}

/// A claimed message's handlers begin.
pub(crate) fn start(worker: Uuid, fence: Fence) {
    tracing::debug!(target: TARGET, action = "start", %worker, message = %fence.id,
        token = %fence.claim_token);
}

/// The worker's stop request (`stop`), and its end (`stopped`; `complete`: the final writes
/// finished within their bound).
pub(crate) fn lifecycle(worker: Uuid, action: &'static str, complete: bool) {
    tracing::debug!(target: TARGET, action, %worker, complete);
}
