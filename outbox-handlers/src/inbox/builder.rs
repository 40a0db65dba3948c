//! [`InboxBuilder`]: an inbox's handlers and settings, checked by [`InboxBuilder::build`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_nats::jetstream::consumer::PullConsumer;
use outbox::{Connection, Event, Resources};
use sqlx::{Database, Pool, Postgres};

use super::route::{Route, Typed};
use super::{Inbox, Inner, DEFAULT_CONCURRENCY, DEFAULT_MAX_ATTEMPTS};
use crate::dedup::TxHandler;
use crate::ConfigError;

/// Builds an [`Inbox`]; see [`Inbox::builder`].
///
/// # About type parameter `DB`
///
/// The database of the processed records and of the handlers' transactions, as for
/// [`Inbox`]: inferred from the pool given to [`Inbox::builder`].
pub struct InboxBuilder<DB: Database = Postgres> {
    consumer: PullConsumer,
    pool: Pool<DB>,
    routes: Vec<(&'static str, Box<dyn Route<DB>>)>,
    resources: Resources,
    concurrency: usize,
    max_attempts: u32,
}

impl<DB: Database> fmt::Debug for InboxBuilder<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxBuilder")
            .field(
                "handlers",
                &self
                    .routes
                    .iter()
                    .map(|(t, r)| (*t, r.name()))
                    .collect::<Vec<_>>(),
            )
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl<DB> InboxBuilder<DB>
where
    DB: Database,
    DB::Connection: Connection,
{
    pub(super) fn new(consumer: PullConsumer, pool: Pool<DB>) -> Self {
        InboxBuilder {
            consumer,
            pool,
            routes: Vec::new(),
            resources: Resources::new(),
            concurrency: DEFAULT_CONCURRENCY,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
        }
    }

    /// Adds a handler: it receives the messages of its event's topic, and runs in a transaction
    /// of the inbox's database `DB`.
    pub fn handler<H: TxHandler<DB>>(mut self, handler: H) -> Self {
        self.routes
            .push((<H::Event as Event>::TOPIC, Box::new(Typed(handler))));
        self
    }

    /// Adds a shared value handlers can read through [`Context::resources`](outbox::Context::resources).
    pub fn resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.resources.insert(value);
        self
    }

    /// Messages handled at once (default [`DEFAULT_CONCURRENCY`]).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// The delivery after which a retryable failure terminates the message (default
    /// [`DEFAULT_MAX_ATTEMPTS`]). Keep the consumer's `max_deliver` unlimited or above it.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// Checks the handlers and builds the inbox.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `inbox.handlers` when there are none or two of a topic share a
    /// name, `inbox.concurrency` or `inbox.max_attempts` when zero.
    pub fn build(self) -> Result<Inbox<DB>, ConfigError> {
        if self.routes.is_empty() {
            return Err(ConfigError::Rejected {
                key: "inbox.handlers".into(),
                reason: "the inbox has no handlers; add them with InboxBuilder::handler".into(),
            });
        }
        if self.concurrency == 0 {
            return Err(ConfigError::Invalid {
                key: "inbox.concurrency".into(),
                reason: "must be at least 1".into(),
                got: "0".into(),
            });
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::Invalid {
                key: "inbox.max_attempts".into(),
                reason: "must be at least 1".into(),
                got: "0".into(),
            });
        }
        let mut routes: BTreeMap<&'static str, Vec<Box<dyn Route<DB>>>> = BTreeMap::new();
        for (topic, route) in self.routes {
            let same = routes.entry(topic).or_default();
            if let Some(other) = same.iter().find(|r| r.name() == route.name()) {
                return Err(ConfigError::Rejected {
                    key: "inbox.handlers".into(),
                    reason: format!(
                        "handlers `{}` and `{}` of topic `{topic}` share the name `{}`: their \
                         processed records would collide; give each a unique TxHandler::NAME",
                        other.type_name(),
                        route.type_name(),
                        route.name()
                    ),
                });
            }
            same.push(route);
        }
        Ok(Inbox {
            inner: Arc::new(Inner {
                consumer: self.consumer,
                pool: self.pool,
                routes,
                resources: self.resources,
                concurrency: self.concurrency,
                max_attempts: self.max_attempts,
            }),
        })
    }
}
