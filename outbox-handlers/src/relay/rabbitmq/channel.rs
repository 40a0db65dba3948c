//! The confirm-mode channels of a [`RabbitPublisher`]: one lent to each publish in flight
//! ([`Lease`]), given back for the next publish once its confirm has come.

use lapin::options::ConfirmSelectOptions;
use lapin::Channel;

use super::link::Open;
use super::RabbitPublisher;

impl RabbitPublisher {
    /// A confirm-mode channel of `open` with no publish in flight: an idle one, else a new one.
    pub(super) async fn checkout(&self, open: &Open) -> Result<Lease<'_>, lapin::Error> {
        loop {
            let idle = lock(&self.inner.idle).pop();
            match idle {
                Some((channel, number))
                    if number == open.number && channel.status().connected() =>
                {
                    return Ok(self.lease(channel, number))
                }
                // A channel of a connection that was lost, or closed by the broker.
                Some(_) => continue,
                None => break,
            }
        }
        let channel = open.conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(self.lease(channel, open.number))
    }

    /// Forgets the idle channels of connection `number`, which is lost.
    pub(super) fn forget_channels(&self, number: u64) {
        lock(&self.inner.idle).retain(|(_, n)| *n != number);
    }

    fn lease(&self, channel: Channel, number: u64) -> Lease<'_> {
        Lease {
            idle: &self.inner.idle,
            channel,
            number,
            settled: false,
        }
    }
}

/// Idle channels, each with the number of its connection.
pub(super) type Idle = std::sync::Mutex<Vec<(Channel, u64)>>;

fn lock(idle: &Idle) -> std::sync::MutexGuard<'_, Vec<(Channel, u64)>> {
    idle.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A channel lent to one publish.
///
/// RabbitMQ confirms a channel's publishes by a number it gives them in the order their frames
/// arrive, and returns an unroutable message before its confirm without naming the publish:
/// lapin can match a confirm or a return to its call only while a channel has one publish in
/// flight. Two concurrent calls on one channel may reach the wire in the other order than lapin
/// numbered them, and a confirm then resolves the wrong call: a message lost in a connection
/// drop is reported as delivered, or a routable one as returned. So each publish in flight
/// has a channel of its own, given back for the next publish once its confirm has come.
pub(super) struct Lease<'a> {
    idle: &'a Idle,
    pub(super) channel: Channel,
    /// The number of the channel's connection.
    number: u64,
    /// Set once the publish has its confirm, or failed.
    settled: bool,
}

impl Lease<'_> {
    /// The publish has its confirm (or failed): the channel, if still open, serves the next.
    pub(super) fn give_back(mut self) {
        self.settled = true;
    }
}

impl Drop for Lease<'_> {
    /// Gives a settled channel back. A publish abandoned before its confirm (its handler timed
    /// out) closes its channel instead: lapin keeps an abandoned confirm on its channel until
    /// someone waits for all of the channel's confirms, which this publisher never does, so a
    /// channel reused after each abandoned publish would hold more of them for as long as it
    /// stays open.
    fn drop(&mut self) {
        if self.settled {
            if self.channel.status().connected() {
                lock(self.idle).push((self.channel.clone(), self.number));
            }
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let channel = self.channel.clone();
            runtime.spawn(async move {
                let _ = channel.close(200, "publish abandoned".into()).await;
            });
        }
    }
}
