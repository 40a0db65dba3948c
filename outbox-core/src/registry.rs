//! The handler registry: what is linked into this binary, and checks that it is complete.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use crate::event::EventDescriptor;
use crate::handler::{erase, ErasedHandler, Handler};
use crate::resources::{FromResources, ResourceError, Resources};

/// A handler registered at link time by [`register_handler!`](crate::register_handler).
///
/// Const data only: names and a constructor, never an instance.
#[derive(Clone, Copy)]
pub struct HandlerRegistration {
    topic: &'static str,
    name: &'static str,
    type_name: fn() -> &'static str,
    build: fn(&Resources) -> Result<Arc<dyn ErasedHandler>, ResourceError>,
}

impl HandlerRegistration {
    #[doc(hidden)]
    pub const fn __new<H: Handler + FromResources>() -> Self {
        Self {
            topic: <H::Event as crate::event::Event>::TOPIC,
            name: H::NAME,
            type_name: std::any::type_name::<H>,
            build: build_registered::<H>,
        }
    }

    /// The topic the handler serves.
    pub fn topic(&self) -> &'static str {
        self.topic
    }

    /// The handler's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Rust type of the handler.
    pub fn type_name(&self) -> &'static str {
        (self.type_name)()
    }

    pub(crate) fn build(
        &self,
        resources: &Resources,
    ) -> Result<Arc<dyn ErasedHandler>, ResourceError> {
        (self.build)(resources)
    }
}

fn build_registered<H: Handler + FromResources>(
    resources: &Resources,
) -> Result<Arc<dyn ErasedHandler>, ResourceError> {
    Ok(erase(H::from_resources(resources)?))
}

impl fmt::Debug for HandlerRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerRegistration")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .field("type_name", &self.type_name())
            .finish()
    }
}

inventory::collect!(HandlerRegistration);

/// Registers a handler at link time, so that a worker built with
/// [`Registry::linked`] finds it.
///
/// The type must implement [`Handler`] and [`FromResources`]; the worker builds it from its
/// resources when it starts. Users need no dependency on `inventory`.
///
/// Registration happens only if the crate that holds this line is linked into the binary: a
/// crate nothing refers to is dropped by the linker and registers nothing. Reference handler
/// crates from the worker binary (`use my_handlers as _;`) and call
/// [`Registry::check`] or [`assert_all_events_handled`] to catch the mistake.
///
/// ```
/// # use outbox::{outbox_event, Context, FromResources, Handler, HandlerError, ResourceError, Resources};
/// # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)] struct Ping;
/// #[derive(Default)]
/// struct Pong;
/// # #[outbox::async_trait]
/// # impl Handler for Pong {
/// #     type Event = Ping;
/// #     const NAME: &'static str = "pong";
/// #     async fn handle(&self, _: Ping, _: &Context) -> Result<(), HandlerError> { Ok(()) }
/// # }
/// impl FromResources for Pong {
///     fn from_resources(_: &Resources) -> Result<Self, ResourceError> { Ok(Pong) }
/// }
/// outbox::register_handler!(Pong);
/// ```
#[macro_export]
macro_rules! register_handler {
    ($handler:ty) => {
        const _: () = {
            $crate::__private::inventory::submit! {
                $crate::__private::HandlerRegistration::__new::<$handler>()
            }
        };
    };
}

/// One handler as the registry lists it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct HandlerInfo {
    /// The handler's name.
    pub name: &'static str,
    /// The Rust type of the handler.
    pub type_name: &'static str,
}

/// The handlers and events linked into this binary, with checks that they fit together.
///
/// # Example
///
/// ```
/// use outbox::Registry;
///
/// let registry = Registry::linked();
/// for (topic, handlers) in registry.topics() {
///     println!("{topic}: {}", handlers.iter().map(|h| h.name).collect::<Vec<_>>().join(", "));
/// }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Registry {
    handlers: Vec<HandlerRegistration>,
    events: BTreeSet<EventDescriptor>,
    allowed_unhandled: BTreeSet<String>,
}

impl Registry {
    /// Every handler and event registered by the crates linked into this binary.
    pub fn linked() -> Self {
        let mut handlers: Vec<_> = inventory::iter::<HandlerRegistration>
            .into_iter()
            .copied()
            .collect();
        handlers.sort_by_key(|h| (h.topic, h.name, h.type_name()));
        let events = inventory::iter::<EventDescriptor>
            .into_iter()
            .copied()
            .collect();
        Self {
            handlers,
            events,
            allowed_unhandled: BTreeSet::new(),
        }
    }

    /// An empty registry, for workers whose handlers are all added explicitly.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Keeps only the handlers for which `keep` returns true (e.g. one topic per worker pool).
    pub fn filter(mut self, mut keep: impl FnMut(&HandlerRegistration) -> bool) -> Self {
        self.handlers.retain(|h| keep(h));
        self
    }

    /// Declares that events of `topic` are handled elsewhere (another service's worker), so
    /// [`check`](Registry::check) does not report them.
    pub fn allow_unhandled(mut self, topic: impl Into<String>) -> Self {
        self.allowed_unhandled.insert(topic.into());
        self
    }

    /// The registered handlers, sorted by topic and name.
    pub fn handlers(&self) -> &[HandlerRegistration] {
        &self.handlers
    }

    /// The declared events (types with `#[outbox_event]`), sorted by topic.
    pub fn events(&self) -> impl Iterator<Item = &EventDescriptor> {
        self.events.iter()
    }

    /// Topic -> handlers, sorted.
    pub fn topics(&self) -> BTreeMap<&'static str, Vec<HandlerInfo>> {
        let mut map: BTreeMap<&'static str, Vec<HandlerInfo>> = BTreeMap::new();
        for h in &self.handlers {
            map.entry(h.topic).or_default().push(HandlerInfo {
                name: h.name,
                type_name: h.type_name(),
            });
        }
        map
    }

    /// Declared events that no registered handler serves, except those allowed.
    pub fn unhandled_events(&self) -> Vec<EventDescriptor> {
        let topics = self.topics();
        self.events
            .iter()
            .filter(|e| {
                !topics.contains_key(e.topic()) && !self.allowed_unhandled.contains(e.topic())
            })
            .copied()
            .collect()
    }

    /// Checks that the registry can run: not empty, no two handlers of a topic share a name,
    /// and every declared event has a handler (unless allowed with
    /// [`allow_unhandled`](Registry::allow_unhandled)).
    ///
    /// Every problem found is reported at once, naming the types involved.
    pub fn check(&self) -> Result<(), RegistryError> {
        let mut problems = Vec::new();
        if self.handlers.is_empty() {
            problems.push(
                "no handlers are registered: the crates that call register_handler! are probably not \
                 linked; reference them from the binary (`use my_handlers as _;`)"
                    .to_string(),
            );
        }
        problems.extend(duplicate_names(
            self.handlers
                .iter()
                .map(|h| (h.topic, h.name, h.type_name())),
        ));
        for e in self.unhandled_events() {
            problems.push(format!(
                "event `{}` (topic `{}`) has no handler: link the crate that handles it, or call \
                 Registry::allow_unhandled(\"{}\") if another service handles it",
                e.type_name(),
                e.topic(),
                e.topic()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RegistryError { problems })
        }
    }
}

pub(crate) fn duplicate_names<'a>(
    handlers: impl Iterator<Item = (&'a str, &'a str, &'a str)>,
) -> Vec<String> {
    let mut seen: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for (topic, name, type_name) in handlers {
        seen.entry((topic, name)).or_default().push(type_name);
    }
    seen.into_iter()
        .filter(|(_, types)| types.len() > 1)
        .map(|((topic, name), types)| {
            format!(
                "handlers {} of topic `{topic}` share the name `{name}`: give each a unique Handler::NAME",
                types.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(" and ")
            )
        })
        .collect()
}

/// The handler registry failed its checks; each problem names the types involved and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the outbox handler registry has {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
pub struct RegistryError {
    problems: Vec<String>,
}

impl RegistryError {
    pub(crate) fn from_problems(problems: Vec<String>) -> Self {
        Self { problems }
    }

    /// The problems found, one sentence each.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

/// Panics, naming them, if a declared event has no handler or the registry is not sound.
///
/// Call it from a test of the binary that runs your worker, so an unlinked handler crate fails
/// the build instead of leaving messages pending in production.
///
/// ```no_run
/// #[test]
/// fn every_event_has_a_handler() {
///     outbox::assert_all_events_handled();
/// }
/// ```
///
/// # Panics
///
/// When [`Registry::linked`]`().check()` fails; the message lists every problem.
#[track_caller]
pub fn assert_all_events_handled() {
    if let Err(e) = Registry::linked().check() {
        panic!("{e}");
    }
}

impl crate::model::Stats {
    /// Topics with pending messages that no handler of `registry` serves, with their counts.
    /// They stay pending until a worker that handles them runs.
    pub fn unhandled(&self, registry: &Registry) -> Vec<&crate::model::TopicStats> {
        let known: std::collections::BTreeSet<&str> =
            registry.handlers().iter().map(|h| h.topic()).collect();
        self.topics
            .iter()
            .filter(|t| t.pending() > 0 && !known.contains(t.topic.as_str()))
            .collect()
    }
}
