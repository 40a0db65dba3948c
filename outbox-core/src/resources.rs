//! [`Resources`]: the dependencies handlers take from the worker instead of from globals.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// A type map of shared dependencies (HTTP clients, API keys, configuration, pools) that the
/// worker hands to handlers.
///
/// Registered handlers are built from it through [`FromResources`]; every handler can also read
/// it at delivery time through [`Context::resources`](crate::Context::resources).
///
/// # Example
///
/// ```
/// use outbox::Resources;
///
/// #[derive(Clone)]
/// struct ApiKey(String);
///
/// let resources = Resources::new().with(ApiKey("secret".into()));
/// assert_eq!(resources.require::<ApiKey>().unwrap().0, "secret");
/// assert!(resources.get::<u32>().is_none());
/// ```
#[derive(Clone, Default)]
pub struct Resources {
    map: HashMap<TypeId, (&'static str, Arc<dyn Any + Send + Sync>)>,
}

impl Resources {
    /// An empty set of resources.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a value, replacing any earlier value of the same type.
    pub fn insert<T: Send + Sync + 'static>(&mut self, value: T) -> &mut Self {
        self.map.insert(
            TypeId::of::<T>(),
            (std::any::type_name::<T>(), Arc::new(value)),
        );
        self
    }

    /// Adds a value and returns `self`, for building in one expression.
    pub fn with<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.insert(value);
        self
    }

    /// The value of type `T`, if one was added.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.map
            .get(&TypeId::of::<T>())
            .and_then(|(_, v)| v.downcast_ref::<T>())
    }

    /// The value of type `T`, or an error naming the missing type.
    pub fn require<T: Send + Sync + 'static>(&self) -> Result<&T, ResourceError> {
        self.get::<T>().ok_or_else(|| ResourceError::Missing {
            type_name: std::any::type_name::<T>(),
        })
    }
}

impl fmt::Debug for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.map.values().map(|(n, _)| *n).collect();
        names.sort_unstable();
        f.debug_struct("Resources").field("types", &names).finish()
    }
}

/// A handler could not be built from the worker's resources.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// A resource the handler needs was not given to the worker.
    #[error("no resource of type `{type_name}`; add it with Worker::builder(..).resource(value)")]
    Missing {
        /// The Rust type that was asked for.
        type_name: &'static str,
    },
    /// A handler rejected its configuration.
    #[error("handler `{handler}` could not be built: {message}")]
    Invalid {
        /// The handler's name.
        handler: &'static str,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// Builds a handler from the worker's [`Resources`]; required by
/// [`register_handler!`](crate::register_handler).
///
/// # Example
///
/// ```
/// use outbox::{FromResources, ResourceError, Resources};
///
/// struct Mailer { api_key: String }
/// #[derive(Clone)]
/// struct MailerKey(String);
///
/// impl FromResources for Mailer {
///     fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
///         Ok(Mailer { api_key: resources.require::<MailerKey>()?.0.clone() })
///     }
/// }
/// ```
pub trait FromResources: Sized {
    /// Builds the value, or says which resource is missing or wrong.
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError>;
}
