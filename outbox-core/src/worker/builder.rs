//! [`WorkerBuilder`]: the handlers (from the registry and added one by one), resources and
//! config a [`Worker`] is built from, checked once at build time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::{Inner, Worker, WorkerConfig};
use crate::error::{Error, Result};
use crate::handler::{erase, erase_raw, ErasedHandler, Handler, RawHandler};
use crate::health::Health;
use crate::registry::{duplicate_names, Registry, RegistryError};
use crate::resources::Resources;
use crate::store::Store;

/// Builds a [`Worker`]: a store, handlers from the registry and added explicitly, resources,
/// and a config.
///
/// ```no_run
/// use outbox::{Registry, Worker, WorkerConfig};
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
/// let worker = Worker::builder(&pool)
///     .registry(Registry::linked())
///     .resource(reqwest_client_or_any_shared_value())
///     .config(WorkerConfig::default().concurrency(16))
///     .build()?;
/// worker.run_until(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// # fn reqwest_client_or_any_shared_value() -> u8 { 0 }
/// ```
pub struct WorkerBuilder {
    store: Store,
    registry: Registry,
    explicit: Vec<Arc<dyn ErasedHandler>>,
    resources: Resources,
    config: WorkerConfig,
    strict: bool,
}

impl WorkerBuilder {
    pub(super) fn new(store: Store) -> Self {
        WorkerBuilder {
            store,
            registry: Registry::empty(),
            explicit: Vec::new(),
            resources: Resources::new(),
            config: WorkerConfig::default(),
            strict: true,
        }
    }

    /// Whether [`build`](WorkerBuilder::build) refuses a worker when an event declared in its
    /// registry has no handler in it (default: yes).
    ///
    /// A handler crate listed in `Cargo.toml` but never named in the binary's code is not
    /// linked, so its handlers do not register, and that event's messages would wait for ever
    /// while the worker looks healthy. Strict, the worker refuses to start and names the
    /// event. Topics that another service's workers serve are declared with
    /// [`Registry::allow_unhandled`] (the worker binary's `--served-elsewhere TOPIC`); turn
    /// strictness off only for tools that never run handlers.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Uses the handlers of `registry` (default: none; pass [`Registry::linked`] for all linked
    /// ones, or a filtered registry).
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Adds a handler instance, beside those of the registry.
    pub fn handler<H: Handler>(mut self, handler: H) -> Self {
        self.explicit.push(erase(handler));
        self
    }

    /// Adds a [`RawHandler`] for the messages of `topic`, beside the other handlers: it gets
    /// each payload as stored, undecoded. Call it once per topic for a chosen set.
    ///
    /// ```no_run
    /// # use outbox::{async_trait, Context, HandlerError, RawHandler, Worker};
    /// # struct Archive;
    /// # #[async_trait]
    /// # impl RawHandler for Archive {
    /// #     const NAME: &'static str = "archive";
    /// #     async fn handle_raw(&self, _: &str, _: &Context) -> Result<(), HandlerError> { Ok(()) }
    /// # }
    /// # fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
    /// let archive = std::sync::Arc::new(Archive);
    /// let worker = Worker::builder(&pool)
    ///     .raw_handler("booking.created", archive.clone())
    ///     .raw_handler("booking.cancelled", archive)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn raw_handler<H: RawHandler>(mut self, topic: &'static str, handler: Arc<H>) -> Self {
        self.explicit.push(erase_raw(topic, handler));
        self
    }

    /// Adds a [`RawHandler`] for every event declared in this binary: each type marked
    /// `#[outbox_event]` in the crates linked into it ([`Registry::linked`]'s events), whether
    /// or not another handler serves it too. The one line that relays every event to a broker.
    ///
    /// ```no_run
    /// # use outbox::{async_trait, Context, HandlerError, RawHandler, Worker};
    /// # struct Archive;
    /// # #[async_trait]
    /// # impl RawHandler for Archive {
    /// #     const NAME: &'static str = "archive";
    /// #     async fn handle_raw(&self, _: &str, _: &Context) -> Result<(), HandlerError> { Ok(()) }
    /// # }
    /// # fn run(pool: sqlx::PgPool) -> Result<(), outbox::Error> {
    /// let worker = Worker::builder(&pool)
    ///     .raw_handler_for_declared_events(std::sync::Arc::new(Archive))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn raw_handler_for_declared_events<H: RawHandler>(mut self, handler: Arc<H>) -> Self {
        for event in Registry::linked().events() {
            self.explicit
                .push(erase_raw(event.topic(), handler.clone()));
        }
        self
    }

    /// Adds a shared value handlers can use (an HTTP client, an API key, a pool).
    pub fn resource<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.resources.insert(value);
        self
    }

    /// Replaces the resources.
    pub fn resources(mut self, resources: Resources) -> Self {
        self.resources = resources;
        self
    }

    /// Sets the config.
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the registered handlers from the resources and checks everything.
    ///
    /// # Errors
    ///
    /// [`Error::Resource`](crate::error::Error::Resource) when a handler cannot be built, [`Error::Registry`](crate::error::Error::Registry) when there are no
    /// handlers, two handlers of a topic share a name, the handlers of a topic take event types
    /// of different versions or two types claim the same version of a topic, [`Error::Config`](crate::error::Error::Config) for bad settings.
    pub fn build(self) -> Result<Worker> {
        let mut handlers: Vec<Arc<dyn ErasedHandler>> = Vec::new();
        for reg in self.registry.handlers() {
            handlers.push(reg.build(&self.resources)?);
        }
        handlers.extend(self.explicit);
        if handlers.is_empty() {
            return Err(RegistryError::from_problems(vec![
                "the worker has no handlers: pass Registry::linked() and make sure the handler crates are linked \
                 (`use my_handlers as _;`), or add handlers with WorkerBuilder::handler"
                    .into(),
            ])
            .into());
        }
        let dups = duplicate_names(
            handlers
                .iter()
                .map(|h| (h.topic(), h.name(), h.type_name())),
        );
        if !dups.is_empty() {
            return Err(RegistryError::from_problems(dups).into());
        }
        let longest = handlers
            .iter()
            .map(|h| h.timeout().unwrap_or(self.config.handler_timeout))
            .max()
            .unwrap_or(self.config.handler_timeout);
        self.config.validate(longest)?;
        for h in &handlers {
            if let Some(b) = h.breaker() {
                b.validate(h.name()).map_err(crate::error::Error::Config)?;
            }
        }
        let mut topics: BTreeMap<&'static str, Vec<Arc<dyn ErasedHandler>>> = BTreeMap::new();
        for h in handlers {
            topics.entry(h.topic()).or_default().push(h);
        }
        let versions = super::versions::known_versions(&topics)
            .map_err(|problems| Error::from(RegistryError::from_problems(problems)))?;
        // The event log's windows this worker declares: of its handlers' events and of the
        // events linked into it, the longest per topic.
        let mut retention: BTreeMap<&'static str, Duration> = BTreeMap::new();
        let declared = topics
            .values()
            .flatten()
            .filter_map(|h| Some((h.topic(), h.retain()?)))
            .chain(
                self.registry
                    .events()
                    .filter_map(|e| Some((e.topic(), e.retain()?))),
            );
        for (topic, window) in declared {
            let longest = retention.entry(topic).or_insert(window);
            *longest = (*longest).max(window);
        }
        // Declared events none of this worker's handlers serve, registered or explicit.
        let unhandled_events: Vec<(&'static str, &'static str)> = self
            .registry
            .unhandled_events()
            .iter()
            .filter(|e| !topics.contains_key(e.topic()))
            .map(|e| (e.topic(), e.type_name()))
            .collect();
        if self.strict && !unhandled_events.is_empty() {
            return Err(RegistryError::from_problems(
                unhandled_events
                    .iter()
                    .map(|(topic, type_name)| {
                        format!(
                            "event `{type_name}` (topic `{topic}`) is declared but no handler in this worker \
                             serves it: link the crate that registers its handler (`use my_handlers as _;` \
                             in the binary), or declare the topic served elsewhere \
                             (`--served-elsewhere {topic}`, Registry::allow_unhandled)"
                        )
                    })
                    .collect(),
            )
            .into());
        }
        Ok(Worker {
            inner: Arc::new(Inner {
                store: self.store,
                topics,
                versions,
                retention,
                recorded: std::sync::atomic::AtomicBool::new(false),
                unhandled_events,
                resources: Arc::new(self.resources),
                health: Health::new(
                    self.config.max_tick_age(),
                    self.config.health_max_oldest_ready,
                    self.config.health_max_awaiting_version,
                ),
                config: self.config,
                id: Uuid::now_v7(),
                next_topic: std::sync::atomic::AtomicUsize::new(0),
                abandoned: std::sync::atomic::AtomicU64::new(0),
                pauses: Arc::new(super::pauses::Pauses::default()),
            }),
        })
    }
}
