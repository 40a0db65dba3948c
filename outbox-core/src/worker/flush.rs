//! Writes successful outcomes in batches: one statement deletes many done messages.
//!
//! A batch lost to a crash only means those messages are delivered again after their lease.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::config::reconnect_delay;
use super::protocol;
use super::wake::Wakeups;
use crate::backend::{Backend, ClaimParams, ClaimedMessage, Done};

/// The most done messages one statement deletes.
pub(crate) const FLUSH_MAX: usize = 1000;

/// How the flusher claims the next messages of the keys its writes release.
pub(crate) struct NextClaim {
    /// The worker's topics: only their messages are claimed.
    pub(crate) topics: Vec<&'static str>,
    /// Per topic of `topics`, the highest version the worker decodes.
    pub(crate) versions: Vec<i32>,
    pub(crate) lease: Duration,
    /// Where the claimed messages go to be started.
    pub(crate) start: mpsc::UnboundedSender<Vec<ClaimedMessage>>,
    /// Once the worker stops claiming, so does the flusher.
    pub(crate) stop: CancellationToken,
    /// The pauses in force: topics the worker does not claim are not claimed here either.
    pub(crate) pauses: Arc<super::pauses::Pauses>,
}

/// Collects done messages and writes them every `interval` or every `max` messages, until
/// every sender is gone and the last batch is written. A batch with ordered messages is written
/// without waiting out the interval: the next messages of their keys may start now, and no
/// producer's commit will announce them. Where the backend can, the same statement claims
/// those next messages (sent to `next.start`); otherwise the worker's claim loop is woken to
/// look them up.
///
/// A batch with ordered messages may be written while up to
/// [`Backend::done_writes_in_flight`] - 1 other writes run: the next messages of its keys wait
/// for it, not for the writes before it. A key has one running message, so its next done
/// outcome comes only after the write that claimed that message: two writes in flight never
/// hold one key.
pub(crate) async fn run_flusher(
    backend: Arc<dyn Backend>,
    worker: Uuid,
    mut rx: mpsc::UnboundedReceiver<Done>,
    interval: Duration,
    max: usize,
    wake: Arc<Wakeups>,
    next: NextClaim,
) {
    let in_flight = backend.done_writes_in_flight().max(1);
    let next = Arc::new(next);
    let mut writes = tokio::task::JoinSet::new();
    loop {
        while writes.try_join_next().is_some() {}
        let Some(first) = rx.recv().await else { break };
        let mut ordered = first.key.is_some();
        let mut buf = vec![first];
        let deadline = tokio::time::sleep(interval);
        tokio::pin!(deadline);
        while buf.len() < max {
            // An ordered message's key waits for this write: take what has already come and
            // write now. Writes in flight delay the next one, so batches still form under load.
            if ordered {
                while buf.len() < max {
                    match rx.try_recv() {
                        Ok(f) => buf.push(f),
                        Err(_) => break,
                    }
                }
                break;
            }
            tokio::select! {
                biased;
                f = rx.recv() => match f {
                    Some(f) => {
                        ordered |= f.key.is_some();
                        buf.push(f);
                    }
                    None => break,
                },
                () = &mut deadline => break,
            }
        }
        // Unordered outcomes gate nothing (their handler slots are free already): their
        // writes go one at a time, so their batches stay large.
        let limit = if ordered { in_flight } else { 1 };
        while writes.len() >= limit {
            writes.join_next().await;
        }
        writes.spawn(write(
            backend.clone(),
            worker,
            buf,
            ordered,
            wake.clone(),
            next.clone(),
        ));
    }
    while writes.join_next().await.is_some() {}
}

/// Writes one batch of done outcomes (`keyed`: some have an ordering key), retrying while the
/// database is unreachable; after 20 failures the batch is given up (those messages are
/// delivered again after their lease).
async fn write(
    backend: Arc<dyn Backend>,
    worker: Uuid,
    buf: Vec<Done>,
    keyed: bool,
    wake: Arc<Wakeups>,
    next: Arc<NextClaim>,
) {
    let mut failures: u32 = 0;
    loop {
        let written = if keyed && !next.stop.is_cancelled() {
            let paused = next.pauses.current();
            let (topics, versions): (Vec<&str>, Vec<i32>) = next
                .topics
                .iter()
                .zip(&next.versions)
                .filter(|(t, _)| paused.claims(t))
                .map(|(t, v)| (*t, *v))
                .unzip();
            let params = ClaimParams {
                topics: &topics,
                versions: &versions,
                limit: 0,
                lease: next.lease,
                claim_token: Uuid::now_v7(),
                worker,
                released: &[],
            };
            backend
                .outbox_mark_done_and_claim(worker, &buf, &params)
                .await
        } else {
            backend
                .outbox_mark_done(worker, &buf)
                .await
                .map(|n| (n, None))
        };
        let fences = || buf.iter().map(|d| d.fence);
        match written {
            Ok((n, claimed)) => {
                protocol::written(worker, "done", fences(), n);
                if let Some(c) = &claimed {
                    protocol::claimed(worker, "done", c);
                }
                match claimed {
                    Some(c) if !c.is_empty() => {
                        // The receiver is gone only when the worker is stopping: those
                        // claims run again after their lease.
                        let _ = next.start.send(c);
                    }
                    Some(_) => {}
                    None if n > 0 && keyed => {
                        wake.released(buf.iter().filter_map(|d| d.key.clone()));
                    }
                    None => {}
                }
                if (n as usize) < buf.len() {
                    tracing::warn!(
                        written = n,
                        batch = buf.len(),
                        "some done outcomes were not written: their lease ran out and another claim took them"
                    );
                }
                return;
            }
            Err(e) => {
                protocol::error(worker, "done", fences());
                failures += 1;
                if failures >= 20 {
                    tracing::error!(batch = buf.len(), error = %e, "giving up on a batch of done outcomes; those messages will be redelivered after their lease");
                    return;
                }
                let delay = reconnect_delay(failures);
                tracing::warn!(error = %e, batch = buf.len(), failures, retry_in = ?delay, "could not write done outcomes; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
