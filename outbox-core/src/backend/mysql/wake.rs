//! Wake-ups without LISTEN: MySQL has no notifications, so only inserts of this process wake
//! its workers directly. Commits of other processes are found by polling, which the worker
//! loop speeds up while messages flow (the claim interval) and slows to the poll interval when
//! idle.

use std::sync::LazyLock;

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::backend::{Wake, WakeupListener};
use crate::error::Result;

/// Wakes the MySQL workers of this process when a due message is inserted. The insert runs
/// before its transaction commits, so a woken worker looks again every millisecond for a
/// little while (see the worker loop) until the commit shows the row.
static ENQUEUED: LazyLock<Notify> = LazyLock::new(Notify::new);

/// Wakes the waiting workers of this process: a due message was inserted (`enqueue.rs`).
pub(super) fn enqueued() {
    ENQUEUED.notify_waiters();
}

/// A listener on this process's inserts.
pub(super) fn listener() -> Box<dyn WakeupListener> {
    Box::new(MySqlWakeup)
}

/// The wake-up channel of MySQL workers: inserts in this process.
struct MySqlWakeup;

#[async_trait]
impl WakeupListener for MySqlWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        ENQUEUED.notified().await;
        Ok(Wake::BeforeCommit)
    }
}
