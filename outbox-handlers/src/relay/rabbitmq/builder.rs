//! [`RabbitPublisherBuilder`]: the exchange, the topic map and the channel limit of a
//! [`RabbitPublisher`], checked by [`RabbitPublisherBuilder::build`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::link::{address, Link};
use super::{
    Inner, Outages, RabbitPublisher, DEFAULT_EXCHANGE, DEFAULT_MAX_CHANNELS, DEFAULT_RECONNECT_WAIT,
};
use crate::cloudevents::CloudEvents;
use crate::ConfigError;

/// The most channels AMQP 0-9-1 numbers on one connection.
const AMQP_MAX_CHANNELS: usize = 65_535;

/// Builds a [`RabbitPublisher`]; see [`RabbitPublisher::builder`].
pub struct RabbitPublisherBuilder {
    uri: String,
    exchange: String,
    map: Vec<(String, String, String)>,
    max_channels: usize,
    reconnect_wait: Duration,
    cloudevents: Option<String>,
}

impl fmt::Debug for RabbitPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitPublisherBuilder")
            .field("exchange", &self.exchange)
            .field("map", &self.map)
            .field("max_channels", &self.max_channels)
            .field("reconnect_wait", &self.reconnect_wait)
            .field("cloudevents", &self.cloudevents)
            .finish_non_exhaustive()
    }
}

impl RabbitPublisherBuilder {
    pub(super) fn new(uri: String) -> Self {
        RabbitPublisherBuilder {
            uri,
            exchange: DEFAULT_EXCHANGE.to_string(),
            map: Vec::new(),
            max_channels: DEFAULT_MAX_CHANNELS,
            reconnect_wait: DEFAULT_RECONNECT_WAIT,
            cloudevents: None,
        }
    }

    /// How long a publish waits for the connection while it is down (default
    /// [`DEFAULT_RECONNECT_WAIT`]) before it fails, to be retried by the worker.
    ///
    /// The connection is made again in the background as soon as it is lost; the publishes it
    /// caught in flight, and those that come meanwhile, wait for it and go out on the new
    /// connection, so that a broker restart or a network blip costs a pause rather than a failed
    /// attempt per message. Keep it below the handler's timeout (the worker's
    /// [`handler_timeout`](outbox::WorkerConfig::handler_timeout), 60 s by default), or the
    /// worker gives up on the waiting publishes first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox_handlers::relay::rabbitmq::RabbitPublisher;
    /// let rabbit = RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .reconnect_wait(Duration::from_secs(20))
    ///     .build()
    ///     .unwrap();
    /// # let _ = rabbit;
    /// assert!(RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .reconnect_wait(Duration::ZERO)
    ///     .build()
    ///     .is_err());
    /// ```
    pub fn reconnect_wait(mut self, wait: Duration) -> Self {
        self.reconnect_wait = wait;
        self
    }

    /// The most channels the publisher opens on its connection, which is the most publishes in
    /// flight (default [`DEFAULT_MAX_CHANNELS`]): a call beyond them waits for a channel to be
    /// free. Each publish in flight needs a channel of its own (see the [module](super)); keep this
    /// below the broker's `channel_max` (2,047 by default), as every channel costs the broker
    /// memory. A worker whose concurrency is above it relays no faster for the excess.
    ///
    /// ```
    /// use outbox_handlers::relay::rabbitmq::RabbitPublisher;
    /// let rabbit = RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .max_channels(32)
    ///     .build()
    ///     .unwrap();
    /// # let _ = rabbit;
    /// assert!(RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f").max_channels(0).build().is_err());
    /// ```
    pub fn max_channels(mut self, channels: usize) -> Self {
        self.max_channels = channels;
        self
    }

    /// The exchange topics are published to, with the topic as routing key
    /// (default [`DEFAULT_EXCHANGE`]). `""` is the default exchange, which routes to the queue
    /// named like the routing key.
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// Publishes `topic` to `exchange` with `routing_key`, overriding the default rule.
    pub fn map(
        mut self,
        topic: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        self.map
            .push((topic.into(), exchange.into(), routing_key.into()));
        self
    }

    /// Sends each message as a CloudEvents 1.0 event in binary content mode, with `source` (a
    /// URI-reference naming the producer) as its `source` attribute: the `cloudEvents_…` headers
    /// of [`cloudevents`](crate::cloudevents) beside the outbox's own, the payload unchanged. Off
    /// unless set.
    ///
    /// ```
    /// use outbox_handlers::relay::rabbitmq::RabbitPublisher;
    /// let rabbit = RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .cloudevents("https://bookings.example.com")
    ///     .build()
    ///     .unwrap();
    /// # let _ = rabbit;
    /// assert!(RabbitPublisher::builder("amqp://127.0.0.1:5672/%2f")
    ///     .cloudevents("")
    ///     .build()
    ///     .is_err());
    /// ```
    pub fn cloudevents(mut self, source: impl Into<String>) -> Self {
        self.cloudevents = Some(source.into());
        self
    }

    /// Checks the names and builds the publisher; it connects on its first publish.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `rabbitmq.uri`, `rabbitmq.exchange`,
    /// `rabbitmq.map.<topic>`, `rabbitmq.max_channels`, `rabbitmq.reconnect_wait` or
    /// `rabbitmq.cloudevents` when the URI does not start with `amqp://` or `amqps://`, a name
    /// is longer than AMQP allows (255 bytes), the channels are not between 1 and 65,535, the
    /// reconnect wait is zero, or the CloudEvents source is empty or holds whitespace.
    pub fn build(self) -> Result<RabbitPublisher, ConfigError> {
        if !(self.uri.starts_with("amqp://") || self.uri.starts_with("amqps://")) {
            return Err(ConfigError::Rejected {
                key: "rabbitmq.uri".into(),
                reason: "must start with amqp:// or amqps://".into(),
            });
        }
        check_name("rabbitmq.exchange", &self.exchange)?;
        if !(1..=AMQP_MAX_CHANNELS).contains(&self.max_channels) {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.max_channels".into(),
                reason: format!(
                    "must be between 1 and {AMQP_MAX_CHANNELS}, the channels AMQP numbers"
                ),
                got: self.max_channels.to_string(),
            });
        }
        if self.reconnect_wait.is_zero() {
            return Err(ConfigError::Invalid {
                key: "rabbitmq.reconnect_wait".into(),
                reason: "must be more than zero: every publish waits for the connection to be made"
                    .into(),
                got: format!("{:?}", self.reconnect_wait),
            });
        }
        let cloudevents = self
            .cloudevents
            .map(|source| CloudEvents::new("rabbitmq.cloudevents", source))
            .transpose()?;
        let mut map = BTreeMap::new();
        for (topic, exchange, key) in self.map {
            let name = format!("rabbitmq.map.{topic}");
            check_name(&name, &exchange)?;
            check_name(&name, &key)?;
            map.insert(topic, (exchange, key));
        }
        Ok(RabbitPublisher {
            inner: Arc::new(Inner {
                outages: Outages::new("RabbitMQ", "rabbitmq", address(&self.uri)),
                uri: self.uri,
                exchange: self.exchange,
                map,
                link: Link::new(),
                reconnect_wait: self.reconnect_wait,
                idle: std::sync::Mutex::new(Vec::new()),
                channels: Semaphore::new(self.max_channels),
                cloudevents,
            }),
        })
    }
}

/// An exchange name or routing key: an AMQP short string.
fn check_name(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.len() > 255 {
        return Err(ConfigError::Invalid {
            key: key.to_string(),
            reason: "longer than the 255 bytes AMQP allows".into(),
            got: value.chars().take(100).collect(),
        });
    }
    Ok(())
}
