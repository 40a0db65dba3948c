//! [`NatsPublisherBuilder`]: the subject prefix, the topic map, the reconnect wait and the
//! CloudEvents source of a [`NatsPublisher`], checked by [`NatsPublisherBuilder::build`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use super::{NatsPublisher, Outages, Subjects};
use crate::cloudevents::CloudEvents;
use crate::ConfigError;

/// Builds a [`NatsPublisher`]; see [`NatsPublisher::builder`].
#[derive(Debug)]
pub struct NatsPublisherBuilder {
    pub(super) js: jetstream::Context,
    pub(super) prefix: Option<String>,
    pub(super) map: Vec<(String, String)>,
    pub(super) reconnect_wait: Duration,
    pub(super) cloudevents: Option<String>,
}

impl NatsPublisherBuilder {
    /// Publishes topic `t` to `{prefix}.{t}`. The prefix is one or more subject tokens separated
    /// by dots (`outbox`, `acme.outbox`), without wildcards.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Publishes `topic` to `subject` exactly (no prefix), overriding the prefix rule.
    pub fn map(mut self, topic: impl Into<String>, subject: impl Into<String>) -> Self {
        self.map.push((topic.into(), subject.into()));
        self
    }

    /// How long a publish waits for the client to reconnect while it is disconnected (default
    /// [`DEFAULT_RECONNECT_WAIT`](super::DEFAULT_RECONNECT_WAIT)) before it fails, to be retried by the worker.
    ///
    /// Publishes the lost connection caught in flight, and those that come meanwhile, wait for
    /// the client and go out on the new connection, so that a server restart or a network blip
    /// costs a pause rather than a failed attempt per message. Keep it below the handler's
    /// timeout (the worker's [`handler_timeout`](outbox::WorkerConfig::handler_timeout), 60 s by
    /// default), or the worker gives up on the waiting publishes first.
    pub fn reconnect_wait(mut self, wait: Duration) -> Self {
        self.reconnect_wait = wait;
        self
    }

    /// Sends each message as a CloudEvents 1.0 event in binary content mode, with `source` (a
    /// URI-reference naming the producer) as its `source` attribute: the `ce-…` headers of
    /// [`cloudevents`](crate::cloudevents) beside the outbox's own, the payload unchanged. Off
    /// unless set.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// # use outbox_handlers::relay::nats::NatsPublisher;
    /// # let js = async_nats::jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
    /// let nats = NatsPublisher::builder(js)
    ///     .prefix("outbox")
    ///     .cloudevents("https://bookings.example.com")
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cloudevents(mut self, source: impl Into<String>) -> Self {
        self.cloudevents = Some(source.into());
        self
    }

    /// Checks the subjects and builds the publisher.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming `nats.prefix`, `nats.map.<topic>`,
    /// `nats.reconnect_wait` or `nats.cloudevents` when a subject is empty, has an empty token,
    /// a wildcard (`*`, `>`) or whitespace, the reconnect wait is zero, or the CloudEvents source
    /// is empty or holds whitespace.
    pub fn build(self) -> Result<NatsPublisher, ConfigError> {
        if let Some(p) = &self.prefix {
            check_subject("nats.prefix", p)?;
        }
        if self.reconnect_wait.is_zero() {
            return Err(ConfigError::Invalid {
                key: "nats.reconnect_wait".into(),
                reason: "must be more than zero".into(),
                got: format!("{:?}", self.reconnect_wait),
            });
        }
        let cloudevents = self
            .cloudevents
            .map(|source| CloudEvents::new("nats.cloudevents", source).map(Arc::new))
            .transpose()?;
        let mut map = BTreeMap::new();
        for (topic, subject) in self.map {
            check_subject(&format!("nats.map.{topic}"), &subject)?;
            map.insert(topic, subject);
        }
        Ok(NatsPublisher {
            js: self.js,
            subjects: Arc::new(Subjects {
                prefix: self.prefix,
                map,
            }),
            outages: Arc::new(Outages::new("NATS", "nats", None)),
            reconnect_wait: self.reconnect_wait,
            cloudevents,
        })
    }
}

/// A subject to publish to: dot-separated non-empty tokens, no wildcards, no whitespace.
fn check_subject(key: &str, subject: &str) -> Result<(), ConfigError> {
    let bad = |reason: &str| ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.to_string(),
        got: subject.chars().take(100).collect(),
    };
    if subject.split('.').any(str::is_empty) {
        return Err(bad(
            "a NATS subject is dot-separated tokens, none of them empty",
        ));
    }
    if subject
        .chars()
        .any(|c| c.is_whitespace() || c == '*' || c == '>')
    {
        return Err(bad(
            "a subject to publish to takes no whitespace and no wildcard (`*`, `>`)",
        ));
    }
    Ok(())
}
