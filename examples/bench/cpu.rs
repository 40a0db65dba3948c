//! CPU time spent by the bench process and by the server's backends during a timed section.
//!
//! Wall-clock rates move with whatever else runs on the machine; CPU time per message moves much
//! less, so it is reported beside every rate. The server's share is read from
//! `/proc/<pid>/stat` of the backends of the bench database, so it is there only when
//! PostgreSQL runs on this machine and its processes are readable; SQLite runs in the bench
//! process.

use std::collections::HashMap;

use serde::Serialize;

use crate::db::{Db, Pool};

/// Linux's `USER_HZ`: the unit of the CPU times in `/proc/<pid>/stat`.
const TICKS_PER_SEC: f64 = 100.0;

/// CPU seconds of one timed section.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// The bench process (producers and the in-process worker).
    pub(crate) client_s: f64,
    /// The server's backends on the bench database; `None` when they cannot be read.
    pub(crate) server_s: Option<f64>,
}

/// CPU microseconds per unit of work (message or transaction).
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct CpuPer {
    /// The bench process.
    pub(crate) client_us: f64,
    /// The server's backends, when known.
    pub(crate) server_us: Option<f64>,
}

impl Cpu {
    /// Per unit of `units`.
    pub(crate) fn per(self, units: u64) -> CpuPer {
        let n = units.max(1) as f64;
        CpuPer {
            client_us: self.client_s * 1e6 / n,
            server_us: self.server_s.map(|s| s * 1e6 / n),
        }
    }
}

/// A reading taken at the start of a timed section.
pub(crate) struct CpuMeter {
    client: Option<f64>,
    backends: Option<HashMap<i32, f64>>,
}

/// `utime + stime` of a process, in seconds.
fn proc_cpu(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / TICKS_PER_SEC)
}

/// CPU seconds of every client backend on the bench database, by pid.
async fn backends(db: &Db) -> Option<HashMap<i32, f64>> {
    let Pool::Pg(pool) = &db.pool else {
        return None;
    };
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
         WHERE datname = current_database() AND backend_type = 'client backend'",
    )
    .fetch_all(pool)
    .await
    .ok()?;
    let map: HashMap<i32, f64> = pids
        .into_iter()
        .filter_map(|pid| proc_cpu(&pid.to_string()).map(|c| (pid, c)))
        .collect();
    (!map.is_empty()).then_some(map)
}

impl CpuMeter {
    /// Reads the counters now.
    pub(crate) async fn start(db: &Db) -> CpuMeter {
        CpuMeter {
            client: proc_cpu("self"),
            backends: backends(db).await,
        }
    }

    /// The CPU time used since [`CpuMeter::start`]. Backends that connected meanwhile count in
    /// full; those that disconnected meanwhile are missed (the bench keeps its pools open).
    pub(crate) async fn stop(self, db: &Db) -> Cpu {
        let client = match (self.client, proc_cpu("self")) {
            (Some(a), Some(b)) => b - a,
            _ => 0.0,
        };
        let server = match (self.backends, backends(db).await) {
            (Some(before), Some(after)) => Some(
                after
                    .iter()
                    .map(|(pid, c)| c - before.get(pid).copied().unwrap_or(0.0))
                    .sum(),
            ),
            _ => None,
        };
        Cpu {
            client_s: client,
            server_s: server,
        }
    }
}
