//! [`enqueue`]: write an event into the caller's transaction.

use std::time::Duration;

use uuid::Uuid;

use crate::backend::NewMessage;
use crate::backend::{Connection, ConnectionMut};
use crate::error::{Error, Result};
use crate::event::Event;

/// The default limit on a serialized payload: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The longest idempotency key accepted, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

/// The longest ordering key accepted, in bytes.
pub const MAX_ORDERING_KEY_BYTES: usize = 255;

/// Options for [`enqueue_with`] and [`enqueue_many_with`].
///
/// ```
/// use outbox::EnqueueOptions;
/// use std::time::Duration;
///
/// let options = EnqueueOptions::new()
///     .delay(Duration::from_secs(60))
///     .idempotency_key("booking-created:42")
///     .max_payload_bytes(64 * 1024)
///     .ordering_key("booking:42");
/// assert_eq!(options.scheduled_delay(), Duration::from_secs(60));
/// assert_eq!(options.key_for_ordering(), Some("booking:42"));
/// ```
#[derive(Debug, Clone)]
pub struct EnqueueOptions {
    delay: Duration,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    dead_releases_key: Option<bool>,
    max_payload_bytes: usize,
}

impl Default for EnqueueOptions {
    fn default() -> Self {
        Self {
            delay: Duration::ZERO,
            idempotency_key: None,
            ordering_key: None,
            dead_releases_key: None,
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

impl EnqueueOptions {
    /// No delay, no explicit key, the default payload limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the message available only after `delay` from the transaction's start.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Sets the idempotency key handlers send downstream, overriding
    /// [`Event::idempotency_key`]. Not accepted by [`enqueue_many_with`], where each event's own
    /// key is used.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the ordering key, overriding [`Event::ordering_key`]: the message is not started
    /// while an earlier message of the same key (of any topic) is pending, running, waiting for
    /// a retry, delayed, or dead and holding its key. With [`enqueue_many_with`] every event of
    /// the slice gets this key, and they are handled in slice order.
    ///
    /// Keys are compared byte for byte and hold 1 to 255 bytes; `booking:42` style keys name
    /// an aggregate across topics. See [`Event::ordering_key`] for what "earlier" means.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Whether the message, once dead, lets the later messages of its ordering key go on,
    /// overriding [`Event::DEAD_RELEASES_KEY`]. By default a dead message blocks its key until
    /// it is retried or discarded.
    pub fn dead_releases_key(mut self, releases: bool) -> Self {
        self.dead_releases_key = Some(releases);
        self
    }

    /// The ordering key set with [`ordering_key`](EnqueueOptions::ordering_key).
    pub fn key_for_ordering(&self) -> Option<&str> {
        self.ordering_key.as_deref()
    }

    /// Refuses payloads whose JSON is larger than `bytes` (default 1 MiB).
    pub fn max_payload_bytes(mut self, bytes: usize) -> Self {
        self.max_payload_bytes = bytes;
        self
    }

    /// The delay set with [`delay`](EnqueueOptions::delay).
    pub fn scheduled_delay(&self) -> Duration {
        self.delay
    }
}

/// Enqueues `event` on the caller's connection or transaction and returns the message's public
/// id (a UUID v7).
///
/// One `INSERT`, never a `BEGIN` or a `COMMIT`: the message exists if and only if the caller's
/// transaction commits. Call it as `enqueue(&mut *tx, &event)` with a `sqlx::Transaction`, or
/// `enqueue(&mut *conn, &event)` with a connection ([`ConnectionMut`]), as sqlx's queries take
/// them. The borrow is taken by value: holding a `&mut PgConnection` (say in a handler), pass
/// `&mut *conn` to use `conn` again after.
///
/// With the `opentelemetry` feature, the trace context of the current span is stored with the
/// message, and the worker's delivery continues that trace; see [`trace`](crate::trace).
///
/// # Errors
///
/// [`Error::PayloadTooLarge`] when the JSON is over the limit, [`Error::Serialize`] when serde
/// fails, [`Error::Database`] when the insert fails; nothing is written in each case (and after
/// a database error PostgreSQL needs the transaction rolled back).
///
/// On MariaDB and MySQL a deadlock (1213) or a lock wait timeout (1205) comes back as
/// [`DatabaseErrorKind::Conflict`](crate::DatabaseErrorKind::Conflict), and `enqueue` has
/// rolled the caller's transaction back: a lock wait timeout alone would have ended only the
/// insert, leaving the business rows written before it to a commit without their event.
/// Inside a `sqlx::Transaction` a read-only transaction then stands in for it until the caller
/// ends it, so a commit stores nothing and a later write fails. Run the whole transaction again.
///
/// # Cancellation safety
///
/// Dropping the future may leave the statement sent or not; the transaction decides. Roll it
/// back if in doubt.
///
/// # Example
///
/// ```no_run
/// use outbox::{enqueue, outbox_event};
/// use serde::{Deserialize, Serialize};
///
/// #[outbox_event]
/// #[derive(Serialize, Deserialize)]
/// struct BookingCreated { booking_id: i64 }
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// let booking_id: i64 = sqlx::query_scalar("INSERT INTO bookings DEFAULT VALUES RETURNING id")
///     .fetch_one(&mut *tx)
///     .await?;
/// enqueue(&mut *tx, &BookingCreated { booking_id }).await?;
/// tx.commit().await?; // the booking and its event, or neither
/// # Ok(()) }
/// ```
pub async fn enqueue<C, E>(conn: C, event: &E) -> Result<Uuid>
where
    C: ConnectionMut,
    E: Event,
{
    enqueue_with(conn, event, &EnqueueOptions::default()).await
}

/// [`enqueue`] with options: a delay, an explicit idempotency key, a payload limit.
///
/// # Errors
///
/// As [`enqueue`], plus [`Error::InvalidIdempotencyKey`], [`Error::InvalidOrderingKey`] and
/// [`Error::DelayOutOfRange`].
///
/// # Cancellation safety
///
/// As [`enqueue`].
pub async fn enqueue_with<C, E>(mut conn: C, event: &E, options: &EnqueueOptions) -> Result<Uuid>
where
    C: ConnectionMut,
    E: Event,
{
    let key = match &options.idempotency_key {
        Some(k) => Some(k.clone()),
        None => event.idempotency_key(),
    };
    let row = new_message(event, key, options, crate::trace::TraceContext::current())?;
    let id = row.id;
    conn.__connection()
        .__insert(std::slice::from_ref(&row))
        .await?;
    Ok(id)
}

/// Enqueues every event of `events` in one statement and returns their public ids, in order.
///
/// All rows or none: it is one `INSERT` on the caller's transaction.
///
/// # Errors
///
/// As [`enqueue`]; one payload over the limit refuses the whole slice.
///
/// # Cancellation safety
///
/// As [`enqueue`].
///
/// # Example
///
/// ```no_run
/// use outbox::{enqueue_many, outbox_event};
///
/// #[outbox_event]
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct NightBooked { booking_id: i64, night: String }
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let nights = ["2026-12-24", "2026-12-25"]
///     .map(|night| NightBooked { booking_id: 1, night: night.into() });
/// let mut tx = pool.begin().await?;
/// let ids = enqueue_many(&mut *tx, &nights).await?; // one INSERT, in your transaction
/// tx.commit().await?;
/// assert_eq!(ids.len(), 2);
/// # Ok(()) }
/// ```
pub async fn enqueue_many<C, E>(conn: C, events: &[E]) -> Result<Vec<Uuid>>
where
    C: ConnectionMut,
    E: Event,
{
    enqueue_many_with(conn, events, &EnqueueOptions::default()).await
}

/// [`enqueue_many`] with options (delay and payload limit apply to every event).
///
/// # Errors
///
/// As [`enqueue_many`]; [`Error::Config`] when the options carry an idempotency key, since one
/// key cannot serve many messages.
///
/// # Cancellation safety
///
/// As [`enqueue`].
pub async fn enqueue_many_with<C, E>(
    mut conn: C,
    events: &[E],
    options: &EnqueueOptions,
) -> Result<Vec<Uuid>>
where
    C: ConnectionMut,
    E: Event,
{
    if options.idempotency_key.is_some() {
        return Err(Error::Config(
            "enqueue_many_with takes no idempotency key; implement Event::idempotency_key to key each event"
                .into(),
        ));
    }
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let trace = crate::trace::TraceContext::current();
    let rows = events
        .iter()
        .map(|e| new_message(e, e.idempotency_key(), options, trace.clone()))
        .collect::<Result<Vec<_>>>()?;
    conn.__connection().__insert(&rows).await?;
    Ok(rows.iter().map(|r| r.id).collect())
}

fn new_message<E: Event>(
    event: &E,
    key: Option<String>,
    options: &EnqueueOptions,
    trace: Option<crate::trace::TraceContext>,
) -> Result<NewMessage> {
    let payload = serde_json::to_string(event).map_err(|source| Error::Serialize {
        topic: E::TOPIC,
        source,
    })?;
    if payload.len() > options.max_payload_bytes {
        return Err(Error::PayloadTooLarge {
            topic: E::TOPIC,
            size: payload.len(),
            limit: options.max_payload_bytes,
        });
    }
    let ordering_key = match &options.ordering_key {
        Some(k) => Some(k.clone()),
        None => event.ordering_key(),
    };
    if let Some(k) = &ordering_key {
        if k.is_empty() {
            return Err(Error::InvalidOrderingKey {
                topic: E::TOPIC,
                reason: "the key is empty; pass None for an unordered message",
            });
        }
        if k.len() > MAX_ORDERING_KEY_BYTES {
            return Err(Error::InvalidOrderingKey {
                topic: E::TOPIC,
                reason: "the key is over 255 bytes; use the aggregate's id",
            });
        }
    }
    if let Some(k) = &key {
        if k.is_empty() {
            return Err(Error::InvalidIdempotencyKey {
                topic: E::TOPIC,
                reason: "the key is empty; pass None to derive one from the message id",
            });
        }
        if k.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(Error::InvalidIdempotencyKey {
                topic: E::TOPIC,
                reason: "the key is over 255 bytes; hash it or use a shorter id",
            });
        }
    }
    // 100 years: far beyond any sensible delay, well inside every timestamp type.
    if options.delay > Duration::from_secs(100 * 365 * 24 * 3600) {
        return Err(Error::DelayOutOfRange(options.delay));
    }
    Ok(NewMessage {
        id: crate::message_id::new_message_id(),
        topic: E::TOPIC,
        version: i32::try_from(E::VERSION).unwrap_or(i32::MAX),
        payload,
        idempotency_key: key,
        delay: options.delay,
        releases_key: ordering_key.is_some()
            && options.dead_releases_key.unwrap_or(E::DEAD_RELEASES_KEY),
        ordering_key,
        trace,
    })
}
