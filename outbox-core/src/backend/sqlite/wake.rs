//! Wake-ups without LISTEN: inserts in this process, and commits of other processes, seen as
//! a change of the write-ahead log file (every commit appends to it).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sqlx::sqlite::SqlitePool;
use tokio::sync::Notify;

use crate::backend::{Wake, WakeupListener};
use crate::error::Result;

/// Wakes the SQLite workers of this process when a due message is inserted. SQLite has no
/// NOTIFY, and the insert runs before its transaction commits, so a woken worker looks again
/// every millisecond for a little while (see the worker loop) until the commit shows the row.
static ENQUEUED: LazyLock<Notify> = LazyLock::new(Notify::new);

/// How often a SQLite worker looks at the database's write-ahead log for commits of other
/// processes: one `stat` call, no query.
const WAL_LOOK: Duration = Duration::from_millis(10);

/// Wakes the waiting workers of this process: a due message was inserted (`enqueue.rs`).
pub(super) fn enqueued() {
    ENQUEUED.notify_waiters();
}

/// A listener on the database of `pool`.
pub(super) fn listener(pool: &SqlitePool) -> Box<dyn WakeupListener> {
    let options = pool.connect_options();
    Box::new(SqliteWakeup::new(options.get_filename()))
}

/// The wake-up channel of SQLite workers: inserts in this process, and commits of other
/// processes, seen as a change of the write-ahead log file.
///
/// The log also changes with this worker's own writes, and a look may fall between the frames
/// of one commit; either way the next look sees the change that matters, and a claim that finds
/// nothing costs little. Where the file cannot be read (an in-memory database), only inserts
/// in this process wake the worker, and the poll interval finds the rest.
struct SqliteWakeup {
    wal: PathBuf,
    seen: Option<(u64, SystemTime)>,
}

impl SqliteWakeup {
    fn new(database: &Path) -> Self {
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let seen = stamp(&wal);
        SqliteWakeup { wal, seen }
    }
}

/// The size and modification time of a file, `None` while it does not exist.
fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

#[async_trait]
impl WakeupListener for SqliteWakeup {
    async fn recv(&mut self) -> Result<Wake> {
        let enqueued = ENQUEUED.notified();
        tokio::pin!(enqueued);
        enqueued.as_mut().enable();
        loop {
            tokio::select! {
                () = &mut enqueued => return Ok(Wake::BeforeCommit),
                () = tokio::time::sleep(WAL_LOOK) => {
                    let now = stamp(&self.wal);
                    if now != self.seen {
                        self.seen = now;
                        return Ok(Wake::Committed);
                    }
                }
            }
        }
    }
}
