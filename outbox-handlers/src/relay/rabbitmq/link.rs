//! The connection of a [`RabbitPublisher`]: made on the first publish, and made again in the
//! background, by one task with a growing pause between attempts, once it is lost. Publishes
//! wait for it meanwhile, up to the publisher's
//! [`reconnect_wait`](super::RabbitPublisherBuilder::reconnect_wait).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures_util::stream::BoxStream;
use futures_util::{FutureExt, StreamExt};
use lapin::{Connection, ConnectionProperties};
use outbox::HandlerError;

use super::{Inner, RabbitPublisher};

/// How long one attempt to connect may take, handshake included. Generous for a broker that
/// answers at all; an attempt whose connection is cut during the handshake can otherwise wait
/// for ever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause after the first failed attempt to connect; it doubles with each failure.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to connect.
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// The shared connection and whether one is being made.
pub(super) struct Link {
    state: Mutex<LinkState>,
    /// Sent to whenever a connection is made or an attempt fails: waiting publishes look again.
    changed: tokio::sync::watch::Sender<()>,
}

#[derive(Default)]
struct LinkState {
    /// The connection made last, until it is found lost.
    open: Option<Open>,
    /// A task is making a connection.
    connecting: bool,
    /// Connections made so far: the number of the last one.
    made: u64,
}

/// A connection, with its number: 1 for the first, one more for each reconnect.
#[derive(Clone)]
pub(super) struct Open {
    pub(super) conn: Arc<Connection>,
    pub(super) number: u64,
    /// The connection's events, which say why it failed when no publish saw it fail.
    events: Arc<Mutex<BoxStream<'static, lapin::Event>>>,
}

impl Open {
    fn new(conn: Connection, number: u64) -> Self {
        Open {
            events: Arc::new(Mutex::new(conn.events_listener().boxed())),
            conn: Arc::new(conn),
            number,
        }
    }

    /// Why the connection is no longer connected, as far as its events tell.
    fn why_closed(&self) -> String {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(Some(event)) = events.next().now_or_never() {
            if let lapin::Event::Error(e) = event {
                return e.to_string();
            }
        }
        "the connection closed".to_string()
    }
}

impl Link {
    pub(super) fn new() -> Self {
        Link {
            state: Mutex::default(),
            changed: tokio::sync::watch::Sender::new(()),
        }
    }

    fn state(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `host:port` of an AMQP URI, without its credentials.
pub(super) fn address(uri: &str) -> Option<String> {
    let uri: lapin::uri::AMQPUri = uri.parse().ok()?;
    Some(format!("{}:{}", uri.authority.host, uri.authority.port))
}

impl RabbitPublisher {
    /// The open connection. While there is none, a task makes one in the background and this
    /// waits for it until `deadline`; `waited` records that this publish waited.
    pub(super) async fn connection(
        &self,
        deadline: Instant,
        waited: &mut bool,
    ) -> Result<Open, HandlerError> {
        loop {
            let mut changed = self.inner.link.changed.subscribe();
            if let Some(open) = self.open_or_reconnect()? {
                return Ok(open);
            }
            self.inner.outages.waits(waited);
            let wait = tokio::time::timeout_at(deadline.into(), changed.changed()).await;
            if wait.is_err() {
                let outages = &self.inner.outages;
                return Err(HandlerError::retry(format!(
                    "RabbitMQ{} is unreachable ({}); waited {:?} for the connection",
                    outages
                        .address()
                        .map_or(String::new(), |a| format!(" at {a}")),
                    outages.error().as_deref().unwrap_or("still connecting"),
                    self.inner.reconnect_wait,
                )));
            }
        }
    }

    /// The connection if it is open; else starts making one, if no task is already.
    fn open_or_reconnect(&self) -> Result<Option<Open>, HandlerError> {
        let mut link = self.inner.link.state();
        if let Some(open) = &link.open {
            if open.conn.status().connected() {
                return Ok(Some(open.clone()));
            }
            // Lost while no publish was in flight to report how.
            let (number, why) = (open.number, open.why_closed());
            link.open = None;
            self.forget_channels(number);
            self.inner.outages.lost(number, &why);
        }
        self.reconnect(&mut link)?;
        Ok(None)
    }

    /// A publish failed on `open` as `error` says, and `open` is no longer connected: the
    /// connection is lost. Reported once, however many publishes report it.
    pub(super) fn lost(&self, open: &Open, error: &lapin::Error) {
        let mut link = self.inner.link.state();
        if link.open.as_ref().is_some_and(|o| o.number == open.number) {
            link.open = None;
        }
        self.forget_channels(open.number);
        self.inner.outages.lost(open.number, error);
        if link.open.is_none() {
            // A waiting publish starts it otherwise; without a runtime it reports that itself.
            let _ = self.reconnect(&mut link);
        }
    }

    /// Starts the task that makes the connection, unless it runs already.
    fn reconnect(&self, link: &mut LinkState) -> Result<(), HandlerError> {
        if link.connecting {
            return Ok(());
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            HandlerError::retry(
                "the RabbitMQ publisher connects from a Tokio runtime; none is running",
            )
        })?;
        link.connecting = true;
        runtime.spawn(connect(Arc::downgrade(&self.inner)));
        Ok(())
    }
}

/// Makes the connection, trying again after a pause that doubles up to [`MAX_PAUSE`], until it
/// is made or the publisher is dropped.
async fn connect(inner: Weak<Inner>) {
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let attempt = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Connection::connect(&inner.uri, ConnectionProperties::default()),
        )
        .await;
        match attempt {
            Ok(Ok(conn)) => {
                {
                    let mut link = inner.link.state();
                    link.made += 1;
                    link.open = Some(Open::new(conn, link.made));
                    link.connecting = false;
                }
                inner.link.changed.send_replace(());
                return;
            }
            Ok(Err(e)) => inner.outages.connect_failed(&e),
            Err(_) => inner
                .outages
                .connect_failed(&format_args!("no answer within {CONNECT_TIMEOUT:?}")),
        }
        tracing::debug!(retry_in = ?pause, "could not connect to RabbitMQ; trying again");
        inner.link.changed.send_replace(());
        drop(inner);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
