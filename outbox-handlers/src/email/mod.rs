//! The email handler: turns an event into an [`Email`] through your mapping and sends it through
//! an [`EmailTransport`].
//!
//! - [`HttpTransport`] posts JSON to an email provider with `Authorization: Bearer <key>` and an
//!   `Idempotency-Key` header equal to [`Context::idempotency_key`], identical on every retry, so
//!   the provider sends the email once however often the message is delivered.
//! - [`FileTransport`] writes one JSON file per email, named from the idempotency key: a
//!   redelivery rewrites the same file. For development and demos.
//!
//! How the HTTP provider's answers are handled:
//!
//! | answer | outcome |
//! |--------|---------|
//! | 2xx | sent |
//! | 409 (the idempotency key was already used) | sent: the provider has it |
//! | 408, 429, 5xx, timeout, connection error | retry, after `Retry-After` if given |
//! | any other 4xx | dead letter now, with the provider's message in `last_error` |
//!
//! # Example
//!
//! ```no_run
//! use outbox::{outbox_event, Worker};
//! use outbox_handlers::email::{Email, EmailHandler, HttpTransport};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[outbox_event]
//! #[derive(Serialize, Deserialize)]
//! struct BookingCreated { booking_id: i64, guest_email: String }
//!
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let transport = HttpTransport::builder()
//!     .base_url("https://api.mail.example")
//!     .api_key(std::env::var("MAIL_API_KEY")?)
//!     .from("Stayhub <bookings@stayhub.example>")
//!     .timeout(Duration::from_secs(10))
//!     .build()?;
//! let confirmation = EmailHandler::from_fn(transport, |e: &BookingCreated, _ctx| {
//!     Email::new(&e.guest_email, "Your booking", format!("Booking {} is confirmed.", e.booking_id))
//! });
//! let worker = Worker::builder(&pool).handler(confirmation).build()?;
//! # Ok(()) }
//! ```

mod config;
mod file;
mod http;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use outbox::{Context, Event, FromResources, Handler, HandlerError, ResourceError, Resources};
use serde::{Deserialize, Serialize};

pub use config::EmailConfig;
pub use file::FileTransport;
pub use http::{HttpTransport, HttpTransportBuilder};

/// One email: recipients, subject, plain text and optional HTML.
///
/// ```
/// use outbox_handlers::email::Email;
///
/// let email = Email::new("guest@example.com", "Your booking", "Booking 42 is confirmed.")
///     .to("frontdesk@example.com")
///     .html("<p>Booking <b>42</b> is confirmed.</p>")
///     .from("Stayhub <bookings@stayhub.example>");
/// assert_eq!(email.to, ["guest@example.com", "frontdesk@example.com"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Email {
    /// The sender; `None` uses the transport's default sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The recipients (at least one).
    pub to: Vec<String>,
    /// The subject line.
    pub subject: String,
    /// The plain-text body.
    pub text: String,
    /// The HTML body, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}

impl Email {
    /// An email to one recipient with a subject and a plain-text body.
    pub fn new(to: impl Into<String>, subject: impl Into<String>, text: impl Into<String>) -> Self {
        Email {
            from: None,
            to: vec![to.into()],
            subject: subject.into(),
            text: text.into(),
            html: None,
        }
    }

    /// Adds a recipient.
    pub fn to(mut self, to: impl Into<String>) -> Self {
        self.to.push(to.into());
        self
    }

    /// Sets the HTML body.
    pub fn html(mut self, html: impl Into<String>) -> Self {
        self.html = Some(html.into());
        self
    }

    /// Sets the sender, overriding the transport's default.
    pub fn from(mut self, from: impl Into<String>) -> Self {
        self.from = Some(from.into());
        self
    }

    /// Checks the email can be sent: a recipient, no empty addresses, no line breaks in
    /// addresses or subject.
    fn check(&self) -> Result<(), HandlerError> {
        if self.to.is_empty() {
            return Err(HandlerError::permanent("the email has no recipient"));
        }
        for addr in self.to.iter().chain(self.from.as_ref()) {
            if addr.trim().is_empty() || addr.contains(['\r', '\n']) {
                return Err(HandlerError::permanent(format!(
                    "the email has an invalid address `{}`",
                    addr.escape_debug()
                )));
            }
        }
        if self.subject.contains(['\r', '\n']) {
            return Err(HandlerError::permanent(
                "the email subject has a line break",
            ));
        }
        Ok(())
    }
}

/// Sends emails. Implemented by [`HttpTransport`] and [`FileTransport`]; implement it for
/// another provider or for tests.
///
/// A transport must make the send idempotent on `idempotency_key`: the handler passes the same
/// key on every retry of a message.
///
/// ```
/// use outbox_handlers::email::{Email, EmailTransport};
/// use outbox::HandlerError;
/// use std::sync::Mutex;
///
/// #[derive(Default)]
/// struct Outbox(Mutex<Vec<(String, Email)>>);
///
/// #[outbox::async_trait]
/// impl EmailTransport for Outbox {
///     async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError> {
///         let mut sent = self.0.lock().unwrap();
///         if !sent.iter().any(|(k, _)| k == idempotency_key) {
///             sent.push((idempotency_key.to_string(), email.clone()));
///         }
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait EmailTransport: Send + Sync + 'static {
    /// Sends `email` once per `idempotency_key`.
    ///
    /// Return [`HandlerError::retry`] (or `retry_after`) for failures that may pass and
    /// [`HandlerError::permanent`] for those that will not.
    async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError>;
}

impl fmt::Debug for dyn EmailTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn EmailTransport")
    }
}

#[async_trait]
impl<T: EmailTransport + ?Sized> EmailTransport for Arc<T> {
    async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError> {
        (**self).send(email, idempotency_key).await
    }
}

#[async_trait]
impl<T: EmailTransport + ?Sized> EmailTransport for Box<T> {
    async fn send(&self, email: &Email, idempotency_key: &str) -> Result<(), HandlerError> {
        (**self).send(email, idempotency_key).await
    }
}

/// How an event becomes an email, and the handler's name.
///
/// Implement it on a type of yours when you need a handler name of your own (several email
/// handlers on one topic), a fallible mapping, or registration with
/// [`register_handler!`](outbox::register_handler); otherwise use
/// [`EmailHandler::from_fn`].
///
/// ```
/// use outbox::{outbox_event, Context, HandlerError};
/// use outbox_handlers::email::{Email, EmailMapping};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct BookingCancelled { booking_id: i64, guest_email: Option<String> }
///
/// #[derive(Default)]
/// struct CancellationEmail;
///
/// impl EmailMapping for CancellationEmail {
///     type Event = BookingCancelled;
///     const NAME: &'static str = "cancellation-email";
///
///     fn email(&self, e: &BookingCancelled, _ctx: &Context) -> Result<Email, HandlerError> {
///         let to = e.guest_email.as_deref().ok_or_else(|| HandlerError::permanent("no guest email"))?;
///         Ok(Email::new(to, "Booking cancelled", format!("Booking {} was cancelled.", e.booking_id)))
///     }
/// }
/// ```
pub trait EmailMapping: Send + Sync + 'static {
    /// The event type, whose topic decides which messages reach the handler.
    type Event: Event;

    /// The handler's stable name (see [`Handler::NAME`]).
    const NAME: &'static str;

    /// The email for one event.
    ///
    /// # Errors
    ///
    /// Whatever the mapping decides; [`HandlerError::permanent`] dead-letters the message.
    fn email(&self, event: &Self::Event, ctx: &Context) -> Result<Email, HandlerError>;
}

/// A closure `Fn(&E, &Context) -> Email` as an [`EmailMapping`], named `"email"`; made by
/// [`EmailHandler::from_fn`].
///
/// # About type parameter `E`
///
/// The event type the closure takes.
pub struct EmailFn<E, F> {
    f: F,
    _event: PhantomData<fn() -> E>,
}

impl<E, F> EmailFn<E, F> {
    /// Wraps a closure.
    pub fn new(f: F) -> Self {
        EmailFn {
            f,
            _event: PhantomData,
        }
    }
}

impl<E, F> fmt::Debug for EmailFn<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailFn")
            .field("event", &std::any::type_name::<E>())
            .finish_non_exhaustive()
    }
}

impl<E, F> EmailMapping for EmailFn<E, F>
where
    E: Event,
    F: Fn(&E, &Context) -> Email + Send + Sync + 'static,
{
    type Event = E;
    const NAME: &'static str = "email";

    fn email(&self, event: &E, ctx: &Context) -> Result<Email, HandlerError> {
        Ok((self.f)(event, ctx))
    }
}

/// The email handler: maps each event to an [`Email`] and sends it through a transport, with
/// [`Context::idempotency_key`] as the send's idempotency key.
///
/// Its [`Handler::NAME`] is the mapping's `NAME` (`"email"` for [`from_fn`](Self::from_fn)).
///
/// # About type parameter `M`
///
/// The [`EmailMapping`]: the event type, the handler name and how an event becomes an email.
///
/// # Registration
///
/// With a mapping that is `Default`, the handler can be registered with
/// [`register_handler!`](outbox::register_handler). It is then built from the worker's
/// resources: an `Arc<dyn EmailTransport>` if there is one, else an [`EmailConfig`].
///
/// ```
/// # use outbox::{outbox_event, Context, HandlerError};
/// # use outbox_handlers::email::{Email, EmailMapping};
/// # #[outbox_event] #[derive(serde::Serialize, serde::Deserialize)] struct Welcome { to: String }
/// #[derive(Default)]
/// struct WelcomeEmail;
/// impl EmailMapping for WelcomeEmail {
///     type Event = Welcome;
///     const NAME: &'static str = "welcome-email";
///     fn email(&self, e: &Welcome, _: &Context) -> Result<Email, HandlerError> {
///         Ok(Email::new(&e.to, "Welcome", "Hello!"))
///     }
/// }
/// outbox::register_handler!(outbox_handlers::email::EmailHandler<WelcomeEmail>);
///
/// // The worker then needs the configuration as a resource:
/// # fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let config = outbox_handlers::email::EmailConfig::from_env()?;
/// let builder = outbox::Worker::builder(&pool)
///     .registry(outbox::Registry::linked())
///     .resource(config);
/// # Ok(()) }
/// ```
pub struct EmailHandler<M> {
    transport: Arc<dyn EmailTransport>,
    mapping: M,
}

impl<M: EmailMapping> EmailHandler<M> {
    /// A handler sending through `transport` the emails that `mapping` makes.
    pub fn new(transport: impl EmailTransport, mapping: M) -> Self {
        EmailHandler {
            transport: Arc::new(transport),
            mapping,
        }
    }

    /// A handler sharing a transport with others.
    pub fn with_shared(transport: Arc<dyn EmailTransport>, mapping: M) -> Self {
        EmailHandler { transport, mapping }
    }

    /// The mapping.
    pub fn mapping(&self) -> &M {
        &self.mapping
    }
}

impl<E, F> EmailHandler<EmailFn<E, F>>
where
    E: Event,
    F: Fn(&E, &Context) -> Email + Send + Sync + 'static,
{
    /// A handler named `"email"` whose mapping is a closure.
    ///
    /// The closure cannot fail, as with [`SearchHandler::from_fn`](crate::search::SearchHandler::from_fn)
    /// (when both features are on): a mapping that can (a payload without an address, say)
    /// implements [`EmailMapping`], whose `email` returns a [`HandlerError`].
    pub fn from_fn(transport: impl EmailTransport, f: F) -> Self {
        EmailHandler::new(transport, EmailFn::new(f))
    }
}

impl<M> fmt::Debug for EmailHandler<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmailHandler")
            .field("mapping", &std::any::type_name::<M>())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<M: EmailMapping> Handler for EmailHandler<M> {
    type Event = M::Event;
    const NAME: &'static str = M::NAME;

    async fn handle(&self, event: M::Event, ctx: &Context) -> Result<(), HandlerError> {
        let email = self.mapping.email(&event, ctx)?;
        email.check()?;
        self.transport.send(&email, ctx.idempotency_key()).await
    }
}

impl<M: EmailMapping + Default> FromResources for EmailHandler<M> {
    fn from_resources(resources: &Resources) -> Result<Self, ResourceError> {
        if let Some(t) = resources.get::<Arc<dyn EmailTransport>>() {
            return Ok(EmailHandler::with_shared(t.clone(), M::default()));
        }
        let config = resources
            .get::<EmailConfig>()
            .ok_or(ResourceError::Missing {
                type_name: "outbox_handlers::email::EmailConfig (or an Arc<dyn EmailTransport>)",
            })?;
        let transport = config.transport().map_err(|e| ResourceError::Invalid {
            handler: M::NAME,
            message: e.to_string(),
        })?;
        Ok(EmailHandler::with_shared(transport, M::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_checked_before_sending() {
        assert!(Email::new("a@b", "s", "t").check().is_ok());
        let mut e = Email::new("a@b", "s", "t");
        e.to.clear();
        assert!(e.check().is_err());
        assert!(Email::new(" ", "s", "t").check().is_err());
        assert!(Email::new("a@b", "s\r\nBcc: x@y", "t").check().is_err());
        assert!(Email::new("a@b", "s", "t").from("x\n").check().is_err());
    }

    #[test]
    fn emails_serialize_without_empty_options() {
        let json = serde_json::to_string(&Email::new("a@b", "s", "t")).unwrap();
        assert_eq!(json, r#"{"to":["a@b"],"subject":"s","text":"t"}"#);
    }
}
