//! A relay's broker outages, each reported once however many publishes it catches: a WARN line
//! when the connection is lost (with the publishes caught in flight), a WARN line when
//! publishing works again (with how long it did not and the publishes that waited), and the
//! counters of [`crate::metrics`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::metrics::{RELAY_CONNECTION_LOSSES, RELAY_PUBLISHES_WAITED};

/// The outages of one publisher's broker connection.
///
/// Connections are numbered from 1 in the order they were made, so that the many publishes one
/// lost connection fails report one loss between them. An outage lasts from the first loss
/// until a publish is answered on a newer connection: connections made and lost again before
/// that (a network that keeps cutting them, a broker that accepts and drops them while it
/// starts) belong to the same outage.
pub(crate) struct Outages {
    /// The broker as the log lines name it: `RabbitMQ`, `NATS`.
    broker: &'static str,
    /// The `relay` label of the metrics and field of the log lines: `rabbitmq`, `nats`.
    relay: &'static str,
    /// `host:port` of the broker, when the publisher knows it (never with credentials).
    address: Option<String>,
    /// Whether an outage is under way: spares the publishes answered outside one the lock.
    down: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Publishes sent and not yet answered, by the number of the connection they went out on.
    in_flight: BTreeMap<u64, u64>,
    /// The outage under way.
    down: Option<Down>,
    /// The newest connection reported lost: reports of it or of an older one change nothing.
    last_lost: u64,
}

struct Down {
    since: Instant,
    /// Connections lost during the outage; none when the first connection could not be made.
    losses: u64,
    /// Why the connection is down: how it was lost, or how the last attempt to connect failed.
    error: String,
    /// Publishes that waited for the connection during the outage.
    waited: u64,
}

impl Outages {
    pub(crate) fn new(broker: &'static str, relay: &'static str, address: Option<String>) -> Self {
        Outages {
            broker,
            relay,
            address,
            down: AtomicBool::new(false),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts an outage.
    fn begin(&self, state: &mut State, down: Down) {
        state.down = Some(down);
        self.down.store(true, Ordering::Release);
    }

    /// A publish goes out on connection `connection`: it counts as in flight until the guard
    /// is dropped, which is after it has reported the loss of its connection, if it saw one.
    pub(crate) fn sent(&self, connection: u64) -> InFlight<'_> {
        *self.state().in_flight.entry(connection).or_default() += 1;
        InFlight {
            outages: self,
            connection,
        }
    }

    /// Connection `connection` is lost, as `error` says. The first report counts the loss, and
    /// the publishes in flight on it among the ones that wait for the connection; it is logged
    /// when it starts an outage. The reports of the other publishes it caught change nothing.
    pub(crate) fn lost(&self, connection: u64, error: &dyn fmt::Display) {
        let mut state = self.state();
        if connection <= state.last_lost {
            return;
        }
        state.last_lost = connection;
        let in_flight: u64 = state.in_flight.range(..=connection).map(|(_, n)| n).sum();
        let error = error.to_string();
        let starts = match &mut state.down {
            Some(down) => {
                down.losses += 1;
                down.error.clone_from(&error);
                down.waited += in_flight;
                false
            }
            None => {
                let down = Down {
                    since: Instant::now(),
                    losses: 1,
                    error: error.clone(),
                    waited: in_flight,
                };
                self.begin(&mut state, down);
                true
            }
        };
        drop(state);
        metrics::counter!(RELAY_CONNECTION_LOSSES, "relay" => self.relay).increment(1);
        metrics::counter!(RELAY_PUBLISHES_WAITED, "relay" => self.relay).increment(in_flight);
        if starts {
            let caught = match in_flight {
                0 => "no publish was in flight".to_string(),
                n => format!("{} in flight will be retried", publishes(n)),
            };
            // Of no one message: outside the span of the publish that happened to see it.
            tracing::warn!(
                parent: None,
                relay = self.relay,
                broker = self.address.as_deref(),
                error = %error,
                in_flight,
                "{} connection lost ({error}); {caught}",
                self.broker,
            );
        }
    }

    /// An attempt to connect failed, as `error` says. Logged when it starts an outage (the
    /// first connection failed); during one it only becomes the outage's latest error.
    #[cfg(feature = "rabbitmq")]
    pub(crate) fn connect_failed(&self, error: &dyn fmt::Display) {
        let mut state = self.state();
        let error = error.to_string();
        if let Some(down) = &mut state.down {
            down.error = error;
            return;
        }
        let down = Down {
            since: Instant::now(),
            losses: 0,
            error: error.clone(),
            waited: 0,
        };
        self.begin(&mut state, down);
        drop(state);
        tracing::warn!(
            parent: None,
            relay = self.relay,
            broker = self.address.as_deref(),
            error = %error,
            "cannot connect to {} ({error}); publishes wait for the connection",
            self.broker,
        );
    }

    /// A publish waits for the connection. Counted once per publish (`counted` remembers it;
    /// a publish caught in flight by the loss is counted already), and only during an outage:
    /// not while a first connection is being made.
    pub(crate) fn waits(&self, counted: &mut bool) {
        if *counted {
            return;
        }
        let mut state = self.state();
        if let Some(down) = &mut state.down {
            down.waited += 1;
            *counted = true;
            drop(state);
            metrics::counter!(RELAY_PUBLISHES_WAITED, "relay" => self.relay).increment(1);
        }
    }

    /// The broker answered a publish sent on connection `connection`: if that connection is
    /// newer than the last one lost, the outage under way, if any, is over, and reported.
    pub(crate) fn answered(&self, connection: u64) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state();
        if connection <= state.last_lost {
            return;
        }
        let Some(down) = state.down.take() else {
            return;
        };
        self.down.store(false, Ordering::Release);
        drop(state);
        let outage = down.since.elapsed();
        let (broker, waited, losses) = (self.broker, down.waited, down.losses);
        let how = if losses == 0 { "made" } else { "restored" };
        let lost = match losses {
            0 | 1 => String::new(),
            n => format!(" ({n} connections lost)"),
        };
        tracing::warn!(
            parent: None,
            relay = self.relay,
            broker = self.address.as_deref(),
            outage_secs = outage.as_secs_f64(),
            losses,
            waited,
            "{broker} connection {how} after {outage:.1?}{lost}; {} waited for it",
            publishes(waited),
        );
    }

    /// Why the connection is down, while it is.
    pub(crate) fn error(&self) -> Option<String> {
        self.state().down.as_ref().map(|d| d.error.clone())
    }

    /// `host:port` of the broker, when known.
    #[cfg(feature = "rabbitmq")]
    pub(crate) fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }
}

/// A publish in flight; see [`Outages::sent`].
pub(crate) struct InFlight<'a> {
    outages: &'a Outages,
    connection: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut state = self.outages.state();
        if let Some(n) = state.in_flight.get_mut(&self.connection) {
            *n -= 1;
            if *n == 0 {
                state.in_flight.remove(&self.connection);
            }
        }
    }
}

/// "1 publish", "3 publishes".
fn publishes(n: u64) -> String {
    match n {
        1 => "1 publish".to_string(),
        n => format!("{n} publishes"),
    }
}
