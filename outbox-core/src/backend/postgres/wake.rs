//! Wake-ups: producers NOTIFY a waiting worker of their topic after their commit (see
//! `enqueue.rs`, and the dead-letter retry and discard in `ops.rs`); each worker LISTENs on one
//! channel and takes only the notifications that name it.

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool};
use uuid::Uuid;

use crate::backend::{Wake, WakeupListener};
use crate::error::Result;

/// The channel producers notify when a worker is waiting.
pub(super) const WAKEUP_CHANNEL: &str = "outbox_wakeup";

/// Opens a listener for the worker `worker` on its own connection.
pub(super) async fn listener(
    pool: &PgPool,
    worker: Uuid,
) -> Result<Option<Box<dyn WakeupListener>>> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(WAKEUP_CHANNEL).await?;
    Ok(Some(Box::new(PgWakeup {
        listener,
        me: worker.to_string(),
    })))
}

struct PgWakeup {
    listener: PgListener,
    /// This worker's id: a notification for another worker is not a reason to look.
    me: String,
}

#[async_trait]
impl WakeupListener for PgWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        loop {
            // `None` means the connection was lost: it reconnects on the next call, and
            // notifications sent meanwhile are gone, so wake the worker to look for itself.
            match self.listener.try_recv().await? {
                Some(n) if n.payload() != self.me && !n.payload().is_empty() => continue,
                _ => return Ok(Wake::Committed),
            }
        }
    }
}
