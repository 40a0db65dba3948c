//! [`Store`]: a handle on the outbox tables of one database.

use std::fmt;
use std::sync::Arc;

use crate::backend::Backend;

/// A handle on the outbox tables of one database, built from a connection pool.
///
/// Every call that works on a pool ([`migrate`](crate::migrate), the worker, the operations
/// calls) takes `impl Into<Store>`, so a `sqlx::PgPool` (or a reference to one) can be passed
/// directly. Cloning is cheap.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
/// let store = outbox::Store::from(&pool);
/// outbox::migrate(store.clone()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    kind: &'static str,
}

impl Store {
    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// The database kind, `"postgres"`, `"sqlite"` or `"mysql"` (MariaDB or MySQL).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// A store on a PostgreSQL pool.
    #[cfg(feature = "postgres")]
    pub fn postgres(pool: sqlx::PgPool) -> Self {
        Self {
            backend: Arc::new(crate::backend::postgres::PgBackend::new(pool)),
            kind: "postgres",
        }
    }

    /// A store on a SQLite pool. Open the pool with [`sqlite_pool`](crate::backend::sqlite::sqlite_pool) (or
    /// the options of [`sqlite_options`](crate::sqlite_options)): WAL and a busy timeout.
    #[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
    pub fn sqlite(pool: sqlx::SqlitePool) -> Self {
        Self {
            backend: Arc::new(crate::backend::sqlite::SqliteBackend::new(pool)),
            kind: "sqlite",
        }
    }
}

impl Store {
    /// A store on a MariaDB or MySQL pool (InnoDB; MariaDB >= 10.6, MySQL >= 8.0).
    ///
    /// The worker opens a pool of its own with the same connect options, whose sessions run
    /// at READ COMMITTED; the outbox's transactions on this pool ask for READ COMMITTED each
    /// time, and leave the pool's sessions as they were.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/app").await?;
    /// let store = outbox::Store::mysql(pool);
    /// outbox::migrate(store.clone()).await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "mysql")]
    pub fn mysql(pool: sqlx::MySqlPool) -> Self {
        Self {
            backend: Arc::new(crate::backend::mysql::MySqlBackend::new(pool)),
            kind: "mysql",
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("kind", &self.kind).finish()
    }
}

#[cfg(feature = "postgres")]
impl From<sqlx::PgPool> for Store {
    fn from(pool: sqlx::PgPool) -> Self {
        Store::postgres(pool)
    }
}

#[cfg(feature = "postgres")]
impl From<&sqlx::PgPool> for Store {
    fn from(pool: &sqlx::PgPool) -> Self {
        Store::postgres(pool.clone())
    }
}

#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
impl From<sqlx::SqlitePool> for Store {
    fn from(pool: sqlx::SqlitePool) -> Self {
        Store::sqlite(pool)
    }
}

#[cfg(any(feature = "sqlite", feature = "sqlite-unbundled"))]
impl From<&sqlx::SqlitePool> for Store {
    fn from(pool: &sqlx::SqlitePool) -> Self {
        Store::sqlite(pool.clone())
    }
}

#[cfg(feature = "mysql")]
impl From<sqlx::MySqlPool> for Store {
    fn from(pool: sqlx::MySqlPool) -> Self {
        Store::mysql(pool)
    }
}

#[cfg(feature = "mysql")]
impl From<&sqlx::MySqlPool> for Store {
    fn from(pool: &sqlx::MySqlPool) -> Self {
        Store::mysql(pool.clone())
    }
}
