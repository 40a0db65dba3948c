//! StayHub's database: properties and bookings, on SQLite (the default), PostgreSQL or
//! MariaDB/MySQL.
//!
//! The no-double-booking rule lives in the database: an exclusion constraint on PostgreSQL, a
//! trigger on SQLite (which has one writer at a time, so the check and the insert cannot race),
//! and on MariaDB a unique key on (property, night) over a table of the nights each booking
//! holds: two bookings of one night cannot both commit, whatever their isolation level, since
//! the second insert of a key waits for the first and then fails.
//!
//! On SQLite a booking's transaction starts with [`outbox::sqlite_begin_immediate`]: it checks
//! the existing bookings before it writes, and a transaction begun with a plain `pool.begin()`
//! takes a read snapshot at its first read, then fails with "database is locked" when it tries
//! to write after another booking committed in between (SQLite cannot upgrade a stale snapshot,
//! and its busy timeout does not help). `BEGIN IMMEDIATE` takes the write lock first, waiting
//! for the other writer, so the check sees every committed booking and the write cannot fail
//! for the lock.

use std::path::PathBuf;

use chrono::NaiveDate;
use outbox::{enqueue, enqueue_with, EnqueueOptions, Store};
use sqlx::{MySqlPool, PgPool, SqlitePool};
use uuid::Uuid;

use crate::events::{BookingCreated, PropertyChanged};

/// The name of the rule both backends enforce; it appears in the error of a refused booking.
const NO_DOUBLE_BOOKING: &str = "stayhub_no_double_booking";

/// The demo's database.
pub(crate) enum Db {
    Sqlite { pool: SqlitePool, path: PathBuf },
    Postgres { pool: PgPool },
    MySql { pool: MySqlPool },
}

/// A property as the index sees it.
#[derive(Debug, Clone)]
pub(crate) struct Property {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) city: String,
    pub(crate) nightly_price: i64,
    pub(crate) version: i64,
}

type PropertyRow = (i64, String, String, i64, i64);

impl From<PropertyRow> for Property {
    fn from((id, name, city, nightly_price, version): PropertyRow) -> Self {
        Property {
            id,
            name,
            city,
            nightly_price,
            version,
        }
    }
}

/// A request to book.
pub(crate) struct NewBooking<'a> {
    pub(crate) property_id: i64,
    pub(crate) guest_email: &'a str,
    pub(crate) check_in: NaiveDate,
    pub(crate) check_out: NaiveDate,
}

/// What became of a booking request.
pub(crate) enum Booked {
    Confirmed(Uuid),
    Rejected,
}

fn is_double_booking(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|d| {
        d.constraint() == Some(NO_DOUBLE_BOOKING) || d.message().contains(NO_DOUBLE_BOOKING)
    })
}

/// How often a booking runs when PostgreSQL picks it as a deadlock's victim.
const DEADLOCK_RETRIES: u32 = 3;

/// The database aborted the transaction to break a deadlock (PostgreSQL's SQLSTATE 40P01,
/// MySQL's 40001 for error 1213): run it again.
fn is_deadlock(e: &anyhow::Error) -> bool {
    if let Some(e) = e.downcast_ref::<outbox::Error>() {
        return e.database_kind() == Some(outbox::DatabaseErrorKind::Conflict);
    }
    e.downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .is_some_and(|d| matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

/// One try of a booking on MariaDB/MySQL: the event, the booking and the nights it holds in
/// one transaction; a night already held fails the insert of the nights.
async fn book_on_mysql(
    pool: &MySqlPool,
    event: &BookingCreated,
    options: &EnqueueOptions,
    public_id: Uuid,
    b: &NewBooking<'_>,
) -> anyhow::Result<()> {
    let nights: Vec<NaiveDate> = b
        .check_in
        .iter_days()
        .take_while(|d| *d < b.check_out)
        .collect();
    anyhow::ensure!(!nights.is_empty(), "a stay needs at least one night");
    let mut tx = pool.begin().await?;
    enqueue_with(&mut *tx, event, options).await?;
    let r = async {
        sqlx::query(
            "INSERT INTO stayhub_bookings (public_id, property_id, guest_email, check_in, check_out) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(public_id)
        .bind(b.property_id)
        .bind(b.guest_email)
        .bind(b.check_in)
        .bind(b.check_out)
        .execute(&mut *tx)
        .await?;
        let mut held = sqlx::QueryBuilder::new(
            "INSERT INTO stayhub_booked_nights (booking_public_id, property_id, night) ",
        );
        held.push_values(&nights, |mut row, night| {
            row.push_bind(public_id)
                .push_bind(b.property_id)
                .push_bind(*night);
        });
        held.build().execute(&mut *tx).await?;
        Ok::<_, sqlx::Error>(())
    }
    .await;
    match r {
        Ok(()) => Ok(tx.commit().await?),
        Err(e) => {
            tx.rollback().await?;
            Err(e.into())
        }
    }
}

/// One try of a booking on PostgreSQL: the event and the booking in one transaction.
async fn book_on_postgres(
    pool: &PgPool,
    event: &BookingCreated,
    options: &EnqueueOptions,
    public_id: Uuid,
    b: &NewBooking<'_>,
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    enqueue_with(&mut *tx, event, options).await?;
    let r = sqlx::query(
        "INSERT INTO stayhub_bookings (public_id, property_id, guest_email, check_in, check_out) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(public_id)
    .bind(b.property_id)
    .bind(b.guest_email)
    .bind(b.check_in)
    .bind(b.check_out)
    .execute(&mut *tx)
    .await;
    match r {
        Ok(_) => Ok(tx.commit().await?),
        Err(e) => {
            tx.rollback().await?;
            Err(e.into())
        }
    }
}

impl Db {
    /// `DATABASE_URL` if set (postgres://... or mysql://...), else a fresh SQLite file
    /// `stayhub.sqlite`. A MariaDB/MySQL database that does not exist yet is created.
    pub(crate) async fn open() -> anyhow::Result<Db> {
        match std::env::var("DATABASE_URL") {
            Ok(url) if url.starts_with("postgres") => Ok(Db::Postgres {
                pool: PgPool::connect(&url).await?,
            }),
            Ok(url) if url.starts_with("mysql") || url.starts_with("mariadb") => Ok(Db::MySql {
                pool: open_mysql(&url).await?,
            }),
            Ok(url) => anyhow::bail!(
                "DATABASE_URL must be a postgres:// or mysql:// URL (got `{url}`); unset it for SQLite"
            ),
            Err(_) => {
                let path = PathBuf::from("stayhub.sqlite");
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
                let pool = outbox::sqlite_pool(&format!("sqlite://{}", path.display())).await?;
                Ok(Db::Sqlite { pool, path })
            }
        }
    }

    pub(crate) fn store(&self) -> Store {
        match self {
            Db::Sqlite { pool, .. } => Store::from(pool),
            Db::Postgres { pool } => Store::from(pool),
            Db::MySql { pool } => Store::from(pool),
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self {
            Db::Sqlite { path, .. } => format!("SQLite ({}, no server needed)", path.display()),
            Db::Postgres { .. } => "PostgreSQL (DATABASE_URL)".to_string(),
            Db::MySql { .. } => "MariaDB/MySQL (DATABASE_URL)".to_string(),
        }
    }

    /// Creates StayHub's tables afresh, so the demo can run again and again.
    pub(crate) async fn reset(&self) -> anyhow::Result<()> {
        match self {
            Db::Sqlite { pool, .. } => {
                sqlx::raw_sql(
                    "CREATE TABLE stayhub_properties (
                        id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
                        nightly_price INTEGER NOT NULL, version INTEGER NOT NULL DEFAULT 1);
                     CREATE TABLE stayhub_bookings (
                        id INTEGER PRIMARY KEY, public_id TEXT NOT NULL UNIQUE,
                        property_id INTEGER NOT NULL REFERENCES stayhub_properties (id),
                        guest_email TEXT NOT NULL, check_in TEXT NOT NULL, check_out TEXT NOT NULL,
                        CHECK (check_in < check_out));
                     CREATE TRIGGER stayhub_no_double_booking BEFORE INSERT ON stayhub_bookings
                     WHEN EXISTS (SELECT 1 FROM stayhub_bookings b WHERE b.property_id = NEW.property_id
                                  AND b.check_in < NEW.check_out AND NEW.check_in < b.check_out)
                     BEGIN SELECT RAISE(ABORT, 'stayhub_no_double_booking: already booked for those dates'); END;",
                )
                .execute(pool)
                .await?;
            }
            Db::Postgres { pool } => {
                sqlx::raw_sql(
                    "CREATE EXTENSION IF NOT EXISTS btree_gist;
                     DROP TABLE IF EXISTS stayhub_bookings;
                     DROP TABLE IF EXISTS stayhub_properties;
                     DELETE FROM outbox_messages WHERE topic IN ('booking.created', 'property.changed');
                     DELETE FROM outbox_dead WHERE topic IN ('booking.created', 'property.changed');
                     DELETE FROM outbox_done_counts WHERE topic IN ('booking.created', 'property.changed');
                     SELECT outbox_event_log_forget('booking.created');
                     DELETE FROM outbox_replays WHERE topic = 'booking.created';
                     DELETE FROM outbox_handlers WHERE topic = 'booking.created';
                     CREATE TABLE stayhub_properties (
                        id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
                        nightly_price BIGINT NOT NULL, version BIGINT NOT NULL DEFAULT 1);
                     CREATE TABLE stayhub_bookings (
                        id BIGSERIAL PRIMARY KEY, public_id UUID NOT NULL UNIQUE,
                        property_id BIGINT NOT NULL REFERENCES stayhub_properties (id),
                        guest_email TEXT NOT NULL, check_in DATE NOT NULL, check_out DATE NOT NULL,
                        CHECK (check_in < check_out),
                        CONSTRAINT stayhub_no_double_booking
                            EXCLUDE USING gist (property_id WITH =, daterange(check_in, check_out) WITH &&));",
                )
                .execute(pool)
                .await?;
            }
            Db::MySql { pool } => {
                sqlx::raw_sql(
                    "DROP TABLE IF EXISTS stayhub_booked_nights;
                     DROP TABLE IF EXISTS stayhub_bookings;
                     DROP TABLE IF EXISTS stayhub_properties;
                     DELETE FROM outbox_messages WHERE topic IN ('booking.created', 'property.changed');
                     DELETE FROM outbox_dead WHERE topic IN ('booking.created', 'property.changed');
                     DELETE FROM outbox_done_counts WHERE topic IN ('booking.created', 'property.changed');
                     DELETE FROM outbox_events WHERE topic = 'booking.created';
                     DELETE FROM outbox_retention WHERE topic = 'booking.created';
                     DELETE FROM outbox_replays WHERE topic = 'booking.created';
                     DELETE FROM outbox_handlers WHERE topic = 'booking.created';
                     CREATE TABLE stayhub_properties (
                        id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(255) NOT NULL,
                        city VARCHAR(255) NOT NULL, nightly_price BIGINT NOT NULL,
                        version BIGINT NOT NULL DEFAULT 1) ENGINE = InnoDB;
                     CREATE TABLE stayhub_bookings (
                        id BIGINT AUTO_INCREMENT PRIMARY KEY, public_id BINARY(16) NOT NULL UNIQUE,
                        property_id BIGINT NOT NULL REFERENCES stayhub_properties (id),
                        guest_email VARCHAR(255) NOT NULL, check_in DATE NOT NULL, check_out DATE NOT NULL,
                        CHECK (check_in < check_out)) ENGINE = InnoDB;
                     CREATE TABLE stayhub_booked_nights (
                        booking_public_id BINARY(16) NOT NULL, property_id BIGINT NOT NULL,
                        night DATE NOT NULL,
                        CONSTRAINT stayhub_no_double_booking UNIQUE (property_id, night)) ENGINE = InnoDB;",
                )
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn add_property(
        &self,
        name: &str,
        city: &str,
        price: i64,
    ) -> anyhow::Result<Property> {
        Ok(match self {
            Db::Sqlite { pool, .. } => sqlx::query_as::<_, PropertyRow>(
                "INSERT INTO stayhub_properties (name, city, nightly_price) VALUES (?1, ?2, ?3) \
                     RETURNING id, name, city, nightly_price, version",
            )
            .bind(name)
            .bind(city)
            .bind(price)
            .fetch_one(pool)
            .await?,
            Db::Postgres { pool } => sqlx::query_as::<_, PropertyRow>(
                "INSERT INTO stayhub_properties (name, city, nightly_price) VALUES ($1, $2, $3) \
                     RETURNING id, name, city, nightly_price, version",
            )
            .bind(name)
            .bind(city)
            .bind(price)
            .fetch_one(pool)
            .await?,
            Db::MySql { pool } => {
                // No RETURNING on MariaDB's INSERT before 10.5, nor on MySQL's: read it back.
                let id = sqlx::query(
                    "INSERT INTO stayhub_properties (name, city, nightly_price) VALUES (?, ?, ?)",
                )
                .bind(name)
                .bind(city)
                .bind(price)
                .execute(pool)
                .await?
                .last_insert_id();
                mysql_property(pool, i64::try_from(id)?).await?
            }
        }
        .into())
    }

    /// Books a stay: the booking and its `booking.created` event in one transaction.
    ///
    /// The event is enqueued before the booking row here, so that when the database refuses a
    /// double booking, the rollback visibly takes an already-written event with it.
    pub(crate) async fn book(&self, b: &NewBooking<'_>) -> anyhow::Result<Booked> {
        let public_id = Uuid::now_v7();
        let event = BookingCreated {
            booking_id: public_id,
            property_id: b.property_id,
            guest_email: b.guest_email.to_string(),
            check_in: b.check_in,
            check_out: b.check_out,
        };
        // The key the email provider deduplicates on: the same for every retry of this booking.
        let options = EnqueueOptions::new().idempotency_key(format!("booking-created:{public_id}"));
        let inserted = match self {
            Db::Sqlite { pool, .. } => {
                // Reads (the double-booking check) and writes: take the write lock first.
                let mut tx = outbox::sqlite_begin_immediate(pool).await?;
                enqueue_with(&mut *tx, &event, &options).await?;
                let r = sqlx::query(
                    "INSERT INTO stayhub_bookings (public_id, property_id, guest_email, check_in, check_out) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .bind(public_id.to_string())
                .bind(b.property_id)
                .bind(b.guest_email)
                .bind(b.check_in)
                .bind(b.check_out)
                .execute(&mut *tx)
                .await;
                match r {
                    Ok(_) => tx.commit().await.map_err(anyhow::Error::from),
                    Err(e) => {
                        tx.rollback().await?;
                        Err(e.into())
                    }
                }
            }
            Db::Postgres { pool } => {
                // Two bookings of the same nights inserted at the same moment can each wait on
                // the other's exclusion check; PostgreSQL breaks the tie by failing one with a
                // deadlock error. Run again, that one meets the committed booking and is refused
                // as a double booking, as any application should retry a deadlock victim.
                let mut attempt = 1;
                loop {
                    let r = book_on_postgres(pool, &event, &options, public_id, b).await;
                    match r {
                        Err(e) if attempt < DEADLOCK_RETRIES && is_deadlock(&e) => attempt += 1,
                        r => break r,
                    }
                }
            }
            Db::MySql { pool } => {
                // As on PostgreSQL: a deadlock victim runs again, and then meets the committed
                // booking's nights.
                let mut attempt = 1;
                loop {
                    let r = book_on_mysql(pool, &event, &options, public_id, b).await;
                    match r {
                        Err(e) if attempt < DEADLOCK_RETRIES && is_deadlock(&e) => attempt += 1,
                        r => break r,
                    }
                }
            }
        };
        match inserted {
            Ok(()) => Ok(Booked::Confirmed(public_id)),
            Err(e)
                if e.downcast_ref::<sqlx::Error>()
                    .is_some_and(is_double_booking) =>
            {
                Ok(Booked::Rejected)
            }
            Err(e) => Err(e),
        }
    }

    /// Changes a price and bumps the row's version, in its own transaction.
    pub(crate) async fn set_price(&self, property_id: i64, price: i64) -> anyhow::Result<Property> {
        Ok(match self {
            Db::Sqlite { pool, .. } => {
                sqlx::query_as::<_, PropertyRow>(
                    "UPDATE stayhub_properties SET nightly_price = ?2, version = version + 1 WHERE id = ?1 \
                     RETURNING id, name, city, nightly_price, version",
                )
                .bind(property_id)
                .bind(price)
                .fetch_one(pool)
                .await?
            }
            Db::Postgres { pool } => {
                sqlx::query_as::<_, PropertyRow>(
                    "UPDATE stayhub_properties SET nightly_price = $2, version = version + 1 WHERE id = $1 \
                     RETURNING id, name, city, nightly_price, version",
                )
                .bind(property_id)
                .bind(price)
                .fetch_one(pool)
                .await?
            }
            Db::MySql { pool } => {
                sqlx::query(
                    "UPDATE stayhub_properties SET nightly_price = ?, version = version + 1 WHERE id = ?",
                )
                .bind(price)
                .bind(property_id)
                .execute(pool)
                .await?;
                mysql_property(pool, property_id).await?
            }
        }
        .into())
    }

    /// The fallback of an inline update that failed: a `property.changed` event, in a second
    /// transaction of its own.
    pub(crate) async fn enqueue_property_changed(
        &self,
        event: &PropertyChanged,
    ) -> anyhow::Result<Uuid> {
        Ok(match self {
            Db::Sqlite { pool, .. } => {
                let mut tx = pool.begin().await?;
                let id = enqueue(&mut *tx, event).await?;
                tx.commit().await?;
                id
            }
            Db::Postgres { pool } => {
                let mut tx = pool.begin().await?;
                let id = enqueue(&mut *tx, event).await?;
                tx.commit().await?;
                id
            }
            Db::MySql { pool } => {
                let mut tx = pool.begin().await?;
                let id = enqueue(&mut *tx, event).await?;
                tx.commit().await?;
                id
            }
        })
    }

    /// How many bookings exist, and how many `booking.created` messages were committed: those
    /// still in the outbox or dead-lettered, and those done (deleted, counted per minute).
    pub(crate) async fn booking_counts(&self) -> anyhow::Result<(i64, i64)> {
        let (bookings, events) = (
            "SELECT count(*) FROM stayhub_bookings",
            "SELECT (SELECT count(*) FROM outbox_messages WHERE topic = 'booking.created') \
                  + (SELECT count(*) FROM outbox_dead WHERE topic = 'booking.created') \
                  + (SELECT CAST(coalesce(sum(done), 0) AS BIGINT) FROM outbox_done_counts \
                     WHERE topic = 'booking.created')",
        );
        // MySQL casts to SIGNED, not BIGINT.
        let mysql_events =
            "SELECT (SELECT count(*) FROM outbox_messages WHERE topic = 'booking.created') \
                  + (SELECT count(*) FROM outbox_dead WHERE topic = 'booking.created') \
                  + (SELECT CAST(coalesce(sum(done), 0) AS SIGNED) FROM outbox_done_counts \
                     WHERE topic = 'booking.created')";
        Ok(match self {
            Db::Sqlite { pool, .. } => (
                sqlx::query_scalar(bookings).fetch_one(pool).await?,
                sqlx::query_scalar(events).fetch_one(pool).await?,
            ),
            Db::Postgres { pool } => (
                sqlx::query_scalar(bookings).fetch_one(pool).await?,
                sqlx::query_scalar(events).fetch_one(pool).await?,
            ),
            Db::MySql { pool } => (
                sqlx::query_scalar(bookings).fetch_one(pool).await?,
                sqlx::query_scalar(mysql_events).fetch_one(pool).await?,
            ),
        })
    }
}

/// A property read back on MariaDB/MySQL.
async fn mysql_property(pool: &MySqlPool, id: i64) -> anyhow::Result<PropertyRow> {
    Ok(sqlx::query_as::<_, PropertyRow>(
        "SELECT id, name, city, nightly_price, version FROM stayhub_properties WHERE id = ?",
    )
    .bind(id)
    .fetch_one(pool)
    .await?)
}

/// A pool on the MariaDB/MySQL database of `url`, which is created first when missing. Its
/// name comes from the URL, so it is checked to be a plain identifier before it goes into the
/// `CREATE DATABASE` statement.
async fn open_mysql(url: &str) -> anyhow::Result<MySqlPool> {
    use sqlx::mysql::MySqlConnectOptions;
    use sqlx::ConnectOptions;
    let options: MySqlConnectOptions = url.parse()?;
    if let Some(name) = options.get_database().map(str::to_owned) {
        anyhow::ensure!(
            !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "the database name in DATABASE_URL must be letters, digits and underscores (got `{name}`)"
        );
        let mut server = options.clone().database("").connect().await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4"
        )))
        .execute(&mut server)
        .await?;
    }
    Ok(MySqlPool::connect_with(options).await?)
}
